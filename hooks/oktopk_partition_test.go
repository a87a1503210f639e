package hooks

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
)

// Skewed data for Ok-Topk's region partition (issue 24), the tiny test copies of spargo bench
// comm's -gen generators: call c's gradients of P ranks, from the seed, c and the rank only.
// Outside its hot positions a rank's vector is noise below 1e-3 (never zero).
type skewGen struct {
	name string
	gen  func(seed uint64, call, p, n int) [][]float32
}

var skewGens = []skewGen{
	{"moving-hotspot", movingHotspotGrads},
	{"disjoint-hotspot", disjointHotspotGrads},
}

// hotStart is where call's hot region of w positions begins: the same on every rank, a new
// place every call.
func hotStart(seed uint64, call, n, w int) int {
	return rand.New(rand.NewPCG(seed, 1<<32+uint64(call))).IntN(n - w + 1)
}

func noise(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((rng.Float64()*2 - 1) * 1e-3)
		if v[i] == 0 {
			v[i] = 1e-4
		}
	}
	return v
}

func signed(rng *rand.Rand, x float64) float32 {
	if rng.IntN(2) == 0 {
		return float32(-x)
	}
	return float32(x)
}

// movingHotspotGrads: every rank's large values lie in one region of n/32 positions that
// moves each call: a shared value in [0.5, 1.5) plus a rank's own in [-0.5, 0.5).
func movingHotspotGrads(seed uint64, call, p, n int) [][]float32 {
	w := max(1, n/32)
	start := hotStart(seed, call, n, w)
	common := rand.New(rand.NewPCG(seed, 2<<32+uint64(call)))
	shared := make([]float32, w)
	for i := range shared {
		shared[i] = signed(common, 0.5+common.Float64())
	}
	gs := make([][]float32, p)
	for r := range gs {
		rng := rand.New(rand.NewPCG(seed, uint64(call)<<16|uint64(r)))
		gs[r] = noise(rng, n)
		for i, c := range shared {
			gs[r][start+i] = c + float32(rng.Float64()-0.5)
		}
	}
	return gs
}

// disjointHotspotGrads: one region of n/4 positions that moves each call, cut into P slices;
// rank r's large values (magnitudes in [0.5, 1.5)) fill slice (r + call) mod P only, so the
// ranks' selections do not overlap and a rank's own region seldom holds its own entries.
func disjointHotspotGrads(seed uint64, call, p, n int) [][]float32 {
	w := max(p, n/4)
	start := hotStart(seed, call, n, w)
	gs := make([][]float32, p)
	for r := range gs {
		rng := rand.New(rand.NewPCG(seed, uint64(call)<<16|uint64(r)))
		gs[r] = noise(rng, n)
		s := (r + call) % p
		for i := start + s*w/p; i < start+(s+1)*w/p; i++ {
			gs[r][i] = signed(rng, 0.5+rng.Float64())
		}
	}
	return gs
}

// tiesGrads: every magnitude is one of three (1, 1/2 or 1/4, mostly the smallest), so the k-th
// largest is shared by thousands of entries.
func tiesGrads(seed uint64, call, p, n int) [][]float32 {
	gs := make([][]float32, p)
	for r := range gs {
		rng := rand.New(rand.NewPCG(seed, uint64(call)<<16|uint64(r)))
		gs[r] = make([]float32, n)
		for i := range gs[r] {
			level := 0.25
			if u := rng.IntN(100); u < 2 {
				level = 1
			} else if u < 10 {
				level = 0.5
			}
			gs[r][i] = signed(rng, level)
		}
	}
	return gs
}

// wordsOf runs f on every rank of a fresh in-process group of p and returns the words each
// rank received.
func wordsOf(t *testing.T, p int, f func(ctx context.Context, g comm.Group) error) []int64 {
	t.Helper()
	groups := commtest.Groups(t, p)
	defer commtest.Close(groups)
	stats, err := onEveryRank(groups, 60*time.Second, func(ctx context.Context, r int) error { return f(ctx, groups[r]) })
	if err != nil {
		t.Fatal(err)
	}
	words := make([]int64, p)
	for r, s := range stats {
		words[r] = s.BytesRecv / 4
	}
	return words
}

