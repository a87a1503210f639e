package hooks

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// Ok-Topk's schedule, state, edge cases and collectives.

func TestOkTopkSchedule(t *testing.T) {
	for _, guard := range []bool{false, true} {
		testOkTopkSchedule(t, guard)
	}
}

func testOkTopkSchedule(t *testing.T, guard bool) {
	const p, n, density = 4, 4000, 0.02
	k := int(n * density)
	w := newWorld(t, p, okSpec(density, fmt.Sprintf("dense_warmup=2,tau_prime=4,tau=6,guard=%v,guard_band=0,partition=reference", guard)))
	c, _ := OkTopkPreset("vgg")
	stored := make([]float64, p)
	var prevBounds []int
	var roundsRepart, roundsPlain []int64
	moved, localGuards, globalGuards, reused := 0, 0, 0, 0
	for call := range 16 {
		gs := grads(uint64(call), p, n)
		if call%5 == 4 {
			for r := range p { // a jump in scale: the reused thresholds select too few
				kernels.Scale(0.5, gs[r])
			}
		}
		res := w.residuals(n)
		outs, stats := w.call(t, 0, gs)
		if call < 2 { // dense warm-up: the plain average
			for i := range n {
				var s float32
				for r := range p {
					s += gs[r][i]
				}
				if math.Abs(float64(outs[0][i]-s/p)) > 1e-5 {
					t.Fatalf("warm-up call %d: output[%d] = %v, want the average %v", call, i, outs[0][i], s/p)
				}
			}
			continue
		}
		i := call - 2
		for r := range p {
			info := okInfo(w, r)
			acc := make([]float32, n)
			kernels.Add(acc, gs[r], res[r])
			countAt := func(th float64) int {
				m := 0
				for _, v := range acc {
					if v != 0 && float32(math.Abs(float64(v))) >= float32(th) {
						m++
					}
				}
				return m
			}
			base := stored[r]
			wantGuard := false
			if i%4 == 0 {
				base = float64(kthLargestBySort(acc, k))
			} else if guard && outOfBand(countAt(base), base, k, c.LocalLow, c.LocalHigh) {
				base, wantGuard = float64(kthLargestBySort(acc, k)), true
			}
			if info.call != int64(i) || info.reevaluated != (i%4 == 0) || info.repartitioned != (i%6 == 0) || info.localGuard != wantGuard {
				t.Fatalf("guard=%v sparse call %d rank %d: call %d reevaluated %v repartitioned %v local guard %v (want %v)", guard, i, r, info.call, info.reevaluated, info.repartitioned, info.localGuard, wantGuard)
			}
			count := countAt(base)
			if info.localTh != float32(base) || info.local != count {
				t.Fatalf("guard=%v sparse call %d rank %d: local threshold %v selecting %d, want %v selecting %d", guard, i, r, info.localTh, info.local, float32(base), count)
			}
			if (i%4 == 0 || wantGuard) && count != k {
				t.Fatalf("guard=%v sparse call %d rank %d: %d selected at the exact threshold, want k = %d", guard, i, r, count, k)
			}
			if guard && (float64(count) < c.LocalLow*float64(k) || float64(count) > c.LocalHigh*float64(k)) {
				t.Fatalf("guard=%v sparse call %d rank %d: local count %d outside the band of k = %d", guard, i, r, count, k)
			}
			next := hookMemory(w.hooks[r]).buckets[0].Var(varLocalTh, 0)
			if want := feedback(base, count, k, c.LocalLow, c.LocalHigh, c.LocalScale, c.LocalScale); next != want {
				t.Fatalf("guard=%v sparse call %d rank %d: next threshold %v, want %v (count %d, k %d)", guard, i, r, next, want, count, k)
			}
			if next != base {
				moved++
			}
			if wantGuard {
				localGuards++
			}
			if i%4 != 0 && !wantGuard {
				reused++
			}
			stored[r] = next
			if i%6 != 0 && !slices.Equal(info.bounds, prevBounds) {
				t.Fatalf("guard=%v sparse call %d: boundaries moved without a repartition: %v -> %v", guard, i, prevBounds, info.bounds)
			}
		}
		info := okInfo(w, 0)
		if info.globalGuard {
			globalGuards++
			if info.global < k || info.global > k+2 {
				t.Fatalf("guard=%v sparse call %d: the global guard left %d selected, want k = %d", guard, i, info.global, k)
			}
		}
		if guard && (float64(info.global) < c.GlobalLow*float64(k) && info.globalTh > 0 || float64(info.global) > c.GlobalHigh*float64(k)) {
			t.Fatalf("guard=%v sparse call %d: global count %d outside the band of k = %d", guard, i, info.global, k)
		}
		prevBounds = info.bounds
		rounds, _ := maxStats(stats)
		if i%6 == 0 && i%4 != 0 && !info.globalGuard {
			roundsRepart = append(roundsRepart, rounds)
		} else if i%6 != 0 && i%4 != 0 && !info.globalGuard {
			roundsPlain = append(roundsPlain, rounds)
			// sizes all-to-all, ceil((P-1)/4) split-and-reduce buckets, counts, balancing, all-gather-v
			want := int64(1 + (p-1+okTopkInFlight-1)/okTopkInFlight + 2*ceilLog2(p))
			if info.balanced && !evenCounts(info.counts) {
				want++
			}
			if rounds != want {
				t.Errorf("guard=%v sparse call %d: %d rounds, want %d", guard, i, rounds, want)
			}
		}
	}
	// With the guard a count outside the band is re-evaluated at once, so the feedback (which
	// acts on the same band) never has anything to correct.
	if reused == 0 || guard != (moved == 0) {
		t.Errorf("guard=%v: the feedback moved %d thresholds, %d calls reused one", guard, moved, reused)
	}
	if guard != (localGuards > 0) || guard != (globalGuards > 0) {
		t.Errorf("guard=%v: %d local and %d global guard re-evaluations", guard, localGuards, globalGuards)
	}
	if !guard && (len(roundsRepart) == 0 || len(roundsPlain) == 0 || slices.Min(roundsRepart) <= slices.Max(roundsPlain)) {
		t.Errorf("guard=%v: repartition calls should add the boundary all-reduce's rounds: %v vs plain calls %v", guard, roundsRepart, roundsPlain)
	}
}

