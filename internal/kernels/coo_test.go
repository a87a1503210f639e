package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func randCOO(r *rand.Rand, n, nnz int) ([]int32, []float32) {
	perm := r.Perm(n)[:nnz]
	slices.Sort(perm)
	idx := make([]int32, nnz)
	val := make([]float32, nnz)
	for i, p := range perm {
		idx[i] = int32(p)
		val[i] = float32(r.NormFloat64())
		if r.IntN(10) == 0 {
			val[i] = float32(math.Copysign(0, -1))
		}
	}
	return idx, val
}

func TestScatterAddGather(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 7, 33, 1000} {
		for _, nnz := range []int{0, 1, 5, 3 * n} {
			idx := make([]int32, nnz)
			val := make([]float32, nnz)
			for i := range idx {
				idx[i] = int32(r.IntN(n)) // repeats included
				val[i] = float32(r.NormFloat64())
			}
			dst := fill(n, func(int) float32 { return float32(r.NormFloat64()) })
			want := slices.Clone(dst)
			for i := range idx {
				want[idx[i]] = want[idx[i]] + val[i]
			}
			ScatterAdd(dst, idx, val)
			for i := range dst {
				if math.Float32bits(dst[i]) != math.Float32bits(want[i]) {
					t.Fatalf("ScatterAdd n=%d nnz=%d: dst[%d] = %v, want %v", n, nnz, i, dst[i], want[i])
				}
			}
			g := make([]float32, nnz)
			Gather(g, dst, idx)
			for i := range g {
				if g[i] != dst[idx[i]] {
					t.Fatalf("Gather n=%d nnz=%d: [%d] = %v, want %v", n, nnz, i, g[i], dst[idx[i]])
				}
			}
		}
	}
}

func TestMergeCOO(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{1, 2, 10, 1000} {
		for _, na := range []int{0, 1, n / 2, n} {
			for _, nb := range []int{0, 1, n / 3, n} {
				ai, av := randCOO(r, n, na)
				bi, bv := randCOO(r, n, nb)
				// oracle: dense accumulation with presence flags
				has := make([]bool, n)
				sum := make([]float32, n)
				ina := make([]bool, n)
				for i, j := range ai {
					has[j], ina[j], sum[j] = true, true, av[i]
				}
				for i, j := range bi {
					if ina[j] {
						sum[j] = sum[j] + bv[i]
					} else {
						sum[j] = bv[i]
					}
					has[j] = true
				}
				var wi []int32
				var wv []float32
				for j := range n {
					if has[j] {
						wi, wv = append(wi, int32(j)), append(wv, sum[j])
					}
				}
				oi, ov := MergeCOO([]int32{-1}, []float32{7, 8}, ai, av, bi, bv)
				if oi[0] != -1 || ov[0] != 7 || ov[1] != 8 {
					t.Fatal("MergeCOO clobbered the prefix")
				}
				oi, ov = oi[1:], ov[2:]
				if !slices.Equal(oi, wi) || len(ov) != len(wv) {
					t.Fatalf("MergeCOO n=%d na=%d nb=%d: indices differ", n, na, nb)
				}
				for i := range ov {
					if math.Float32bits(ov[i]) != math.Float32bits(wv[i]) {
						t.Fatalf("MergeCOO n=%d: value %d = %v, want %v", n, i, ov[i], wv[i])
					}
				}
			}
		}
	}
}

// TestMergeCOOEdges covers the split of the two-way merge (the second input
// entirely below, above or around the first's middle index), identical
// index sets and disjoint ranges.
func TestMergeCOOEdges(t *testing.T) {
	ai := []int32{0, 2, 4, 6, 8, 10}
	for _, bi := range [][]int32{{}, {1}, {11}, {4}, {5}, {3, 5, 7}, {0, 2, 4, 6, 8, 10}, {-3, -1}, {20, 30}, {1, 3, 5, 7, 9, 11, 13}} {
		av := make([]float32, len(ai))
		bv := make([]float32, len(bi))
		want := map[int32]float32{}
		for i, j := range ai {
			av[i] = float32(j) + 0.5
			want[j] = av[i]
		}
		for i, j := range bi {
			bv[i] = -float32(j) * 2
			want[j] = want[j] + bv[i]
		}
		for _, swap := range []bool{false, true} {
			a, va, b, vb := ai, av, bi, bv
			if swap {
				a, va, b, vb = b, vb, a, va
			}
			oi, ov := MergeCOO(nil, nil, a, va, b, vb)
			if len(oi) != len(want) || len(ov) != len(oi) {
				t.Fatalf("bi=%v swap=%v: %d outputs, want %d", bi, swap, len(oi), len(want))
			}
			for i := range oi {
				if i > 0 && oi[i] <= oi[i-1] {
					t.Fatalf("bi=%v: indices not increasing: %v", bi, oi)
				}
				if ov[i] != want[oi[i]] {
					t.Fatalf("bi=%v: value at %d = %v, want %v", bi, oi[i], ov[i], want[oi[i]])
				}
			}
		}
	}
}
