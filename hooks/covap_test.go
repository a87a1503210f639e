package hooks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// The sharding rule: min(I, max(1, floor(x/m))) shards, m the median bucket size.
func TestCovapShardCounts(t *testing.T) {
	cases := []struct {
		name     string
		sizes    []int
		interval int
		want     []int
		median   float64
	}{
		{"equal buckets", []int{1000, 1000, 1000}, 4, []int{1, 1, 1}, 1000},
		{"one bucket", []int{10000}, 4, []int{1}, 10000},
		{"odd count", []int{300, 1000, 5000, 700, 200}, 8, []int{1, 1, 7, 1, 1}, 700},
		{"even count, median between", []int{300, 1000, 5000, 700}, 8, []int{1, 1, 5, 1}, 850},
		{"capped at I", []int{300, 1000, 5000, 700}, 3, []int{1, 1, 3, 1}, 850},
		{"I = 1 never shards", []int{300, 1000, 5000, 700}, 1, []int{1, 1, 1, 1}, 850},
		{"exactly twice the median", []int{100, 200, 100}, 4, []int{1, 2, 1}, 100},
		{"just under twice", []int{100, 199, 100}, 4, []int{1, 1, 1}, 100},
		// The paper's VGG-19 buckets (Table V). The paper states a median of 5590260 and 3 and
		// 19 shards for buckets 2 and 3 before the cap; the median of these six sizes is
		// (7079424 + 7669760)/2 = 7374592 (5590260 is the mean of the 2nd and 3rd smallest),
		// which gives 2 and 14.
		{"VGG-19 of the paper, I=4", []int{4101096, 16781312, 107480576, 7079424, 7669760, 555072}, 4, []int{1, 2, 4, 1, 1, 1}, 7374592},
		{"VGG-19 of the paper, I=16", []int{4101096, 16781312, 107480576, 7079424, 7669760, 555072}, 16, []int{1, 2, 14, 1, 1, 1}, 7374592},
		{"a bucket smaller than I elements", []int{3, 3, 3, 1000}, 8, []int{1, 1, 1, 8}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := NewCovapPlan(c.sizes, c.interval)
			if !slices.Equal(p.Shards, c.want) || p.Median != c.median {
				t.Fatalf("sizes %v, I=%d: shards %v (median %v), want %v (median %v)", c.sizes, c.interval, p.Shards, p.Median, c.want, c.median)
			}
			// Shards of a bucket tile it in order and differ by at most one element.
			for b, k := range p.Shards {
				at, smallest, largest := 0, math.MaxInt, 0
				for j := range k {
					lo, hi := covapShardBounds(c.sizes[b], k, j)
					if lo != at {
						t.Fatalf("bucket %d shard %d starts at %d, want %d", b, j, lo, at)
					}
					at = hi
					smallest, largest = min(smallest, hi-lo), max(largest, hi-lo)
				}
				if at != c.sizes[b] || largest-smallest > 1 {
					t.Fatalf("bucket %d: shards end at %d of %d, sizes %d…%d", b, at, c.sizes[b], smallest, largest)
				}
			}
		})
	}
}

