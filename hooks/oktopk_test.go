package hooks

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// The gradient distributions of the Ok-Topk tests (issue 6: uniform, heavy-tailed, all mass in
// one region). Every entry is non-zero.
type gradDist struct {
	name string
	gen  func(seed uint64, p, n int, density float64) [][]float32
}

var okDists = []gradDist{
	{"uniform", uniformGrads},
	{"heavy", func(seed uint64, p, n int, _ float64) [][]float32 { return grads(seed, p, n) }},
	{"local-mass-in-one-region", localMassGrads},
	{"global-mass-in-one-region", globalMassGrads},
}

func uniformGrads(seed uint64, p, n int, _ float64) [][]float32 {
	gs := make([][]float32, p)
	for r := range gs {
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		gs[r] = make([]float32, n)
		for i := range gs[r] {
			gs[r][i] = float32(rng.Float64()*2 - 1)
			if gs[r][i] == 0 {
				gs[r][i] = 0.5
			}
		}
	}
	return gs
}

// noiseWith returns rank r's vector of tiny noise (|x| < 0.001) with the magnitudes big(pos)
// (random sign) at the positions chosen.
func noiseWith(rng *rand.Rand, n int, chosen []int, big func(pos int) float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((rng.Float64()*2 - 1) * 1e-3)
		if v[i] == 0 {
			v[i] = 1e-4
		}
	}
	for _, j := range chosen {
		x := big(j) * (1 + rng.Float64())
		if rng.IntN(2) == 0 {
			x = -x
		}
		v[j] = float32(x)
	}
	return v
}

// localMassGrads is the split's worst case (the paper's Sec. 3.1.1): every rank's k largest
// entries lie in the first n/P elements, at random positions; equal regions would send them
// all to rank 0.
func localMassGrads(seed uint64, p, n int, density float64) [][]float32 {
	k := max(1, int(float64(n)*density))
	gs := make([][]float32, p)
	for r := range gs {
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		m := max(1, n/p)
		gs[r] = noiseWith(rng, n, rng.Perm(m)[:min(k, m)], func(int) float64 { return 1 })
	}
	return gs
}

// globalMassGrads is the data-balancing worst case (Sec. 3.1.2): every rank's k largest entries
// spread evenly over the bucket, so the balanced regions are near-equal, but those in the first
// n/P elements are 100 times larger: the global top-k lies in one rank's region.
func globalMassGrads(seed uint64, p, n int, density float64) [][]float32 {
	k := max(1, int(float64(n)*density))
	gs := make([][]float32, p)
	for r := range gs {
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		gs[r] = noiseWith(rng, n, rng.Perm(n)[:k], func(j int) float64 {
			if j < n/p {
				return 100
			}
			return 1
		})
	}
	return gs
}

// okSpec is an oktopk spec with the given options.
func okSpec(density float64, extra string) string {
	s := fmt.Sprintf("oktopk:density=%g", density)
	if extra != "" {
		s += "," + extra
	}
	return s
}

func okInfo(w *world, r int) oktopkInfo { return w.hooks[r].(*OkTopk).lastInfo() }

// runOkTopkCalls runs calls of w on gradients from gen and checks, after every call, replica
// consistency and the conservation test; it returns the outputs of the last call.
func runOkTopkCalls(t *testing.T, w *world, name string, calls int, gen func(call int) [][]float32) [][]float32 {
	t.Helper()
	var outs [][]float32
	for it := range calls {
		gs := gen(it)
		what := fmt.Sprintf("%s/call %d", name, it)
		outs = w.callConserving(t, what, what, gs)
	}
	return outs
}

// Conservation (ALGORITHMS.md §0) and replica consistency for every P from 2 to 16, three
// densities, the four distributions, the three balancing policies (rotating), over five calls
// with tau=2, tau_prime=3: calls 0 and 3 re-evaluate the thresholds, 0, 2 and 4 repartition,
// the others reuse thresholds adjusted by the feedback.
func TestOkTopkConservationAndConsistency(t *testing.T) {
	policies := []string{BalanceAuto, BalanceAlways, BalanceNever}
	for p := 2; p <= 16; p++ {
		n := 97*p + 13
		for di, density := range []float64{0.01, 0.05, 0.3} {
			for dj, d := range okDists {
				balance := policies[(p+di+dj)%3]
				spec := okSpec(density, "tau=2,tau_prime=3,balance="+balance)
				w := newWorld(t, p, spec)
				runOkTopkCalls(t, w, fmt.Sprintf("%s/%s/P=%d", spec, d.name, p), 5, func(it int) [][]float32 {
					return d.gen(uint64(1000*p+10*it+dj), p, n, density)
				})
			}
		}
	}
}