// okFixedWords are the words each rank receives in the k-independent messages of an Ok-Topk
// call on p ranks with k-entry selections (k sets the sketch's size only when it is small): the four 256-bin histograms of the exact global threshold, the sketches of
// a union repartition, the reference's boundary all-reduce. Recursive doubling on P not a
// power of two gives some ranks more than others, so they are counted rank by rank.
func okFixedWords(t *testing.T, p, k int) (radix, sketch, proposals []int64) {
	t.Helper()
	radix = wordsOf(t, p, func(ctx context.Context, g comm.Group) error {
		for _, width := range radixDigits {
			if err := allReduceInts(ctx, g, 2, make([]int64, 1<<width)); err != nil {
				return err
			}
		}
		return nil
	})
	sketch = wordsOf(t, p, func(ctx context.Context, g comm.Group) error {
		_, _, err := agreeUnionBoundaries(ctx, g, 3, []int32{1, 2, 3}, 100, k, nil)
		return err
	})
	proposals = wordsOf(t, p, func(ctx context.Context, g comm.Group) error {
		return allReduceInts(ctx, g, 4, make([]int64, p-1))
	})
	return radix, sketch, proposals
}

// The sketch's estimate against exact counts, and the union boundaries against the exact
// loads they cut, on selections the reference's averaged proposals split badly: each rank's
// positions in its own slice of the bucket (slices in a permuted order), one narrow cluster
// shared by all, clusters at different places, ranks with nothing selected, n < P. The
// estimate is exact at the sketch's points and off by less than m/q between them; every
// region's load is within the balanced share M/P plus twice the ranks' summed uncertainty
// Σ ceil(m_r/q), plus P (the worst case: every rank's error on the same boundary).
func TestOkTopkUnionBoundaries(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 1))
	type selGen func(p, n, r int) []int32
	sorted := func(v []int32) []int32 { slices.Sort(v); return slices.Compact(v) }
	inRange := func(lo, hi, m int) []int32 {
		var v []int32
		for range m {
			v = append(v, int32(lo+rng.IntN(max(1, hi-lo))))
		}
		return sorted(v)
	}
	gens := map[string]selGen{
		"spread": func(p, n, r int) []int32 { return inRange(0, n, n/20) },
		"disjoint-permuted": func(p, n, r int) []int32 {
			s := (7*r + 3) % p
			return inRange(s*n/(2*p)+n/4, (s+1)*n/(2*p)+n/4, n/(4*p))
		},
		"one-cluster":     func(p, n, r int) []int32 { return inRange(n/2, n/2+n/40, n/60) },
		"own-clusters":    func(p, n, r int) []int32 { c := rng.IntN(n - n/50); return inRange(c, c+n/50, n/80) },
		"some-empty":      func(p, n, r int) []int32 { return map[bool][]int32{true: nil, false: inRange(0, n/3, n/30)}[r%3 == 1] },
		"single-position": func(p, n, r int) []int32 { return []int32{int32(n / 3)} },
	}
	for _, p := range []int{2, 3, 5, 8, 13, 16, 31} {
		q := okTopkSketchPoints * p
		for _, n := range []int{p - 1, 40 * p, 20011} {
			if n < 1 {
				continue
			}
			for name, gen := range gens {
				sels := make([][]int32, p)
				sketches := make([][]uint32, p)
				var total, slack int64
				for r := range p {
					sels[r] = sorted(slices.DeleteFunc(gen(p, n, r), func(x int32) bool { return int(x) >= n }))
					sketches[r] = make([]uint32, q+2)
					sketchSelection(sketches[r], sels[r], q)
					if err := checkSketch(sketches[r], q, n); err != nil {
						t.Fatalf("P=%d n=%d %s rank %d: %v", p, n, name, r, err)
					}
					m := int64(len(sels[r]))
					total += m
					slack += (m + int64(q) - 1) / int64(q)
					for _, x := range []int{0, 1, n / 7, n / 2, n - 1, n} {
						below := int64(sort.Search(len(sels[r]), func(e int) bool { return int(sels[r][e]) >= x }))
						if got := sketchBelow(sketches[r], q, int64(x)); got < below-(m+int64(q)-1)/int64(q) || got > below+(m+int64(q)-1)/int64(q) {
							t.Fatalf("P=%d n=%d %s rank %d: %d positions below %d, estimated %d (m = %d, q = %d)", p, n, name, r, below, x, got, m, q)
						}
					}
					for i := range q + 1 { // exact at the points
						if m == 0 {
							break
						}
						e := int64(i) * (m - 1) / int64(q)
						if got := sketchBelow(sketches[r], q, int64(sels[r][e])); got != e {
							t.Fatalf("P=%d n=%d %s rank %d: %d positions below point %d, estimated %d", p, n, name, r, e, sels[r][e], got)
						}
					}
				}
				b := unionBoundaries(sketches, q, n)
				if len(b) != p+1 || b[0] != 0 || b[p] != n || !slices.IsSorted(b) {
					t.Fatalf("P=%d n=%d %s: boundaries %v are not a partition of [0, %d)", p, n, name, b, n)
				}
				limit := total/int64(p) + 2*slack + int64(p)
				worst := int64(0)
				for j := range p {
					var load int64
					for r := range p {
						load += int64(len(regionPart(COO{Idx: sels[r], Val: make([]float32, len(sels[r]))}, b[j], b[j+1]).Idx))
					}
					worst = max(worst, load)
				}
				if worst > limit {
					t.Errorf("P=%d n=%d %s: a region holds %d of %d selected entries, want <= %d (M/P = %d): boundaries %v", p, n, name, worst, total, limit, total/int64(p), b)
				}
				if p == 16 && n == 20011 {
					t.Logf("P=%d n=%d %-17s: largest region load %5d, M/P = %5d (%.3f), worst-case allowance %d", p, n, name, worst, total/int64(p), float64(worst)/math.Max(1, float64(total)/float64(p)), limit)
				}
			}
		}
	}
	// The sketch's size: 4P intervals, fewer only when the all-gather would cost more than
	// the bound 6k(P-1)/P.
	for _, c := range [][3]int{{16, 10000, 64}, {16, 327, 64}, {5, 102, 20}, {1024, 147000, 859}, {64, 10, 4}} {
		if q := sketchIntervals(c[0], c[1]); q != c[2] || c[0] > 1 && q > 4 && (c[0]-1)*(q+2) > 6*c[1]*(c[0]-1)/c[0] {
			t.Errorf("P=%d k=%d: %d sketch intervals, want %d", c[0], c[1], q, c[2])
		}
	}
	// A damaged sketch is refused.
	for _, sk := range [][]uint32{{5, 1, 9, 2}, {5, 1, 2, 200}, {500, 1, 2, 3}} {
		if err := checkSketch(sk, 2, 100); err == nil {
			t.Errorf("checkSketch(%v) accepted a sketch no selection of [0, 100) gives", sk)
		}
	}
}

