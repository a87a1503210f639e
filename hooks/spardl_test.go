package hooks

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

func TestSRSSchedule(t *testing.T) {
	cases := map[int][2][]int{
		2: {{1}, {1}},
		3: {{1, 1}, {2, 1}},
		5: {{1, 2, 1}, {4, 2, 1}},
		6: {{2, 2, 1}, {4, 2, 1}},
		8: {{4, 2, 1}, {4, 2, 1}},
		9: {{1, 4, 2, 1}, {8, 4, 2, 1}},
	}
	for n, want := range cases {
		sizes, gaps := srsSchedule(n)
		if !slices.Equal(sizes, want[0]) || !slices.Equal(gaps, want[1]) {
			t.Errorf("N=%d: sizes %v gaps %v, want %v %v", n, sizes, gaps, want[0], want[1])
		}
	}
	// Every block but the own one is sent exactly once, and what a rank receives is among
	// what it holds (Theorem 1), for every N.
	for n := 1; n <= 40; n++ {
		sizes, gaps := srsSchedule(n)
		held := make([]map[int]bool, n)
		for r := range held {
			held[r] = map[int]bool{}
			for i := range n {
				held[r][i] = true
			}
		}
		total := 0
		for t2, size := range sizes {
			next := make([]map[int]bool, n)
			for r := range n {
				next[r] = map[int]bool{}
				for b := range held[r] {
					next[r][b] = true
				}
				for p := range size {
					b := (r + gaps[t2] + p) % n
					if !held[r][b] {
						t.Fatalf("N=%d round %d: rank %d sends block %d it no longer holds", n, t2, r, b)
					}
					delete(next[r], b)
				}
			}
			for r := range n {
				from := (r - gaps[t2] + n) % n
				for p := range size {
					if b := (from + gaps[t2] + p) % n; !next[r][b] {
						t.Fatalf("N=%d round %d: rank %d receives block %d it does not hold", n, t2, r, b)
					}
				}
			}
			held = next
			total += size
		}
		for r := range n {
			if len(held[r]) != 1 || !held[r][r] {
				t.Fatalf("N=%d: rank %d ends holding %v, want block %d", n, r, held[r], r)
			}
		}
		if total != n-1 || len(sizes) != ceilLog2(n) {
			t.Fatalf("N=%d: %d blocks sent in %d rounds, want %d in %d", n, total, len(sizes), n-1, ceilLog2(n))
		}
	}
}

// The cost oracle of docs/ALGORITHMS.md §2 at d = 1: exactly 2·ceil(log2 P) rounds and 4(P-1)·k_b
// words received on every rank, when every block has at least k_b non-zeros.
func TestSparDLCostOracle(t *testing.T) {
	for p := 2; p <= 16; p++ {
		n := 64*p + 3 // blocks of 65, the last one shorter but above k_b
		w := newWorld(t, p, "spardl:density=0.1")
		_, stats := w.call(t, 0, grads(uint64(p), p, n))
		kb := int64(int(float64((n+p-1)/p) * 0.1))
		for r, s := range stats {
			if s.Rounds != 2*int64(ceilLog2(p)) || s.BytesRecv != 4*4*int64(p-1)*kb {
				t.Errorf("P=%d rank %d: %v; want %d rounds and 4(P-1)k_b = %d words received", p, r, s, 2*ceilLog2(p), 4*int64(p-1)*kb)
			}
		}
		w.close()
	}
}

// SparDL with global residual collection loses nothing and double-counts nothing, for every
// P from 2 to 16, several densities, over several calls (residuals carried over), and every
// rank gets the same bits.
func TestSparDLConservationAndConsistency(t *testing.T) {
	for p := 2; p <= 16; p++ {
		for _, density := range []float64{0.01, 0.05, 0.3, 1} {
			name := fmt.Sprintf("P=%d/density=%g", p, density)
			w := newWorld(t, p, fmt.Sprintf("spardl:density=%g", density))
			n := 97*p + 13
			for it := range 3 {
				gs := grads(uint64(100*p+it), p, n)
				w.callConserving(t, name, fmt.Sprintf("%s/call %d", name, it), gs)
			}
			w.close()
		}
	}
}

// With residual=local or partial the in-procedure residuals are lost (the paper's Fig. 17
// ablation): conservation must fail somewhere, and partial keeps more than local.
func TestSparDLResidualAblation(t *testing.T) {
	const p, n = 6, 600
	gs := grads(9, p, n)
	lost := map[string]float64{}
	for _, mode := range []string{"global", "partial", "local"} {
		w := newWorld(t, p, "spardl:density=0.05,residual="+mode)
		outs, _ := w.call(t, 0, gs)
		var missing float64
		for i := range n {
			var tsum, got float64
			for r := range p {
				tsum += float64(gs[r][i])
				got += float64(w.residual(r, 0, n)[i])
			}
			got += float64(p) * float64(outs[0][i])
			missing += math.Abs(tsum - got)
		}
		lost[mode] = missing
		checkIdentical(t, mode, outs)
	}
	if lost["global"] > 1e-3 || !(lost["partial"] > 1e-2) || !(lost["local"] > lost["partial"]) {
		t.Errorf("mass lost per mode: %v; want ≈0 for global, then partial < local", lost)
	}
}