// okReference is Ok-Topk written plainly for P simulated ranks, without messages: the same
// threshold schedule and feedback, boundaries from the same proposals, each region summed by
// its owner in the hook's order (own part, then ranks r-1, r-2, …), exact thresholds by
// sorting. The hook must give its outputs, residuals and thresholds bit for bit.
type okReference struct {
	p, n, k, tau int
	c            OkTopkConstants
	guard        bool
	band         float64 // the hook's GuardBand (0: the feedback bands)
	res          [][]float32
	lth          []float64
	gth          float64
	bounds       []int
	call         int
}

func (o *okReference) guardBand(low, high float64) (float64, float64) {
	if b := o.band; b > 0 {
		return max(low, 1-b), min(high, 1+b)
	}
	return low, high
}

func newOKReference(p, n int, density float64, tau int, c OkTopkConstants, guard bool) *okReference {
	o := &okReference{p: p, n: n, k: min(n, max(1, int(float64(n)*density))), tau: tau, c: c, guard: guard, lth: make([]float64, p)}
	for range p {
		o.res = append(o.res, make([]float32, n))
	}
	return o
}

// kthLargestBySort is the k-th largest |x| by sorting (0 when len(x) < k).
func kthLargestBySort(x []float32, k int) float32 {
	if len(x) < k {
		return 0
	}
	a := make([]float64, len(x))
	for i, v := range x {
		a[i] = math.Abs(float64(v))
	}
	sort.Sort(sort.Reverse(sort.Float64Slice(a)))
	return float32(a[k-1])
}

func (o *okReference) step(gs [][]float32) []float32 {
	p, n, k := o.p, o.n, o.k
	reeval := o.call%o.c.TauPrime == 0
	acc := make([][]float32, p)
	sel := make([][]bool, p)
	nsel := make([]int, p)
	for r := range p {
		acc[r] = make([]float32, n)
		for i := range n {
			acc[r][i] = gs[r][i] + o.res[r][i]
		}
		if reeval {
			o.lth[r] = float64(kthLargestBySort(acc[r], k))
		}
		choose := func() {
			th := float32(o.lth[r])
			sel[r] = make([]bool, n)
			nsel[r] = 0
			for i, v := range acc[r] {
				if v != 0 && float32(math.Abs(float64(v))) >= th {
					sel[r][i] = true
					nsel[r]++
				}
			}
		}
		choose()
		if lo, hi := o.guardBand(o.c.LocalLow, o.c.LocalHigh); !reeval && o.guard && outOfBand(nsel[r], o.lth[r], k, lo, hi) {
			o.lth[r] = float64(kthLargestBySort(acc[r], k))
			choose()
		}
	}
	if o.call%o.tau == 0 {
		sums := make([]int, p)
		for r := range p {
			var pos []int
			for i, s := range sel[r] {
				if s {
					pos = append(pos, i)
				}
			}
			for j := 1; j < p; j++ {
				if len(pos) >= p {
					sums[j] += pos[j*len(pos)/p]
				} else {
					sums[j] += j * n / p
				}
			}
		}
		o.bounds = make([]int, p+1)
		o.bounds[p] = n
		for j := 1; j < p; j++ {
			o.bounds[j] = sums[j] / p
		}
	}
	reduced := make([]float32, n)
	for owner := range p {
		for i := o.bounds[owner]; i < o.bounds[owner+1]; i++ {
			var s float32
			for step := range p {
				src := (owner - step + p) % p
				if sel[src][i] {
					s += acc[src][i]
				}
			}
			reduced[i] = s
		}
	}
	exact := func() {
		var nz []float32
		for _, v := range reduced {
			if v != 0 {
				nz = append(nz, v)
			}
		}
		o.gth = float64(kthLargestBySort(nz, k))
		if len(nz) <= k {
			o.gth = 0
		}
	}
	selected := func() []bool {
		g := make([]bool, n)
		for i, v := range reduced {
			g[i] = v != 0 && float32(math.Abs(float64(v))) >= float32(o.gth)
		}
		return g
	}
	if reeval {
		exact()
	}
	inG := selected()
	global := 0
	for _, s := range inG {
		if s {
			global++
		}
	}
	if lo, hi := o.guardBand(o.c.GlobalLow, o.c.GlobalHigh); !reeval && o.guard && outOfBand(global, o.gth, k, lo, hi) {
		exact()
		inG = selected()
		global = 0
		for _, s := range inG {
			if s {
				global++
			}
		}
	}
	out := make([]float32, n)
	for i, v := range reduced {
		if inG[i] {
			out[i] = v
			for r := range p {
				if sel[r][i] {
					acc[r][i] = 0
				}
			}
		}
	}
	kernels.Scale(1/float32(p), out)
	for r := range p {
		o.res[r] = acc[r]
		o.lth[r] = feedback(o.lth[r], nsel[r], k, o.c.LocalLow, o.c.LocalHigh, o.c.LocalScale, o.c.LocalScale)
	}
	o.gth = feedback(o.gth, global, k, o.c.GlobalLow, o.c.GlobalHigh, o.c.GlobalDecrease, o.c.GlobalIncrease)
	o.call++
	return out
}

