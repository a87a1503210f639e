package gorgonia

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"

	"github.com/spargo-dl/spargo/nn"
)

// mlpBuild is a two-layer perceptron written in gorgonia, relu(x·W1 + b1)·W2 + b2, with
// weights in gorgonia's [in, out] layout and PyTorch's default initialisation. act replaces
// the ReLU when not nil.
func mlpBuild(in, hidden, out int, act func(*G.Node) (*G.Node, error)) BuildFunc {
	if act == nil {
		act = G.Rectify
	}
	return func(b *Builder, xs ...*G.Node) (*G.Node, error) {
		w1 := b.Param("fc1.weight", KaimingUniform(in), in, hidden)
		b1 := b.Param("fc1.bias", KaimingUniform(in), hidden)
		w2 := b.Param("fc2.weight", KaimingUniform(hidden), hidden, out)
		b2 := b.Param("fc2.bias", KaimingUniform(hidden), out)
		h := G.Must(G.BroadcastAdd(G.Must(G.Mul(xs[0], w1)), b1, nil, []byte{0}))
		h, err := act(h)
		if err != nil {
			return nil, err
		}
		return G.BroadcastAdd(G.Must(G.Mul(h, w2)), b2, nil, []byte{0})
	}
}

// spargoMLP is the same computation with spargo layers.
func spargoMLP(in, hidden, out int, seed uint64) (*nn.Sequential, *nn.Linear, *nn.Linear) {
	rng := nn.NewRand(seed)
	l1, l2 := nn.NewLinear(in, hidden, true, rng), nn.NewLinear(hidden, out, true, rng)
	return nn.NewSequential(l1, nn.ReLU{}, l2), l1, l2
}

// copyLinearInto sets a gorgonia MLP's parameters (offset j) to a spargo Linear's, transposing
// the weight from [out, in] to [in, out].
func copyLinearInto(ps []*nn.Param, j int, l *nn.Linear) {
	w := ps[j].Value.Data
	for o := 0; o < l.Out; o++ {
		for i := 0; i < l.In; i++ {
			w[i*l.Out+o] = l.Weight.Value.Data[o*l.In+i]
		}
	}
	copy(ps[j+1].Value.Data, l.Bias.Value.Data)
}

// transposeGrad returns a [in, out] gradient in spargo's [out, in] layout.
func transposeGrad(g []float32, in, out int) []float32 {
	t := make([]float32, len(g))
	for i := 0; i < in; i++ {
		for o := 0; o < out; o++ {
			t[o*in+i] = g[i*out+o]
		}
	}
	return t
}

func randTensor(rng *rand.Rand, shape ...int) *nn.Tensor {
	t := nn.NewTensor(shape...)
	for i := range t.Data {
		t.Data[i] = float32(rng.NormFloat64())
	}
	return t
}

func randSlice(rng *rand.Rand, n int) []float32 { return randTensor(rng, n).Data }

// closeTo checks |got-want| <= tol·(1+|want|) elementwise.
func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst, at := 0.0, -1
	for i := range got {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if d/(1+math.Abs(float64(want[i]))) > worst {
			worst, at = d/(1+math.Abs(float64(want[i]))), i
		}
	}
	if worst > tol || math.IsNaN(worst) {
		t.Errorf("%s: element %d is %v, want %v (relative error %.3g > %g)", what, at, got[at], want[at], worst, tol)
	}
}

func mustBlock(t testing.TB, build BuildFunc, seed uint64, shapes ...[]int) *Block {
	t.Helper()
	b, err := NewBlock(build, nn.NewRand(seed), shapes...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func shapeStr(s []int) string { return fmt.Sprint(s) }
