package hooks

import (
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
)

// teamCounts lists every (P, d) with 1 < d, d | P, P <= 16.
func teamCounts() [][2]int {
	var pd [][2]int
	for p := 2; p <= 16; p++ {
		for _, d := range divisors(p)[1:] {
			pd = append(pd, [2]int{p, d})
		}
	}
	return pd
}

// Table I's rows for SparDL with d teams, per rank, with k_b = d·k/P (blocks of n·d/P):
// R-SAG exactly 2·ceil(log2 P/d) + log2 d rounds and 2k((2P-2d)/P + (d/P)·log2 d) words;
// B-SAG 2·ceil(log2 P/d) + ceil(log2 d) rounds and the exact count from its h and union
// sizes, which must lie in the paper's range [2k(d²+P-2d)/(Pd), 2k(d²+2P-3d)/P].
func TestSAGCost(t *testing.T) {
	for _, pd := range teamCounts() {
		p, d := pd[0], pd[1]
		nt := p / d
		n := 64*p + 3
		w := newWorld(t, p, fmt.Sprintf("spardl:density=0.1,teams=%d", d))
		for call := range 3 {
			outs, stats := w.call(t, 0, grads(uint64(p*d+call), p, n))
			checkIdentical(t, fmt.Sprintf("P=%d d=%d", p, d), outs)
			c := (n + nt - 1) / nt
			kb := int(float64(c) * 0.1)
			k := float64(p*kb) / float64(d)
			lg := math.Log2(float64(d))
			for r, s := range stats {
				info := w.hooks[r].(*SparDL).lastInfo()
				if info.d != d || info.kb != kb {
					t.Fatalf("P=%d d=%d rank %d: call info %+v", p, d, r, info)
				}
				words := float64(s.BytesRecv) / 4
				if isPow2(d) {
					table := 2 * k * (float64(2*p-2*d)/float64(p) + float64(d)/float64(p)*lg)
					if s.Rounds != int64(2*ceilLog2(nt)+ceilLog2(d)) || math.Abs(words-table) > 1e-9*table {
						t.Errorf("R-SAG P=%d d=%d call %d rank %d: %v = %v words; want %d rounds, Table I's %v words", p, d, call, r, s, words, 2*ceilLog2(nt)+ceilLog2(d), table)
					}
					continue
				}
				pos := r % nt
				exact := 2*(nt-1)*kb + 2*(d-1)*info.h
				for i := range nt {
					if i != pos {
						exact += 2 * min(kb, w.hooks[i].(*SparDL).lastInfo().union)
					}
				}
				lower := 2 * k * float64(d*d+p-2*d) / float64(p*d)
				upper := 2 * k * float64(d*d+2*p-3*d) / float64(p)
				if s.Rounds != int64(2*ceilLog2(nt)+ceilLog2(d)) || words != float64(exact) || words < lower || words > upper {
					t.Errorf("B-SAG P=%d d=%d call %d rank %d (h %d, union %d): %v = %v words; want %d rounds, %d words, within Table I's [%v, %v]",
						p, d, call, r, info.h, info.union, s, words, 2*ceilLog2(nt)+ceilLog2(d), exact, lower, upper)
				}
				if info.h < (kb+d-1)/d || info.h > kb {
					t.Errorf("B-SAG P=%d d=%d rank %d: h = %d outside [k_b/d, k_b] = [%v, %d]", p, d, r, info.h, float64(kb)/float64(d), kb)
				}
			}
		}
		w.close()
	}
}

// Global residual collection stays exact with teams: conservation and identical replicas for
// every (P, d), R-SAG and B-SAG, over several calls (B-SAG's h moving).
func TestSAGConservationAndConsistency(t *testing.T) {
	for _, pd := range teamCounts() {
		p, d := pd[0], pd[1]
		for _, density := range []float64{0.05, 0.4} {
			runConserving(t, fmt.Sprintf("spardl:density=%g,teams=%d", density, d), p, 53*p+7)
		}
	}
}

