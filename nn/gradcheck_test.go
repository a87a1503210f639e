package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// gradCheck compares the tape's gradients with central finite differences of
// L = Σ y·R for the input x and every parameter of m. Elements are probed at a stride
// so large tensors stay cheap.
func gradCheck(t *testing.T, name string, m Module, x *Tensor, eps, tol float64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	tape := NewTape()
	xv := tape.Input(x)
	y := m.Forward(xv)
	if err := tape.Err(); err != nil {
		t.Fatalf("%s: forward: %v", name, err)
	}
	r := make([]float32, y.Value.Len())
	for i := range r {
		r[i] = float32(rng.NormFloat64())
	}
	params := Parameters(m)
	ZeroGrad(params)
	if err := tape.BackwardFrom(y, r); err != nil {
		t.Fatalf("%s: backward: %v", name, err)
	}
	loss := func() float64 {
		tp := NewTape()
		out := m.Forward(tp.Const(x))
		var s float64
		for i, v := range out.Value.Data {
			s += float64(v) * float64(r[i])
		}
		return s
	}
	check := func(what string, val, grad []float32) {
		step := max(1, len(val)/40)
		for i := 0; i < len(val); i += step {
			orig := val[i]
			val[i] = orig + float32(eps)
			lp := loss()
			val[i] = orig - float32(eps)
			lm := loss()
			val[i] = orig
			num := (lp - lm) / (2 * eps)
			got := float64(grad[i])
			if math.Abs(num-got) > tol*(1+math.Abs(num)) {
				t.Errorf("%s: d/d%s[%d] = %.6g, finite difference %.6g", name, what, i, got, num)
			}
		}
	}
	check("x", x.Data, xv.Grad.Data)
	for _, p := range params {
		check(p.Name, p.Value.Data, p.Grad.Data)
	}
}

func randTensor(rng *rand.Rand, shape ...int) *Tensor {
	x := NewTensor(shape...)
	for i := range x.Data {
		x.Data[i] = float32(rng.NormFloat64())
	}
	return x
}

func TestGradientsFiniteDifferences(t *testing.T) {
	rng := NewRand(1)
	evalBN := NewBatchNorm2d(3)
	evalBN.SetTraining(false)
	Uniform(evalBN.RunningMean.Value.Data, 0.5, rng)
	for i := range evalBN.RunningVar.Value.Data {
		evalBN.RunningVar.Value.Data[i] = 0.5 + rng.Float32()
	}
	Uniform(evalBN.Weight.Value.Data, 1, rng)
	cases := []struct {
		name    string
		m       Module
		shape   []int
		tieFree bool // inputs spaced 0.05 apart, so a probe never crosses a max tie
	}{
		{"linear", NewLinear(5, 4, true, rng), []int{3, 5}, false},
		{"linear-nobias", NewLinear(6, 2, false, rng), []int{4, 6}, false},
		{"conv-k3-s1-p1", NewConv2d(2, 3, 3, 1, 1, true, rng), []int{2, 2, 5, 6}, false},
		{"conv-k3-s2-p0", NewConv2d(3, 2, 3, 2, 0, false, rng), []int{2, 3, 7, 7}, false},
		{"conv-k1", NewConv2d(3, 4, 1, 1, 0, true, rng), []int{2, 3, 3, 3}, false},
		{"conv-k5-s2-p2", NewConv2d(2, 2, 5, 2, 2, true, rng), []int{1, 2, 6, 5}, false},
		{"conv-16ch-nhwc-wgrad", NewConv2d(16, 3, 3, 1, 1, true, rng), []int{1, 16, 4, 5}, false},
		{"batchnorm-train", NewBatchNorm2d(3), []int{4, 3, 2, 3}, false},
		{"batchnorm-eval", evalBN, []int{2, 3, 2, 2}, false},
		{"relu", NewSequential(NewLinear(4, 6, true, rng), ReLU{}), []int{3, 4}, false},
		{"maxpool-2", MaxPool2d{Kernel: 2}, []int{2, 2, 4, 6}, true},
		{"maxpool-3-s2-p1", MaxPool2d{Kernel: 3, Stride: 2, Padding: 1}, []int{1, 2, 5, 5}, true},
		{"avgpool-2", AvgPool2d{Kernel: 2}, []int{2, 2, 4, 4}, false},
		{"avgpool-3-s1-p1", AvgPool2d{Kernel: 3, Stride: 1, Padding: 1}, []int{1, 2, 4, 5}, false},
		{"flatten-linear", NewSequential(Flatten{}, NewLinear(12, 3, true, rng)), []int{2, 3, 2, 2}, false},
		{"conv-bn-relu-pool", NewSequential(NewConv2d(2, 4, 3, 1, 1, true, rng), NewBatchNorm2d(4), ReLU{}, MaxPool2d{Kernel: 2}), []int{3, 2, 4, 4}, false},
		// Last, so that the cases above keep their random parameters: the NHWC path.
		{"conv-16to16-nhwc", NewConv2d(16, 16, 3, 1, 1, true, rng), []int{2, 16, 3, 4}, false},
		{"conv-16to16-s2-nhwc", NewConv2d(16, 16, 3, 2, 1, false, rng), []int{1, 16, 5, 5}, false},
		// After the NHWC cases, for the same reason: the ResNet ops.
		{"adaptiveavgpool-1x1", AdaptiveAvgPool2d{OutH: 1, OutW: 1}, []int{2, 3, 5, 7}, false},
		{"adaptiveavgpool-2x3-overlap", AdaptiveAvgPool2d{OutH: 2, OutW: 3}, []int{2, 2, 5, 7}, false},
		{"subsamplepad-s2", SubsamplePad{Stride: 2, Before: 1, After: 2}, []int{2, 3, 5, 6}, false},
		{"conv-subsamplepad-s1", NewSequential(NewConv2d(2, 3, 3, 1, 1, true, rng), SubsamplePad{After: 2}), []int{1, 2, 3, 3}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Batch statistics change with every probe of a training-mode BatchNorm, as
			// they should: the finite difference sees the same function as backward.
			x := randTensor(rng, c.shape...)
			if c.tieFree {
				for i, j := range rng.Perm(len(x.Data)) {
					x.Data[i] = 0.05 * float32(j-len(x.Data)/2)
				}
			}
			gradCheck(t, c.name, c.m, x, 2e-3, 2e-2)
		})
	}
}

