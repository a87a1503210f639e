package hooks

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// runConserving checks the conservation test and replica consistency of a hook over three
// calls on random heavy-tailed data.
func runConserving(t *testing.T, spec string, p, n int) {
	t.Helper()
	w := newWorld(t, p, spec)
	defer w.close()
	for it := range 3 {
		gs := grads(uint64(31*p+it), p, n)
		name := fmt.Sprintf("%s/P=%d/call %d", spec, p, it)
		w.callConserving(t, name, name, gs)
	}
}

func TestTopkAConservationAndConsistency(t *testing.T) {
	for p := 2; p <= 16; p++ {
		for _, density := range []float64{0.01, 0.1, 0.5} {
			runConserving(t, fmt.Sprintf("topka:density=%g", density), p, 61*p+5)
		}
	}
}

func TestTopkDSAConservationAndConsistency(t *testing.T) {
	for p := 2; p <= 16; p++ {
		// 0.01 and 0.05 stay sparse; 0.5 crosses n/3 and takes the dense all-gather.
		for _, density := range []float64{0.01, 0.05, 0.5} {
			runConserving(t, fmt.Sprintf("topkdsa:density=%g", density), p, 61*p+5)
		}
	}
}

// TopkA: exactly 2k(P-1) words and ceil(log2 P) rounds on every rank.
func TestTopkACost(t *testing.T) {
	for p := 2; p <= 16; p++ {
		n := 50 * p
		w := newWorld(t, p, "topka:density=0.05")
		_, stats := w.call(t, 0, grads(3, p, n))
		k := int64(n / 20)
		for r, s := range stats {
			if s.Rounds != int64(ceilLog2(p)) || s.BytesRecv != 4*2*k*int64(p-1) {
				t.Errorf("P=%d rank %d: %v; want %d rounds and 2k(P-1) = %d words", p, r, s, ceilLog2(p), 2*k*int64(p-1))
			}
		}
		w.close()
	}
}

// TopkDSA on inputs that hit Table I's two bounds exactly: every rank's top-k spreads evenly
// over the regions (q entries in each), at the same positions on every rank (the union is k:
// the lower bound 4k(P-1)/P) or at disjoint positions (the union is n: the dense all-gather
// and the upper bound (2k+n)(P-1)/P). Both plus the P-1 words of the count exchange; rounds
// P-1 + 2·ceil(log2 P).
func TestTopkDSACostBounds(t *testing.T) {
	const q = 4 // selected entries per region and rank
	for p := 2; p <= 16; p++ {
		for _, overlap := range []bool{true, false} {
			m := 64 // region size: the union, k = P·q, stays below n/3
			if !overlap {
				m = p * q // the union fills every region
			}
			n, k := p*m, p*q
			density := (float64(k) + 0.5) / float64(n)
			gs := make([][]float32, p)
			for r := range p {
				gs[r] = make([]float32, n)
				for i := range n {
					gs[r][i] = 0.001 * float32(1+i%7)
				}
				for reg := range p {
					for j := range q {
						at := reg*m + j
						if !overlap {
							at += r * q
						}
						gs[r][at] = float32(100 + r + j)
					}
				}
			}
			w := newWorld(t, p, fmt.Sprintf("topkdsa:density=%v", density))
			outs, stats := w.call(t, 0, gs)
			checkIdentical(t, "topkdsa bounds", outs)
			want := int64(4 * k * (p - 1) / p)
			if !overlap {
				want = int64((2*k + n) * (p - 1) / p)
			}
			want += int64(p - 1)
			for r, s := range stats {
				if s.BytesRecv != 4*want || s.Rounds != int64(p-1+2*ceilLog2(p)) {
					t.Errorf("P=%d overlap=%v rank %d: %v; want %d words (Table I bound + P-1 counts) and %d rounds", p, overlap, r, s, want, p-1+2*ceilLog2(p))
				}
			}
			w.close()
		}
	}
}

// gTopk: power-of-two P only; rank 0 receives 2k·log2 P words in 2·log2 P rounds, no rank
// more than 4k·log2 P; all ranks get the same bits; the result is the tree's top-k.
func TestGTopk(t *testing.T) {
	for _, p := range []int{2, 4, 8, 16} {
		n := 40 * p
		k := int64(n / 10)
		w := newWorld(t, p, "gtopk:density=0.1")
		for it := range 2 {
			gs := grads(uint64(p+it), p, n)
			before := w.residuals(n)
			outs, stats := w.call(t, 0, gs)
			checkIdentical(t, fmt.Sprintf("gtopk P=%d", p), outs)
			lg := int64(ceilLog2(p))
			rounds, words := maxStats(stats)
			if stats[0].BytesRecv != 4*2*k*lg || stats[0].Rounds != 2*lg || rounds != 2*lg || words > 4*k*lg {
				t.Errorf("P=%d: rank 0 %v, max %d rounds %d words; want rank 0 2k·log2 P = %d words in %d rounds and at most 4k·log2 P = %d words", p, stats[0], rounds, words, 2*k*lg, 2*lg, 4*k*lg)
			}
			want := referenceGTopk(gs, before, int(k))
			for i := range n {
				if math.Float32bits(outs[0][i]) != math.Float32bits(want[i]) {
					t.Fatalf("P=%d call %d: output[%d] = %v, reference tree %v", p, it, i, outs[0][i], want[i])
				}
			}
			if got := nnz(outs[0]); int64(got) > k {
				t.Fatalf("P=%d: %d non-zeros, want at most k = %d", p, got, k)
			}
		}
		w.close()
	}
	for _, p := range []int{3, 6, 12} {
		w := newWorld(t, p, "gtopk")
		_, _, err := w.try(0, grads(1, p, 30))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("power-of-two number of workers, have P=%d", p)) {
			t.Errorf("gtopk on P=%d: %v", p, err)
		}
		w.close()
	}
}

// referenceGTopk is gTopk written plainly: local top-k, then pairwise merges at distance 1, 2,
// 4, … keeping the top-k of each merge, the root's result divided by P.
func referenceGTopk(gs, residuals [][]float32, k int) []float32 {
	p, n := len(gs), len(gs[0])
	sets := make([]COO, p)
	for r := range p {
		acc := make([]float32, n)
		for i := range n {
			acc[i] = gs[r][i] + residuals[r][i]
		}
		sets[r] = TopK(COO{}, acc, k)
	}
	for s := 1; s < p; s *= 2 {
		for r := 0; r+s < p; r += 2 * s {
			sets[r], _ = TopKOf(COO{}, COO{}, Merge(COO{}, sets[r], sets[r+s]), k)
		}
	}
	out := make([]float32, n)
	for e, j := range sets[0].Idx {
		out[j] = sets[0].Val[e] * (1 / float32(p))
	}
	return out
}
