package ddp_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// lastParamLater averages each bucket now except its last parameter, whose average it
// delivers late: a two-stage hook in a dozen lines (OSP does this with the least important
// layers and communicates them while the next iteration computes).
type lastParamLater struct{}

func (lastParamLater) Name() string { return "last-param-later" }

func (lastParamLater) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	avg, err := ddp.AllReduceHook{}.Run(ctx, g, b).Wait()
	if err != nil {
		return ddp.Ready(nil, err)
	}
	last := len(b.Params()) - 1
	late := avg[b.Offsets()[last]:] // the last parameter's average, already computed here
	return ddp.Defer(ddp.Ready(avg, nil), ddp.Deferred{Params: []int{last}, Result: ddp.Ready(late, nil), Correct: true})
}

// A training loop with a hook that delivers results late: SetCorrector for LGP, Flush
// before the last step, EndEpoch after each epoch.
func Example_lateResults() {
	groups, _ := comm.NewLocal(2)
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			ctx := context.Background()
			rng := nn.NewRand(1)
			model := nn.NewSequential(nn.NewLinear(4, 3, true, rng))
			dp, _ := ddp.New(ctx, model, g, ddp.WithCommHook(lastParamLater{}))
			opt, _ := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
			dp.SetCorrector(opt)
			tape := nn.NewTape()
			x := nn.NewTensor(2, 4)
			for i := range x.Data {
				x.Data[i] = float32(i%5+g.Rank()) / 4
			}
			const steps = 3
			for step := range steps {
				tape.Reset()
				opt.ZeroGrad()
				loss := nn.CrossEntropy(dp.Forward(tape.Const(x)), []int{0, 2})
				if err := dp.Backward(ctx, loss); err != nil {
					panic(err)
				}
				pending := len(dp.Pending())
				if step == steps-1 {
					if err := dp.Flush(ctx); err != nil {
						panic(err)
					}
				}
				opt.Step()
				if g.Rank() == 0 {
					fmt.Printf("step %d: %d parameter pending after Backward, %d after the step\n", step+1, pending, len(dp.Pending()))
				}
			}
			info, err := dp.EndEpoch(ctx)
			if err != nil {
				panic(err)
			}
			if g.Rank() == 0 {
				fmt.Printf("epoch %d ended\n", info.Epoch)
			}
		})
	}
	wg.Wait()
	// Output:
	// step 1: 1 parameter pending after Backward, 1 after the step
	// step 2: 1 parameter pending after Backward, 1 after the step
	// step 3: 1 parameter pending after Backward, 0 after the step
	// epoch 1 ended
}
