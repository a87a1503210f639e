package models

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

// stepGrads runs one forward and backward pass of m on x with labels y and
// returns the logits and every parameter's gradient.
func stepGrads(t *testing.T, m nn.Module, x *nn.Tensor, y []int) (logits []float32, grads [][]float32) {
	t.Helper()
	ps := nn.Parameters(m)
	nn.ZeroGrad(ps)
	tape := nn.NewTape()
	out := m.Forward(tape.Const(x))
	if err := tape.Backward(nn.CrossEntropy(out, y)); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		grads = append(grads, append([]float32(nil), p.Grad.Data...))
	}
	return append([]float32(nil), out.Value.Data...), grads
}

// maxDiff returns max |a−b| and max |b|.
func maxDiff(a, b []float32) (d, scale float64) {
	for i := range b {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		scale = max(scale, math.Abs(float64(b[i])))
	}
	return d, scale
}

// TestChannelsLastModels trains one step of each convolutional family in
// both layouts from the same weights: the logits and every parameter's
// gradient agree to float32 rounding, and the parameter names are the same,
// so checkpoints carry over. The BatchNorm sums run in another order, and a
// freshly initialised deep network amplifies rounding: its gradients move by
// up to a fifth of their scale (ResNet-50 in training mode) when the input
// moves by one part in 10⁷. So each difference is held against that noise
// floor, measured on the NCHW model: at most four times the change a 10⁻⁷
// perturbation of the input makes, plus 10⁻⁴ of the scale. That floor does
// not cover the rounding every layer adds in a deep network in training mode
// (ResNet-18 there differs by up to 10⁻³ of a gradient's scale with the
// portable kernels), so the ImageNet ResNets run in evaluation mode, where
// BatchNorm is affine and nothing amplifies; each layer's training-mode passes
// are checked on their own in nn. With the AVX2 and the portable kernels the
// largest difference is a twentieth of its allowance. (A bug, such
// as a transposed weight or a dropped tap, moves a gradient by its whole
// scale.)
func TestChannelsLastModels(t *testing.T) {
	for _, c := range []struct {
		name  string
		ds    Dataset
		n     int
		train bool
	}{
		{"resnet20", CIFAR10, 4, true},
		{"resnet18", Dataset{Name: "tiny", Classes: 7, Channels: 3, Size: 32}, 2, false},
		{"resnet50", Dataset{Name: "tiny", Classes: 5, Channels: 3, Size: 32}, 2, false},
		{"vgg11", CIFAR10, 3, true},
		{"vgg11", CIFAR10, 3, false},
	} {
		t.Run(fmt.Sprintf("%s/train=%v", c.name, c.train), func(t *testing.T) {
			var m nn.Module
			var err error
			if strings.HasPrefix(c.name, "vgg") {
				m, err = NewVGG(c.name, c.ds, nn.NewRand(1))
			} else {
				m, err = NewResNet(c.name, c.ds, nn.NewRand(1))
			}
			if err != nil {
				t.Fatal(err)
			}
			nn.SetTraining(m, c.train)
			rng := nn.NewRand(2)
			x := nn.NewTensor(c.n, c.ds.Channels, c.ds.Size, c.ds.Size)
			for i := range x.Data {
				x.Data[i] = float32(rng.NormFloat64())
			}
			y := make([]int, c.n)
			for i := range y {
				y[i] = rng.IntN(c.ds.Classes)
			}
			paramNames := func() string {
				var s []string
				for _, p := range nn.Parameters(m) {
					s = append(s, p.Name)
				}
				return strings.Join(s, ",")
			}
			names := paramNames()
			l0, g0 := stepGrads(t, m, x, y)
			xn := nn.NewTensor(x.Shape...)
			for i, v := range x.Data {
				xn.Data[i] = v * (1 + 1e-7*float32(rng.NormFloat64()))
			}
			ln, gn := stepGrads(t, m, xn, y)
			if err := SetChannelsLast(m, true); err != nil {
				t.Fatal(err)
			}
			if !m.(ChannelsLaster).ChannelsLast() || paramNames() != names {
				t.Fatalf("after SetChannelsLast: ChannelsLast %v, parameter names changed", m.(ChannelsLaster).ChannelsLast())
			}
			l1, g1 := stepGrads(t, m, x, y)
			within := func(what string, got, want, noisy []float32) {
				d, scale := maxDiff(got, want)
				floor, _ := maxDiff(noisy, want)
				if d > 4*floor+1e-4*scale {
					t.Errorf("%s: differs by %.3g (scale %.3g), the NCHW model's noise floor is %.3g", what, d, scale, floor)
				}
			}
			// In training mode the bias of a convolution that feeds a BatchNorm (VGG's)
			// has a zero gradient in exact arithmetic: both layouts give rounding noise
			// that is not compared.
			zero := map[string]bool{}
			if c.train {
				nn.Walk(m, func(path string, mod nn.Module) {
					if cv, ok := mod.(*nn.Conv2d); ok && cv.Bias != nil {
						zero[cv.Bias.Name] = true
					}
				})
			}
			within("logits", l1, l0, ln)
			for k, p := range nn.Parameters(m) {
				if !zero[p.Name] {
					within(p.Name+" gradient", g1[k], g0[k], gn[k])
				}
			}
			// And back: the NCHW results again, bit for bit.
			if err := SetChannelsLast(m, false); err != nil {
				t.Fatal(err)
			}
			l2, g2 := stepGrads(t, m, x, y)
			for i := range l0 {
				if math.Float32bits(l2[i]) != math.Float32bits(l0[i]) {
					t.Fatalf("back in NCHW: logit %d = %v, was %v", i, l2[i], l0[i])
				}
			}
			for k := range g0 {
				for i := range g0[k] {
					if math.Float32bits(g2[k][i]) != math.Float32bits(g0[k][i]) {
						t.Fatalf("back in NCHW: gradient %d[%d] = %v, was %v", k, i, g2[k][i], g0[k][i])
					}
				}
			}
		})
	}
	if err := SetChannelsLast(nn.NewLinear(2, 2, true, nn.NewRand(1)), true); err == nil || !strings.Contains(err.Error(), "no channels-last layout") {
		t.Errorf("SetChannelsLast(Linear): error %v", err)
	}
}
