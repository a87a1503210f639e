//go:build linux

package comm_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// Three ranks of one process, each with its own mapping of one shared segment, sum their
// vectors through it: Auto runs the shared all-reduce on a shared-memory group. Processes do
// the same with comm.NewShm, one rank each.
func ExampleNewShmLocal() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := comm.NewShmLocal(ctx, 3)
	if err != nil {
		panic(err)
	}
	results := make([][]float32, len(groups))
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			r := float32(g.Rank())
			buf := []float32{r, 10 * r, 1}
			if err := comm.AllReduce(ctx, g, 0, buf, comm.Auto); err != nil {
				panic(err)
			}
			results[g.Rank()] = buf
		})
	}
	wg.Wait()
	s := groups[0].Counters().Snapshot()
	for _, g := range groups {
		g.Close()
	}
	for r, buf := range results {
		fmt.Println("rank", r, buf)
	}
	fmt.Println("algorithm:", comm.SharedMemory, "- rank 0 read", s.BytesRecv, "bytes of its peers' memory in", s.Rounds, "rounds")
	// Output:
	// rank 0 [3 30 3]
	// rank 1 [3 30 3]
	// rank 2 [3 30 3]
	// algorithm: shared-memory - rank 0 read 16 bytes of its peers' memory in 2 rounds
}

// Vectors in shared buffers: every rank allocates its vector with AllocShared (collective: same
// tag and length on every rank), and the all-reduce reads the peers' vectors where they lie
// instead of copying them through the segment (for vectors of 64 KiB and more). DDP keeps its
// buckets this way.
func ExampleAllocShared() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := comm.NewShmLocal(ctx, 2)
	if err != nil {
		panic(err)
	}
	defer func() {
		for _, g := range groups {
			g.Close()
		}
	}()
	const n = 1 << 16 // 256 KiB of float32
	sums := make([]float32, len(groups))
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			buf, err := comm.AllocShared[float32](ctx, g, 1, n)
			if err != nil {
				panic(err)
			}
			for i := range buf {
				buf[i] = float32(g.Rank() + 1)
			}
			if err := comm.AllReduce(ctx, g, 2, buf, comm.Auto); err != nil {
				panic(err)
			}
			sums[g.Rank()] = buf[0] + buf[n-1]
		})
	}
	wg.Wait()
	fmt.Println("first + last element on each rank:", sums)
	// Output:
	// first + last element on each rank: [6 6]
}
