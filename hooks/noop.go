package hooks

import (
	"context"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
)

// Noop is PyTorch's noop_hook (debugging_hooks.py): it returns the bucket as it is, the
// rank's own undivided local gradient, without any communication. It does not train a
// data-parallel model correctly: every rank steps with its own gradient, so the replicas drift
// apart. Its only use is head-room analysis: if a run with noop is not much faster than with
// allreduce, communication is not the bottleneck.
type Noop struct{}

var _ ddp.CommHook = Noop{}

// Name returns "noop".
func (Noop) Name() string { return "noop" }

// Run returns b.Flat() unchanged.
func (Noop) Run(_ context.Context, _ comm.Group, b ddp.Bucket) ddp.Future {
	return ddp.Ready(b.Flat(), nil)
}

func init() {
	Register(Spec{
		Name: "noop",
		Summary: "NO communication: each rank keeps its local, undivided gradient (PyTorch's noop_hook); " +
			"it does NOT train correctly (replicas diverge): only for measuring communication head-room",
		New: func(Values) (ddp.CommHook, error) { return Noop{}, nil },
	})
}