// Save and restore: a hook restored from a checkpoint taken after call 3 continues exactly like
// the one that kept running (outputs, residuals, thresholds, boundaries, schedule), and the
// state refuses another bucket plan.
func TestOkTopkSaveRestore(t *testing.T) {
	const p, n = 5, 900
	spec := okSpec(0.03, "tau=3,tau_prime=2,dense_warmup=1")
	a := newWorld(t, p, spec)
	for call := range 4 {
		a.call(t, 0, grads(uint64(call), p, n))
	}
	b, _ := restoredWorld(t, a, spec, []string{"oktopk.bucket0.var.local_th", "oktopk.bucket0.var.global_th", "oktopk.bucket0.var.bound.1", "oktopk.bucket0.var.bounds.P"})
	for call := 4; call < 9; call++ {
		gs := grads(uint64(call), p, n)
		oa, _ := a.call(t, 0, gs)
		ob, _ := b.call(t, 0, gs)
		for r := range p {
			ra, rb := a.residual(r, 0, n), b.residual(r, 0, n)
			for i := range n {
				if math.Float32bits(oa[r][i]) != math.Float32bits(ob[r][i]) || math.Float32bits(ra[i]) != math.Float32bits(rb[i]) {
					t.Fatalf("call %d rank %d element %d: restored hook gives %v (residual %v), original %v (%v)", call, r, i, ob[r][i], rb[i], oa[r][i], ra[i])
				}
			}
			ia, ib := okInfo(a, r), okInfo(b, r)
			if ia.localTh != ib.localTh || ia.globalTh != ib.globalTh || ia.call != ib.call || !slices.Equal(ia.bounds, ib.bounds) || ia.repartitioned != ib.repartitioned {
				t.Fatalf("call %d rank %d: restored %+v, original %+v", call, r, ib, ia)
			}
		}
	}
	// Another bucket size: refused with an error naming the plan.
	st, _ := a.hooks[0].(ddp.Stateful).State()
	c := newWorld(t, p, spec)
	for r := range p {
		if err := c.hooks[r].(ddp.Stateful).LoadState(st); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := c.try(0, grads(1, p, n+1)); err == nil || !strings.Contains(err.Error(), "different bucket plan") {
		t.Errorf("restoring onto another bucket size: %v", err)
	}
}

// The cases the reference crashes on, and other degenerate inputs: fewer selected entries than
// workers, empty regions, n < P, an all-zero bucket, a single rank, ties everywhere, one rank
// with nothing to send. No error, identical replicas, conservation, over four calls.
func TestOkTopkEdgeCases(t *testing.T) {
	cases := []struct {
		name string
		p, n int
		spec string
		gen  func(r, call, n int) []float32
	}{
		{"n<P", 8, 3, okSpec(0.5, "tau=1,tau_prime=1"), func(r, call, n int) []float32 { return heavyTailed(uint64(call), r, n) }},
		{"n=1", 5, 1, okSpec(1, ""), func(r, call, n int) []float32 { return heavyTailed(uint64(call), r, n) }},
		{"k=1<P", 16, 1000, okSpec(0.0001, "tau=1,tau_prime=2"), func(r, call, n int) []float32 { return heavyTailed(uint64(call), r, n) }},
		{"all-zero", 6, 300, okSpec(0.05, "tau=1,tau_prime=1"), func(r, call, n int) []float32 { return make([]float32, n) }},
		{"one-rank", 1, 200, okSpec(0.05, "tau=2,tau_prime=2"), func(r, call, n int) []float32 { return heavyTailed(uint64(call), r, n) }},
		{"ties", 4, 400, okSpec(0.05, "tau=1,tau_prime=3"), func(r, call, n int) []float32 {
			v := make([]float32, n)
			kernels.Fill(v, 0.25)
			return v
		}},
		{"one-position", 7, 500, okSpec(0.1, "tau=1,tau_prime=1"), func(r, call, n int) []float32 { // |L| = 1 < P on every rank
			v := make([]float32, n)
			v[123] = float32(r + 1)
			return v
		}},
		{"cluster", 7, 500, okSpec(0.1, "tau=1,tau_prime=1"), func(r, call, n int) []float32 { // P positions: regions of one element
			v := make([]float32, n)
			for j := range 7 {
				v[200+j] = float32(r + j + 1)
			}
			return v
		}},
		{"silent-rank", 6, 600, okSpec(0.05, "tau=3,tau_prime=2,balance=always"), func(r, call, n int) []float32 {
			if r == 2 {
				return make([]float32, n)
			}
			return heavyTailed(uint64(call), r, n)
		}},
	}
	for _, tc := range cases {
		w := newWorld(t, tc.p, tc.spec)
		runOkTopkCalls(t, w, tc.name, 4, func(call int) [][]float32 {
			gs := make([][]float32, tc.p)
			for r := range gs {
				gs[r] = tc.gen(r, call, tc.n)
			}
			return gs
		})
		info := okInfo(w, 0)
		empty := 0
		for j := range tc.p {
			if info.bounds[j] == info.bounds[j+1] {
				empty++
			}
		}
		if tc.name == "n<P" && empty != tc.p-tc.n {
			t.Errorf("n<P: boundaries %v: want %d empty regions", info.bounds, tc.p-tc.n)
		}
		if tc.name == "cluster" && !slices.Equal(info.bounds[1:tc.p], []int{201, 202, 203, 204, 205, 206}) {
			t.Errorf("cluster: boundaries %v, want one-element regions 201…206", info.bounds)
		}
		w.close()
	}
	for _, spec := range []string{"oktopk:tau=0", "oktopk:tau_prime=0", "oktopk:tau_prime=x", "oktopk:preset=resnet", "oktopk:balance=sometimes", "oktopk:density=0"} {
		if _, err := Parse(spec); err == nil {
			t.Errorf("Parse(%q) accepted a bad option", spec)
		}
	}
}

// exactIntAllReduce and the distributed radix select against plain computations, for P up to
// 16, sums past 2^24 (where float32 sums round) and duplicate magnitudes.
func TestOkTopkExactCollectives(t *testing.T) {
	for _, p := range []int{1, 2, 3, 7, 16} {
		groups := commtest.Groups(t, p)
		vals := make([][]float32, p)
		var all []float32
		for r := range p {
			rng := rand.New(rand.NewPCG(uint64(p), uint64(r)))
			for range 50 + 30*r {
				x := float32(rng.NormFloat64())
				if rng.IntN(5) == 0 {
					x = float32(rng.IntN(3) + 1) // repeated magnitudes
				}
				if x != 0 {
					vals[r] = append(vals[r], x)
				}
			}
			all = append(all, vals[r]...)
		}
		var wg sync.WaitGroup
		for r := range p {
			wg.Go(func() {
				ints := []int64{math.MaxInt32, int64(r), 1<<24 + 1}
				if err := allReduceInts(context.Background(), groups[r], 1, ints); err != nil {
					t.Error(err)
					return
				}
				if want := []int64{int64(p) * math.MaxInt32, int64(p * (p - 1) / 2), int64(p) * (1<<24 + 1)}; !slices.Equal(ints, want) {
					t.Errorf("P=%d rank %d: sums %v, want %v", p, r, ints, want)
				}
				for _, k := range []int{1, 7, len(all) / 2, len(all) - 1, len(all), len(all) + 5} {
					got, err := globalKthLargestAbs(context.Background(), groups[r], 2, vals[r], k)
					if err != nil {
						t.Error(err)
						return
					}
					want := kthLargestBySort(all, k)
					if k >= len(all) {
						want = 0
					}
					if got != want {
						t.Errorf("P=%d rank %d k=%d: global k-th largest %v, want %v", p, r, k, got, want)
					}
				}
			})
		}
		wg.Wait()
		commtest.Close(groups)
	}
}
