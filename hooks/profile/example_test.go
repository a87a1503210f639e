package profile_test

import (
	"context"
	"fmt"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/nn"
)

// A hook that plans from measured costs (omgs) gets its profile before DDP starts: a few
// forward passes on real batches through the step, then the top-k and all-gather timings.
// Every rank runs this with its own replica and batches.
func ExampleMeasure() {
	ctx := context.Background()
	groups, _ := comm.NewLocal(1) // one rank here; every rank of a job does the same
	g := groups[0]
	rng := nn.NewRand(1)
	model := nn.NewSequential(nn.NewLinear(8, 16, true, rng), nn.ReLU{}, nn.NewLinear(16, 3, true, rng))
	hook := hooks.MustParse("omgs:density=0.01")

	tape := nn.NewTape()
	x := nn.NewTensor(4, 8) // a real program takes its next batch here
	step := func(backward func(*nn.Var) error) error {
		tape.Reset()
		return backward(nn.CrossEntropy(model.Forward(tape.Const(x)), []int{0, 1, 2, 0}))
	}
	pp := hook.(hooks.ProfiledPlanner)
	opts := pp.ProfileOptions()
	opts.Warmup, opts.Iterations = 2, 5
	prof, err := profile.Measure(ctx, model, g, step, opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	pp.SetProfile(prof) // the hook plans from it when ddp.New asks for its buckets
	dp, err := ddp.New(ctx, model, g, ddp.WithCommHook(hook))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(prof.Params), "parameters profiled;", len(dp.Plan()) >= 1)
	// Output: 4 parameters profiled; true
}