// The distributed hook against the plain reference, bit for bit (outputs, residuals, both
// thresholds, boundaries), over eight calls that re-evaluate (tau_prime=3), repartition
// (tau=2) and run the feedback in between (every fourth call switches distribution, so reused
// thresholds miss and the feedback or the guard acts), for every P from 2 to 16, sizes that
// leave empty regions (n < P), several densities, every balancing policy, guard on and off;
// partition=reference (the averaged proposals; the union partition and its trigger are
// checked in oktopk_partition_test.go).
func TestOkTopkMatchesReference(t *testing.T) {
	c, _ := OkTopkPreset("vgg")
	c.TauPrime = 3
	for p := 2; p <= 16; p++ {
		for _, n := range []int{p - 1, 5*p + 1, 211} {
			for _, density := range []float64{0.02, 0.25} {
				balance := []string{BalanceAuto, BalanceAlways, BalanceNever}[(n+p)%3]
				guard := (n+p)%2 == 0
				name := fmt.Sprintf("P=%d/n=%d/density=%g/balance=%s/guard=%v", p, n, density, balance, guard)
				band := 0.0 // the feedback bands, or ±25 % on every third case
				if guard && p%3 == 0 {
					band = 0.25
				}
				w := newWorld(t, p, okSpec(density, fmt.Sprintf("tau=2,tau_prime=3,balance=%s,guard=%v,guard_band=%g,partition=reference", balance, guard, band)))
				ref := newOKReference(p, n, density, 2, c, guard)
				ref.band = band
				for it := range 8 {
					gs := grads(uint64(7*p+it), p, n)
					if it%4 == 3 { // a call on another distribution: thresholds are off, feedback moves
						gs = uniformGrads(uint64(7*p+it), p, n, density)
					}
					want := ref.step(gs)
					outs, stats := w.call(t, 0, gs)
					if info := okInfo(w, 0); n == 211 && density == 0.25 && !info.reevaluated && !info.repartitioned && !info.globalGuard {
						// A plain call: sizes all-to-all, ceil((P-1)/4) split-and-reduce
						// buckets, counts, balancing, all-gather-v.
						wantRounds := int64(1 + (p+2)/4 + 2*ceilLog2(p))
						if info.balanced && !evenCounts(info.counts) {
							wantRounds++
						}
						if rounds, _ := maxStats(stats); rounds != wantRounds {
							t.Errorf("%s call %d: %d rounds, want %d (counts %v, stats %v)", name, it, rounds, wantRounds, info.counts, stats)
						}
					}
					for r := range p {
						got := w.residual(r, 0, n)
						for i := range n {
							if math.Float32bits(outs[r][i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s call %d rank %d: output[%d] = %v, reference %v", name, it, r, i, outs[r][i], want[i])
							}
							if math.Float32bits(got[i]) != math.Float32bits(ref.res[r][i]) {
								t.Fatalf("%s call %d rank %d: residual[%d] = %v, reference %v", name, it, r, i, got[i], ref.res[r][i])
							}
						}
						st := hookMemory(w.hooks[r]).buckets[0]
						if st.Var(varLocalTh, -1) != ref.lth[r] || st.Var(varGlobalTh, -1) != ref.gth {
							t.Fatalf("%s call %d rank %d: next thresholds local %v global %v, reference %v %v", name, it, r, st.Var(varLocalTh, -1), st.Var(varGlobalTh, -1), ref.lth[r], ref.gth)
						}
						if info := okInfo(w, r); !slices.Equal(info.bounds, ref.bounds) {
							t.Fatalf("%s call %d rank %d: boundaries %v, reference %v", name, it, r, info.bounds, ref.bounds)
						}
					}
				}
			}
		}
	}
}

// evenCounts reports whether counts already are the balanced split of their total (the first
// total%P ranks one more): then balancing moves nothing and costs no round.
func evenCounts(counts []int) bool {
	total, p := sumInts(counts), len(counts)
	for j, c := range counts {
		want := total / p
		if j < total%p {
			want++
		}
		if c != want {
			return false
		}
	}
	return true
}

// okOverhead measures, on a fresh world of p ranks, the words and rounds of the messages whose
// size does not depend on k: one boundary all-reduce (P-1 values) and the four 256-bin
// histograms of the exact global threshold (the maximum over ranks).
func okOverhead(t *testing.T, p int) (words, rounds int64) {
	t.Helper()
	groups, err := comm.NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() {
			g := groups[r]
			if err := allReduceInts(context.Background(), g, 1, make([]int64, p-1)); err != nil {
				t.Error(err)
			}
			for range len(radixDigits) {
				if err := allReduceInts(context.Background(), g, 2, make([]int64, 256)); err != nil {
					t.Error(err)
				}
			}
			s := g.Counters().Snapshot()
			mu.Lock()
			words, rounds = max(words, s.BytesRecv/4), max(rounds, s.Rounds)
			mu.Unlock()
		})
	}
	wg.Wait()
	return words, rounds
}

