package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// ParseHook parses a program's -hook spec (see `spargo hooks`) once, in its flag check,
// before any data is loaded: the result is what Setup.Hook takes and what checkpoints store
// (its canonical String). An empty spec is allreduce; a bad one, or a hook that cannot run
// on workers ranks (ddp.CheckWorldSize; workers 0: not checked), is an error naming -hook.
func ParseHook(spec string, workers int) (hooks.Config, error) {
	if strings.TrimSpace(spec) == "" {
		spec = "allreduce"
	}
	c, err := hooks.ParseConfig(spec)
	if err != nil {
		return hooks.Config{}, fmt.Errorf("-hook %q: %w", spec, err)
	}
	if workers > 0 {
		h, err := c.New()
		if err == nil {
			err = ddp.CheckWorldSize(h, workers)
		}
		if err != nil {
			return hooks.Config{}, fmt.Errorf("-hook %s with -workers %d: %w", c, workers, err)
		}
	}
	return c, nil
}

// Setup is a rank's set-up, the same in every program: the comm hook from its spec, DDP
// around the model with it (bucket cap, the program's options, and for a hook that plans its
// buckets from measured costs the profile it needs), then the optimizer of Flags over DDP's
// parameters, installed as DDP's corrector when it is one:
//
//	hook, err := train.ParseHook("spardl:density=0.01", workers) // once, in the flag check
//	rep, err := train.Setup{Hook: hook, Flags: &flags}.New(ctx, g, model) // on every rank
//	// rep.DDP wraps model; rep.Optimizer steps its parameters
type Setup struct {
	// Hook is the parsed -hook spec (ParseHook); New builds this rank's own hook from it.
	// The zero Config means allreduce.
	Hook hooks.Config
	// Flags build the optimizer (-optim, -lr, -momentum, -wd); required.
	Flags *Flags
	// BucketMB caps every DDP bucket at BucketMB MiB (-bucket-mb; 0: ddp's defaults).
	BucketMB float64
	// Options are the program's own DDP options (e.g. ddp.WithBroadcastBuffers, a bucket
	// observer), applied after the comm hook and before the bucket cap.
	Options []ddp.Option
	// Profile is -profile: where a hook that plans from measured costs (omgs) loads its
	// profile from, or saves the one it measures to (empty: measure, save nothing).
	Profile string
	// ProfileStep makes the training step such a hook's profile is measured on (a forward
	// and backward of the model, before DDP wraps it, on this rank's next training batch)
	// and a function that releases what it holds. It is called only for such hooks; nil
	// refuses them.
	ProfileStep func() (step profile.Step, stop func(), err error)
	// Stdout receives the profile's messages (rank 0 prints them; nil: io.Discard).
	Stdout io.Writer
	// Agree are the program's own settings that every rank must share (Fields makes them
	// from a name → value map): the model's name, batch, seed, steps, epochs, the data set's
	// identity, clipping, evaluation and checkpoint periods, whether it resumes…. New agrees
	// on them, with the set-up's own (world size, hook, optimizer, schedule, -lr, -momentum,
	// -wd, -warmup, -bucket-mb, -log-every) and a digest of the model's parameter names and
	// shapes, before anything else is communicated; see the package doc for what may differ.
	Agree []comm.Field
}

// Replica is one rank's trained model: DDP around it with the comm hook, and the optimizer.
type Replica struct {
	Hook      ddp.CommHook
	DDP       *ddp.DDP
	Optimizer optim.Optimizer

	group   comm.Group
	traffic comm.Stats // the group's counters when the set-up ended
}

// New sets up model on g (see Setup). Every rank of g must call it: the agreement on the
// settings (Agree), DDP's start and the profile's measurement are collective. Ranks whose
// settings differ all get an error wrapping the *comm.ConfigError that names the first
// differing field, its values and the ranks that have each.
func (s Setup) New(ctx context.Context, g comm.Group, model nn.Module) (*Replica, error) {
	if s.Flags == nil {
		return nil, errors.New("train: Setup.Flags is nil: the set-up builds the optimizer from them")
	}
	cfg := s.Hook
	if cfg.Name() == "" {
		var err error
		if cfg, err = ParseHook("", 0); err != nil {
			return nil, err
		}
	}
	hook, err := cfg.New()
	if err != nil {
		return nil, fmt.Errorf("-hook %s: %w", cfg, err)
	}
	// Every rank must train the same thing: refuse a rank started with other settings before
	// the first collective that depends on them (the profile, DDP's start) runs.
	if err := s.agree(ctx, g, model, cfg); err != nil {
		return nil, err
	}
	opts := append([]ddp.Option{ddp.WithCommHook(hook)}, s.Options...)
	if s.BucketMB > 0 {
		capBytes := int(s.BucketMB * (1 << 20))
		opts = append(opts, ddp.WithBucketCap(capBytes, capBytes))
	}
	stdout := s.Stdout
	if stdout == nil {
		stdout = io.Discard
	}
	newStep := s.ProfileStep
	if newStep == nil {
		newStep = func() (profile.Step, func(), error) {
			return nil, nil, errNoProfileStep
		}
	}
	opts, err = withProfile(ctx, g, model, hook, s.Profile, stdout, opts, newStep)
	if err != nil {
		return nil, err
	}
	traffic := g.Counters().Snapshot() // training's traffic, not the set-up's (omgs's profile)
	dp, err := ddp.New(ctx, model, g, opts...)
	if err != nil {
		return nil, err
	}
	opt, err := s.Flags.NewOptimizer(dp, hook) // also LGP's corrector for hooks that deliver results late (osp)
	if err != nil {
		return nil, err
	}
	return &Replica{Hook: hook, DDP: dp, Optimizer: opt, group: g, traffic: traffic}, nil
}

// Traffic is the rank's communication since the set-up ended: training's and evaluation's,
// not the profile's.
func (r *Replica) Traffic() comm.Stats {
	return r.group.Counters().Snapshot().Sub(r.traffic)
}
