package ddp

import (
	"context"
	"fmt"
	"strings"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/nn"
)

// DDP wraps one replica of a model on one rank of a group.
type DDP struct {
	model   nn.Module
	params  []*nn.Param
	buffers []*nn.Buffer
	group   comm.Group
	reducer *Reducer
	plan    [][]int
	cfg     config
	noSync  bool
	late    *lateState // late results and LGP (late.go)
	// bufFlat is SyncBuffers' message buffer, reused every step.
	bufFlat []float32
	// serial and hookIDs bind the hook instance to this DDP (bind.go); closed is set by Close.
	serial  uint64
	hookIDs []hookID
	closed  bool
}

type config struct {
	hook             CommHook
	firstBucketBytes int
	bucketBytesCap   int
	plan             [][]int
	broadcastBuffers bool
	observer         BucketObserver
}

// Option configures New.
type Option func(*config)

// WithCommHook selects how buckets are communicated (default: AllReduceHook, the dense
// average).
func WithCommHook(h CommHook) Option { return func(c *config) { c.hook = h } }

// WithBucketCap sets the first bucket's and the later buckets' caps in bytes (defaults
// DefaultFirstBucketBytes and DefaultBucketBytesCap).
func WithBucketCap(firstBytes, capBytes int) Option {
	return func(c *config) { c.firstBucketBytes, c.bucketBytesCap = firstBytes, capBytes }
}

// WithPlan fixes the buckets: groups of indices into the model's parameters in
// declaration order, communicated in the given order.
func WithPlan(plan [][]int) Option { return func(c *config) { c.plan = plan } }

// WithBroadcastBuffers chooses whether rank 0's buffers (BatchNorm running statistics)
// are broadcast after every synchronised step (default true, like PyTorch's
// broadcast_buffers), so that every replica's whole state is identical.
func WithBroadcastBuffers(on bool) Option { return func(c *config) { c.broadcastBuffers = on } }

// BucketObserver sees every bucket's local gradients just before the comm hook gets the
// bucket (gradient recorders such as gradrec.Recorder). ObserveBucket runs on DDP's
// communication goroutine, once per bucket per synchronised iteration, in bucket order; it
// must only read b (copy what it keeps: the hook may use Flat as scratch afterwards), so
// training computes the same numbers with and without an observer. An error stops the
// iteration like a hook's error.
type BucketObserver interface {
	ObserveBucket(g comm.Group, b Bucket) error
}

// WithBucketObserver installs o to see each bucket before the comm hook (nil: none).
func WithBucketObserver(o BucketObserver) Option { return func(c *config) { c.observer = o } }

// New wraps model for data-parallel training on g. Every rank calls it with its own
// replica. It checks that all ranks have the same parameter names and shapes (the
// error names the first mismatch and the ranks), broadcasts rank 0's parameters and
// buffers, and builds the bucket plan: WithPlan's, else the hook's own if it is a Planner
// that returns one, else size-capped like PyTorch. A hook that cannot run at the group's
// world size (a WorldSizeChecker: gTopk needs a power of two) is refused first, with an
// error naming the hook and P.
//
// The hook instance is bound to the new DDP until Close (bind.go): a hook that another
// rank's DDP holds is refused, on every rank alike (the ranks exchange their verdicts with
// the parameter shapes), with an error that says to build one hook per rank.
func New(ctx context.Context, model nn.Module, g comm.Group, opts ...Option) (*DDP, error) {
	cfg := config{firstBucketBytes: DefaultFirstBucketBytes, bucketBytesCap: DefaultBucketBytesCap, broadcastBuffers: true}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.hook == nil {
		cfg.hook = AllReduceHook{}
	}
	if cfg.firstBucketBytes <= 0 || cfg.bucketBytesCap <= 0 {
		return nil, fmt.Errorf("ddp: bucket caps must be positive, got first %d and cap %d bytes", cfg.firstBucketBytes, cfg.bucketBytesCap)
	}
	if err := CheckWorldSize(cfg.hook, g.Size()); err != nil {
		return nil, err // every rank refuses alike, before any message
	}
	d := &DDP{model: model, params: nn.Parameters(model), buffers: nn.Buffers(model), group: g, cfg: cfg}
	if len(d.params) == 0 {
		return nil, fmt.Errorf("ddp: the model has no parameters")
	}
	bindErr := d.bindHook()
	if err := d.checkShapes(ctx, bindErr); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.broadcastState(ctx); err != nil {
		d.Close()
		return nil, err
	}
	switch {
	case cfg.plan != nil:
		d.plan = cfg.plan
	default:
		if p, ok := cfg.hook.(Planner); ok {
			plan, err := p.Plan(d.params)
			if err != nil {
				d.Close()
				return nil, fmt.Errorf("ddp: hook %s: planning buckets: %w", cfg.hook.Name(), err)
			}
			d.plan = plan
		}
		if d.plan == nil { // no Planner, or one that keeps the default
			d.plan = SizeCappedPlan(d.params, cfg.firstBucketBytes, cfg.bucketBytesCap)
		}
	}
	if err := validatePlan(d.plan, len(d.params)); err != nil {
		d.Close()
		return nil, err
	}
	reducer, err := newReducer(ctx, g, cfg.hook, d.params, d.plan)
	if err != nil {
		d.Close()
		return nil, err
	}
	d.reducer = reducer
	d.reducer.observer = cfg.observer
	d.late = newLateState(d.params, d.plan)
	d.late.attach(d.reducer)
	return d, nil
}

