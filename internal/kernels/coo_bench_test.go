package kernels

import (
	"math/rand/v2"
	"testing"
)

func BenchmarkScatterAdd(b *testing.B) {
	benchCases(b, func(b *testing.B, x []float32, k int) int {
		idx := TopKAbs(nil, x, k)
		val := make([]float32, len(idx))
		Gather(val, x, idx)
		dst := make([]float32, len(x))
		copy(dst, x) // touch every page before timing
		ScatterAdd(dst, idx, val)
		b.ResetTimer()
		for b.Loop() {
			ScatterAdd(dst, idx, val)
		}
		return len(idx)
	})
}

func BenchmarkGather(b *testing.B) {
	benchCases(b, func(b *testing.B, x []float32, k int) int {
		idx := TopKAbs(nil, x, k)
		val := make([]float32, len(idx))
		Gather(val, x, idx)
		b.ResetTimer()
		for b.Loop() {
			Gather(val, x, idx)
		}
		return len(idx)
	})
}

// BenchmarkMergeCOO merges two independent random sparse vectors of the
// given density (two workers' selections).
func BenchmarkMergeCOO(b *testing.B) {
	benchCases(b, func(b *testing.B, x []float32, k int) int {
		r := rand.New(rand.NewPCG(3, 4))
		ai, av := bernoulliCOO(r, len(x), k)
		bi, bv := bernoulliCOO(r, len(x), k)
		oi, ov := MergeCOO(nil, nil, ai, av, bi, bv)
		b.ResetTimer()
		for b.Loop() {
			oi, ov = MergeCOO(oi[:0], ov[:0], ai, av, bi, bv)
		}
		return len(ai) + len(bi)
	})
}

// bernoulliCOO draws a sparse vector with each index present with
// probability k/n.
func bernoulliCOO(r *rand.Rand, n, k int) ([]int32, []float32) {
	p := float64(k) / float64(n)
	var idx []int32
	var val []float32
	for i := range n {
		if r.Float64() < p {
			idx, val = append(idx, int32(i)), append(val, float32(r.NormFloat64()))
		}
	}
	return idx, val
}