// Algorithm 2 on a scripted sequence of union sizes.
func TestBSAGAdapt(t *testing.T) {
	h := &SparDL{}
	st := &BucketState{}
	const d, kb = 3, 300 // L = 300, h starts at k/P = 100, step 0.01·300·2/3 = 2
	if got := h.bsagH(st, d, kb); got != 100 || st.Var("bsag.step", 0) != 2 {
		t.Fatalf("initial h %d step %v, want 100 and 2", got, st.Var("bsag.step", 0))
	}
	steps := []struct {
		union   int
		h, step float64
		flag    bool
		what    string
	}{
		{200, 102, 2, true, "too few entries and h rising: the right direction, flag"},
		{200, 106, 4, false, "the right direction twice: double the step"},
		{400, 104, -2, false, "too many entries while h rises: reverse and halve"},
		{400, 102, -2, true, "the right direction, flag"},
		{400, 100, -4, false, "double; h clamps at k/P"},
	}
	for i, s := range steps {
		h.bsagAdapt(st, d, kb, s.union)
		got := st.Var("bsag.h", 0)
		if got != s.h || st.Var("bsag.step", 0) != s.step || (st.Var("bsag.flag", 0) != 0) != s.flag {
			t.Fatalf("update %d (%s): h %v step %v flag %v; want %v %v %v", i, s.what, got, st.Var("bsag.step", 0), st.Var("bsag.flag", 0), s.h, s.step, s.flag)
		}
	}
	for range 100 { // h never leaves [k/P, d·k/P]
		h.bsagAdapt(st, d, kb, 10_000)
	}
	if got := st.Var("bsag.h", 0); got != 100 {
		t.Fatalf("after many too-large unions h = %v, want the floor k/P = 100", got)
	}
	for range 100 {
		h.bsagAdapt(st, d, kb, 0)
	}
	if got := st.Var("bsag.h", 0); got != kb {
		t.Fatalf("after many small unions h = %v, want the ceiling d·k/P = %d", got, kb)
	}
}

// teams=auto times every divisor, every rank picks the same d, and the debug log names d, h
// and the union size.
func TestTeamsAutoAndLogging(t *testing.T) {
	const p, n = 6, 400
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w := newWorld(t, p, "spardl:density=0.05,teams=auto")
	for _, h := range w.hooks {
		h.(*SparDL).Logger = logger
	}
	trials := len(divisors(p)) * autoTrials
	seen := map[int]bool{}
	for call := range trials + 2 {
		gs := grads(uint64(call), p, n)
		w.callConserving(t, "teams=auto", fmt.Sprintf("teams=auto call %d", call), gs)
		d := w.hooks[0].(*SparDL).lastInfo().d
		for r := range p {
			if got := w.hooks[r].(*SparDL).lastInfo().d; got != d {
				t.Fatalf("call %d: rank %d used d=%d, rank 0 d=%d", call, r, got, d)
			}
		}
		if call < trials {
			seen[d] = true
		} else if st := hookMemory(w.hooks[0]).buckets[0]; int(st.Var("teams.chosen", 0)) != d {
			t.Fatalf("call %d: d=%d, chosen %v", call, d, st.Var("teams.chosen", 0))
		}
	}
	if len(seen) != len(divisors(p)) {
		t.Errorf("trials used d in %v, want every divisor of %d", seen, p)
	}
	log := buf.String()
	for _, want := range []string{"teams=auto chose d", "sag=B-SAG", "h=", "union=", "sag=R-SAG", "teams=1"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%.2000s", want, log)
		}
	}
}

// Buckets smaller than the number of blocks (empty blocks, k_b larger than a block) work for
// every hook and team count, with conservation where it is promised.
func TestTinyBuckets(t *testing.T) {
	for _, spec := range []string{"spardl", "spardl:teams=2", "spardl:teams=3", "spardl:teams=6", "topka", "topkdsa"} {
		for _, n := range []int{0, 1, 2, 5, 13} {
			const p = 6
			w := newWorld(t, p, spec+map[bool]string{true: ",", false: ":"}[strings.Contains(spec, ":")]+"density=0.5")
			for it := range 2 {
				gs := grads(uint64(n+it), p, n)
				name := fmt.Sprintf("%s/n=%d/call %d", spec, n, it)
				w.callConserving(t, name, name, gs)
			}
			w.close()
		}
	}
	w := newWorld(t, 4, "gtopk")
	outs, _ := w.call(t, 0, grads(1, 4, 3))
	checkIdentical(t, "gtopk n=3", outs)
}