// TestConvNoBiasNHWCGradients checks, against finite differences, the NHWC
// convolutions without a bias whose weight gradient reads the NCHW dY in
// place (kernels.ConvWeightGradNHWCPlanes), 3×3 and 1×1, and a stride-2 one
// whose input is a constant (no input gradient, so no [Out, N·plane] copy).
func TestConvNoBiasNHWCGradients(t *testing.T) {
	rng := NewRand(5)
	for _, c := range []struct {
		name  string
		m     *Conv2d
		shape []int
	}{
		{"16to16-k3", NewConv2d(16, 16, 3, 1, 1, false, rng), []int{2, 16, 3, 4}},
		{"16to8-k1", NewConv2d(16, 8, 1, 1, 0, false, rng), []int{3, 16, 2, 3}},
	} {
		gradCheck(t, c.name, c.m, randTensor(rng, c.shape...), 2e-3, 2e-2)
	}
	m := NewConv2d(16, 4, 3, 2, 1, false, rng)
	x := randTensor(rng, 2, 16, 5, 5)
	tape := NewTape()
	y := m.Forward(tape.Const(x))
	r := randTensor(rng, y.Value.Shape...)
	ZeroGrad(Parameters(m))
	if err := tape.BackwardFrom(y, r.Data); err != nil {
		t.Fatal(err)
	}
	loss := func() float64 {
		out := m.Forward(NewTape().Const(x))
		var s float64
		for i, v := range out.Value.Data {
			s += float64(v) * float64(r.Data[i])
		}
		return s
	}
	w, g := m.Weight.Value.Data, m.Weight.Grad.Data
	for i := 0; i < len(w); i += 7 {
		orig := w[i]
		w[i] = orig + 2e-3
		lp := loss()
		w[i] = orig - 2e-3
		lm := loss()
		w[i] = orig
		if num := (lp - lm) / 4e-3; math.Abs(num-float64(g[i])) > 2e-2*(1+math.Abs(num)) {
			t.Errorf("stride 2, constant input: d/dweight[%d] = %.6g, finite difference %.6g", i, g[i], num)
		}
	}
}

func TestCrossEntropyGradient(t *testing.T) {
	rng := NewRand(3)
	x := randTensor(rng, 4, 5)
	labels := []int{0, 4, 2, 2}
	tape := NewTape()
	xv := tape.Input(x)
	loss := CrossEntropy(xv, labels)
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	f := func() float64 {
		tp := NewTape()
		return float64(CrossEntropy(tp.Const(x), labels).Item())
	}
	const eps = 1e-2
	for i := range x.Data {
		o := x.Data[i]
		x.Data[i] = o + eps
		lp := f()
		x.Data[i] = o - eps
		lm := f()
		x.Data[i] = o
		if num := (lp - lm) / (2 * eps); math.Abs(num-float64(xv.Grad.Data[i])) > 1e-3 {
			t.Errorf("d loss/d x[%d] = %g, finite difference %g", i, xv.Grad.Data[i], num)
		}
	}
}
