package kernels

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkReluBackwardFresh compares the two ways to produce a fresh ReLU input
// gradient at [32,64,32,32]: clearing the buffer and accumulating (the tape's old
// grad() path) versus writing it directly (ReluBackwardSet). GB/s counts y and dy
// read and dx written once.
func BenchmarkReluBackwardFresh(b *testing.B) {
	const n = 32 * 64 * 32 * 32
	r := rand.New(rand.NewPCG(1, 1))
	y, dy, dx := randSlice(r, n), randSlice(r, n), make([]float32, n)
	b.Run("zero+accumulate", func(b *testing.B) {
		b.SetBytes(12 * n)
		for b.Loop() {
			clear(dx)
			ReluBackward(dx, y, dy)
		}
	})
	b.Run("set", func(b *testing.B) {
		b.SetBytes(12 * n)
		for b.Loop() {
			ReluBackwardSet(dx, y, dy)
		}
	})
}
