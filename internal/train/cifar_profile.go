package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// A hook that plans its buckets from measured costs (omgs: ddp.ProfiledPlanner) gets its
// profile from a few steps on real batches before DDP starts: fewer than the OMGS reference's
// 5 warm-up + 50 measured iterations, because a VGG step takes a second or more on the
// 2-core machines and the backward timings settle within a few steps.
const (
	profileWarmup     = 3
	profileIterations = 10
	// tagProfileAgree is the CIFAR program's tag for agreeing on a saved profile (99-101 and
	// 103 are its other collectives').
	tagProfileAgree = 102
)

// profile returns the profile pp needs for model: the one in -profile when every rank could
// load one measured on this model and world size, otherwise measured now on CIFAR batches
// (rank 0 prints it and saves it to -profile). Every rank must call it: measuring is
// collective.
func (w *cifarWorker) profile(ctx context.Context, model nn.Module, pp ddp.ProfiledPlanner) (*ddp.Profile, error) {
	c, g := w.cfg, w.group
	loader, err := datasets.NewLoader(w.train, CIFARTrainLoader(c.Batch, g.Rank(), g.Size(), c.Seed))
	if err != nil {
		return nil, err
	}
	epoch := 0
	next, stop := iter.Pull2(loader.Epoch(ctx, epoch))
	defer func() { stop() }()
	tape := nn.NewTape()
	nn.SetTraining(model, true)
	step := func(backward func(*nn.Var) error) error {
		b, err, more := next()
		if !more { // a short epoch: go on with the next
			stop()
			epoch++
			next, stop = iter.Pull2(loader.Epoch(ctx, epoch))
			b, err, more = next()
		}
		if err != nil {
			return err
		}
		if !more {
			return errors.New("the training set yields no batch")
		}
		x, err := nn.FromSlice(b.X, b.N, 3, 32, 32)
		if err != nil {
			return err
		}
		tape.Reset()
		return backward(nn.CrossEntropy(model.Forward(tape.Const(x)), b.Y))
	}
	return loadOrMeasureProfile(ctx, g, model, pp, c.Profile, w.stdout, step)
}

// loadOrMeasureProfile returns the profile pp needs for model: the one saved at path when
// every rank could load one measured on this model and world size, otherwise one measured
// now with step (ddp.MeasureProfile's: one forward and backward on a training batch); rank 0
// prints it and saves it to path. path may be empty (measure, save nothing). Every rank
// must call it: measuring is collective.
func loadOrMeasureProfile(ctx context.Context, g comm.Group, model nn.Module, pp ddp.ProfiledPlanner, path string, stdout io.Writer,
	step func(backward func(*nn.Var) error) error) (*ddp.Profile, error) {
	params := nn.Parameters(model)
	var loaded *ddp.Profile
	if path != "" {
		prof, err := ddp.LoadProfile(path)
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
	opts.Warmup, opts.Iterations = profileWarmup, profileIterations
	prof, err := ddp.MeasureProfile(ctx, model, g, step, opts)
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
