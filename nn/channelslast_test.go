package nn

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// clCase builds a layer in NCHW (cl false) or channels-last form from the
// same random draws, and says whether its results must match bit for bit.
type clCase struct {
	name  string
	shape []int // NCHW input
	mk    func(cl bool) Module
	exact bool
}

// residual adds the input to m's output (m keeps the shape), so the input's
// gradient is accumulated into rather than written.
type residual struct{ m Module }

func (r residual) Forward(x *Var) *Var { return Add(r.m.Forward(x), x) }
func (r residual) Children() []Child   { return []Child{{Name: "m", Module: r.m}} }

func conv(in, out, k, s, p int, bias bool) func(bool) Module {
	return func(cl bool) Module {
		c := NewConv2d(in, out, k, s, p, bias, NewRand(11))
		c.ChannelsLast = cl
		return c
	}
}

// runLayout runs m on x (NCHW) with the output gradient r: directly, or
// between ToChannelsLast and ToChannelsFirst. It returns the output, the
// input gradient and the parameters' gradients.
func runLayout(t *testing.T, m Module, x *Tensor, r []float32, cl bool) (y, dx []float32, grads [][]float32) {
	t.Helper()
	params := Parameters(m)
	ZeroGrad(params)
	tape := NewTape()
	xv := tape.Input(x)
	h := xv
	if cl {
		h = ToChannelsLast(h)
	}
	out := m.Forward(h)
	if cl {
		out = ToChannelsFirst(out)
	}
	if r == nil {
		return out.Value.Data, nil, nil
	}
	if err := tape.BackwardFrom(out, r); err != nil {
		t.Fatal(err)
	}
	for _, p := range params {
		grads = append(grads, p.Grad.Data)
	}
	return out.Value.Data, xv.Grad.Data, grads
}

// closeTo reports the first element where got and want differ by more than
// tol relative to the larger magnitude in want (bit for bit when tol is 0).
func closeTo(got, want []float32, tol float64) int {
	var scale float64
	for _, v := range want {
		scale = max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		if tol == 0 && math.Float32bits(got[i]) != math.Float32bits(want[i]) ||
			math.Abs(float64(got[i])-float64(want[i])) > tol*(scale+1e-30) {
			return i
		}
	}
	return -1
}

