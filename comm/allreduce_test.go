package comm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// addInt64 is the exact (wrapping) integer sum AllReduceOf is tested with.
func addInt64(dst, a, b []int64) {
	for i := range a {
		dst[i] = a[i] + b[i]
	}
}

// AllReduceOf on int64: every algorithm gives every rank the exact sum, for every P from 2 to
// 8 and lengths around the block sizes and the Auto threshold (256 int64 = 2 KiB). The inputs
// are large enough that a float64 sum would round.
func TestAllReduceOfInt64(t *testing.T) {
	for _, alg := range []Algorithm{Auto, Ring, Rabenseifner, RecursiveDoubling} {
		for p := 2; p <= 8; p++ {
			for _, n := range []int{0, 1, p - 1, 2*p + 3, 256, 257, 1000} {
				name := fmt.Sprintf("%v/P=%d/n=%d", alg, p, n)
				inputs := make([][]int64, p)
				bufs := make([][]int64, p)
				for r := range p {
					rng := rand.New(rand.NewPCG(uint64(n), uint64(r)))
					inputs[r] = make([]int64, n)
					for i := range n {
						inputs[r][i] = rng.Int64N(1<<60) - 1<<59
					}
					bufs[r] = slices.Clone(inputs[r])
				}
				runRanks(t, p, func(ctx context.Context, g Group) error {
					return AllReduceOf(ctx, g, 1, bufs[g.Rank()], addInt64, alg)
				})
				for i := range n {
					var want int64
					for r := range p {
						want += inputs[r][i]
					}
					for r := range p {
						if bufs[r][i] != want {
							t.Fatalf("%s: rank %d element %d = %d, want %d", name, r, i, bufs[r][i], want)
						}
					}
				}
			}
		}
	}
}

// AllReduceOf's traffic is AllReduce's with 8-byte words for int64, and Auto chooses by bytes:
// 256 int64 (2 KiB) by recursive doubling, 264 by Rabenseifner (P = 8).
func TestAllReduceOfCounters(t *testing.T) {
	cases := []struct {
		alg               Algorithm
		p, n              int
		rounds, bytesRecv int64
	}{
		{Ring, 4, 1024, 6, 8 * 1536},
		{Ring, 6, 600, 10, 8 * 1000},
		{Rabenseifner, 8, 1024, 6, 8 * 1792},
		{RecursiveDoubling, 8, 100, 3, 8 * 300},
		{Auto, 8, 256, 3, 8 * 768},
		{Auto, 8, 264, 6, 8 * 462},
	}
	for _, c := range cases {
		groups := runRanks(t, c.p, func(ctx context.Context, g Group) error {
			return AllReduceOf(ctx, g, 0, make([]int64, c.n), addInt64, c.alg)
		})
		for _, g := range groups {
			if c.alg == Auto && isSharedMemory(g) {
				// Auto runs the shared all-reduce (SPARGO_TEST_TRANSPORT=shm): two rounds,
				// block r from every peer and every other block's sum.
				counts, _ := blockCounts(c.n, c.p)
				mine := int64(counts[g.Rank()])
				c.rounds, c.bytesRecv = 2, 8*(int64(c.p-1)*mine+int64(c.n)-mine)
			}
			if s := g.Counters().Snapshot(); s.Rounds != c.rounds || s.BytesRecv != c.bytesRecv {
				t.Errorf("%v P=%d n=%d rank %d: %v; want %d rounds, %d bytes received", c.alg, c.p, c.n, g.Rank(), s, c.rounds, c.bytesRecv)
			}
		}
	}
}

func TestAllReduceOfErrors(t *testing.T) {
	if err := AllReduceOf(context.Background(), nil, 0, []int64{1}, addInt64, Ring); err == nil || !strings.Contains(err.Error(), "AllReduceOf: nil Group") {
		t.Errorf("nil Group: %v", err)
	}
	groups := newLocal(t, 1)
	if err := AllReduceOf(context.Background(), groups[0], 0, []int64{1}, addInt64, Bruck); err == nil || !strings.Contains(err.Error(), "not an all-reduce algorithm") {
		t.Errorf("Bruck: %v", err)
	}
}

// BenchmarkLocalAllReduce measures the float32 all-reduce algorithms on in-process ranks, where
// the transport costs little and the collective's own work (scratch, adds, copies) shows:
// a small vector (recursive doubling's range) and a 1 MiB one, on a power-of-two P and on one
// that folds.
func BenchmarkLocalAllReduce(b *testing.B) {
	for _, n := range []int{256, 1 << 18} {
		for _, p := range []int{4, 6} {
			for _, alg := range []Algorithm{Ring, Rabenseifner, RecursiveDoubling} {
				b.Run(fmt.Sprintf("%v/P=%d/n=%d", alg, p, n), func(b *testing.B) {
					groups, err := NewLocal(p)
					if err != nil {
						b.Fatal(err)
					}
					bufs := make([][]float32, p)
					for r := range bufs {
						bufs[r] = rankData(1, r, n)
					}
					ctx := context.Background()
					errs := make([]error, p)
					b.SetBytes(int64(4 * n))
					b.ReportAllocs()
					b.ResetTimer()
					for range b.N {
						var wg sync.WaitGroup
						for r, g := range groups {
							wg.Go(func() { errs[r] = AllReduce(ctx, g, 0, bufs[r], alg) })
						}
						wg.Wait()
						if err := errors.Join(errs...); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
