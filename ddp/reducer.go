package ddp

import (
	"context"
	"fmt"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/nn"
)

// bucket is the Reducer's state for one group of parameters.
type bucket struct {
	index   int
	params  []*nn.Param
	offsets []int
	flat    []float32
	pending int
	iter    int64
	last    bool
	stats   BucketStats
	late    *lateState // the whole model's view (ModelView) and late results
}

func (b *bucket) Index() int          { return b.index }
func (b *bucket) Iteration() int64    { return b.iter }
func (b *bucket) IsLast() bool        { return b.last }
func (b *bucket) Flat() []float32     { return b.flat }
func (b *bucket) Params() []*nn.Param { return b.params }
func (b *bucket) Offsets() []int      { return b.offsets }
func (b *bucket) Tag() uint32         { return firstBucketTag + uint32(b.index)*TagsPerBucket }

// BucketStats describes one bucket in the last synchronised iteration. Times are
// measured from the start of backward.
type BucketStats struct {
	Index     int
	Params    int
	Elements  int
	Bytes     int
	Ready     time.Duration // all gradients of the bucket final
	CommStart time.Duration // hook Run called
	CommEnd   time.Duration // hook result available
}

// IterationStats describes the last synchronised iteration.
type IterationStats struct {
	Iteration   int64
	BackwardEnd time.Duration // tape backward returned
	End         time.Duration // all buckets reduced and written back
	Buckets     []BucketStats
	// UnusedParams lists parameters the forward did not use; DDP reduced their
	// (unchanged) gradients like any other.
	UnusedParams []string
	// Deferred counts the elements whose averaged gradient the hook deferred to the next
	// step (late.go); LateWait is how long Backward waited, after the buckets, for the
	// previous iteration's late results (near zero when they were communicated while this
	// iteration computed).
	Deferred int
	LateWait time.Duration
}

// Reducer counts down the gradients of each bucket as the grad-ready hooks report
// them, launches complete buckets in plan order on a communication goroutine, and
// writes the hook's results back into the parameters' gradients.
type Reducer struct {
	group    comm.Group
	hook     CommHook
	observer BucketObserver // nil: none
	buckets  []*bucket
	where    map[*nn.Param][2]int // bucket, position in bucket
	iter     int64
	late     *lateState

	// per iteration
	start    time.Time
	ready    []bool // per bucket, in the current iteration
	launched int
	launch   chan *bucket
	done     chan error
	marked   map[*nn.Param]bool
	stats    IterationStats
}

// newReducer builds the buckets of plan. Their flat buffers are consecutive slices of one
// comm.AllocShared allocation (collective, under tagBucketArena): on a shared-memory group
// the dense all-reduce then reads the peers' buckets in place.
func newReducer(ctx context.Context, g comm.Group, hook CommHook, params []*nn.Param, plan [][]int) (*Reducer, error) {
	r := &Reducer{group: g, hook: hook, where: map[*nn.Param][2]int{}, marked: map[*nn.Param]bool{}}
	total := 0
	for _, group := range plan {
		for _, idx := range group {
			total += params[idx].Len()
		}
	}
	flat, err := comm.AllocShared[float32](ctx, g, tagBucketArena, total)
	if err != nil {
		return nil, fmt.Errorf("ddp: allocating the buckets: %w", err)
	}
	for bi, group := range plan {
		b := &bucket{index: bi, last: bi == len(plan)-1}
		n := 0
		for pi, idx := range group {
			p := params[idx]
			b.params = append(b.params, p)
			b.offsets = append(b.offsets, n)
			r.where[p] = [2]int{bi, pi}
			n += p.Len()
		}
		b.flat, flat = flat[:n:n], flat[n:]
		b.stats = BucketStats{Index: bi, Params: len(group), Elements: n, Bytes: 4 * n}
		r.buckets = append(r.buckets, b)
	}
	return r, nil
}

// begin prepares an iteration and starts the communication goroutine.
func (r *Reducer) begin(ctx context.Context) {
	r.start = time.Now()
	r.launched = 0
	r.ready = make([]bool, len(r.buckets))
	clear(r.marked)
	for _, b := range r.buckets {
		b.pending = len(b.params)
		b.iter = r.iter
	}
	r.stats = IterationStats{Iteration: r.iter}
	r.launch = make(chan *bucket, len(r.buckets))
	r.done = make(chan error, 1)
	go r.communicate(ctx, r.launch, r.done)
}

// communicate runs the hook on each launched bucket, in order, and writes results back.
func (r *Reducer) communicate(ctx context.Context, launch <-chan *bucket, done chan<- error) {
	var firstErr error
	for b := range launch {
		if firstErr != nil {
			continue // drain
		}
		if r.observer != nil {
			if err := r.observer.ObserveBucket(r.group, b); err != nil {
				firstErr = fmt.Errorf("ddp: iteration %d, bucket %d: observer: %w", b.iter, b.index, err)
				continue
			}
		}
		b.stats.CommStart = time.Since(r.start)
		fut := r.hook.Run(ctx, r.group, b)
		res, err := fut.Wait()
		b.stats.CommEnd = time.Since(r.start)
		if err == nil && len(res) != len(b.flat) {
			err = fmt.Errorf("ddp: hook %s returned %d values for bucket %d of %d elements", r.hook.Name(), len(res), b.index, len(b.flat))
		}
		if err == nil {
			err = r.late.writeBack(b, fut, res) // all but the deferred parameters
		}
		if err != nil {
			firstErr = fmt.Errorf("ddp: iteration %d, bucket %d (%d parameters, %d elements), hook %s: %w", b.iter, b.index, len(b.params), len(b.flat), r.hook.Name(), err)
			continue
		}
	}
	done <- firstErr
}

// markReady is the grad-ready hook: it copies p's gradient into its bucket and launches
// every bucket that is complete and whose predecessors have been launched.
func (r *Reducer) markReady(p *nn.Param) {
	loc, ok := r.where[p]
	if !ok || r.marked[p] {
		return // not a parameter of this model, or already counted
	}
	r.marked[p] = true
	b := r.buckets[loc[0]]
	copy(b.flat[b.offsets[loc[1]]:], p.Grad.Data)
	b.pending--
	if b.pending == 0 {
		b.stats.Ready = time.Since(r.start)
		r.ready[b.index] = true
		for r.launched < len(r.buckets) && r.ready[r.launched] {
			r.launch <- r.buckets[r.launched]
			r.launched++
		}
	}
}

// finish marks parameters the forward did not use as ready, waits for every bucket and
// records the statistics.
func (r *Reducer) finish(params []*nn.Param, backwardErr error) error {
	r.stats.BackwardEnd = time.Since(r.start)
	if backwardErr == nil {
		for _, p := range params {
			if !r.marked[p] {
				r.stats.UnusedParams = append(r.stats.UnusedParams, p.Name)
				r.markReady(p)
			}
		}
	}
	close(r.launch)
	err := <-r.done
	if backwardErr != nil {
		return backwardErr
	}
	r.stats.End = time.Since(r.start)
	for _, b := range r.buckets {
		r.stats.Buckets = append(r.stats.Buckets, b.stats)
	}
	r.iter++
	return err
}
