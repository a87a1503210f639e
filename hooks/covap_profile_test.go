package hooks

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/comm/simnet"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/optim"
)

// The alignment on hand-made records: per bucket the shortest rank's time (the latest
// arrival's), per iteration the slowest rank's backward, medians over iterations.
func TestCovapAlign(t *testing.T) {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	sample := func(comp float64, comm ...float64) covapSample {
		s := covapSample{comp: ms(comp)}
		for _, c := range comm {
			s.comm = append(s.comm, ms(c))
		}
		return s
	}
	// Rank 0 is late: its all-reduce times are the true ones, ranks 1 and 2 waited for it.
	all := [][]covapSample{
		{sample(10, 5, 7), sample(12, 6, 6), sample(11, 5, 8)},
		{sample(4, 11, 9), sample(5, 6.5, 10), sample(30, 4, 8)}, // iteration 3: rank 1 is the late one on bucket 0
		{sample(6, 9, 8), sample(7, 8, 6.2), sample(6, 9, 9)},
	}
	p, err := covapAlign(all, 16)
	if err != nil {
		t.Fatal(err)
	}
	// T_comm per iteration: 5+7 = 12, 6+6 = 12, 4+8 = 12; T_comp: 10, 12, 30 → medians 12 and 12.
	// Unaligned: (12+20+17)/3, (12+16.5+14.2)/3, (13+12+18)/3 → median 14.333….
	if p.Comm != ms(12) || p.Comp != ms(12) || p.CCR != 1 || p.Interval != 1 || p.Iterations != 3 || p.P != 3 || p.Clamped {
		t.Fatalf("profile %+v", p)
	}
	if want := ms(43) / 3; p.CommUnaligned != want {
		t.Fatalf("unaligned %v, want %v", p.CommUnaligned, want)
	}
	// An even number of iterations: the mean of the middle two; ceil(CCR).
	p, _ = covapAlign([][]covapSample{{sample(10, 12, 1), sample(20, 25, 1)}}, 16)
	if p.Comm != ms(19.5) || p.Comp != ms(15) || p.CCR != 1.3 || p.Interval != 2 {
		t.Fatalf("profile %+v", p)
	}
	for _, c := range []struct {
		comp, comm float64
		max        int
		want       int
		clamped    bool
	}{{10, 0, 16, 1, false}, {10, 10, 16, 1, false}, {10, 10.0001, 16, 2, false}, {10, 39, 16, 4, false}, {10, 40, 16, 4, false},
		{10, 41, 16, 5, false}, {10, 500, 16, 16, true}, {10, 41, 4, 4, true}, {0, 1, 16, 16, true}, {0, 0, 16, 1, false}} {
		p, _ := covapAlign([][]covapSample{{sample(c.comp, c.comm)}}, c.max)
		if p.Interval != c.want || p.Clamped != c.clamped {
			t.Errorf("comp %v comm %v max %d: I=%d clamped=%v (CCR %v), want %d %v", c.comp, c.comm, c.max, p.Interval, p.Clamped, p.CCR, c.want, c.clamped)
		}
	}
	if _, err := covapAlign([][]covapSample{{sample(1, 1, 1)}, {sample(1, 1)}}, 16); err == nil || !strings.Contains(err.Error(), "rank 1 measured 1 buckets") {
		t.Errorf("mismatched buckets: %v", err)
	}
	if _, err := covapAlign([][]covapSample{{sample(1, 1)}, {}}, 16); err == nil || !strings.Contains(err.Error(), "rank 1 measured 0 iterations") {
		t.Errorf("mismatched iterations: %v", err)
	}
	got, err := decodeCovapSamples(encodeCovapSamples(all[1]))
	if err != nil || len(got) != 3 || got[1].comp != all[1][1].comp || !slices.Equal(got[2].comm, all[1][2].comm) {
		t.Fatalf("wire round trip: %+v %v", got, err)
	}
	if _, err := decodeCovapSamples(encodeCovapSamples(all[1])[:20]); err == nil {
		t.Error("truncated profile message accepted")
	}
}

// delayGroup is an in-process rank whose sends cost perByte per payload byte: the sender holds
// the message for that long before handing it over, one message at a time, like a NIC of
// bandwidth 1/perByte.
type delayGroup struct {
	comm.Group
	perByte time.Duration
	mu      sync.Mutex
}

func (g *delayGroup) transmit(n int) {
	g.mu.Lock()
	time.Sleep(time.Duration(n) * g.perByte)
	g.mu.Unlock()
}

func (g *delayGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	g.transmit(len(payload))
	return g.Group.Send(ctx, to, tag, payload)
}