// The cost oracle (ALGORITHMS.md §3): words received per rank <= 6k(P-1)/P plus the 2(P-1)
// words of counts, on every distribution, for every P from 2 to 16, with balancing on. The
// selections are exact (tau_prime=1: both thresholds re-evaluated, so every rank selects k
// locally and k are selected globally, a few more on ties) and the regions fresh (tau=1), as the bound assumes;
// such calls also carry the boundary all-reduce and the four threshold histograms, whose size
// does not depend on k (measured by okOverhead and allowed on top). Three calls, so the later
// ones start from residuals. Rounds: the 2P + 2·log2 P of Table 1 plus the overhead's.
func TestOkTopkCostOracle(t *testing.T) {
	const density = 0.05
	for p := 2; p <= 16; p++ {
		n := 20000 * p
		k := int(float64(n) * density)
		ovWords, ovRounds := okOverhead(t, p)
		bound := 6*float64(k)*float64(p-1)/float64(p) + 2*float64(p-1) + float64(ovWords)
		maxRounds := int64(2*p+2*ceilLog2(p)) + ovRounds
		for _, d := range okDists {
			w := newWorld(t, p, okSpec(density, "balance=auto,tau=1,tau_prime=1"))
			worst := int64(0)
			for call := range 3 {
				_, stats := w.call(t, 0, d.gen(uint64(p+call), p, n, density))
				kk := k // ties at the k-th magnitude select a few more
				for r := range p {
					info := okInfo(w, r)
					if info.local < k || info.local > k+2 || info.global < k || info.global > k+2 {
						t.Fatalf("%s P=%d call %d rank %d: %d local and %d global selections, want k = %d (ties aside)", d.name, p, call, r, info.local, info.global, k)
					}
					kk = max(kk, info.local, info.global)
				}
				bound := bound + 6*float64(kk-k)
				rounds, words := maxStats(stats)
				worst = max(worst, words)
				if float64(words) > bound || rounds > maxRounds {
					t.Errorf("%s P=%d call %d: max %d words, %d rounds; want <= %.0f words (6k(P-1)/P = %.0f, counts, overhead %d) and <= %d rounds",
						d.name, p, call, words, rounds, bound, 6*float64(k)*float64(p-1)/float64(p), ovWords, maxRounds)
				}
			}
			if p == 4 || p == 8 || p == 16 {
				t.Logf("%-26s P=%2d: max %6d words received (%.2f of 6k(P-1)/P = %.0f; overhead %d)", d.name, p, worst,
					float64(worst-ovWords)/(6*float64(k)*float64(p-1)/float64(p)), 6*float64(k)*float64(p-1)/float64(p), ovWords)
			}
		}
	}
}

