package comm_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// Four in-process ranks sum their vectors; every rank ends with the same bits.
func Example() {
	groups, err := comm.NewLocal(4)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

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
	for r, buf := range results {
		fmt.Println("rank", r, buf)
	}
	s := groups[0].Counters().Snapshot()
	fmt.Println("rank 0:", s.Rounds, "rounds,", s.BytesRecv, "bytes received")
	// Output:
	// rank 0 [6 60 4]
	// rank 1 [6 60 4]
	// rank 2 [6 60 4]
	// rank 3 [6 60 4]
	// rank 0: 2 rounds, 24 bytes received
}

// Gathering differently sized vectors, e.g. the sparse indices each rank selected.
func ExampleAllGatherV() {
	groups, _ := comm.NewLocal(3)
	ctx := context.Background()
	out := make([][][]float32, 3)
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			send := make([]float32, g.Rank()+1)
			for i := range send {
				send[i] = float32(g.Rank())
			}
			var err error
			if out[g.Rank()], err = comm.AllGatherV(ctx, g, 7, send); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(out[0])
	// Output: [[0] [1 1] [2 2 2]]
}

// Exact integer sums: AllReduceOf runs AllReduce's algorithms on any fixed-size number type
// with the caller's reduction; here three ranks count events in int64 without rounding.
func ExampleAllReduceOf() {
	groups, _ := comm.NewLocal(3)
	ctx := context.Background()
	add := func(dst, a, b []int64) {
		for i := range a {
			dst[i] = a[i] + b[i]
		}
	}
	out := make([][]int64, 3)
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			counts := []int64{1<<60 + 1, int64(g.Rank()), 1} // 3·(2^60+1) is no float64
			if err := comm.AllReduceOf(ctx, g, 0, counts, add, comm.Auto); err != nil {
				panic(err)
			}
			out[g.Rank()] = counts
		})
	}
	wg.Wait()
	fmt.Println(out[0], out[2])
	// Output: [3458764513820540931 3 3] [3458764513820540931 3 3]
}
