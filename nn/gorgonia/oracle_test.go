package gorgonia

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// gorgonia as a second, independent gradient oracle for spargo's own kernels: the same
// computation is written once with spargo layers and once as a gorgonia graph in a Block, on
// random shapes, and the outputs and every gradient must agree. (The goldens in nn/ come from
// PyTorch; gorgonia's im2col convolution, gonum GEMM and softmax share no code with either.)

// compareOnTape runs ref and blk forward on x and backward from dy (both on fresh tapes) and
// compares output, input gradient and the parameter gradients, mapped by gradOf.
func compareOnTape(t *testing.T, name string, ref nn.Module, blk *Block, x *nn.Tensor, dy []float32,
	pairs [][2]*nn.Param, tol float64) {
	t.Helper()
	run := func(m nn.Module) (y, dx []float32) {
		tape := nn.NewTape()
		xv := tape.Input(x)
		yv := m.Forward(xv)
		if err := tape.BackwardFrom(yv, dy); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return slices.Clone(yv.Value.Data), slices.Clone(xv.Grad.Data)
	}
	nn.ZeroGrad(nn.Parameters(ref))
	nn.ZeroGrad(blk.OwnParams())
	yRef, dxRef := run(ref)
	y, dx := run(blk)
	closeTo(t, name+": output", y, yRef, tol)
	closeTo(t, name+": input gradient", dx, dxRef, tol)
	for _, pr := range pairs {
		closeTo(t, name+": "+pr[0].Name+" gradient", pr[0].Grad.Data, pr[1].Grad.Data, tol)
	}
}

// spargo's Conv2d (implicit-GEMM kernels) against gorgonia's Conv2d (im2col + gonum GEMM),
// random geometry: batch, channels (both sides of the weight gradient's NHWC threshold),
// size, kernel, stride, padding up to wider than the kernel, with and without bias. This
// test found packIm2colT reading past the input when the padding is wider than the kernel.
func TestOracleConv2d(t *testing.T) {
	rng := rand.New(rand.NewPCG(2024, 1))
	for trial := range 24 {
		n, cin, cout := 1+rng.IntN(3), 1+rng.IntN(20), 1+rng.IntN(6)
		k := []int{1, 3, 5}[rng.IntN(3)]
		stride, pad := 1+rng.IntN(3), rng.IntN(k+2)
		h, w := k+rng.IntN(6), k+rng.IntN(6)
		bias := trial%2 == 0
		name := fmt.Sprintf("conv N%d C%d→%d %dx%d k%d s%d p%d bias %v", n, cin, cout, h, w, k, stride, pad, bias)
		conv := nn.NewConv2d(cin, cout, k, stride, pad, bias, nn.NewRand(uint64(trial)))
		blk := mustBlock(t, func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			wt := b.Param("weight", Values(conv.Weight.Value.Data), cout, cin, k, k) // PyTorch's layout
			y, err := G.Conv2d(xs[0], wt, tensor.Shape{k, k}, []int{pad, pad}, []int{stride, stride}, []int{1, 1})
			if err != nil || !bias {
				return y, err
			}
			bb := b.Param("bias", Values(conv.Bias.Value.Data), 1, cout, 1, 1)
			return G.BroadcastAdd(y, bb, nil, []byte{0, 2, 3})
		}, 1, []int{n, cin, h, w})
		x := randTensor(rng, n, cin, h, w)
		oh, ow := (h+2*pad-k)/stride+1, (w+2*pad-k)/stride+1
		pairs := [][2]*nn.Param{{blk.OwnParams()[0], conv.Weight}}
		if bias {
			pairs = append(pairs, [2]*nn.Param{blk.OwnParams()[1], conv.Bias})
		}
		compareOnTape(t, name, conv, blk, x, randSlice(rng, n*cout*oh*ow), pairs, 1e-4)
	}
}

// spargo's Linear against x·Wᵀ + b in gorgonia (weight in PyTorch's [out, in] layout,
// transposed inside the graph), random sizes.
func TestOracleLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(2024, 2))
	for trial := range 8 {
		n, in, out := 1+rng.IntN(9), 1+rng.IntN(40), 1+rng.IntN(30)
		bias := trial%2 == 1
		lin := nn.NewLinear(in, out, bias, nn.NewRand(uint64(trial)))
		blk := mustBlock(t, func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			w := b.Param("weight", Values(lin.Weight.Value.Data), out, in)
			y, err := G.Mul(xs[0], G.Must(G.Transpose(w)))
			if err != nil || !bias {
				return y, err
			}
			return G.BroadcastAdd(y, b.Param("bias", Values(lin.Bias.Value.Data), out), nil, []byte{0})
		}, 1, []int{n, in})
		pairs := [][2]*nn.Param{{blk.OwnParams()[0], lin.Weight}}
		if bias {
			pairs = append(pairs, [2]*nn.Param{blk.OwnParams()[1], lin.Bias})
		}
		compareOnTape(t, fmt.Sprintf("linear N%d %d→%d bias %v", n, in, out, bias), lin, blk,
			randTensor(rng, n, in), randSlice(rng, n*out), pairs, 1e-5)
	}
}