// Why the balanced split exists: with the regions left equal (boundaries from a uniform
// call, tau too long to repartition, and partition=reference, which has no trigger), "local mass in one region" sends every selection to
// rank 0, which receives about 2k(P-1) words in the split and reduce (the paper's Sec. 3.1.1);
// the same data with the boundaries recomputed (tau=1) gives each rank about 2k(P-1)/P.
func TestOkTopkSplitWorstCase(t *testing.T) {
	const density = 0.05
	for _, p := range []int{4, 8, 16} {
		n := 20000 * p
		k := int(float64(n) * density)
		// The first call sets the boundaries from uniform data, scaled down so that its
		// residuals do not matter; tau_prime=1 re-evaluates the thresholds on the second.
		setup := uniformGrads(1, p, n, density)
		for r := range p {
			kernels.Scale(1e-6, setup[r])
		}
		received := func(tau int) (rank0, most int) {
			w := newWorld(t, p, okSpec(density, fmt.Sprintf("tau=%d,tau_prime=1,partition=reference", tau)))
			w.call(t, 0, setup)
			w.call(t, 0, localMassGrads(2, p, n, density))
			for r := range p {
				most = max(most, okInfo(w, r).received)
			}
			return okInfo(w, 0).received, most
		}
		stale0, _ := received(1000)
		_, fresh := received(1)
		t.Logf("P=%2d, local mass in one region: equal regions: rank 0 receives %d entries (k(P-1) = %d); repartitioned: at most %d per rank (k(P-1)/P = %d)",
			p, stale0, k*(p-1), fresh, k*(p-1)/p)
		if stale0 < k*(p-1)*95/100 {
			t.Errorf("P=%d: equal regions: rank 0 received %d entries, want about k(P-1) = %d", p, stale0, k*(p-1))
		}
		if fresh > k*(p-1)/p*110/100 {
			t.Errorf("P=%d: repartitioned regions: a rank received %d entries, want about k(P-1)/P = %d", p, fresh, k*(p-1)/p)
		}
	}
}

// abGroup wraps a Group with a virtual α-β clock (test only): a message of b bytes leaves its
// sender's link, one after the other, β·b after the link is free and the sender has reached the
// send, and arrives α later; a receive moves the receiver's clock to the arrival. Every message
// carries its departure time in an 8-byte header (so the wrapped group's byte counters are off
// by 8 per message: use the clock, not the counters, with it). The clock is deterministic as
// long as a rank posts a round's sends before its receives, which every collective here does.
type abGroup struct {
	comm.Group
	alpha, beta float64
	mu          sync.Mutex
	clock, link float64
}

func (a *abGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *comm.Request {
	a.mu.Lock()
	a.link = max(a.link, a.clock) + a.beta*float64(len(payload))
	leave := a.link
	a.mu.Unlock()
	msg := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(payload)), math.Float64bits(leave))
	msg = append(msg, payload...)
	req := a.Group.Isend(ctx, to, tag, msg)
	return comm.GoRequest(func() (int, error) {
		m, err := req.Wait()
		return max(0, m-8), err
	})
}

func (a *abGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	_, err := a.Isend(ctx, to, tag, payload).Wait()
	return err
}

func (a *abGroup) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *comm.Request {
	tmp := make([]byte, 8+len(buf))
	req := a.Group.Irecv(ctx, from, tag, tmp)
	return comm.GoRequest(func() (int, error) {
		m, err := req.Wait()
		if err != nil {
			return 0, err
		}
		arrive := math.Float64frombits(binary.LittleEndian.Uint64(tmp)) + a.alpha
		a.mu.Lock()
		a.clock = max(a.clock, arrive)
		a.mu.Unlock()
		return copy(buf, tmp[8:m]), nil
	})
}