// The schedule: which shard of which bucket goes at which iteration, written out by hand for a
// few layouts, and checked against its defining properties for many.
func TestCovapSchedule(t *testing.T) {
	cases := []struct {
		name     string
		sizes    []int
		interval int
		// sent[s-1][b]: bucket b's shard at iteration s, -1 for none (iteration 0 is dense).
		sent [][]int
		load []int // elements per iteration s ≡ 0, 1, … (mod I)
	}{
		// shards 1,1,3,1 → numbers 0 | 1 | 2 3 4 | 5; at s the numbers ≡ -s (mod 3) go.
		{"sharded, I=3", []int{300, 1000, 5000, 700}, 3, [][]int{
			{-1, -1, 0, 0}, // s=1: numbers 2, 5
			{-1, 0, 2, -1}, // s=2: numbers 1, 4
			{0, -1, 1, -1}, // s=3: numbers 0, 3
			{-1, -1, 0, 0}, // s=4 = s=1
		}, []int{300 + 1667, 1666 + 700, 1000 + 1667}},
		{"equal buckets, I=2", []int{1000, 1000, 1000, 1000, 1000}, 2, [][]int{
			{-1, 0, -1, 0, -1},
			{0, -1, 0, -1, 0},
			{-1, 0, -1, 0, -1},
		}, []int{3000, 2000}},
		{"one bucket, I=4", []int{10000}, 4, [][]int{{-1}, {-1}, {-1}, {0}, {-1}}, []int{10000, 0, 0, 0}},
		{"I=1 sends everything", []int{10, 20, 30}, 1, [][]int{{0, 0, 0}, {0, 0, 0}}, []int{60}},
		// sizes sorted 90 100 120 250 1000: median 120; shards 1,2,4 (8 capped),1,1 →
		// numbers 0 | 1 2 | 3 4 5 6 | 7 | 8.
		{"two sharded buckets, I=4", []int{100, 250, 1000, 120, 90}, 4, [][]int{
			{-1, -1, 0, 0, -1}, // s=1: numbers ≡ 3 (mod 4): 3, 7
			{-1, 1, 3, -1, -1}, // s=2: ≡ 2: 2, 6
			{-1, 0, 2, -1, -1}, // s=3: ≡ 1: 1, 5
			{0, -1, 1, -1, 0},  // s=4: ≡ 0: 0, 4, 8
		}, []int{100 + 250 + 90, 250 + 120, 125 + 250, 125 + 250}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := NewCovapPlan(c.sizes, c.interval)
			for i, row := range c.sent {
				s := int64(i + 1)
				for b := range c.sizes {
					if got := covapSentShard(p.First[b], p.Shards[b], c.interval, s); got != row[b] {
						t.Fatalf("s=%d bucket %d: shard %d, want %d (plan %v)", s, b, got, row[b], p.Shards)
					}
				}
			}
			if c.load != nil && !slices.Equal(p.Load, c.load) {
				t.Fatalf("load per iteration %v, want %v", p.Load, c.load)
			}
		})
	}
	// Properties, for many layouts and intervals: in any I consecutive iterations every shard
	// goes exactly once, and a bucket sends at most one shard per iteration.
	for _, sizes := range [][]int{{5}, {7, 7}, {100, 3000, 250, 90, 5000, 640, 10}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
		for interval := 1; interval <= 9; interval++ {
			p := NewCovapPlan(sizes, interval)
			for start := int64(1); start <= 3; start++ {
				count := make([]int, p.TotalShards())
				for s := start; s < start+int64(interval); s++ {
					for b := range sizes {
						if j := covapSentShard(p.First[b], p.Shards[b], interval, s); j >= 0 {
							count[p.First[b]+j]++
						}
					}
				}
				for i, n := range count {
					if n != 1 {
						t.Fatalf("sizes %v I=%d: shard %d sent %d times in iterations %d…%d", sizes, interval, i, n, start, start+int64(interval)-1)
					}
				}
			}
			total := 0
			for _, x := range p.Load {
				total += x
			}
			if n := sum(sizes); total != n {
				t.Fatalf("sizes %v I=%d: loads %v sum to %d, want n=%d", sizes, interval, p.Load, total, n)
			}
		}
	}
}

func sum(v []int) int {
	t := 0
	for _, x := range v {
		t += x
	}
	return t
}

