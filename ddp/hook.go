package ddp

import (
	"context"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/nn"
)

// Bucket is what a comm hook sees: the concatenated local gradients of some
// parameters, not yet divided by the world size (PyTorch's GradBucket).
type Bucket interface {
	// Index is the bucket's position in the plan; buckets run in index order.
	Index() int
	// Iteration counts synchronised backward passes from 0.
	Iteration() int64
	// IsLast reports whether this is the last bucket of the iteration.
	IsLast() bool
	// Flat is the concatenated local gradients. The hook may read it and may use it as
	// scratch; DDP refills it every iteration.
	Flat() []float32
	// Params and Offsets: parameter i occupies Flat()[Offsets()[i] : Offsets()[i]+Params()[i].Len()].
	Params() []*nn.Param
	Offsets() []int
	// Tag is a message tag reserved for this bucket: Tag()..Tag()+TagsPerBucket-1 are
	// free for the hook's collectives and point-to-point messages.
	Tag() uint32
}

// TagsPerBucket is how many consecutive tags each bucket owns (see Bucket.Tag).
const TagsPerBucket = 64

// Tags below firstBucketTag are DDP's own (start-up checks, broadcasts).
const (
	tagShapeCheck    uint32 = 1
	tagBroadcast     uint32 = 2
	tagBufferSync    uint32 = 3
	tagBufferAverage uint32 = 4
	tagBucketArena   uint32 = 5
	firstBucketTag   uint32 = 1 << 16
)

// CommHook communicates one bucket. DDP calls Run once per bucket per iteration, in
// bucket order, on every rank, from a goroutine of its own while backward goes on; the
// next bucket's Run starts after the previous Future has completed (one bucket in
// flight, like a single NCCL stream). The Future's result is the averaged gradient:
// len(b.Flat()) values that DDP copies into the parameters' Grad. DDP does not divide:
// the hook does.
//
// A hook keeps its state (residuals, thresholds) per bucket index.
type CommHook interface {
	Name() string
	Run(ctx context.Context, g comm.Group, b Bucket) Future
}

// Future is the pending result of a hook (PyTorch's torch.futures.Future). Why Run returns
// one although every hook here completes inside Run is in the package doc ("Futures").
type Future interface {
	Wait() ([]float32, error)
}

// Ready returns a completed Future, for hooks that do their work inside Run.
func Ready(result []float32, err error) Future { return readyFuture{result, err} }

type readyFuture struct {
	v   []float32
	err error
}

func (f readyFuture) Wait() ([]float32, error) { return f.v, f.err }

// Then returns a Future whose result is fn applied to f's (PyTorch's Future.then): a wrapper
// hook (the 16-bit wrappers) transforms its inner hook's result when it is waited for,
// without waiting inside Run. fn runs once, on the first Wait, and only when f succeeded;
// f's error passes through. When f is a LateFuture its Late part passes through unchanged:
// fn sees only the result of now.
func Then(f Future, fn func([]float32) ([]float32, error)) Future {
	t := &thenFuture{inner: f, fn: fn}
	if lf, ok := f.(LateFuture); ok {
		return Defer(t, lf.Late())
	}
	return t
}

type thenFuture struct {
	inner Future
	fn    func([]float32) ([]float32, error)
	once  sync.Once
	v     []float32
	err   error
}

func (f *thenFuture) Wait() ([]float32, error) {
	f.once.Do(func() {
		f.v, f.err = f.inner.Wait()
		if f.err == nil {
			f.v, f.err = f.fn(f.v)
		}
	})
	return f.v, f.err
}

// Planner is implemented by hooks that choose the buckets themselves (OMGS merges
// layers by a cost model). Plan returns groups of indices into params (the model's
// parameters in declaration order); every index must appear exactly once. A nil plan
// (and nil error) keeps DDP's size-capped default. What a planner plans from (OMGS: costs
// measured before New, package hooks/profile) it holds itself: DDP only asks.
type Planner interface {
	Plan(params []*nn.Param) ([][]int, error)
}

// Stateful hooks save and restore their state with checkpoints.
type Stateful interface {
	State() (map[string][]float32, error)
	LoadState(map[string][]float32) error
}