// okWorstCallFactor is the most a single call of the union partition may receive, as a
// multiple of the bound 6k(P-1)/P + 2(P-1) (the k-independent messages added to both sides),
// on data whose selections move every call from the first call on: TestOkTopkSkewBound.
const okWorstCallFactor = 1.0

// skewRun is one hook's volume over calls of a skewed generator.
type skewRun struct {
	// avgWords and avgBound: the most words any rank received in a call, averaged over the
	// calls, and the bound with the k-independent messages of each call added.
	avgWords, avgBound float64
	// avgMain and avgMainBound: the same without the k-independent messages (subtracted rank
	// by rank), against 6kk(P-1)/P + 2(P-1).
	avgMain, avgMainBound float64
	worst                 float64 // the largest main words / main bound of a single call
	worstCall             int
	repartitions          int
}

// runSkew runs calls of gen on a fresh world of spec (every rank selecting exactly k entries:
// tau_prime=1) and measures each call's words against its bound: 6kk(P-1)/P + 2(P-1) words of
// counts + the four threshold histograms + the sketches (or the reference's proposals) on
// repartition calls, kk the most entries any rank or the global selection chose (k, a few
// more on ties).
func runSkew(t *testing.T, p, n, calls int, density float64, spec string, gen skewGen) skewRun {
	t.Helper()
	k := int(float64(n) * density)
	radix, sketch, proposals := okFixedWords(t, p, k)
	w := newWorld(t, p, spec)
	defer w.close()
	union := w.hooks[0].(*OkTopk).Partition != PartitionReference
	var run skewRun
	for call := range calls {
		_, stats := w.call(t, 0, gen.gen(7, call, p, n))
		kk := k
		for r := range p {
			info := okInfo(w, r)
			if info.local < k || info.local > k+2 || info.global < k || info.global > k+2 {
				t.Fatalf("%s %s P=%d call %d rank %d: %d local and %d global selections, want k = %d (ties aside)", spec, gen.name, p, call, r, info.local, info.global, k)
			}
			kk = max(kk, info.local, info.global)
		}
		info := okInfo(w, 0)
		if info.repartitioned {
			run.repartitions++
		}
		var most, mostMain, mostFixed int64
		for r, s := range stats {
			fixed := radix[r]
			switch {
			case info.repartitioned && union:
				fixed += sketch[r]
			case info.repartitioned:
				fixed += proposals[r]
			}
			words := s.BytesRecv / 4
			most, mostMain, mostFixed = max(most, words), max(mostMain, words-fixed), max(mostFixed, fixed)
		}
		bound := 6*float64(kk)*float64(p-1)/float64(p) + 2*float64(p-1)
		run.avgWords += float64(most) / float64(calls)
		run.avgBound += (bound + float64(mostFixed)) / float64(calls)
		run.avgMain += float64(mostMain) / float64(calls)
		run.avgMainBound += bound / float64(calls)
		if r := float64(mostMain) / bound; r > run.worst {
			run.worst, run.worstCall = r, call
		}
	}
	return run
}

