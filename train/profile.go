package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/nn"
)

// A hook that plans its buckets from measured costs (omgs: hooks.ProfiledPlanner) gets its
// profile (Setup.New) from a few steps on real batches before DDP starts, in every
// program (CIFAR, MLM, the PTB language model, IMDB): fewer than the OMGS reference's
// 5 warm-up + 50 measured iterations, because a VGG step takes a second or more on the
// 2-core machines and the backward timings settle within a few steps.
const (
	ProfileWarmup     = 3
	ProfileIterations = 10
	// tagProfileAgree is the programs' tag for agreeing on a saved profile (99-101 and 103
	// are their other collectives').
	tagProfileAgree = 102
)

// withProfile gives a hook that plans its buckets from measured costs (omgs: a
// hooks.ProfiledPlanner) the profile it needs for model (SetProfile): loaded from path
// (the programs' -profile) when every rank could load one that fits, otherwise measured on
// the training steps newStep makes (see loadOrMeasureProfile). It returns opts as they are;
// for any other hook it measures nothing. Every rank must call it: measuring is collective.
// The programs call it before ddp.New; the traffic it causes is set-up, not training.
func withProfile(ctx context.Context, g comm.Group, model nn.Module, hook ddp.CommHook, path string, stdout io.Writer,
	opts []ddp.Option, newStep func() (step profile.Step, stop func(), err error)) ([]ddp.Option, error) {
	pp, ok := hook.(hooks.ProfiledPlanner)
	if !ok {
		return opts, nil
	}
	step, stop, err := newStep()
	if err != nil {
		return nil, fmt.Errorf("measuring the profile for -hook %s: %w", hook.Name(), err)
	}
	defer stop()
	prof, err := loadOrMeasureProfile(ctx, g, model, pp, path, stdout, step)
	if err != nil {
		return nil, err
	}
	pp.SetProfile(prof)
	return opts, nil
}

// EpochCycle pulls batches from epochs 0, 1, 2, … of epoch in turn, for profile steps
// (Setup.ProfileStep) that may need more batches than an epoch has; next reports an epoch
// that yields none. stop ends the pull.
func EpochCycle[B any](ctx context.Context, epoch func(ctx context.Context, epoch int) iter.Seq2[B, error]) (next func() (B, error), stop func()) {
	e := 0
	pull, stopPull := iter.Pull2(epoch(ctx, e))
	next = func() (B, error) {
		b, err, more := pull()
		if !more { // the epoch is over: go on with the next
			stopPull()
			e++
			pull, stopPull = iter.Pull2(epoch(ctx, e))
			b, err, more = pull()
		}
		if err == nil && !more {
			err = fmt.Errorf("epoch %d of the training set yields no batch", e+1)
		}
		return b, err
	}
	return next, func() { stopPull() }
}

// loadOrMeasureProfile returns the profile pp needs for model: the one saved at path when
// every rank could load one measured on this model and world size, otherwise one measured
// now with step (profile.Measure's: one forward and backward on a training batch); rank 0
// prints it and saves it to path. path may be empty (measure, save nothing). Every rank
// must call it: measuring is collective.
func loadOrMeasureProfile(ctx context.Context, g comm.Group, model nn.Module, pp hooks.ProfiledPlanner, path string, stdout io.Writer,
	step func(backward func(*nn.Var) error) error) (*profile.Profile, error) {
	params := nn.Parameters(model)
	var loaded *profile.Profile
	if path != "" {
		prof, err := profile.Load(path)
		switch {
		case err == nil && prof.P == g.Size() && prof.Check(params) == nil:
			loaded = prof
		case err == nil:
			if g.Rank() == 0 {
				fmt.Fprintf(stdout, "profile %s was measured on another model or number of workers: measuring again\n", path)
			}
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("-profile: %w", err)
		}
	}
	// Use the saved profile only if every rank loaded one, so that all measure or none does.
	ok := []float32{0}
	if loaded != nil {
		ok[0] = 1
	}
	if err := comm.AllReduce(ctx, g, tagProfileAgree, ok, comm.Auto); err != nil {
		return nil, fmt.Errorf("agreeing on -profile: %w", err)
	}
	if int(ok[0]) == g.Size() {
		if g.Rank() == 0 {
			fmt.Fprintf(stdout, "using the profile in %s\n%v\n", path, loaded)
		}
		return loaded, nil
	}

	opts := pp.ProfileOptions()
	opts.Warmup, opts.Iterations = ProfileWarmup, ProfileIterations
	prof, err := profile.Measure(ctx, model, g, step, opts)
	if err != nil {
		return nil, err
	}
	if g.Rank() == 0 {
		fmt.Fprintf(stdout, "%v\n", prof)
		if path != "" {
			if err := prof.Save(path); err != nil {
				return nil, err
			}
			fmt.Fprintf(stdout, "saved the profile to %s\n", path)
		}
	}
	return prof, nil
}

// errNoProfileStep is Setup.New's error for a hook that needs a measured profile when the
// program gave no Setup.ProfileStep.
var errNoProfileStep = errors.New("the program gives no training step to measure it on (Setup.ProfileStep)")
