package comm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var testSizes = []int{1, 2, 3, 4, 5, 6, 7, 8, 13, 16}

// runRanks runs fn on every rank of a fresh in-process group of p ranks (see newLocal),
// concurrently, and fails the test with every rank's error. It returns the groups, closed, for
// their counters.
func runRanks(t *testing.T, p int, fn func(ctx context.Context, g Group) error) []Group {
	t.Helper()
	groups := newLocal(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() { errs[r] = fn(ctx, groups[r]) })
	}
	wg.Wait()
	closeAll(groups)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return groups
}

// lengths returns the vector lengths tested for p ranks: empty, one, fewer than p, a
// non-multiple of p, past the Auto threshold, and large-ish.
func lengths(p int) []int {
	ns := []int{0, 1, max(p-1, 1), 2*p + 3, 1000, 100_000}
	slices.Sort(ns)
	return slices.Compact(ns)
}

// rankData is rank r's deterministic test vector of length n, uniform in [-1, 1).
func rankData(seed uint64, r, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	v := make([]float32, n)
	for i := range v {
		v[i] = 2*rng.Float32() - 1
	}
	return v
}

// checkSum compares got against the float64 sum of the ranks' inputs, allowing float32
// rounding of a P-term sum.
func checkSum(t *testing.T, what string, got []float32, inputs [][]float32) {
	t.Helper()
	p := len(inputs)
	for i := range got {
		var ref, abs float64
		for r := range p {
			ref += float64(inputs[r][i])
			abs += math.Abs(float64(inputs[r][i]))
		}
		if tol := float64(p) * 1.2e-7 * abs; math.Abs(float64(got[i])-ref) > tol {
			t.Fatalf("%s: element %d = %v, float64 reference %v (tolerance %g)", what, i, got[i], ref, tol)
		}
	}
}

// checkIdentical requires every rank's vector to have the same bits as rank 0's.
func checkIdentical(t *testing.T, what string, vs [][]float32) {
	t.Helper()
	for r := 1; r < len(vs); r++ {
		for i := range vs[0] {
			if math.Float32bits(vs[r][i]) != math.Float32bits(vs[0][i]) {
				t.Fatalf("%s: rank %d element %d = %v, rank 0 has %v: replicas differ", what, r, i, vs[r][i], vs[0][i])
			}
		}
	}
}

func TestAllReduce(t *testing.T) {
	for _, alg := range []Algorithm{Auto, Ring, Rabenseifner, RecursiveDoubling} {
		for _, p := range testSizes {
			for _, n := range lengths(p) {
				name := fmt.Sprintf("%v/P=%d/n=%d", alg, p, n)
				t.Run(name, func(t *testing.T) {
					inputs := make([][]float32, p)
					bufs := make([][]float32, p)
					for r := range p {
						inputs[r] = rankData(uint64(n), r, n)
						bufs[r] = slices.Clone(inputs[r])
					}
					runRanks(t, p, func(ctx context.Context, g Group) error {
						return AllReduce(ctx, g, 1, bufs[g.Rank()], alg)
					})
					checkIdentical(t, name, bufs)
					checkSum(t, name, bufs[0], inputs)
				})
			}
		}
	}
}

func TestAutoAllReduceChoice(t *testing.T) {
	cases := []struct {
		n, p int
		want Algorithm
	}{
		{512, 8, RecursiveDoubling}, // 2 KiB
		{513, 8, Rabenseifner},
		{513, 6, Ring},
		{1, 3, RecursiveDoubling},
	}
	for _, c := range cases {
		if got := autoAllReduce(c.n, c.p); got != c.want {
			t.Errorf("autoAllReduce(n=%d, P=%d) = %v, want %v", c.n, c.p, got, c.want)
		}
	}
}

// wantStats is what one rank's counters must read after one collective.
type wantStats struct{ rounds, msgsSent, msgsRecv, wordsSent, wordsRecv int64 }

