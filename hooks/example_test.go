package hooks_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
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
	cfg, err := hooks.ParseConfig("spardl:density=0.05") // parsed and checked once
	if err != nil {
		panic(err)
	}
	for _, g := range groups {
		h, err := cfg.New() // one hook per rank
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

// The plan omgs would choose for VGG-16 from a saved profile, without a model or training
// (what `spargo plan` prints): the profile's all-gather replaced by the OMGS reference's
// 1 GbE costs at P = 16, every tensor sparsified at density 0.001 (the paper's algorithm).
func ExampleMergedTopK_PlanProfile() {
	prof, err := profile.Load("testdata/vgg16_p4.profile.json")
	if err != nil {
		fmt.Println(err)
		return
	}
	prof.AllGather = profile.AllGatherCost{Alpha: 22e-3, Beta: 272e-9}
	h, err := hooks.Parse("omgs:density=0.001,dense_below=0")
	if err != nil {
		fmt.Println(err)
		return
	}
	rep, err := h.(*hooks.OMGS).PlanProfile(prof)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d groups; predicted %.1f ms, TopK-SGD %.1f ms, LAGS %.1f ms\n", len(rep.Groups),
		rep.Predicted.Seconds()*1e3, rep.Single.Seconds()*1e3, rep.LAGS.Seconds()*1e3)
	// Output:
	// 13 groups; predicted 940.3 ms, TopK-SGD 1011.8 ms, LAGS 1573.7 ms
}

// Ok-Topk reports its local work to a meter in the context: here rank 0's dense work (the add
// of the residual and the division by P, one unit per element each) and whether it decoded
// what it received, on two ranks and a bucket of 1,000 gradients. `spargo simulate` charges
// every piece at a rate measured on hooks.WorkProbes.
func ExampleWithWorkMeter() {
	groups, _ := comm.NewLocal(2)
	var units [2][hooks.NumWork]int
	var wg sync.WaitGroup
	for _, g := range groups {
		h, err := hooks.Parse("oktopk:density=0.01")
		if err != nil {
			panic(err)
		}
		wg.Go(func() {
			ctx := hooks.WithWorkMeter(context.Background(), func(w hooks.Work, n int) { units[g.Rank()][w] += n })
			grad := make([]float32, 1000)
			for i := range grad {
				grad[i] = float32((i*7+g.Rank()*13)%101) - 50
			}
			if _, err := h.Run(ctx, g, bucket{grad}).Wait(); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("add:", units[0][hooks.WorkAdd], "scale:", units[0][hooks.WorkScale])
	fmt.Println("decoded entries:", units[0][hooks.WorkUnpack] > 0)
	// Output:
	// add: 1000 scale: 1000
	// decoded entries: true
}
