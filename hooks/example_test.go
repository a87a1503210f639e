package hooks_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/nn"
)

// bucket is a minimal ddp.Bucket: DDP builds real ones from a model's gradients.
type bucket struct{ flat []float32 }

func (b bucket) Index() int          { return 0 }
func (b bucket) Iteration() int64    { return 0 }
func (b bucket) IsLast() bool        { return true }
func (b bucket) Flat() []float32     { return b.flat }
func (b bucket) Params() []*nn.Param { return nil }
func (b bucket) Offsets() []int      { return nil }
func (b bucket) Tag() uint32         { return 1 << 16 }

// Four in-process ranks run SparDL on a bucket of 400 gradients at density 0.05: blocks of
// 100 elements, k_b = 5 entries per block; 2·ceil(log2 4) = 4 rounds and 4(P-1)·k_b = 60 words
// received per rank, and every rank gets the same sparse average.
func Example() {
	groups, _ := comm.NewLocal(4)
	ctx := context.Background()
	outs := make([][]float32, len(groups))
	var wg sync.WaitGroup
	for _, g := range groups {
		h, err := hooks.Parse("spardl:density=0.05") // one hook per rank
		if err != nil {
			panic(err)
		}
		wg.Go(func() {
			grad := make([]float32, 400)
			for i := range grad {
				grad[i] = float32((i*7+g.Rank()*13)%101) - 50
			}
			out, err := h.Run(ctx, g, bucket{grad}).Wait()
			if err != nil {
				panic(err)
			}
			outs[g.Rank()] = out
		})
	}
	wg.Wait()
	nonzero := 0
	for _, v := range outs[0] {
		if v != 0 {
			nonzero++
		}
	}
	s := groups[0].Counters().Snapshot()
	fmt.Println("non-zeros in the average:", nonzero)
	fmt.Println("rank 0:", s.Rounds, "rounds,", s.BytesRecv/4, "words received")
	fmt.Println("rank 3 has rank 0's result:", fmt.Sprint(outs[3]) == fmt.Sprint(outs[0]))
	var _ ddp.Bucket = bucket{}
	// Output:
	// non-zeros in the average: 20
	// rank 0: 4 rounds, 60 words received
	// rank 3 has rank 0's result: true
}