func checkStats(t *testing.T, what string, g Group, w wantStats) {
	t.Helper()
	s := g.Counters().Snapshot()
	got := wantStats{s.Rounds, s.MsgsSent, s.MsgsRecv, s.BytesSent / 4, s.BytesRecv / 4}
	if s.BytesSent%4 != 0 || s.BytesRecv%4 != 0 || got != w {
		t.Errorf("%s rank %d: got rounds %d, msgs sent/recv %d/%d, words sent/recv %d/%d (bytes %d/%d); want rounds %d, msgs %d/%d, words %d/%d",
			what, g.Rank(), got.rounds, got.msgsSent, got.msgsRecv, got.wordsSent, got.wordsRecv, s.BytesSent, s.BytesRecv,
			w.rounds, w.msgsSent, w.msgsRecv, w.wordsSent, w.wordsRecv)
	}
}

// foldRole classifies a rank for the non-power-of-two fold: -1 even (sits out), +1 odd (folds
// in its neighbour), 0 unaffected.
func foldRole(r, p int) int {
	rem := p - floorPow2(p)
	switch {
	case r >= 2*rem:
		return 0
	case r%2 == 0:
		return -1
	}
	return 1
}

func TestAllReduceCounters(t *testing.T) {
	for p := 2; p <= 16; p++ {
		pp := floorPow2(p)
		lg := int64(log2(pp))
		n := 2 * p * pp // divisible by P and by P'
		N := int64(n)
		want := map[Algorithm]func(r int) wantStats{
			Ring: func(int) wantStats {
				w := 2 * N * int64(p-1) / int64(p)
				k := 2 * int64(p-1)
				return wantStats{k, k, k, w, w}
			},
			Rabenseifner: func(r int) wantStats {
				core := 2 * N * int64(pp-1) / int64(pp)
				switch foldRole(r, p) {
				case -1:
					return wantStats{2, 1, 1, N, N}
				case 1:
					return wantStats{2*lg + 2, 2*lg + 1, 2*lg + 1, core + N, core + N}
				}
				return wantStats{2 * lg, 2 * lg, 2 * lg, core, core}
			},
			RecursiveDoubling: func(r int) wantStats {
				switch foldRole(r, p) {
				case -1:
					return wantStats{2, 1, 1, N, N}
				case 1:
					return wantStats{lg + 2, lg + 1, lg + 1, N * (lg + 1), N * (lg + 1)}
				}
				return wantStats{lg, lg, lg, N * lg, N * lg}
			},
		}
		for _, alg := range []Algorithm{Ring, Rabenseifner, RecursiveDoubling} {
			name := fmt.Sprintf("%v/P=%d/n=%d", alg, p, n)
			t.Run(name, func(t *testing.T) {
				groups := runRanks(t, p, func(ctx context.Context, g Group) error {
					return AllReduce(ctx, g, 0, rankData(1, g.Rank(), n), alg)
				})
				for r, g := range groups {
					checkStats(t, name, g, want[alg](r))
				}
			})
		}
	}
}

// Spot checks of the headline formulas, written out as numbers.
func TestAllReduceCountersHeadline(t *testing.T) {
	cases := []struct {
		alg            Algorithm
		p, n           int
		rounds, recvWd int64
	}{
		{Ring, 4, 1024, 6, 1536},         // 2(P-1), 2n(P-1)/P
		{Ring, 7, 7000, 12, 12000},       // 2·6, 2·7000·6/7
		{Rabenseifner, 8, 1024, 6, 1792}, // 2·log2 8, 2·1024·7/8
		{Rabenseifner, 16, 1600, 8, 3000},
		{RecursiveDoubling, 8, 100, 3, 300}, // log2 8, n·log2 8
	}
	for _, c := range cases {
		groups := runRanks(t, c.p, func(ctx context.Context, g Group) error {
			return AllReduce(ctx, g, 0, make([]float32, c.n), c.alg)
		})
		for _, g := range groups {
			if s := g.Counters().Snapshot(); s.Rounds != c.rounds || s.BytesRecv != 4*c.recvWd {
				t.Errorf("%v P=%d n=%d rank %d: %v; want %d rounds, %d words received", c.alg, c.p, c.n, g.Rank(), s, c.rounds, c.recvWd)
			}
		}
	}
}