// TestChannelsLastLayers checks every channels-last layer against its NCHW
// form (itself checked against finite differences and PyTorch): the output,
// the input gradient (written and accumulated) and the parameter gradients.
func TestChannelsLastLayers(t *testing.T) {
	bn := func(c int, train bool, relu bool) func(bool) Module {
		return func(cl bool) Module {
			b := NewBatchNorm2d(c)
			r := NewRand(12)
			for i := range b.Weight.Value.Data {
				b.Weight.Value.Data[i] = float32(r.Float64() + 0.5)
				b.Bias.Value.Data[i] = float32(r.Float64() - 0.5)
				b.RunningMean.Value.Data[i] = float32(r.Float64() - 0.5)
				b.RunningVar.Value.Data[i] = float32(r.Float64() + 0.5)
			}
			b.SetTraining(train)
			b.ChannelsLast = cl
			if relu {
				return bnReluModule{b}
			}
			return b
		}
	}
	cases := []clCase{
		{"conv 16→16 k3", []int{2, 16, 6, 5}, conv(16, 16, 3, 1, 1, false), false},
		{"conv 16→16 k3 bias", []int{2, 16, 4, 4}, conv(16, 16, 3, 1, 1, true), false},
		{"conv 16→32 k3 s2", []int{3, 16, 9, 8}, conv(16, 32, 3, 2, 1, false), false},
		{"conv 3→16 k3 (stem)", []int{2, 3, 8, 8}, conv(3, 16, 3, 1, 1, false), false},
		{"conv 64→32 k1 s2", []int{2, 64, 6, 6}, conv(64, 32, 1, 2, 0, false), false},
		{"conv 8→8 k1", []int{2, 8, 5, 3}, conv(8, 8, 1, 1, 0, true), false},
		{"conv 5→7 k7 s2 p3", []int{2, 5, 11, 10}, conv(5, 7, 7, 2, 3, true), false},
		{"conv 4→6 k2 p0", []int{1, 4, 5, 5}, conv(4, 6, 2, 1, 0, false), false},
		{"batchnorm train", []int{4, 16, 5, 6}, bn(16, true, false), false},
		{"batchnorm eval", []int{2, 24, 3, 3}, bn(24, false, false), false},
		{"batchnorm+relu train", []int{3, 8, 4, 4}, bn(8, true, true), false},
		{"subsample-pad", []int{2, 16, 7, 6}, func(cl bool) Module {
			return SubsamplePad{Stride: 2, Before: 8, After: 8, ChannelsLast: cl}
		}, true},
		{"adaptive avg 1×1", []int{3, 16, 8, 8}, func(cl bool) Module {
			return AdaptiveAvgPool2d{OutH: 1, OutW: 1, ChannelsLast: cl}
		}, true},
		{"adaptive avg 2×3", []int{2, 5, 7, 8}, func(cl bool) Module {
			return AdaptiveAvgPool2d{OutH: 2, OutW: 3, ChannelsLast: cl}
		}, true},
		{"maxpool 3/2/1", []int{2, 16, 9, 8}, func(cl bool) Module {
			return MaxPool2d{Kernel: 3, Stride: 2, Padding: 1, ChannelsLast: cl}
		}, true},
		{"maxpool 2/2", []int{2, 64, 4, 6}, func(cl bool) Module {
			return MaxPool2d{Kernel: 2, ChannelsLast: cl}
		}, true},
		{"avgpool 3/2/1", []int{2, 5, 7, 7}, func(cl bool) Module {
			return AvgPool2d{Kernel: 3, Stride: 2, Padding: 1, ChannelsLast: cl}
		}, true},
	}
	rng := NewRand(13)
	for _, c := range cases {
		x := randTensor(rng, c.shape...)
		for _, acc := range []bool{false, true} {
			name := fmt.Sprintf("%s/accumulate=%v", c.name, acc)
			m0, m1 := c.mk(false), c.mk(true)
			if acc {
				y, _, _ := runLayout(t, m0, x, nil, false)
				if len(y) != len(x.Data) {
					continue // the residual needs the input's shape
				}
				m0, m1 = residual{m0}, residual{m1}
			}
			y0, _, _ := runLayout(t, m0, x, nil, false)
			r := randTensor(rng, len(y0)).Data
			y0, dx0, g0 := runLayout(t, m0, x, r, false)
			y1, dx1, g1 := runLayout(t, m1, x, r, true)
			tol := 2e-6
			if c.exact {
				tol = 0
			}
			if i := closeTo(y1, y0, tol); i >= 0 {
				t.Fatalf("%s: output[%d] = %v, NCHW gives %v", name, i, y1[i], y0[i])
			}
			if i := closeTo(dx1, dx0, 10*tol); i >= 0 {
				t.Fatalf("%s: input gradient[%d] = %v, NCHW gives %v", name, i, dx1[i], dx0[i])
			}
			for k := range g0 {
				if i := closeTo(g1[k], g0[k], 10*tol); i >= 0 {
					t.Fatalf("%s: parameter %d gradient[%d] = %v, NCHW gives %v", name, k, i, g1[k][i], g0[k][i])
				}
			}
		}
	}
}

// TestChannelsLastErrors checks that channels-last layers name the layout
// they want when given a tensor of another shape.
func TestChannelsLastErrors(t *testing.T) {
	x := NewTensor(2, 3, 8, 8) // NCHW, 3 channels
	for _, c := range []struct {
		m    Module
		want string
	}{
		{&Conv2d{In: 3, Out: 4, Kernel: 3, Stride: 1, Padding: 1, Weight: NewParam("weight", 4, 3, 3, 3), ChannelsLast: true}, "want [N H W 3]"},
		{&BatchNorm2d{C: 3, Weight: NewParam("w", 3), Bias: NewParam("b", 3), ChannelsLast: true}, "want [N H W 3] (channels last)"},
		{MaxPool2d{Kernel: 2, ChannelsLast: true}, ""},
		{AdaptiveAvgPool2d{OutH: 1, OutW: 1, ChannelsLast: true}, ""},
	} {
		tape := NewTape()
		y := c.m.Forward(tape.Const(x))
		if c.want == "" {
			// A valid channels-last input of 8 channels: [2, 3, 8, 8] is 3×8 maps.
			if tape.Err() != nil || y.Value.Shape[3] != 8 {
				t.Errorf("%T: shape %v, error %v", c.m, y.Value.Shape, tape.Err())
			}
			continue
		}
		if err := tape.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%T: error %v, want one saying %q", c.m, err, c.want)
		}
	}
}
