package hooks

import (
	"context"
	"fmt"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
)

// sparseHook is what the baseline sparse hooks (TopkA, TopkDSA, gTopk) share: the density and
// dense_warmup options, the per-bucket Memory, ddp.Stateful, and the dense warm-up path.
type sparseHook struct {
	name string
	// Density is k/n, in (0, 1]; k = max(1, int(n·density)).
	Density float64
	// DenseWarmup is how many first calls of each bucket use a dense all-reduce.
	DenseWarmup int

	mem *Memory
}

// memory returns the hook's Memory (the constructors create it; a hook built as a struct
// literal gets one on its first call, which DDP makes before any other).
func (h *sparseHook) memory() *Memory {
	if h.mem == nil {
		h.mem = NewMemory(h.name)
	}
	return h.mem
}

// Name returns the hook's registered name.
func (h *sparseHook) Name() string { return h.name }

// State returns the residuals (ddp.Stateful).
func (h *sparseHook) State() (map[string][]float32, error) { return h.memory().State() }

// LoadState restores State's output (ddp.Stateful).
func (h *sparseHook) LoadState(st map[string][]float32) error { return h.memory().LoadState(st) }

func (h *sparseHook) check() error {
	if !(h.Density > 0 && h.Density <= 1) {
		return fmt.Errorf("hooks: %s: option density=%v, want a number in (0, 1]", h.name, h.Density)
	}
	if h.DenseWarmup < 0 {
		return fmt.Errorf("hooks: %s: option dense_warmup=%d, want >= 0", h.name, h.DenseWarmup)
	}
	return nil
}

// k is the number of entries each rank selects from a bucket of n elements.
func (h *sparseHook) k(n int) int { return min(n, max(1, int(float64(n)*h.Density))) }

// sparseStep is one sparse call: flat holds the local gradient g on entry and must hold the
// averaged result on return; st.Residual is ξ.
type sparseStep func(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState) error

// run does what every baseline does around its sparse step: the prologue (beginCall), the
// dense warm-up, and the error naming the hook and the bucket.
func (h *sparseHook) run(ctx context.Context, g comm.Group, b ddp.Bucket, step sparseStep) ddp.Future {
	out, err := h.call(ctx, g, b, step)
	return result(h.name, b, out, err)
}

func (h *sparseHook) call(ctx context.Context, g comm.Group, b ddp.Bucket, step sparseStep) ([]float32, error) {
	st, call, err := beginCall(h.memory(), g, b, h.check, indexable(h.name, b))
	if err != nil {
		return nil, err
	}
	flat := b.Flat()
	if call < int64(h.DenseWarmup) {
		return denseAverage(ctx, g, b.Tag()+tagDense, flat, st.Residual)
	}
	if len(flat) == 0 {
		return flat, nil
	}
	return flat, step(ctx, g, b.Tag(), flat, st)
}

// beginCall is the prologue every hook with a Memory runs before its algorithm (the
// baselines, spardl, powersgd): the checks in order (its options, then what it needs of the
// bucket; the first error stops), the bucket's state (created, or a restored one checked
// against the bucket) and the call counter. It returns the state and this call's number on
// the bucket, from 0, dense warm-up calls included.
func beginCall(mem *Memory, g comm.Group, b ddp.Bucket, checks ...func() error) (*BucketState, int64, error) {
	for _, check := range checks {
		if err := check(); err != nil {
			return nil, 0, err
		}
	}
	st, err := mem.Bucket(g, b)
	if err != nil {
		return nil, 0, err
	}
	call := st.Calls
	st.Calls++
	return st, call, nil
}

// indexable is the check of a hook that sends COO indices: b's positions fit int32.
func indexable(hook string, b ddp.Bucket) func() error {
	return func() error { return checkIndexable(hook, len(b.Flat())) }
}

// result is the completed Future of a hook that did its work inside Run: out, or err
// prefixed with the hook and the bucket.
func result(hook string, b ddp.Bucket, out []float32, err error) ddp.Future {
	if err != nil {
		return ddp.Ready(nil, fmt.Errorf("hooks: %s: bucket %d: %w", hook, b.Index(), err))
	}
	return ddp.Ready(out, nil)
}

// baselineOptions are the options every baseline takes.
var baselineOptions = []Option{
	{Name: "density", Default: "0.01", Help: "k/n, in (0, 1]"},
	{Name: "dense_warmup", Default: "0", Help: "first N calls of each bucket use a dense all-reduce"},
}

// parseBaseline reads the baseline options.
func parseBaseline(o Values) (density float64, denseWarmup int, err error) {
	if density, err = o.Float("density"); err != nil {
		return 0, 0, err
	}
	if denseWarmup, err = o.Int("dense_warmup"); err != nil {
		return 0, 0, err
	}
	return density, denseWarmup, nil
}

// newBaseline is the registry's constructor of a baseline: its options read, then ctor.
func newBaseline[H ddp.CommHook](ctor func(density float64, denseWarmup int) (H, error)) func(Values) (ddp.CommHook, error) {
	return func(o Values) (ddp.CommHook, error) {
		density, warm, err := parseBaseline(o)
		if err != nil {
			return nil, err
		}
		return ctor(density, warm)
	}
}

// newSparseHook checks the options of a baseline.
func newSparseHook(name string, density float64, denseWarmup int) (sparseHook, error) {
	h := sparseHook{name: name, Density: density, DenseWarmup: denseWarmup, mem: NewMemory(name)}
	return h, h.check()
}
