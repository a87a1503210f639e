package hooks

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// A checkpoint (true parameters, SGD momentum, OSP state) taken after a flushed step and
// restored into fresh replicas continues bit-identically to the uninterrupted run; state of
// another model is refused with an error.
func TestOSPStateRoundTrip(t *testing.T) {
	// A cut after step 1 restores the first deferrals' Ĝ and ICS; one after step 3 also SGD's
	// LGP differences, still alive from earlier deferrals.
	for _, cut := range []int{2, 4} {
		t.Run(fmt.Sprintf("cut=%d", cut), func(t *testing.T) { ospStateRoundTrip(t, cut) })
	}
}

func ospStateRoundTrip(t *testing.T, cut int) {
	const p, steps = 2, 7
	spec := "osp:budget=0.5"
	sgd := optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4}
	setup := func(ctx context.Context, g comm.Group, seed uint64) (*ddp.DDP, *optim.SGD, ddp.CommHook, error) {
		h, err := Parse(spec)
		if err != nil {
			return nil, nil, nil, err
		}
		dp, err := ddp.New(ctx, tinyNet(seed), g, ddp.WithCommHook(h), ddp.WithBucketCap(2048, 8192))
		if err != nil {
			return nil, nil, nil, err
		}
		opt, _ := optim.NewSGD(dp.Parameters(), sgd)
		dp.SetCorrector(opt)
		return dp, opt, h, nil
	}
	// The hooks' states after every step from the cut on, by rank: the restored run must
	// continue from the same Ĝ, pending ICS results and counters.
	recordState := func(states [][]map[string][]float32, r int, h ddp.CommHook) func(int) error {
		return func(s int) error {
			if s < cut {
				return nil
			}
			st, err := h.(ddp.Stateful).State()
			states[r] = append(states[r], st)
			return err
		}
	}
	want := make([]uint64, p)
	wantState := make([][]map[string][]float32, p)
	eachRank(t, p, func(ctx context.Context, g comm.Group) error {
		dp, opt, h, err := setup(ctx, g, uint64(1+g.Rank()))
		if err != nil {
			return err
		}
		if err := ospLoop(ctx, g.Rank(), dp, opt, nn.NewTape(), 0, steps, recordState(wantState, g.Rank(), h), cut-1, steps-1); err != nil {
			return err
		}
		want[g.Rank()] = paramHash(dp.Parameters())
		return nil
	})
	got := make([]uint64, p)
	gotState := make([][]map[string][]float32, p)
	saved := make([]map[string][]float32, p)
	eachRank(t, p, func(ctx context.Context, g comm.Group) error {
		dp, opt, h, err := setup(ctx, g, uint64(1+g.Rank()))
		if err != nil {
			return err
		}
		if err := ospLoop(ctx, g.Rank(), dp, opt, nn.NewTape(), 0, cut, nil, cut-1); err != nil {
			return err
		}
		if len(dp.Pending()) != 0 {
			return errors.New("parameters pending after a flushed step")
		}
		values := map[string][]float32{}
		for _, q := range dp.Parameters() {
			values[q.Name] = slices.Clone(q.Value.Data)
		}
		optState := opt.State()
		if cut == 4 && !slices.ContainsFunc(slices.Collect(maps.Keys(optState)), func(k string) bool { return strings.HasPrefix(k, "lgp:") }) {
			return errors.New("no LGP difference in the optimizer's state at the cut: the test would not see it lost")
		}
		hookState, err := h.(ddp.Stateful).State()
		if err != nil {
			return err
		}
		saved[g.Rank()] = hookState
		// Fresh replicas from other seeds, the checkpoint loaded over them.
		dp2, opt2, h2, err := setup(ctx, g, uint64(50+g.Rank()))
		if err != nil {
			return err
		}
		for _, q := range dp2.Parameters() {
			copy(q.Value.Data, values[q.Name])
		}
		if err := opt2.LoadState(optState); err != nil {
			return err
		}
		if err := h2.(ddp.Stateful).LoadState(hookState); err != nil {
			return err
		}
		if err := ospLoop(ctx, g.Rank(), dp2, opt2, nn.NewTape(), cut, steps, recordState(gotState, g.Rank(), h2), steps-1); err != nil {
			return err
		}
		got[g.Rank()] = paramHash(dp2.Parameters())
		return nil
	})
	if !slices.Equal(got, want) {
		t.Fatal("the restored run's parameters differ from the uninterrupted run's")
	}
	for r := range p {
		sameBits := func(a, b []float32) bool {
			return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
		}
		for i := range wantState[r] {
			if !maps.EqualFunc(gotState[r][i], wantState[r][i], sameBits) {
				t.Fatalf("rank %d, step %d: the restored run's OSP state differs from the uninterrupted run's", r, cut+i)
			}
		}
	}
	if saved[0]["osp.meta"] == nil || saved[0]["osp.ghat.0.weight"] == nil {
		t.Fatalf("state keys %v", slices.Sorted(maps.Keys(saved[0])))
	}
	// Another model: the saved Ĝ matches none of its parameters.
	eachRank(t, p, func(ctx context.Context, g comm.Group) error {
		h, _ := Parse(spec)
		if err := h.(ddp.Stateful).LoadState(saved[g.Rank()]); err != nil {
			return err
		}
		rng := nn.NewRand(1)
		m := nn.NewSequential(nn.Flatten{}, nn.NewLinear(3*8*8, 5, true, rng))
		dp, err := ddp.New(ctx, m, g, ddp.WithCommHook(h))
		if err != nil {
			return err
		}
		opt, err := optim.NewSGD(dp.Parameters(), sgd)
		if err != nil {
			return err
		}
		dp.SetCorrector(opt) // OSP's LGP needs it: without, Backward refuses before the state is checked
		x, y := syntheticBatch(1, 2)
		tape := nn.NewTape()
		err = dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y))
		if err == nil || !strings.Contains(err.Error(), "state saved") {
			return fmt.Errorf("restoring another model's state: want an error, got %v", err)
		}
		return nil
	})
}