func TestBroadcast(t *testing.T) {
	for _, p := range testSizes {
		for _, n := range []int{0, 1, 2*p + 3, 10_000} {
			for _, root := range slices.Compact([]int{0, p / 2, p - 1}) {
				name := fmt.Sprintf("P=%d/n=%d/root=%d", p, n, root)
				t.Run(name, func(t *testing.T) {
					src := rankData(7, root, n)
					srcBytes := F32Bytes(rankData(8, root, n))[:n] // n bytes
					bufs := make([][]float32, p)
					raw := make([][]byte, p)
					for r := range p {
						bufs[r] = make([]float32, n)
						raw[r] = make([]byte, n)
					}
					copy(bufs[root], src)
					copy(raw[root], srcBytes)
					groups := runRanks(t, p, func(ctx context.Context, g Group) error {
						if err := Broadcast(ctx, g, 2, root, bufs[g.Rank()]); err != nil {
							return err
						}
						return BroadcastBytes(ctx, g, 2, root, raw[g.Rank()])
					})
					var totalMsgs int64
					for r, g := range groups {
						if !slices.Equal(bufs[r], src) {
							t.Fatalf("rank %d: Broadcast result differs from the root's vector", r)
						}
						if !slices.Equal(raw[r], srcBytes) {
							t.Fatalf("rank %d: BroadcastBytes result differs from the root's bytes", r)
						}
						s := g.Counters().Snapshot()
						totalMsgs += s.MsgsRecv
						// A non-root rank receives each broadcast once: 4n bytes, then n bytes.
						wantMsgs, wantBytes := int64(2), 5*int64(n)
						if r == root {
							wantMsgs, wantBytes = 0, 0
						}
						if s.MsgsRecv != wantMsgs || s.BytesRecv != wantBytes {
							t.Errorf("rank %d: %v, want %d messages and %d bytes received", r, s, wantMsgs, wantBytes)
						}
					}
					if totalMsgs != 2*int64(p-1) {
						t.Errorf("%d messages in two broadcasts, want 2(P-1) = %d", totalMsgs, 2*(p-1))
					}
					if s := groups[root].Counters().Snapshot(); s.Rounds != 2*int64(ceilLog2(p)) || s.MsgsSent != 2*int64(ceilLog2(p)) {
						t.Errorf("root: %v, want ceil(log2 P) = %d rounds and sends per broadcast", s, ceilLog2(p))
					}
				})
			}
		}
	}
}

func TestAllGather(t *testing.T) {
	for _, alg := range []Algorithm{Auto, Bruck, RecursiveDoubling, Ring} {
		for _, p := range testSizes {
			if alg == RecursiveDoubling && !isPow2(p) {
				continue
			}
			for _, n := range []int{0, 1, 3, 2*p + 3, 10_000} {
				name := fmt.Sprintf("%v/P=%d/n=%d", alg, p, n)
				t.Run(name, func(t *testing.T) {
					want := make([]float32, 0, p*n)
					for r := range p {
						want = append(want, rankData(3, r, n)...)
					}
					recvs := make([][]float32, p)
					groups := runRanks(t, p, func(ctx context.Context, g Group) error {
						recvs[g.Rank()] = make([]float32, p*n)
						return AllGather(ctx, g, 4, rankData(3, g.Rank(), n), recvs[g.Rank()], alg)
					})
					for r := range p {
						if !slices.Equal(recvs[r], want) {
							t.Fatalf("rank %d: gathered vector differs from the concatenation in rank order", r)
						}
					}
					if n == 0 || p == 1 {
						return
					}
					real := alg
					if alg == Auto {
						real = Bruck
						if isPow2(p) {
							real = RecursiveDoubling
						}
					}
					rounds := int64(ceilLog2(p)) // Bruck and recursive doubling
					if real == Ring {
						rounds = int64(p - 1)
					}
					words := int64(p-1) * int64(n)
					for _, g := range groups {
						s := g.Counters().Snapshot()
						if s.Rounds != rounds || s.MsgsRecv != rounds || s.BytesRecv != 4*words || s.BytesSent != 4*words {
							t.Errorf("%s rank %d: %v; want %d rounds and messages, (P-1)n = %d words received and sent", name, g.Rank(), s, rounds, words)
						}
					}
				})
			}
		}
	}
}