// The coefficient scheduler c(s) = min(init + floor(s/ascend_steps)·ascend_range, 1), with the
// defaults of the authors' code (0.5, 50, 0.1; the paper gives none) and that code's for I > 8
// (0.2, 100, 0.1).
func TestCovapCoefficient(t *testing.T) {
	short, err := Parse("covap:interval=4")
	if err != nil {
		t.Fatal(err)
	}
	h := short.(*COVAP)
	for _, c := range []struct {
		interval int
		s        int64
		want     float64
	}{
		{4, 0, 0.5}, {4, 49, 0.5}, {4, 50, 0.6}, {4, 99, 0.6}, {4, 100, 0.7}, {4, 249, 0.9}, {4, 250, 1}, {4, 10000, 1},
		{8, 50, 0.6}, // I = 8 is not > 8
		{9, 0, 0.2}, {9, 99, 0.2}, {9, 100, 0.3}, {9, 799, 0.9}, {9, 800, 1}, {16, 5000, 1},
	} {
		init, steps, ascend := h.schedule(c.interval)
		if got := covapCoefficient(c.s, init, steps, ascend); got != float32(c.want) {
			t.Errorf("I=%d s=%d: c = %v, want %v", c.interval, c.s, got, c.want)
		}
	}
	custom, err := Parse("covap:interval=9,init=0.3,ascend_steps=10,ascend_range=0.25")
	if err != nil {
		t.Fatal(err)
	}
	init, steps, ascend := custom.(*COVAP).schedule(9)
	for s, want := range map[int64]float64{0: 0.3, 9: 0.3, 10: 0.55, 29: 0.8, 30: 1, 31: 1} {
		if got := covapCoefficient(s, init, steps, ascend); got != float32(want) {
			t.Errorf("custom s=%d: c = %v, want %v", s, got, want)
		}
	}
	one, _ := Parse("covap:interval=3,init=1")
	init, steps, ascend = one.(*COVAP).schedule(3)
	if c := covapCoefficient(0, init, steps, ascend); c != 1 {
		t.Errorf("init=1: c(0) = %v", c)
	}
}

func TestCovapParse(t *testing.T) {
	h, err := Parse("covap:interval=2")
	if err != nil {
		t.Fatal(err)
	}
	c := h.(*COVAP)
	if c.Interval != 2 || c.Init != CovapAuto || c.AscendSteps != CovapAuto || c.AscendRange != 0.1 || c.Feedback != CovapFeedbackPaper || c.MaxInterval != 16 || c.ProfileIters != 3 || c.Algorithm != comm.Auto {
		t.Fatalf("covap:interval=2 → %+v", c)
	}
	if h, err := Parse("covap"); err != nil || h.(*COVAP).Interval != CovapIntervalAuto {
		t.Fatalf("covap: %v %v", h, err)
	}
	for spec, want := range map[string]string{
		"covap:interval=0":        `interval="0", want a positive integer or auto`,
		"covap:interval=x":        `interval="x"`,
		"covap:init=1.5":          `init="1.5", want a number in [0, 1] or auto`,
		"covap:init=-1":           `init="-1"`,
		"covap:ascend_steps=0":    `ascend_steps="0"`,
		"covap:ascend_range=-0.1": `ascend_range=-0.1`,
		"covap:feedback=none":     `feedback="none", want one of paper|reference`,
		"covap:max_interval=0":    `max_interval=0`,
		"covap:profile_iters=0":   `profile_iters=0`,
		"covap:dense_warmup=-2":   `dense_warmup=-2`,
		"covap:algorithm=tree":    `algorithm="tree"`,
		"covap:density=0.01":      `covap has no option "density"`,
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", spec, err, want)
		}
	}
	if help := Help(); !strings.Contains(help, "covap") || !strings.Contains(help, "ascend_steps") {
		t.Errorf("Help() lacks covap:\n%s", help)
	}
}

// timedBucket is a testBucket that also reports when its gradients were ready (ddp.Timed).
type timedBucket struct {
	testBucket
	ready time.Duration
}

func (b *timedBucket) ReadyAfter() time.Duration { return b.ready }