func (a *abGroup) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	return a.Irecv(ctx, from, tag, buf).Wait()
}

func (a *abGroup) now() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return max(a.clock, a.link)
}

// Data balancing: on "global mass in one region" the global selection lands in one rank's
// region, so balance=auto balances (from P = 5 on, where max > 4·average is possible) and the
// α-β time of the call drops against balance=never: the unbalanced all-gather-v carries the
// whole selection in each of its ceil(log2 P) rounds (2k·log2 P·β, the paper's Sec. 3.1.2),
// the balanced one 2k(P-1)/P·β after at most 2k(P-1)/P·β of balancing. Uniform data does
// not trigger it. The outputs do not depend on the policy. The words received per rank hardly
// differ: a Bruck all-gather delivers every other rank's entries once either way; balancing
// shortens the critical path, which only the clock shows.
func TestOkTopkBalancing(t *testing.T) {
	const density = 0.05
	for _, p := range []int{3, 5, 8, 16} {
		n := 2000 * p
		outs := map[string][]float32{}
		times := map[string]float64{}
		words := map[string]int64{}
		for _, policy := range []string{BalanceAuto, BalanceAlways, BalanceNever} {
			w := newWorld(t, p, okSpec(density, "balance="+policy))
			clocks := make([]*abGroup, p)
			for r := range p {
				clocks[r] = &abGroup{Group: w.groups[r], alpha: 1000, beta: 1}
				w.groups[r] = clocks[r]
			}
			gs := globalMassGrads(3, p, n, density)
			o, stats := w.call(t, 0, gs)
			_, words[policy] = maxStats(stats) // 8 header bytes a message of the clock included
			checkIdentical(t, policy, o)
			outs[policy] = o[0]
			for _, c := range clocks {
				times[policy] = max(times[policy], c.now())
			}
			info := okInfo(w, 0)
			total := 0
			for _, c := range info.counts {
				total += c
			}
			skewed := p*maxInt(info.counts) > 4*total
			want := policy == BalanceAlways || policy == BalanceAuto && skewed
			if info.balanced != want {
				t.Errorf("P=%d balance=%s: counts %v, balanced %v, want %v", p, policy, info.counts, info.balanced, want)
			}
			if p >= 5 && !skewed {
				t.Errorf("P=%d: counts %v are not skewed: the test data does not concentrate the global selection", p, info.counts)
			}
			// Uniform data never triggers auto.
			if policy == BalanceAuto {
				u := newWorld(t, p, okSpec(density, "balance=auto"))
				u.call(t, 0, uniformGrads(4, p, n, density))
				if info := okInfo(u, 0); info.balanced {
					t.Errorf("P=%d: uniform data balanced (counts %v)", p, info.counts)
				}
			}
		}
		for _, policy := range []string{BalanceAlways, BalanceNever} {
			for i := range outs[BalanceAuto] {
				if math.Float32bits(outs[policy][i]) != math.Float32bits(outs[BalanceAuto][i]) {
					t.Fatalf("P=%d: balance=%s changes output[%d]: %v vs %v", p, policy, i, outs[policy][i], outs[BalanceAuto][i])
				}
			}
		}
		t.Logf("P=%2d, global mass in one region, whole call: α-β time (α = 1000, β = 1 per byte) balanced %.0f, unbalanced %.0f (%.2fx); max words received %d and %d",
			p, times[BalanceAlways], times[BalanceNever], times[BalanceNever]/times[BalanceAlways], words[BalanceAlways], words[BalanceNever])
		if p >= 8 && !(times[BalanceAlways] < times[BalanceNever]) {
			t.Errorf("P=%d: balancing does not pay: %.0f vs %.0f", p, times[BalanceAlways], times[BalanceNever])
		}
	}
}