func TestAllGatherVAndBytes(t *testing.T) {
	for _, p := range testSizes {
		for _, pattern := range []string{"varied", "zeros", "some-empty"} {
			name := fmt.Sprintf("P=%d/%s", p, pattern)
			t.Run(name, func(t *testing.T) {
				size := func(r int) int {
					switch pattern {
					case "zeros":
						return 0
					case "some-empty":
						if r%2 == 0 {
							return 0
						}
					}
					return 3*r + 1
				}
				var othersSum int64
				outs := make([][][]float32, p)
				outBytes := make([][][]byte, p)
				groups := runRanks(t, p, func(ctx context.Context, g Group) error {
					r := g.Rank()
					var err error
					if outs[r], err = AllGatherV(ctx, g, 5, rankData(9, r, size(r))); err != nil {
						return err
					}
					outBytes[r], err = AllGatherBytes(ctx, g, 5, []byte(strings.Repeat(string(rune('a'+r)), size(r))))
					return err
				})
				for r := range p {
					for i := range p {
						if !slices.Equal(outs[r][i], rankData(9, i, size(i))) {
							t.Fatalf("rank %d: AllGatherV block of rank %d = %v", r, i, outs[r][i])
						}
						if want := strings.Repeat(string(rune('a'+i)), size(i)); string(outBytes[r][i]) != want {
							t.Fatalf("rank %d: AllGatherBytes block of rank %d = %q, want %q", r, i, outBytes[r][i], want)
						}
					}
				}
				for i := range p {
					othersSum += int64(size(i))
				}
				// Per call: lengths then data, ceil(log2 P) rounds each; P-1 length words plus
				// the other ranks' elements received.
				for r, g := range groups {
					s := g.Counters().Snapshot()
					others := othersSum - int64(size(r))
					rounds := 2 * 2 * int64(ceilLog2(p))
					wantBytes := 2*4*int64(p-1) + 4*others + others
					if s.Rounds != rounds || s.BytesRecv != wantBytes {
						t.Errorf("rank %d: %v; want %d rounds, %d bytes received", r, s, rounds, wantBytes)
					}
				}
			})
		}
	}
}

func TestBarrier(t *testing.T) {
	for _, p := range testSizes {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			var mu sync.Mutex
			arrived := 0
			groups := runRanks(t, p, func(ctx context.Context, g Group) error {
				for round := 1; round <= 3; round++ {
					if g.Rank() == p-1 {
						time.Sleep(2 * time.Millisecond) // a late rank
					}
					mu.Lock()
					arrived++
					mu.Unlock()
					if err := Barrier(ctx, g, 6); err != nil {
						return err
					}
					mu.Lock()
					a := arrived
					mu.Unlock()
					if a < round*p {
						return fmt.Errorf("rank %d left barrier %d when only %d of %d arrivals had happened", g.Rank(), round, a, round*p)
					}
					if err := Barrier(ctx, g, 6); err != nil { // nobody starts the next round early
						return err
					}
				}
				return nil
			})
			for _, g := range groups {
				if s := g.Counters().Snapshot(); s.Rounds != 6*int64(ceilLog2(p)) || s.MsgsSent != 6*int64(ceilLog2(p)) {
					t.Errorf("rank %d: %v after 6 barriers, want ceil(log2 P) = %d rounds and messages each", g.Rank(), s, ceilLog2(p))
				}
			}
		})
	}
}

// A rank that never joins must cost the others a deadline error, not a hang.
func TestCollectiveMissingRankDeadline(t *testing.T) {
	const p = 5
	ops := map[string]func(ctx context.Context, g Group) error{
		"AllReduce/ring": func(ctx context.Context, g Group) error { return AllReduce(ctx, g, 1, make([]float32, 100), Ring) },
		"AllReduce/rabenseifner": func(ctx context.Context, g Group) error {
			return AllReduce(ctx, g, 1, make([]float32, 100), Rabenseifner)
		},
		"AllReduce/rd": func(ctx context.Context, g Group) error {
			return AllReduce(ctx, g, 1, make([]float32, 100), RecursiveDoubling)
		},
		"Broadcast": func(ctx context.Context, g Group) error { return Broadcast(ctx, g, 1, 0, make([]float32, 10)) },
		"AllGather": func(ctx context.Context, g Group) error {
			return AllGather(ctx, g, 1, make([]float32, 2), make([]float32, 2*p), Bruck)
		},
		"AllGatherV": func(ctx context.Context, g Group) error { _, err := AllGatherV(ctx, g, 1, nil); return err },
		"Barrier":    func(ctx context.Context, g Group) error { return Barrier(ctx, g, 1) },
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			groups := newLocal(t, p)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			errs := make([]error, p)
			var wg sync.WaitGroup
			start := time.Now()
			for r := 1; r < p; r++ { // rank 0 (the broadcast root) never calls
				wg.Go(func() { errs[r] = op(ctx, groups[r]) })
			}
			wg.Wait()
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("took %v", el)
			}
			blocked := 0
			for r, err := range errs[1:] {
				if err != nil {
					blocked++
					if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "tag 1") {
						t.Errorf("rank %d: %v, want a deadline error naming the tag", r+1, err)
					}
				}
			}
			if blocked == 0 {
				t.Error("no rank noticed the missing one")
			}
		})
	}
}

