package train

import (
	"context"
	"errors"
	"io"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// NewHook builds the comm hook a -hook spec names (see `spargo hooks`). It is the one place
// where a program's -hook becomes a hook: Setup.New calls it on every rank, and the programs'
// flag checks call it to refuse a bad spec before they load any data.
func NewHook(spec string) (ddp.CommHook, error) {
	return hooks.Parse(spec)
}

// Setup is a rank's set-up, the same in every program: the comm hook from its spec, DDP
// around the model with it (bucket cap, the program's options, and for a hook that plans its
// buckets from measured costs the profile it needs), then the optimizer of Flags over DDP's
// parameters, installed as DDP's corrector when it is one:
//
//	rep, err := train.Setup{Hook: "spardl:density=0.01", Flags: &flags}.New(ctx, g, model)
//	// rep.DDP wraps model; rep.Optimizer steps its parameters
type Setup struct {
	// Hook is the -hook spec ("allreduce", "spardl:density=0.01", …); empty means allreduce.
	Hook string
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
}

// Replica is one rank's trained model: DDP around it with the comm hook, and the optimizer.
type Replica struct {
	Hook      ddp.CommHook
	DDP       *ddp.DDP
	Optimizer optim.Optimizer

	group   comm.Group
	traffic comm.Stats // the group's counters when the set-up ended
}

// New sets up model on g (see Setup). Every rank of g must call it: DDP's start and the
// profile's measurement are collective.
func (s Setup) New(ctx context.Context, g comm.Group, model nn.Module) (*Replica, error) {
	if s.Flags == nil {
		return nil, errors.New("train: Setup.Flags is nil: the set-up builds the optimizer from them")
	}
	spec := s.Hook
	if spec == "" {
		spec = "allreduce"
	}
	hook, err := NewHook(spec)
	if err != nil {
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
