package ddp

import (
	"context"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// AllReduceHook is the dense baseline: sum the bucket over all ranks with an all-reduce
// and divide by the world size (PyTorch's default allreduce_hook). Algorithm chooses
// the collective (comm.Auto picks by message size).
type AllReduceHook struct {
	Algorithm comm.Algorithm
}

// Name returns "allreduce".
func (AllReduceHook) Name() string { return "allreduce" }

// Run all-reduces the bucket in place and averages it.
func (h AllReduceHook) Run(ctx context.Context, g comm.Group, b Bucket) Future {
	buf := b.Flat()
	if err := comm.AllReduce(ctx, g, b.Tag(), buf, h.Algorithm); err != nil {
		return Ready(nil, err)
	}
	kernels.Scale(1/float32(g.Size()), buf)
	return Ready(buf, nil)
}