// signature is one rank's parameter layout, one "name shape" line per parameter.
func signature(ps []*nn.Param) []string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = fmt.Sprintf("%s %v", p.Name, p.Value.Shape)
	}
	return lines
}

// checkShapes exchanges every rank's parameter layout, preceded by its verdict on binding
// the hook (bindErr; an empty line when bound), and fails alike on every rank when a rank
// refused the hook or a layout differs from rank 0's.
func (d *DDP) checkShapes(ctx context.Context, bindErr error) error {
	verdict := ""
	if bindErr != nil {
		verdict = strings.ReplaceAll(bindErr.Error(), "\n", " ")
	}
	mine := append([]string{verdict}, signature(d.params)...)
	all, err := comm.AllGatherBytes(ctx, d.group, tagShapeCheck, []byte(strings.Join(mine, "\n")))
	if err != nil {
		if bindErr != nil {
			return bindErr
		}
		return fmt.Errorf("ddp: exchanging parameter shapes: %w", err)
	}
	if bindErr != nil {
		return bindErr
	}
	for _, msg := range all {
		if v, _, _ := strings.Cut(string(msg), "\n"); v != "" {
			return fmt.Errorf("ddp: rank %d: not starting: %s", d.group.Rank(), strings.TrimPrefix(v, "ddp: "))
		}
	}
	ref := strings.Split(string(all[0]), "\n")[1:]
	for r := 1; r < len(all); r++ {
		other := strings.Split(string(all[r]), "\n")[1:]
		for i := 0; i < max(len(ref), len(other)); i++ {
			switch {
			case i >= len(other):
				return fmt.Errorf("ddp: rank 0 has %d parameters, rank %d has %d: rank 0's %q has no counterpart", len(ref), r, len(other), ref[i])
			case i >= len(ref):
				return fmt.Errorf("ddp: rank 0 has %d parameters, rank %d has %d: rank %d's %q has no counterpart", len(ref), r, len(other), r, other[i])
			case ref[i] != other[i]:
				return fmt.Errorf("ddp: parameter %d differs between ranks: rank 0 has %q, rank %d has %q", i, ref[i], r, other[i])
			}
		}
	}
	return nil
}

// broadcastState copies rank 0's parameters and buffers to every rank in one message.
func (d *DDP) broadcastState(ctx context.Context) error {
	var flat []float32
	if err := broadcastTensors(ctx, d.group, tagBroadcast, paramValues(d.params), &flat); err != nil {
		return fmt.Errorf("ddp: broadcasting rank 0's parameters: %w", err)
	}
	return d.SyncBuffers(ctx)
}

// SyncBuffers broadcasts rank 0's buffers (BatchNorm running statistics) to every rank.
func (d *DDP) SyncBuffers(ctx context.Context) error {
	if len(d.buffers) == 0 {
		return nil
	}
	ts := make([]*nn.Tensor, len(d.buffers))
	for i, b := range d.buffers {
		ts[i] = b.Value
	}
	if err := broadcastTensors(ctx, d.group, tagBufferSync, ts, &d.bufFlat); err != nil {
		return fmt.Errorf("ddp: broadcasting rank 0's buffers: %w", err)
	}
	return nil
}

// AverageBuffers replaces every rank's buffers (BatchNorm running statistics) by their mean
// over the ranks, as timm's distribute_bn "reduce" does before evaluation. With the default
// broadcast after every step the ranks' buffers differ only by their last update; use it
// with WithBroadcastBuffers(false), where each rank's statistics follow its own batches and
// the mean estimates them from P times as many images.
func (d *DDP) AverageBuffers(ctx context.Context) error {
	if len(d.buffers) == 0 {
		return nil
	}
	flat := d.bufFlat[:0]
	for _, b := range d.buffers {
		flat = append(flat, b.Value.Data...)
	}
	d.bufFlat = flat
	if err := comm.AllReduce(ctx, d.group, tagBufferAverage, flat, comm.Auto); err != nil {
		return fmt.Errorf("ddp: averaging the buffers over the ranks: %w", err)
	}
	inv := 1 / float32(d.group.Size())
	for _, b := range d.buffers {
		for i, v := range flat[:b.Value.Len()] {
			b.Value.Data[i] = v * inv
		}
		flat = flat[b.Value.Len():]
	}
	return nil
}