// Issue 24: at P = 5, 8, 13, 16, on data whose hot region moves every call (moving-hotspot) or
// whose ranks' values lie in disjoint slices of one moving region (disjoint-hotspot), with
// every rank selecting exactly k entries, the union partition keeps the words received per
// worker, averaged over 128 calls, within 6k(P-1)/P + 2(P-1) words of counts + the threshold
// histograms and the sketches, and every single call within okWorstCallFactor of that bound.
// The reference's partition (averaged proposals every τ = 64 calls) is run on the same data
// for P = 16 and must break the bound: the generators are as skewed as the issue says.
func TestOkTopkSkewBound(t *testing.T) {
	const density, calls = 0.01, 128
	for _, p := range []int{5, 8, 13, 16} {
		n := 2048 * p
		for _, gen := range skewGens {
			runs := map[string]skewRun{"union": runSkew(t, p, n, calls, density, okSpec(density, "tau_prime=1"), gen)}
			if p == 16 {
				runs["reference"] = runSkew(t, p, n, calls/4, density, okSpec(density, "tau_prime=1,partition=reference"), gen)
			}
			for _, part := range []string{"union", "reference"} {
				run, ok := runs[part]
				if !ok {
					continue
				}
				t.Logf("P=%2d %-16s %-9s: %6.0f words a call (bound %6.0f: %.3f); without the fixed messages %6.0f (bound %6.0f: %.3f), worst call %.3f (call %d); %3d repartitions",
					p, gen.name, part, run.avgWords, run.avgBound, run.avgWords/run.avgBound, run.avgMain, run.avgMainBound, run.avgMain/run.avgMainBound, run.worst, run.worstCall, run.repartitions)
			}
			run := runs["union"]
			if run.avgWords > run.avgBound || run.avgMain > run.avgMainBound || run.worst > okWorstCallFactor {
				t.Errorf("P=%d %s: %.0f words a call on average (bound %.0f; %.0f without the fixed messages, bound %.0f), worst call %.3f of the bound (call %d), want <= %g",
					p, gen.name, run.avgWords, run.avgBound, run.avgMain, run.avgMainBound, run.worst, run.worstCall, okWorstCallFactor)
			}
			if ref, ok := runs["reference"]; ok && ref.worst < 1.5 {
				t.Errorf("P=%d %s: the reference partition's worst call is %.3f of the bound: the data is not skewed enough to test the union partition", p, gen.name, ref.worst)
			}
		}
	}
}