func TestConcurrentCollectivesOnDifferentTags(t *testing.T) {
	const p, n, iters = 5, 3001, 4
	inA := make([][]float32, p)
	inB := make([][]float32, p)
	for r := range p {
		inA[r], inB[r] = rankData(11, r, n), rankData(12, r, n)
	}
	outA := make([][]float32, p)
	outB := make([][]float32, p)
	runRanks(t, p, func(ctx context.Context, g Group) error {
		r := g.Rank()
		var wg sync.WaitGroup
		var errA, errB, errC error
		wg.Go(func() {
			for range iters {
				outA[r] = slices.Clone(inA[r])
				if errA = AllReduce(ctx, g, 10, outA[r], Ring); errA != nil {
					return
				}
			}
		})
		wg.Go(func() {
			for range iters {
				outB[r] = slices.Clone(inB[r])
				if errB = AllReduce(ctx, g, 11, outB[r], Rabenseifner); errB != nil {
					return
				}
			}
		})
		wg.Go(func() {
			for i := range iters {
				got, err := AllGatherBytes(ctx, g, 12, []byte{byte(r), byte(i)})
				if errC = err; err != nil {
					return
				}
				for s, b := range got {
					if len(b) != 2 || b[0] != byte(s) || b[1] != byte(i) {
						errC = fmt.Errorf("rank %d iteration %d: block of rank %d = %v", r, i, s, b)
						return
					}
				}
			}
		})
		wg.Wait()
		return errors.Join(errA, errB, errC)
	})
	checkIdentical(t, "ring on tag 10", outA)
	checkSum(t, "ring on tag 10", outA[0], inA)
	checkIdentical(t, "rabenseifner on tag 11", outB)
	checkSum(t, "rabenseifner on tag 11", outB[0], inB)
}

func TestCollectiveBadInput(t *testing.T) {
	groups := newLocal(t, 3)
	ctx := context.Background()
	g := groups[0]
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"allgather recv length", AllGather(ctx, g, 0, make([]float32, 2), make([]float32, 5), Auto), "len(recv) = 5"},
		{"allgather rd non-power-of-two", AllGather(ctx, g, 0, make([]float32, 2), make([]float32, 6), RecursiveDoubling), "power-of-two"},
		{"allgather rabenseifner", AllGather(ctx, g, 0, make([]float32, 2), make([]float32, 6), Rabenseifner), "not an all-gather algorithm"},
		{"allreduce bruck", AllReduce(ctx, g, 0, make([]float32, 2), Bruck), "not an all-reduce algorithm"},
		{"allreduce unknown", AllReduce(ctx, g, 0, make([]float32, 2), Algorithm(99)), "Algorithm(99)"},
		{"broadcast root", Broadcast(ctx, g, 0, 3, make([]float32, 2)), "root 3 out of range"},
		{"nil group", Barrier(ctx, nil, 0), "nil Group"},
	}
	for _, c := range cases {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", c.name, c.err, c.want)
		}
	}
}

// Ranks that disagree on the vector length get an error naming the sizes, not a hang or a
// silently wrong sum.
func TestAllReduceSizeMismatch(t *testing.T) {
	groups := newLocal(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { errs[r] = AllReduce(ctx, groups[r], 0, make([]float32, 4+r), RecursiveDoubling) })
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "bytes") {
			t.Errorf("rank %d: err = %v, want a size error", r, err)
		}
	}
}