// referenceSparDL is the same block-wise procedure at d = 1 written plainly for P simulated
// ranks, without messages: the Spar-Reduce-Scatter schedule of the paper's Section III-B with
// the sparsify-before-send rule, the own block's final cut, the all-gather, and the global
// residual rule of Algorithm 1. It returns the averaged output and every rank's new residual.
func referenceSparDL(gs, residuals [][]float32, density float64) ([]float32, [][]float32) {
	p, n := len(gs), len(gs[0])
	c := (n + p - 1) / p
	kb := max(1, int(float64(c)*density))
	block := func(i int) (int, int) { return min(i*c, n), min(i*c+c, n) }
	// topk: the kb entries of largest magnitude, ties to the lower index, zeros dropped.
	topk := func(x []float32) []int {
		order := make([]int, len(x))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return math.Abs(float64(x[order[a]])) > math.Abs(float64(x[order[b]])) })
		var keep []int
		for _, i := range order[:min(kb, len(order))] {
			if x[i] != 0 {
				keep = append(keep, i)
			}
		}
		sort.Ints(keep)
		return keep
	}
	acc := make([][]float32, p)
	own := make([][]float32, p) // G of each rank
	for r := range p {
		acc[r] = make([]float32, n)
		for i := range n {
			acc[r][i] = gs[r][i] + residuals[r][i]
		}
		own[r] = slices.Clone(acc[r])
	}
	// Bag sizes and gaps: L = ceil(log2 P); the first bag holds E = P - 2^(L-1) blocks at
	// distance 2^(L-1); then 2^(L-2), ..., 1 blocks at the same distance.
	L := 0
	for 1<<L < p {
		L++
	}
	type entry struct {
		pos int
		val float32
	}
	for t := 0; t < L; t++ {
		gap := 1 << (L - 1 - t)
		size := gap
		if t == 0 {
			size = p - gap
		}
		sent := make([][]entry, p)
		for r := range p {
			for q := range size {
				lo, hi := block((r + gap + q) % p)
				for _, j := range topk(acc[r][lo:hi]) {
					sent[r] = append(sent[r], entry{lo + j, acc[r][lo+j]})
					acc[r][lo+j] = 0
				}
			}
		}
		for r := range p {
			for _, e := range sent[(r-gap+p)%p] {
				acc[r][e.pos] += e.val
			}
		}
	}
	out := make([]float32, n)
	final := make([]bool, n)
	for r := range p {
		lo, hi := block(r)
		for _, j := range topk(acc[r][lo:hi]) {
			out[lo+j] = acc[r][lo+j] * (1 / float32(p))
			final[lo+j] = true
			acc[r][lo+j] = 0
		}
	}
	res := make([][]float32, p)
	for r := range p {
		res[r] = make([]float32, n)
		for i := range n {
			if final[i] {
				res[r][i] = acc[r][i] // what the rank discarded while forwarding
			} else {
				res[r][i] = own[r][i]
			}
		}
	}
	return out, res
}

// The distributed hook gives the reference's output and residuals bit for bit, over several
// calls, for every P from 2 to 16 and sizes that leave short and empty blocks.
func TestSparDLMatchesReference(t *testing.T) {
	for p := 2; p <= 16; p++ {
		for _, n := range []int{p - 1, 5*p + 1, 211} {
			for _, density := range []float64{0.02, 0.25} {
				name := fmt.Sprintf("P=%d/n=%d/density=%g", p, n, density)
				w := newWorld(t, p, fmt.Sprintf("spardl:density=%g", density))
				res := make([][]float32, p)
				for r := range res {
					res[r] = make([]float32, n)
				}
				for it := range 3 {
					gs := grads(uint64(7*p+it), p, n)
					want, wantRes := referenceSparDL(gs, res, density)
					outs, _ := w.call(t, 0, gs)
					for r := range p {
						got := w.residual(r, 0, n)
						for i := range n {
							if math.Float32bits(outs[r][i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s call %d rank %d: output[%d] = %v, reference %v", name, it, r, i, outs[r][i], want[i])
							}
							if math.Float32bits(got[i]) != math.Float32bits(wantRes[r][i]) {
								t.Fatalf("%s call %d rank %d: residual[%d] = %v, reference %v", name, it, r, i, got[i], wantRes[r][i])
							}
						}
					}
					res = wantRes
				}
				w.close()
			}
		}
	}
}

// SparDL plans one bucket with the whole model by default (the paper sparsifies the whole
// gradient) and keeps DDP's plan with buckets=ddp; ddp.New honours both.
func TestSparDLPlan(t *testing.T) {
	params := nn.Parameters(tinyNet(1))
	h, err := Parse("spardl")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := h.(ddp.Planner).Plan(params)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != 1 || len(plan[0]) != len(params) {
		t.Fatalf("default plan %v: want one bucket of all %d parameters", plan, len(params))
	}
	for i, j := range plan[0] {
		if j != len(params)-1-i {
			t.Fatalf("default plan %v: want reverse declaration order (the order gradients become ready)", plan[0])
		}
	}
	h, err = Parse("spardl:buckets=ddp")
	if err != nil {
		t.Fatal(err)
	}
	if plan, err := h.(ddp.Planner).Plan(params); err != nil || plan != nil {
		t.Fatalf("buckets=ddp: plan %v, err %v; want nil (DDP's default)", plan, err)
	}
	if _, err := Parse("spardl:buckets=layers"); err == nil || !strings.Contains(err.Error(), "buckets") {
		t.Fatalf("buckets=layers: err %v, want one naming the option", err)
	}
	groups := commtest.Groups(t, 1)
	dp, err := ddp.New(context.Background(), tinyNet(1), groups[0], ddp.WithCommHook(h), ddp.WithBucketCap(2048, 8192))
	if err != nil {
		t.Fatal(err)
	}
	if want := ddp.SizeCappedPlan(params, 2048, 8192); !slices.EqualFunc(dp.Plan(), want, slices.Equal) {
		t.Fatalf("buckets=ddp under DDP: plan %v, want the size-capped %v", dp.Plan(), want)
	}
}