// The trigger: a hot region that stays put for ten calls and then jumps. The first call
// partitions and the second checks those boundaries (both repartition); then the τ schedule
// (tau=64) holds them. The jump's call still uses the stale boundaries, finds a rank over its
// share and raises the flag; the next call repartitions off the schedule, finds the
// boundaries it replaces out of balance, and so the next okTopkSettleCalls calls repartition
// too (each finding the previous ones fine), after which the schedule holds again. Every call
// but the jump's stays within the bound.
func TestOkTopkRepartitionTrigger(t *testing.T) {
	const p, density, jump = 8, 0.01, 10
	n := 2048 * p
	k := int(float64(n) * density)
	radix, sketch, _ := okFixedWords(t, p, k)
	w := newWorld(t, p, okSpec(density, "tau=64,tau_prime=1"))
	last := jump + 1 + okTopkSettleCalls
	for call := range last + 3 {
		region := 0 // call 0's region until the jump, call 10's after it
		if call >= jump {
			region = jump
		}
		gs := movingHotspotGrads(7, region, p, n)
		for r := range gs {
			for i := range gs[r] {
				gs[r][i] *= float32(1 + 0.01*float64((call+r+i)%7)) // other values in the same region
				if call >= jump {
					gs[r][i] *= 4 // above the residuals left in the old region
				}
			}
		}
		_, stats := w.call(t, 0, gs)
		info := okInfo(w, 0)
		wantRepart := call <= 1 || call > jump && call <= last
		if info.repartitioned != wantRepart || info.triggered != (wantRepart && call > 0) || info.imbalanced != (call == jump) {
			t.Fatalf("call %d: repartitioned %v (want %v), triggered %v, imbalanced %v (want %v)", call, info.repartitioned, wantRepart, info.triggered, info.imbalanced, call == jump)
		}
		most := 0.0
		for r, s := range stats {
			fixed := radix[r]
			if info.repartitioned {
				fixed += sketch[r]
			}
			most = max(most, float64(s.BytesRecv/4-fixed))
		}
		bound := 6*float64(k)*float64(p-1)/float64(p) + 2*float64(p-1)
		if call == jump {
			t.Logf("P=%d: the jump's call, on stale boundaries, receives %.0f words without the fixed messages, %.2f of the bound %.0f", p, most, most/bound, bound)
			if most <= bound {
				t.Errorf("call %d: the jump's call receives %.0f words, within the bound %.0f: the test data does not jump", call, most, bound)
			}
		} else if most > bound*1.01 { // kk may exceed k by a tie or two
			t.Errorf("call %d: %.0f words without the fixed messages, bound %.0f", call, most, bound)
		}
	}
}

// Conservation and replica identity (docs/ALGORITHMS.md §0) on the skewed generators and on many
// equal magnitudes, for both partitions, the balancing policies in turn and the default
// thresholds (reused between re-evaluations, with the guard), over eight calls with tau=3.
func TestOkTopkSkewConservation(t *testing.T) {
	gens := append(slices.Clone(skewGens), skewGen{"ties", tiesGrads})
	policies := []string{BalanceAuto, BalanceAlways, BalanceNever}
	for _, p := range []int{2, 3, 5, 8, 13, 16} {
		n := 64*p + 5
		for gi, gen := range gens {
			for pi, part := range []string{PartitionUnion, PartitionReference} {
				spec := okSpec(0.02, fmt.Sprintf("tau=3,tau_prime=4,partition=%s,balance=%s", part, policies[(p+gi+pi)%3]))
				w := newWorld(t, p, spec)
				runOkTopkCalls(t, w, fmt.Sprintf("%s/%s/P=%d", spec, gen.name, p), 8, func(call int) [][]float32 {
					return gen.gen(uint64(p), call, p, n)
				})
				w.close()
			}
		}
	}
}
