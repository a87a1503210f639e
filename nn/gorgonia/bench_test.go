package gorgonia

import (
	"math/rand/v2"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

// BenchmarkHead: forward and backward of examples/gorgonia's classifier head (batch 32,
// 1024→256→10 with ReLU), as a gorgonia Block and as spargo's Linear+ReLU+Linear with the same
// weights. The difference is the Block's cost: gorgonia's VM and gonum's GEMM, and the forward
// that its backward program recomputes.
//
//	go test ./nn/gorgonia -run '^$' -bench Head -benchtime 100x
func BenchmarkHead(b *testing.B) {
	const batch, in, hidden, out = 32, 1024, 256, 10
	ref, l1, l2 := spargoMLP(in, hidden, out, 1)
	blk := mustBlock(b, mlpBuild(in, hidden, out, nil), 2, []int{batch, in})
	copyLinearInto(blk.OwnParams(), 0, l1)
	copyLinearInto(blk.OwnParams(), 2, l2)
	rng := rand.New(rand.NewPCG(1, 1))
	x, dy := randTensor(rng, batch, in), randSlice(rng, batch*out)
	for _, bc := range []struct {
		name string
		m    nn.Module
	}{{"gorgonia", blk}, {"spargo", ref}} {
		b.Run(bc.name, func(b *testing.B) {
			tape := nn.NewTape()
			for b.Loop() {
				tape.Reset()
				xv := tape.Input(x)
				y := bc.m.Forward(xv)
				if err := tape.BackwardFrom(y, dy); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