// covapIterate runs one iteration on every rank: the buckets in order, bucket b of rank r with
// a copy of gs[r][b]. It returns the outputs and each rank's traffic during the iteration.
func covapIterate(t testing.TB, w *world, gs [][][]float32) ([][][]float32, []comm.Stats) {
	t.Helper()
	outs := make([][][]float32, len(w.groups))
	stats, err := onEveryRank(w.groups, 60*time.Second, func(ctx context.Context, r int) error {
		for b := range gs[r] {
			tb := &timedBucket{testBucket: testBucket{idx: b, last: b == len(gs[r])-1, flat: slices.Clone(gs[r][b])}}
			res, err := w.hooks[r].Run(ctx, w.groups[r], tb).Wait()
			if err != nil {
				return err
			}
			outs[r] = append(outs[r], slices.Clone(res))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return outs, stats
}

func covapGrads(seed uint64, p int, sizes []int) [][][]float32 {
	gs := make([][][]float32, p)
	for r := range p {
		for b, n := range sizes {
			gs[r] = append(gs[r], heavyTailed(seed*1000+uint64(b), r, n))
		}
	}
	return gs
}

// sentShardOracle is the schedule written from its definition: the global shard numbers of
// the plan in bucket order, and shard i goes iff (i + s) mod I == 0.
func sentShardOracle(p *CovapPlan, b int, s int64) int {
	i := 0
	for bb := range b {
		i += p.Shards[bb]
	}
	for j := range p.Shards[b] {
		if (int64(i+j)+s)%int64(p.Interval) == 0 {
			return j
		}
	}
	return -1
}

// With c ≡ 1 (init=1) the conservation test of docs/ALGORITHMS.md §0 holds on every bucket at every
// iteration; with the default schedule the test holds with the old residuals scaled exactly
// where each rule says the coefficient acts (paper: every residual, every iteration;
// reference: the dropped shards only). Outputs are bit-identical on every rank, and zero
// outside the shard whose turn it is.
func TestCovapConservationAndConsistency(t *testing.T) {
	sizes := []int{300, 1000, 5000, 700, 64}
	for _, spec := range []string{"covap:interval=3,init=1", "covap:interval=2,init=1,feedback=reference", "covap:interval=4,init=1,algorithm=ring",
		"covap:interval=3,ascend_steps=2", "covap:interval=3,ascend_steps=2,feedback=reference", "covap:interval=1,init=1"} {
		for _, p := range []int{2, 3, 4, 5, 8} {
			t.Run(fmt.Sprintf("%s/P=%d", spec, p), func(t *testing.T) {
				w := newWorld(t, p, spec)
				h0 := w.hooks[0].(*COVAP)
				for s := int64(0); s < 9; s++ {
					gs := covapGrads(uint64(s), p, sizes)
					before := make([][][]float32, p)
					for r := range p {
						for b, n := range sizes {
							before[r] = append(before[r], w.residual(r, b, n))
						}
					}
					outs, _ := covapIterate(t, w, gs)
					plan := h0.Plan()
					if plan == nil || plan.Interval != h0.Interval {
						t.Fatalf("s=%d: plan %+v", s, plan)
					}
					init, steps, ascend := h0.schedule(plan.Interval)
					c := math.Min(init+float64(s/int64(steps))*ascend, 1)
					for b, n := range sizes {
						lo, hi := 0, n // dense at s = 0
						if s > 0 {
							lo, hi = 0, 0
							if j := sentShardOracle(plan, b, s); j >= 0 {
								lo, hi = j*n/plan.Shards[b], (j+1)*n/plan.Shards[b]
							}
						}
						scaled := make([][]float32, p)
						after := make([][]float32, p)
						outB := make([][]float32, p)
						for r := range p {
							scaled[r] = slices.Clone(before[r][b])
							for i := range scaled[r] {
								if h0.Feedback == CovapFeedbackPaper || i < lo || i >= hi {
									scaled[r][i] = float32(c) * scaled[r][i]
								}
							}
							after[r] = w.residual(r, b, n)
							outB[r] = outs[r][b]
						}
						what := fmt.Sprintf("s=%d bucket %d (sent %d…%d, c=%v)", s, b, lo, hi, c)
						checkIdentical(t, what, outB)
						checkConservation(t, what, gsOf(gs, b), scaled, after, outB[0])
						for i, x := range outB[0] {
							if (i < lo || i >= hi) && x != 0 {
								t.Fatalf("%s: element %d = %v outside the sent shard", what, i, x)
							}
							if i >= lo && i < hi && after[0][i] != 0 {
								t.Fatalf("%s: residual %v left at sent element %d", what, after[0][i], i)
							}
						}
					}
				}
			})
		}
	}
}

func gsOf(gs [][][]float32, b int) [][]float32 {
	out := make([][]float32, len(gs))
	for r := range gs {
		out[r] = gs[r][b]
	}
	return out
}

// Words per iteration: a dense all-reduce (ring) of the shards whose turn it is, 2(P-1)/P of
// their elements up to one element per ring block; over any I consecutive iterations exactly
// 2(P-1)/P·n; one iteration strays from 2(P-1)/P·n/I by at most the imbalance the sharding
// leaves (logged). Iterations where a rank's bucket has no shard to send cost it no message.
func TestCovapWordsPerIteration(t *testing.T) {
	layouts := [][]int{{300, 1000, 5000, 700, 64}, {1000, 1000, 1000, 1000, 1000}, {4000, 250, 250, 250, 9000, 500}}
	for _, sizes := range layouts {
		for _, interval := range []int{2, 3, 4} {
			for _, p := range []int{2, 3, 4, 5, 8} {
				w := newWorld(t, p, fmt.Sprintf("covap:interval=%d,algorithm=ring", interval))
				n := sum(sizes)
				var plan *CovapPlan
				period := 0.0
				for s := int64(0); s <= int64(2*interval); s++ {
					_, stats := covapIterate(t, w, covapGrads(uint64(s), p, sizes))
					plan = w.hooks[0].(*COVAP).Plan()
					_, words := maxStats(stats)
					// Exact bounds from the shards sent (ring: 2(P-1) blocks of floor or ceil(m/P)).
					var lowW, highW int64
					sent := 0
					for b, nb := range sizes {
						lo, hi := 0, nb
						if s > 0 {
							lo, hi = 0, 0
							if j := sentShardOracle(plan, b, s); j >= 0 {
								lo, hi = covapShardBounds(nb, plan.Shards[b], j)
							}
						}
						m := hi - lo
						sent += m
						if m > 0 {
							lowW += int64(2 * (p - 1) * (m / p))
							highW += int64(2 * (p - 1) * ((m + p - 1) / p))
						}
					}
					if words < lowW || words > highW {
						t.Fatalf("sizes %v I=%d P=%d s=%d: %d words received, want %d…%d (%d elements sent)", sizes, interval, p, s, words, lowW, highW, sent)
					}
					if s == 0 {
						continue
					}
					if sent != plan.Load[int(s)%interval] {
						t.Fatalf("s=%d: %d elements sent, the plan's load is %v", s, sent, plan.Load)
					}
					mean := 2 * float64(p-1) / float64(p) * float64(n) / float64(interval)
					if slack := float64(2 * (p - 1) * plan.TotalShards()); float64(words) > plan.Imbalance*mean+slack {
						t.Fatalf("s=%d: %d words > imbalance %.3f × %.0f", s, words, plan.Imbalance, mean)
					}
					if s > int64(interval) {
						period += float64(words)
					}
				}
				want := 2 * float64(p-1) / float64(p) * float64(n)
				if slack := float64(2 * (p - 1) * plan.TotalShards()); math.Abs(period-want) > slack {
					t.Fatalf("sizes %v I=%d P=%d: %v words over one period of I iterations, want 2(P-1)/P·n = %v", sizes, interval, p, period, want)
				}
				if p == 4 {
					t.Logf("sizes %v I=%d: shards %v, elements per iteration %v (n/I = %d), imbalance %.3f", sizes, interval, plan.Shards, plan.Load, n/interval, plan.Imbalance)
				}
				w.close()
			}
		}
	}
}

// The imbalance sharding leaves on the models the convergence check trains, with DDP's default
// bucket plan (1 MiB first bucket, 25 MiB after). Reported, and bounded: the rule caps a bucket
// at I shards of at least the median size, so no iteration moves more than n/I plus the
// largest shard.
func TestCovapImbalanceOnVGG(t *testing.T) {
	for _, name := range []string{"vgg11", "vgg16"} {
		m, err := models.NewVGG(name, models.CIFAR10, nn.NewRand(0))
		if err != nil {
			t.Fatal(err)
		}
		params := nn.Parameters(m)
		var sizes []int
		for _, group := range ddp.SizeCappedPlan(params, ddp.DefaultFirstBucketBytes, ddp.DefaultBucketBytesCap) {
			n := 0
			for _, i := range group {
				n += params[i].Len()
			}
			sizes = append(sizes, n)
		}
		for _, interval := range []int{2, 3, 4, 8} {
			p := NewCovapPlan(sizes, interval)
			largest := 0
			for b, k := range p.Shards {
				largest = max(largest, (sizes[b]+k-1)/k)
			}
			n := sum(sizes)
			if bound := float64(n)/float64(interval) + float64(largest); float64(slices.Max(p.Load)) > bound {
				t.Errorf("%s I=%d: an iteration moves %d elements > n/I + largest shard = %.0f", name, interval, slices.Max(p.Load), bound)
			}
			t.Logf("%s: buckets %v; I=%d: shards %v, elements per iteration %v (n/I = %d), imbalance %.3f", name, sizes, interval, p.Shards, p.Load, n/interval, p.Imbalance)
		}
	}
}

// State and LoadState round-trip the residuals, the iteration counters and the plan: hooks
// restored from a checkpoint continue bit-identically (outputs, residuals, schedule and
// coefficient), and the state refuses another bucket plan.
func TestCovapSaveRestore(t *testing.T) {
	const p = 3
	sizes := []int{300, 1000, 5000, 700}
	spec := "covap:interval=3,ascend_steps=2"
	a := newWorld(t, p, spec)
	for s := range 5 {
		covapIterate(t, a, covapGrads(uint64(s), p, sizes))
	}
	b, states := restoredWorld(t, a, spec, []string{"covap.bucket2.residual", "covap.bucket2.meta", "covap.bucket2.var.interval", "covap.bucket2.var.shards", "covap.bucket2.var.first_shard", "covap.bucket3.var.shard_total", "covap.bucket3.var.buckets"})
	for s := 5; s < 11; s++ {
		gs := covapGrads(uint64(s), p, sizes)
		oa, _ := covapIterate(t, a, gs)
		ob, _ := covapIterate(t, b, gs)
		for r := range p {
			for bk, n := range sizes {
				ra, rb := a.residual(r, bk, n), b.residual(r, bk, n)
				for i := range n {
					if math.Float32bits(oa[r][bk][i]) != math.Float32bits(ob[r][bk][i]) || math.Float32bits(ra[i]) != math.Float32bits(rb[i]) {
						t.Fatalf("s=%d rank %d bucket %d element %d: restored %v (residual %v), original %v (%v)", s, r, bk, i, ob[r][bk][i], rb[i], oa[r][bk][i], ra[i])
					}
				}
			}
			if ia, ib := a.hooks[r].(*COVAP).lastInfo(), b.hooks[r].(*COVAP).lastInfo(); ia != ib || ia.dense {
				t.Fatalf("s=%d rank %d: restored call %+v, original %+v", s, r, ib, ia)
			}
			if pa, pb := a.hooks[r].(*COVAP).Plan(), b.hooks[r].(*COVAP).Plan(); pb == nil || !reflect.DeepEqual(*pa, *pb) {
				t.Fatalf("s=%d rank %d: restored plan %+v, original %+v", s, r, pb, pa)
			}
		}
	}
	// A checkpoint taken while interval=auto was profiling: the profiling starts over (one
	// warm-up and profile_iters measured dense iterations), then compression.
	auto := "covap:interval=auto,profile_iters=2"
	d := newWorld(t, p, auto)
	for s := range 2 {
		covapIterate(t, d, covapGrads(uint64(s), p, sizes))
	}
	e := newWorld(t, p, auto)
	for r := range p {
		st, _ := d.hooks[r].(ddp.Stateful).State()
		if err := e.hooks[r].(ddp.Stateful).LoadState(st); err != nil {
			t.Fatal(err)
		}
	}
	for s := 2; s < 6; s++ {
		covapIterate(t, e, covapGrads(uint64(s), p, sizes))
		h := e.hooks[0].(*COVAP)
		if info := h.lastInfo(); info.s != int64(s) || info.dense != (s < 5) || (h.Plan() != nil) != (s >= 4) {
			t.Fatalf("s=%d after restoring mid-profile: last call %+v, plan %v", s, info, h.Plan())
		}
	}
	// Another plan: a bucket of another size, an extra bucket, a missing bucket.
	for _, other := range [][]int{{300, 1000, 5001, 700}, {300, 1000, 5000, 700, 50}, {300, 1000, 5000}} {
		c := newWorld(t, p, spec)
		for r := range p {
			if err := c.hooks[r].(ddp.Stateful).LoadState(states[r]); err != nil {
				t.Fatal(err)
			}
		}
		if err := covapTry(c, covapGrads(1, p, other)); err == nil || !strings.Contains(err.Error(), "different bucket plan") {
			t.Errorf("restoring onto buckets %v: %v", other, err)
		}
	}
}

// covapTry is covapIterate returning the error.
func covapTry(w *world, gs [][][]float32) error {
	p := len(w.groups)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() {
			for b := range gs[r] {
				tb := &testBucket{idx: b, last: b == len(gs[r])-1, flat: slices.Clone(gs[r][b])}
				if _, err := w.hooks[r].Run(ctx, w.groups[r], tb).Wait(); err != nil {
					errs[r] = err
					cancel() // the other ranks may wait for this one's messages
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Dense iterations: iteration 0 and the dense warm-up return exactly the average; the
// iterations after them drop shards.
func TestCovapDenseIterations(t *testing.T) {
	const p = 4
	sizes := []int{500, 2000, 700} // median 700: shards 1, 2, 1; every iteration drops some
	w := newWorld(t, p, "covap:interval=2,dense_warmup=3")
	for s := range 6 {
		gs := covapGrads(uint64(s), p, sizes)
		outs, _ := covapIterate(t, w, gs)
		zeros := 0
		for b := range sizes {
			for i, x := range outs[0][b] {
				if x == 0 {
					zeros++
				}
				if s >= 3 {
					continue
				}
				var sum, abs float64
				for r := range p {
					sum += float64(gs[r][b][i])
					abs += math.Abs(float64(gs[r][b][i]))
				}
				if d := math.Abs(float64(x) - sum/p); d > 1e-6*abs {
					t.Fatalf("s=%d bucket %d element %d: %v, want the average %v", s, b, i, x, sum/p)
				}
			}
		}
		if info := w.hooks[0].(*COVAP).lastInfo(); info.dense != (s < 3) || (s >= 3) != (zeros > 0) {
			t.Fatalf("s=%d: last call %+v, %d zeros in the output", s, info, zeros)
		}
	}
}

// Replica consistency under DDP (docs/ALGORITHMS.md §0): after every step all ranks hold
// bit-identical parameters, P in {2, 3, 4, 5, 8}, with compression under way.
func TestCovapReplicaConsistencyUnderDDP(t *testing.T) {
	const steps = 7
	for _, spec := range []string{"covap:interval=2", "covap:interval=3,init=1", "covap:interval=4,feedback=reference,dense_warmup=2",
		"covap:interval=auto,profile_iters=2"} {
		for _, p := range []int{2, 3, 4, 5, 8} {
			t.Run(fmt.Sprintf("%s/P=%d", spec, p), func(t *testing.T) {
				tr := trainDDP(t, spec, p, steps, ddpTraining{bucketCap: smallBuckets, check: severalBuckets})
				hs := tr.hooks
				checkReplicasAgree(t, "", tr.hashes)
				plan := hs[0].(*COVAP).Plan()
				if plan == nil || len(plan.Sizes) < 2 {
					t.Fatalf("no plan over several buckets: %+v", plan)
				}
				if info := hs[0].(*COVAP).lastInfo(); info.dense && plan.Interval > 1 {
					t.Fatalf("still dense at the last step: %+v", info)
				}
			})
		}
	}
}