// The balance-and-all-gather-v phase alone, in the α-β clock, when one rank holds all T
// globally selected entries (the extreme case of the paper's Sec. 3.1.2). Without balancing the
// Bruck all-gather carries the whole selection in each of its L = ceil(log2 P) rounds: at least
// L·8T·β. With it: the count exchange, one balancing round (the holder's link sends
// 8T(P-1)/P bytes) and a balanced all-gather, at most L·α + 8·ceil(T/P)·(P-1)·β: about
// 16T(P-1)/P·β against L·8T·β, less from P = 3 on. Both give the same sorted union.
func TestOkTopkBalancePhaseCost(t *testing.T) {
	const alpha, beta, T = 1000.0, 1.0, 4000
	for _, p := range []int{2, 3, 4, 5, 8, 11, 16} {
		n := 2 * T * p
		bounds := make([]int, p+1)
		for j := range bounds {
			bounds[j] = j * n / p
		}
		times := map[string]float64{}
		var unions [][]int32
		for _, policy := range []string{BalanceAlways, BalanceNever} {
			groups, err := comm.NewLocal(p)
			if err != nil {
				t.Fatal(err)
			}
			clocks := make([]*abGroup, p)
			results := make([][]int32, p)
			var wg sync.WaitGroup
			for r := range p {
				clocks[r] = &abGroup{Group: groups[r], alpha: alpha, beta: beta}
				wg.Go(func() {
					var mine COO
					if r == 0 {
						for e := range T {
							mine.Append(int32(2*e), float32(e+1))
						}
					}
					ws := getOktopkScratch()
					defer putOktopkScratch(ws)
					counts, _, err := exchangeCounts(context.Background(), clocks[r], 1, mine.Len(), false, bounds)
					if err != nil {
						t.Error(err)
						return
					}
					final, balanced, err := balanceAndAllGather(context.Background(), clocks[r], 2, mine, counts, bounds, policy, ws)
					if err != nil {
						t.Error(err)
						return
					}
					if balanced != (policy == BalanceAlways) || counts[0] != T {
						t.Errorf("P=%d %s rank %d: balanced %v, counts %v", p, policy, r, balanced, counts)
					}
					results[r] = slices.Clone(final.Idx)
				})
			}
			wg.Wait()
			for _, c := range clocks {
				times[policy] = max(times[policy], c.now())
			}
			unions = append(unions, results...)
		}
		for _, u := range unions {
			if len(u) != T || !slices.IsSorted(u) || !slices.Equal(u, unions[0]) {
				t.Fatalf("P=%d: a rank's union has %d entries (sorted %v), want the same %d everywhere", p, len(u), slices.IsSorted(u), T)
			}
		}
		l := float64(ceilLog2(p))
		counts := l * (alpha + 4*float64(p)*beta)
		upper := counts + alpha + 8*T*float64(p-1)/float64(p)*beta + l*alpha + 8*math.Ceil(float64(T)/float64(p))*float64(p-1)*beta
		lower := l * 8 * T * beta
		t.Logf("P=%2d, all %d entries on one rank: α-β time balanced %6.0f (bound %6.0f), unbalanced %6.0f (>= L·8T·β = %6.0f): %.2fx",
			p, T, times[BalanceAlways], upper, times[BalanceNever], lower, times[BalanceNever]/times[BalanceAlways])
		if times[BalanceAlways] > upper || times[BalanceNever] < lower {
			t.Errorf("P=%d: balanced %.0f (want <= %.0f), unbalanced %.0f (want >= %.0f)", p, times[BalanceAlways], upper, times[BalanceNever], lower)
		}
		if p >= 3 && times[BalanceAlways] >= times[BalanceNever] {
			t.Errorf("P=%d: balancing does not pay: %.0f vs %.0f", p, times[BalanceAlways], times[BalanceNever])
		}
	}
}

// The schedule: with dense_warmup=2, tau_prime=4 and tau=6, sparse call i re-evaluates exactly
// when i%4 == 0 (then the local threshold is the exact k-th largest |g + ξ|, and the local count
// is k), repartitions exactly when i%6 == 0 (one more all-reduce; the boundaries stay put in
// between: partition=reference, whose schedule has no trigger), and in between selects with the previous threshold moved by the feedback rule —
// or, with guard=true, when that threshold's count leaves the band, with the exact one (local
// and global guards both seen firing and not firing; the counts then never leave the band).
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
		groups, err := comm.NewLocal(p)
		if err != nil {
			t.Fatal(err)
		}
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
	}
}