func (g *delayGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *comm.Request {
	g.transmit(len(payload))
	return g.Group.Isend(ctx, to, tag, payload)
}

func delayed(t testing.TB, p int, perByte time.Duration) []comm.Group {
	t.Helper()
	local := commtest.Groups(t, p)
	gs := make([]comm.Group, p)
	for r := range p {
		gs[r] = &delayGroup{Group: local[r], perByte: perByte}
	}
	return gs
}

// profileRun drives COVAP on P ranks of a simulated network (comm/simnet: sends cost beta
// seconds per byte, no latency) the way DDP does, on the ranks' virtual clocks: in each
// iteration rank r's bucket b becomes ready readyAt(r, b) after the iteration's start (the
// backward computes meanwhile), its all-reduce starts once it is ready and the previous bucket's
// has ended, and the bucket reports when it was ready (ddp.Timed). The profiler reads the
// virtual clocks (comm.Now), so what it measures is exactly the imposed cost, on any machine
// load. It returns rank 0's hook after iters iterations.
func profileRun(t *testing.T, p int, beta float64, spec string, sizes []int, readyAt func(r, b int) time.Duration, iters int) *COVAP {
	t.Helper()
	net, err := simnet.New(p, simnet.Config{Beta: beta})
	if err != nil {
		t.Fatal(err)
	}
	hs := make([]*COVAP, p)
	eachRankOn(t, net.Groups(), func(ctx context.Context, g comm.Group) error {
		r := g.Rank()
		h, err := Parse(spec)
		if err != nil {
			return err
		}
		hs[r] = h.(*COVAP)
		for s := range iters {
			start := net.Clock(r)
			for b, n := range sizes {
				net.Advance(r, start+readyAt(r, b).Seconds()-net.Clock(r)) // nothing when the bucket was ready before
				tb := &timedBucket{testBucket: testBucket{idx: b, iter: int64(s), last: b == len(sizes)-1, flat: heavyTailed(uint64(s), r, n)}, ready: readyAt(r, b)}
				if _, err := hs[r].Run(ctx, g, tb).Wait(); err != nil {
					return fmt.Errorf("rank %d: %w", r, err)
				}
			}
		}
		return nil
	})
	return hs[0]
}

// The profiler follows the imposed communication cost. Three ranks on a simulated network
// whose sends take perByte per byte; ring all-reduces (2(P-1) rounds, each sending m/P floats
// of a bucket of m), so a bucket costs 2(P-1)·(4m/P)·perByte = 16m/3·perByte on every rank;
// the backward "computes" for 85 ms. At 400 ns/byte the imposed communication is 51.2 ms per
// iteration (CCR 0.60, I = 1); doubling the per-byte cost doubles it (CCR 1.20, I = 2). On the
// virtual clocks the profiler must measure exactly that (to the nanosecond rounding of the
// clocks). With one rank three times slower, the others wait for it inside every all-reduce:
// their own clocks count that waiting as communication, the aligned timelines do not, and the
// slow rank's backward is the computation window.
func TestCovapProfilerFollowsCommCost(t *testing.T) {
	const p = 3
	sizes := []int{6000, 12000, 6000}
	n := sum(sizes)
	spec := "covap:interval=auto,algorithm=ring,profile_iters=3"
	compute := []time.Duration{30 * time.Millisecond, 60 * time.Millisecond, 85 * time.Millisecond}
	even := func(r, b int) time.Duration { return compute[b] }
	imposed := func(perByte time.Duration) time.Duration { return time.Duration(16*n/3) * perByte }
	near := func(got, want time.Duration) bool { return (got - want).Abs() <= time.Microsecond }

	base := profileRun(t, p, 400e-9, spec, sizes, even, 4).Profile()
	double := profileRun(t, p, 800e-9, spec, sizes, even, 4).Profile()
	if base == nil || double == nil {
		t.Fatal("no profile after 1 warm-up and 3 measured iterations")
	}
	t.Logf("400 ns/B: %+v (imposed comm %v)", *base, imposed(400*time.Nanosecond))
	t.Logf("800 ns/B: %+v (imposed comm %v)", *double, imposed(800*time.Nanosecond))
	for _, c := range []struct {
		prof    *CovapProfile
		perByte time.Duration
		want    int
	}{{base, 400 * time.Nanosecond, 1}, {double, 800 * time.Nanosecond, 2}} {
		want := imposed(c.perByte)
		if !near(c.prof.Comm, want) || !near(c.prof.CommUnaligned, want) {
			t.Errorf("%v/B: measured communication %v (unaligned %v), imposed %v", c.perByte, c.prof.Comm, c.prof.CommUnaligned, want)
		}
		if c.prof.Comp != compute[2] {
			t.Errorf("%v/B: measured computation %v, simulated %v", c.perByte, c.prof.Comp, compute[2])
		}
		if c.prof.Interval != c.want || c.prof.Interval != max(1, int(math.Ceil(c.prof.CCR))) || math.Abs(c.prof.CCR-float64(want)/float64(compute[2])) > 1e-4 {
			t.Errorf("%v/B: CCR %.4f gave I=%d, want %d (imposed CCR %.4f)", c.perByte, c.prof.CCR, c.prof.Interval, c.want, float64(want)/float64(compute[2]))
		}
	}

	// Rank 1 computes three times slower.
	slowRank := func(r, b int) time.Duration {
		if r == 1 {
			return 3 * compute[b]
		}
		return compute[b]
	}
	slow := profileRun(t, p, 400e-9, spec, sizes, slowRank, 4).Profile()
	t.Logf("400 ns/B, rank 1 3× slower: %+v", *slow)
	if want := imposed(400 * time.Nanosecond); !near(slow.Comm, want) {
		t.Errorf("slow rank: aligned communication %v, imposed %v: waiting for the slow rank was counted", slow.Comm, want)
	}
	// The fast ranks wait for the slow one in every all-reduce: per iteration 2·(255 − 85) ms
	// of waiting spread over them (their last bucket starts at 85.6 ms instead of 255 ms, and
	// so on), which their own clocks count as communication: the mean over the 3 ranks is far
	// above the aligned figure.
	if slow.CommUnaligned < slow.Comm+60*time.Millisecond {
		t.Errorf("slow rank: the ranks' own clocks say %v of communication, aligned %v: expected the waiting to show there", slow.CommUnaligned, slow.Comm)
	}
	if slow.Comp != 3*compute[2] {
		t.Errorf("slow rank: computation %v, want the slow rank's %v", slow.Comp, 3*compute[2])
	}
}

// interval=auto under DDP on a real model: the profiler reads the backward time from DDP's
// bucket timestamps (ddp.Timed), the communication stays within what DDP measured around the
// hook, a communication cost far above the computation makes I hit max_interval, and training
// goes on compressed with identical replicas.
func TestCovapAutoUnderDDP(t *testing.T) {
	const p, steps, profileIters = 3, 7, 3
	groups := delayed(t, p, 2*time.Microsecond)
	spec := fmt.Sprintf("covap:interval=auto,max_interval=4,profile_iters=%d", profileIters)
	stats := make([][]ddp.IterationStats, p)
	tr := trainDDP(t, spec, p, steps, ddpTraining{
		groups:    groups,
		bucketCap: smallBuckets,
		sgd:       optim.SGDConfig{LR: 0.05, Momentum: 0.9},
		anyLoss:   true,
		step:      func(r, _ int, dp *ddp.DDP, _ float32) { stats[r] = append(stats[r], dp.Stats()) },
	})
	hs0 := tr.hooks[0].(*COVAP)
	prof, plan := hs0.Profile(), hs0.Plan()
	if prof == nil || plan == nil {
		t.Fatal("no profile or plan")
	}
	t.Logf("profile %+v; plan %+v", *prof, *plan)
	// The backward time the profiler used is one of the ranks' last-bucket Ready times of the
	// measured iterations 1…profileIters (a median over iterations of a maximum over ranks).
	var readies []time.Duration
	var ddpComm time.Duration
	for r := range p {
		for s := 1; s <= profileIters; s++ {
			st := stats[r][s]
			readies = append(readies, st.Buckets[len(st.Buckets)-1].Ready)
			var c time.Duration
			for _, b := range st.Buckets {
				c += b.CommEnd - b.CommStart
			}
			ddpComm = max(ddpComm, c)
		}
	}
	if prof.Comp < slices.Min(readies) || prof.Comp > slices.Max(readies) {
		t.Errorf("profiled computation %v outside DDP's backward times %v", prof.Comp, readies)
	}
	if prof.Comm <= 0 || prof.Comm > ddpComm || prof.CommUnaligned < prof.Comm {
		t.Errorf("profiled communication %v (unaligned %v), DDP measured at most %v around the hook", prof.Comm, prof.CommUnaligned, ddpComm)
	}
	if prof.CCR <= 4 || plan.Interval != 4 || !prof.Clamped {
		t.Errorf("CCR %.2f at 2 µs/B: I=%d clamped=%v, want max_interval 4", prof.CCR, plan.Interval, prof.Clamped)
	}
	checkReplicasAgree(t, "", tr.hashes)
	if info := hs0.lastInfo(); info.dense || info.s != steps-1 {
		t.Errorf("last call %+v: want a compressed call at iteration %d", info, steps-1)
	}
}

// A bucket without DDP's timestamps cannot be profiled: a clear error, not a guess.
func TestCovapAutoNeedsTimestamps(t *testing.T) {
	w := newWorld(t, 2, "covap:interval=auto,profile_iters=1")
	w.call(t, 0, grads(1, 2, 100)) // warm-up iteration: not measured
	if _, _, err := w.try(0, grads(2, 2, 100)); err == nil || !strings.Contains(err.Error(), "needs DDP's bucket timestamps") {
		t.Fatalf("untimed bucket: %v", err)
	}
}