func paramValues(ps []*nn.Param) []*nn.Tensor {
	ts := make([]*nn.Tensor, len(ps))
	for i, p := range ps {
		ts[i] = p.Value
	}
	return ts
}

// broadcastTensors sends rank 0's ts to every rank in one message, packed into *scratch
// (grown as needed and kept for the next call).
func broadcastTensors(ctx context.Context, g comm.Group, tag uint32, ts []*nn.Tensor, scratch *[]float32) error {
	flat := (*scratch)[:0]
	for _, t := range ts {
		flat = append(flat, t.Data...)
	}
	*scratch = flat
	if err := comm.Broadcast(ctx, g, tag, 0, flat); err != nil {
		return err
	}
	for _, t := range ts {
		copy(t.Data, flat[:t.Len()])
		flat = flat[t.Len():]
	}
	return nil
}

// Module returns the wrapped model.
func (d *DDP) Module() nn.Module { return d.model }

// Forward runs the wrapped model. While a hook's late results are pending, a training
// forward (the tape records) runs on the LGP-corrected values and an evaluation forward
// (recording off) on the true values (late.go).
func (d *DDP) Forward(x *nn.Var) *nn.Var {
	var t *nn.Tape
	if x != nil {
		t = x.Tape()
	}
	d.late.forward(t)
	return d.model.Forward(x)
}

// BeforeForward prepares the parameters for a forward on tape t that does not go through
// Forward, for models whose forward takes more than one input (BERT's ids, token types and
// mask): call it, then run the model on t. It does what Forward does first: with a hook's
// late results pending, a training forward (t records) runs on the LGP-corrected values
// and an evaluation forward (recording off) on the true values.
func (d *DDP) BeforeForward(t *nn.Tape) { d.late.forward(t) }

// Parameters returns the model's parameters in declaration order.
func (d *DDP) Parameters() []*nn.Param { return d.params }

// Group returns the communicator.
func (d *DDP) Group() comm.Group { return d.group }

// Hook returns the comm hook in use.
func (d *DDP) Hook() CommHook { return d.cfg.hook }

// Plan returns the bucket plan: groups of parameter indices, in communication order.
func (d *DDP) Plan() [][]int { return d.plan }

// Stats returns the statistics of the last synchronised iteration.
func (d *DDP) Stats() IterationStats { return d.reducer.stats }

// Backward runs backward from loss on its tape. As each parameter's gradient becomes
// final, the Reducer copies it into its bucket; complete buckets go to the comm hook
// while backward continues. Backward returns once every bucket's result is in the
// parameters' Grad (averaged over ranks), and, with buffer broadcasting on, rank 0's
// buffers are on every rank. Inside NoSync it only accumulates local gradients.
//
// Gradients accumulate into Grad as in PyTorch: call ZeroGrad before each step's
// backward.
//
// When the hook defers results (late.go), Backward also waits for the previous
// iteration's late results and adds them to their parameters' Grad; a parameter deferred
// now gets in Grad only what arrived late for it; and the true values are back in p.Value.
func (d *DDP) Backward(ctx context.Context, loss *nn.Var) error {
	if err := d.holdsHook(); err != nil {
		return err
	}
	d.late.recordLoss(loss)
	tape := loss.Tape()
	if d.noSync {
		return tape.Backward(loss)
	}
	if err := d.checkCorrector(); err != nil {
		return err // every rank alike, before any message
	}
	r := d.reducer
	d.late.begin()
	r.begin(ctx)
	h := tape.OnGradReady(r.markReady)
	err := tape.Backward(loss)
	h.Remove()
	if err := r.finish(d.params, err); err != nil {
		return err
	}
	if err := d.late.settle(ctx, d.cfg.hook.Name(), &r.stats); err != nil {
		return err
	}
	if d.cfg.broadcastBuffers {
		return d.SyncBuffers(ctx)
	}
	return nil
}

// NoSync runs fn with gradient synchronisation off: backward passes inside it only
// accumulate local gradients (gradient accumulation). The next Backward outside NoSync
// synchronises the accumulated sum, like PyTorch's no_sync().
func (d *DDP) NoSync(fn func() error) error {
	d.noSync = true
	defer func() { d.noSync = false }()
	return fn()
}
