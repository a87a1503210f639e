package nn

import (
	"math"
	"testing"
)

// The ops write a fresh input gradient directly (gradOverwrite) and accumulate into
// one that already exists. Feeding the same input to an op twice exercises both:
// the gradient must be exactly twice the single-use gradient.
func TestGradOverwriteAndAccumulate(t *testing.T) {
	rng := NewRand(5)
	evalBN := NewBatchNorm2d(3)
	evalBN.SetTraining(false)
	Uniform(evalBN.RunningMean.Value.Data, 0.5, rng)
	cases := []struct {
		name  string
		f     func(x *Var) *Var
		shape []int
	}{
		{"relu", Relu, []int{2, 3, 5, 7}},
		{"batchnorm-train", NewBatchNorm2d(3).Forward, []int{2, 3, 5, 7}},
		{"batchnorm-train-1d", NewBatchNorm2d(5).Forward, []int{4, 5}},
		{"batchnorm-eval", evalBN.Forward, []int{2, 3, 4, 4}},
		{"maxpool-2", MaxPool2d{Kernel: 2}.Forward, []int{2, 3, 7, 9}},
		{"maxpool-3-s2-p1", MaxPool2d{Kernel: 3, Stride: 2, Padding: 1}.Forward, []int{1, 3, 7, 6}},
		{"avgpool-2", AvgPool2d{Kernel: 2}.Forward, []int{2, 3, 5, 8}},
		{"avgpool-3-s1-p1", AvgPool2d{Kernel: 3, Stride: 1, Padding: 1}.Forward, []int{1, 2, 5, 5}},
		{"reshape", func(x *Var) *Var { return Reshape(x, 6, 35) }, []int{2, 3, 5, 7}},
		{"flatten", Flatten{}.Forward, []int{2, 3, 5, 7}},
		{"add", func(x *Var) *Var { return Add(x, x) }, []int{3, 4}},
		{"cross-entropy", func(x *Var) *Var { return CrossEntropy(x, []int{1, 0, 4}) }, []int{3, 5}},
		{"conv-k3-s1-gemm", NewConv2d(3, 4, 3, 1, 1, true, rng).Forward, []int{2, 3, 5, 6}},
		{"conv-k3-s1-9x10", NewConv2d(3, 4, 3, 1, 1, false, rng).Forward, []int{2, 3, 9, 10}},
		{"conv-k3-s2-col2im", NewConv2d(3, 2, 3, 2, 1, true, rng).Forward, []int{2, 3, 7, 7}},
		{"conv-16ch-nhwc", NewConv2d(16, 16, 3, 1, 1, true, rng).Forward, []int{2, 16, 4, 5}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := randTensor(rng, c.shape...)
			grad := func(twice bool) []float32 {
				tape := NewTape()
				xv := tape.Input(x)
				y := c.f(xv)
				if twice {
					y = Add(y, c.f(xv))
				}
				r := make([]float32, y.Value.Len())
				for i := range r {
					r[i] = float32(math.Sin(float64(i) + 0.5))
				}
				if err := tape.BackwardFrom(y, r); err != nil {
					t.Fatal(err)
				}
				return xv.Grad.Data
			}
			once, twice := grad(false), grad(true)
			for i := range once {
				if d := math.Abs(float64(twice[i] - 2*once[i])); d > 1e-5*(1+math.Abs(float64(once[i]))) {
					t.Fatalf("x.grad[%d]: used twice %v, want 2×%v", i, twice[i], once[i])
				}
			}
		})
	}
}

// A parameter's gradient is never overwritten: backward adds to what is there.
func TestParamGradAccumulates(t *testing.T) {
	rng := NewRand(6)
	bn := NewBatchNorm2d(3)
	x := randTensor(rng, 2, 3, 4, 4)
	run := func() {
		tape := NewTape()
		y := Relu(bn.Forward(tape.Const(x)))
		r := make([]float32, y.Value.Len())
		for i := range r {
			r[i] = float32(i%7) - 3
		}
		if err := tape.BackwardFrom(y, r); err != nil {
			t.Fatal(err)
		}
	}
	run()
	g1 := append([]float32(nil), bn.Weight.Grad.Data...)
	run()
	for i, v := range bn.Weight.Grad.Data {
		if math.Abs(float64(v-2*g1[i])) > 1e-5*(1+math.Abs(float64(g1[i]))) {
			t.Fatalf("weight grad[%d] after two backward passes %v, want 2×%v", i, v, g1[i])
		}
	}
}
