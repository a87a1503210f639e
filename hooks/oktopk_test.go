package hooks

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

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

// Conservation (docs/ALGORITHMS.md §0) and replica consistency for every P from 2 to 16, three
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
				w.close()
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
				w.close()
			}
		}
	}
}