// crossEntropyModule is nn.CrossEntropy with fixed labels, as a module.
type crossEntropyModule struct{ labels []int }

func (c crossEntropyModule) Forward(x *nn.Var) *nn.Var { return nn.CrossEntropy(x, c.labels) }

// spargo's fused softmax cross-entropy against −mean(Σ onehot ⊙ LogSoftMax(x)) in gorgonia:
// the loss (a scalar output) and the logits' gradient, random batch and class counts and
// logits of a wide range.
func TestOracleSoftmaxCrossEntropy(t *testing.T) {
	rng := rand.New(rand.NewPCG(2024, 3))
	for trial := range 8 {
		n, k := 1+rng.IntN(8), 2+rng.IntN(12)
		labels := make([]int, n)
		onehot := make([]float32, n*k)
		for i := range labels {
			labels[i] = rng.IntN(k)
			onehot[i*k+labels[i]] = 1
		}
		blk := mustBlock(t, func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			oh := G.NewConstant(tensor.New(tensor.WithShape(n, k), tensor.WithBacking(slices.Clone(onehot))), G.WithName("onehot"))
			picked := G.Must(G.Sum(G.Must(G.HadamardProd(G.Must(G.LogSoftMax(xs[0])), oh))))
			return G.Mul(picked, G.NewConstant(float32(-1)/float32(n)))
		}, 1, []int{n, k})
		x := randTensor(rng, n, k)
		for i := range x.Data {
			x.Data[i] *= float32(1 + trial) // up to ±20 or so: softmax's stability matters
		}
		compareOnTape(t, fmt.Sprintf("cross-entropy N%d K%d", n, k), crossEntropyModule{labels}, blk, x, []float32{1.5}, nil, 1e-5)
	}
}

// spargo's SGEMM (all four transpose combinations, random sizes, alpha and beta) against
// gorgonia's Mul, and its gradient identities through the Block: d(A·B) = dY·Bᵀ, Aᵀ·dY.
func TestOracleMatmul(t *testing.T) {
	rng := rand.New(rand.NewPCG(2024, 4))
	for trial := range 16 {
		m, n, k := 1+rng.IntN(33), 1+rng.IntN(33), 1+rng.IntN(65)
		ta, tb := trial&1 != 0, trial&2 != 0
		alpha, beta := float32(rng.NormFloat64()), float32(trial%3)/2
		aShape, bShape := []int{m, k}, []int{k, n}
		if ta {
			aShape = []int{k, m}
		}
		if tb {
			bShape = []int{n, k}
		}
		a, bm := randTensor(rng, aShape...), randTensor(rng, bShape...)
		c := randSlice(rng, m*n)
		want := slices.Clone(c)
		kernels.Sgemm(ta, tb, m, n, k, alpha, a.Data, aShape[1], bm.Data, bShape[1], beta, want, n)

		g := G.NewGraph()
		an := G.NewMatrix(g, tensor.Float32, G.WithShape(aShape...), G.WithName("a"), G.WithValue(ToDense(a)))
		bn := G.NewMatrix(g, tensor.Float32, G.WithShape(bShape...), G.WithName("b"), G.WithValue(ToDense(bm)))
		if ta {
			an = G.Must(G.Transpose(an))
		}
		if tb {
			bn = G.Must(G.Transpose(bn))
		}
		prod := G.Must(G.Mul(an, bn))
		runAll(t, g)
		ab, err := valueFloat32s(prod.Value())
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, m*n)
		for i := range got {
			got[i] = alpha*ab[i] + beta*c[i]
		}
		closeTo(t, fmt.Sprintf("sgemm %dx%dx%d transA %v transB %v", m, n, k, ta, tb), want, got, 1e-5)
	}
	// The gradient identities, with spargo's Linear (no bias: x·Wᵀ) as the spargo side.
	for trial := range 4 {
		m, n, k := 1+rng.IntN(20), 1+rng.IntN(20), 1+rng.IntN(40)
		lin := nn.NewLinear(k, n, false, nn.NewRand(uint64(100+trial)))
		blk := mustBlock(t, func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			wT := b.Param("weightT", Values(transposeGrad(lin.Weight.Value.Data, n, k)), k, n)
			return G.Mul(xs[0], wT)
		}, 1, []int{m, k})
		tape := nn.NewTape()
		xv := tape.Input(randTensor(rng, m, k))
		dy := randSlice(rng, m*n)
		if err := tape.BackwardFrom(lin.Forward(xv), dy); err != nil {
			t.Fatal(err)
		}
		tape2 := nn.NewTape()
		xv2 := tape2.Input(xv.Value)
		if err := tape2.BackwardFrom(blk.Forward(xv2), dy); err != nil {
			t.Fatal(err)
		}
		closeTo(t, "matmul dA", xv2.Grad.Data, xv.Grad.Data, 1e-5)
		closeTo(t, "matmul dB", transposeGrad(blk.OwnParams()[0].Grad.Data, k, n), lin.Weight.Grad.Data, 1e-5)
	}
}
