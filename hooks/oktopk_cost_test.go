package hooks

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// Ok-Topk's costs: the cost oracle, the split's worst case, data balancing on an α-β clock.

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
	groups := commtest.Groups(t, p)
	defer commtest.Close(groups)
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

// The cost oracle (docs/ALGORITHMS.md §3): words received per rank <= 6k(P-1)/P plus the 2(P-1)
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
			w.close()
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
			defer w.close()
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
			w.close()
			// Uniform data never triggers auto.
			if policy == BalanceAuto {
				u := newWorld(t, p, okSpec(density, "balance=auto"))
				u.call(t, 0, uniformGrads(4, p, n, density))
				if info := okInfo(u, 0); info.balanced {
					t.Errorf("P=%d: uniform data balanced (counts %v)", p, info.counts)
				}
				u.close()
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
			groups := commtest.Groups(t, p)
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
			commtest.Close(groups)
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
