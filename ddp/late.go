package ddp

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// Late results: a two-stage hook (OSP) returns some parameters' averaged gradients now
// and leaves the others to be communicated while the next iteration computes. This file
// holds the contract between such a hook, DDP and the optimizer, and DDP's bookkeeping.
//
// The representation. Every parameter has a true value, identical on every rank, that only
// the optimizer changes and only with global (averaged) gradients. A deferred parameter's
// global gradient of iteration t reaches the optimizer at step t+1 (one step late), added to
// whatever step t+1 brings for it; at step t its gradient holds only what arrived for it
// (the late result of t-1, or zero). So each global gradient is applied exactly once, and
// every parameter gets exactly one optimizer step per iteration, as in a dense run with the
// deferred gradients shifted by one step: momentum and weight decay act on the true values.
//
// LGP (local-gradient-based parameter correction). The shift makes the true values lag
// behind the dense run's, and with momentum the lag is not just the pending gradient's step:
// for a parameter deferred every iteration it is the dense run's whole last step, momentum
// included, and it decays over about 1/(1−momentum) steps after the parameter's gradient
// stops being deferred. Training on the lagging values can destabilise (a VGG-11 whose
// classifier alone was deferred, lr 0.01, momentum 0.9, corrected by the pending step only:
// loss 7.2 after 20 steps, against 2.8 dense). So, for deferrals that ask for
// it, the optimizer (a Corrector) follows the dense-equivalent trajectory next to the true
// one: DDP tells it, before each step, how the dense run's gradient differs from the applied
// one (Diverge: the rank's local gradient stands for a pending global gradient), and when a
// late result arrives, how far that local estimate was off (Revise); the optimizer's update
// is linear in the gradient, so it keeps the exact difference (Offset) of the two values.
// Training forwards run on true value + offset: the dense run's parameters (weight decay
// taken from the true values), except that the newest deferred gradient is this rank's local
// one. Without momentum the offset is the paper's −lr·g while the gradient is pending and
// vanishes once it is applied. DDP saves the true value before adding the offset and copies it back (bit
// for bit, never by subtracting) at the end of the next Backward, before the optimizer runs.
// So from the end of Backward until the next training Forward p.Value holds the true values:
// that is when the optimizer steps and when checkpoints and evaluation read them.

// Deferred is the part of a bucket's result that a hook delivers after the step.
type Deferred struct {
	// Params are the deferred parameters, as indices into the bucket's Params(), ascending.
	Params []int
	// Result delivers their averaged gradients concatenated in the order of Params
	// (Σ Params()[i].Len() values). DDP waits for it at the end of the next synchronised
	// Backward (or in Flush), so the hook may communicate during the next forward and
	// backward. It runs under the context of the Run that deferred it. DDP only reads the
	// returned slice.
	Result Future
	// Correct asks for LGP: training forwards use the parameter's true value plus the
	// Corrector's offset, the rank's local gradient standing in for the pending one.
	Correct bool
}

// LateFuture is a Future that leaves part of its bucket's result for later. DDP calls Late
// once, after Wait returned without error; Wait's values at the deferred parameters are
// ignored. An empty Deferred means nothing is deferred.
type LateFuture interface {
	Future
	Late() Deferred
}

// Defer returns a LateFuture whose Wait is now's and whose Late is d.
func Defer(now Future, d Deferred) Future { return lateFuture{now, d} }

type lateFuture struct {
	Future
	d Deferred
}

func (f lateFuture) Late() Deferred { return f.d }

// Corrector is the optimizer's part of LGP: for each parameter it follows the difference
// between the dense-equivalent trajectory and the true one. optim.SGD implements it exactly.
// DDP calls it on the training goroutine, between Backward and the optimizer's Step.
type Corrector interface {
	// Diverge adds diff to how much p's dense-equivalent gradient exceeds the gradient the
	// coming Step applies to p. It returns false when p is not one of the optimizer's
	// parameters (DDP then gives p no offset).
	Diverge(p *nn.Param, diff []float32) bool
	// Revise says that the difference given for p before the last Step was off by delta
	// (it should have been diff+delta): a late global gradient replaced its local estimate.
	Revise(p *nn.Param, delta []float32)
	// Offset returns p's dense-equivalent value minus its true value after the last Step, or
	// nil once that difference has died out. DDP only reads it.
	Offset(p *nn.Param) []float32
}

// ModelView is implemented by the Buckets DDP hands to hooks (type-assert a Bucket to it):
// the whole model, for hooks whose decisions span buckets. OSP ranks every parameter before
// the first bucket is sent.
type ModelView interface {
	// PlanParams returns the parameters of every bucket: PlanParams()[i] are bucket i's
	// Params() in order. Read-only.
	PlanParams() [][]*nn.Param
	// TrueValue returns p's true value (see the package doc): p.Value.Data, or DDP's saved
	// copy while an LGP offset is applied. Read-only; valid until Backward returns.
	TrueValue(p *nn.Param) []float32
}

// TrueValue returns p's true value as b's DDP knows it, or p.Value.Data when b is not one of
// DDP's buckets.
func TrueValue(b Bucket, p *nn.Param) []float32 {
	if mv, ok := b.(ModelView); ok {
		return mv.TrueValue(p)
	}
	return p.Value.Data
}

// EpochInfo is what EndEpoch tells the hook. Every rank gets the same values.
type EpochInfo struct {
	// Epoch counts finished epochs from 1.
	Epoch int
	// Loss is the mean over the ranks of each rank's mean Backward loss in the epoch;
	// FirstLoss the mean over the ranks of the epoch's first Backward loss (for epoch 1, the
	// loss at the start of training). NaN when a rank ran no Backward.
	Loss, FirstLoss float64
	// Tag is reserved for the hook's own collectives inside EndEpoch.
	Tag uint32
}

// EpochObserver is implemented by hooks that adapt per epoch (OSP's budget, the paper's
// Algorithm 1). DDP.EndEpoch calls EndEpoch on every rank, between steps.
type EpochObserver interface {
	EndEpoch(ctx context.Context, g comm.Group, e EpochInfo) error
}

// DDP's tags for epoch ends (below firstBucketTag; kept apart from hook.go's list).
const (
	tagEpochLoss uint32 = 32
	tagEpochHook uint32 = 33
)

// lateBucket is one bucket's deferral in one iteration.
type lateBucket struct {
	b       *bucket
	params  []*nn.Param
	elems   int
	result  Future
	correct bool
}

// lateState is DDP's bookkeeping of late results (one per DDP).
type lateState struct {
	planParams [][]*nn.Param
	corrector  Corrector

	cur   []lateBucket            // deferred in the running iteration (written by the comm goroutine)
	prev  []lateBucket            // deferred in the last synchronised iteration: results pending
	local map[*nn.Param][]float32 // LGP: the rank's local gradient of a pending parameter
	// LGP offsets: the model's parameters (any may have an offset, also one restored with
	// the optimizer's state), and the true values saved while the offsets are in p.Value.
	params  []*nn.Param
	saved   map[*nn.Param][]float32
	applied bool
	free    map[int][][]float32
	scratch []float32

	// losses seen by Backward since the last EndEpoch
	lossSum   float64
	lossN     int64
	firstLoss float64
	epochs    int
}

func newLateState(params []*nn.Param, plan [][]int) *lateState {
	l := &lateState{local: map[*nn.Param][]float32{}, params: params, saved: map[*nn.Param][]float32{},
		free: map[int][][]float32{}, firstLoss: math.NaN()}
	for _, group := range plan {
		ps := make([]*nn.Param, len(group))
		for i, idx := range group {
			ps[i] = params[idx]
		}
		l.planParams = append(l.planParams, ps)
	}
	return l
}

// attach lets the reducer and its buckets reach l.
func (l *lateState) attach(r *Reducer) {
	r.late = l
	for _, b := range r.buckets {
		b.late = l
	}
}

// PlanParams implements ModelView.
func (b *bucket) PlanParams() [][]*nn.Param { return b.late.planParams }

// TrueValue implements ModelView.
func (b *bucket) TrueValue(p *nn.Param) []float32 { return b.late.trueValue(p) }

func (l *lateState) trueValue(p *nn.Param) []float32 {
	if l.applied {
		if v := l.saved[p]; v != nil {
			return v
		}
	}
	return p.Value.Data
}

func (l *lateState) get(n int) []float32 {
	if s := l.free[n]; len(s) > 0 {
		b := s[len(s)-1]
		l.free[n] = s[:len(s)-1]
		return b
	}
	return make([]float32, n)
}

func (l *lateState) put(b []float32) {
	if b != nil {
		l.free[len(b)] = append(l.free[len(b)], b)
	}
}

// writeBack copies a bucket's result into its parameters' gradients, except the deferred
// ones, whose gradients keep the rank's local values until settle. It runs on the comm
// goroutine.
func (l *lateState) writeBack(b *bucket, fut Future, res []float32) error {
	var d Deferred
	if lf, ok := fut.(LateFuture); ok {
		d = lf.Late()
	}
	if len(d.Params) == 0 {
		for i, p := range b.params {
			copy(p.Grad.Data, res[b.offsets[i]:b.offsets[i]+p.Len()])
		}
		return nil
	}
	if d.Result == nil {
		return fmt.Errorf("deferred %d parameters without a late result", len(d.Params))
	}
	lb := lateBucket{b: b, result: d.Result, correct: d.Correct}
	next := 0
	for _, i := range d.Params {
		if i < next || i >= len(b.params) {
			return fmt.Errorf("deferred parameter indices %v: want ascending indices into the bucket's %d parameters", d.Params, len(b.params))
		}
		for ; next < i; next++ {
			p := b.params[next]
			copy(p.Grad.Data, res[b.offsets[next]:b.offsets[next]+p.Len()])
		}
		next = i + 1
		lb.params = append(lb.params, b.params[i])
		lb.elems += b.params[i].Len()
	}
	for ; next < len(b.params); next++ {
		p := b.params[next]
		copy(p.Grad.Data, res[b.offsets[next]:b.offsets[next]+p.Len()])
	}
	l.cur = append(l.cur, lb)
	return nil
}

// begin starts a synchronised iteration (a failed one leaves no deferrals behind).
func (l *lateState) begin() { l.cur = l.cur[:0] }

// recordLoss notes a Backward's loss for EndEpoch.
func (l *lateState) recordLoss(loss *nn.Var) {
	v := float64(loss.Item())
	if math.IsNaN(v) && len(loss.Value.Data) != 1 {
		return // not a scalar loss
	}
	if l.lossN == 0 {
		l.firstLoss = v
	}
	l.lossSum += v
	l.lossN++
}

// waitCtx waits for f, or for ctx.
func waitCtx(ctx context.Context, f Future) ([]float32, error) {
	type result struct {
		v   []float32
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f.Wait()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// waitPrev waits for every late result of the last synchronised iteration.
func (l *lateState) waitPrev(ctx context.Context, hook string) ([][]float32, error) {
	res := make([][]float32, len(l.prev))
	for i, lb := range l.prev {
		v, err := waitCtx(ctx, lb.result)
		if err == nil && len(v) != lb.elems {
			err = fmt.Errorf("hook %s delivered %d late values for the %d deferred elements of bucket %d", hook, len(v), lb.elems, lb.b.index)
		}
		if err != nil {
			return nil, fmt.Errorf("ddp: late result of bucket %d (%d parameters, %d elements): %w", lb.b.index, len(lb.params), lb.elems, err)
		}
		res[i] = v
	}
	return res, nil
}

// addPrev adds the previous iteration's late results to the gradients and, for LGP, replaces
// their local estimates by them: the dense-equivalent gradient was the estimate at its own
// step (Revise fixes that) and does not get the result again now (Diverge takes it back).
func (l *lateState) addPrev(res [][]float32) {
	for i, lb := range l.prev {
		v := res[i]
		for _, p := range lb.params {
			g := v[:p.Len()]
			v = v[p.Len():]
			kernels.Add(p.Grad.Data, p.Grad.Data, g)
			est, ok := l.local[p]
			if !ok || l.corrector == nil {
				continue
			}
			delete(l.local, p)
			delta := l.scratchOf(p.Len())
			for j := range delta {
				delta[j] = g[j] - est[j]
			}
			l.corrector.Revise(p, delta)
			for j := range delta {
				delta[j] = -g[j]
			}
			l.corrector.Diverge(p, delta)
			l.put(est)
		}
	}
	l.prev = l.prev[:0]
}

func (l *lateState) scratchOf(n int) []float32 {
	if cap(l.scratch) < n {
		l.scratch = make([]float32, n)
	}
	return l.scratch[:n]
}

// settle runs at the end of a synchronised Backward, after every bucket's immediate result
// is in the gradients: it puts the true values back, waits for the previous iteration's late
// results and adds them, tells the Corrector about this iteration's deferrals, and leaves in
// Grad exactly what the optimizer must apply now.
func (l *lateState) settle(ctx context.Context, hook string, st *IterationStats) error {
	l.restore() // first, so that p.Value holds the true values even if a late result failed
	start := time.Now()
	res, err := l.waitPrev(ctx, hook)
	st.LateWait = time.Since(start)
	if err != nil {
		return err
	}
	// This iteration's deferrals: the gradient applied now is only what arrives late for the
	// parameter; with LGP its local gradient stands in for the global one meanwhile.
	type estimate struct {
		p *nn.Param
		g []float32
	}
	var fresh []estimate // kept apart until addPrev has used the previous estimates
	for _, lb := range l.cur {
		st.Deferred += lb.elems
		for _, p := range lb.params {
			if lb.correct && l.corrector != nil && l.corrector.Diverge(p, p.Grad.Data) {
				est := l.get(p.Len())
				copy(est, p.Grad.Data)
				fresh = append(fresh, estimate{p, est})
			}
			clear(p.Grad.Data)
		}
	}
	l.addPrev(res)
	for _, e := range fresh {
		l.local[e.p] = e.g
	}
	l.prev, l.cur = append(l.prev[:0], l.cur...), l.cur[:0]
	return nil
}

// flush waits for the last iteration's late results and adds them to the gradients now; for
// LGP the dense-equivalent gradient becomes the global one too (no difference left).
func (l *lateState) flush(ctx context.Context, hook string) error {
	if len(l.prev) == 0 {
		return nil
	}
	res, err := l.waitPrev(ctx, hook)
	if err != nil {
		return err
	}
	l.restore()
	for i, lb := range l.prev {
		v := res[i]
		for _, p := range lb.params {
			kernels.Add(p.Grad.Data, p.Grad.Data, v[:p.Len()])
			v = v[p.Len():]
			if est, ok := l.local[p]; ok && l.corrector != nil {
				delete(l.local, p)
				neg := l.scratchOf(p.Len())
				for j, e := range est {
					neg[j] = -e
				}
				l.corrector.Diverge(p, neg) // undo settle's estimate: applied and dense agree
				l.put(est)
			}
		}
	}
	l.prev = l.prev[:0]
	return nil
}

// forward applies the LGP offsets before a training forward and takes them off before an
// evaluation forward (recording off), so evaluation sees the true values.
func (l *lateState) forward(t *nn.Tape) {
	if t != nil && !t.GradEnabled() {
		l.restore()
		return
	}
	if l.applied || l.corrector == nil {
		return
	}
	for _, p := range l.params {
		off := l.corrector.Offset(p)
		if off == nil {
			if v := l.saved[p]; v != nil {
				l.put(v)
				delete(l.saved, p)
			}
			continue
		}
		v := l.saved[p]
		if v == nil {
			v = l.get(p.Len())
			l.saved[p] = v
		}
		copy(v, p.Value.Data)
		kernels.Add(p.Value.Data, v, off)
	}
	l.applied = true
}

// restore copies the saved true values back.
func (l *lateState) restore() {
	if !l.applied {
		return
	}
	for p, v := range l.saved {
		copy(p.Value.Data, v)
	}
	l.applied = false
}

// SetCorrector enables LGP for hooks that defer results with Correct set: c (the optimizer)
// follows the dense-equivalent trajectory, and training forwards run on the true values plus
// its offsets. Without a Corrector deferred parameters are forwarded at their true values.
func (d *DDP) SetCorrector(c Corrector) { d.late.corrector = c }

// TrueValue returns p's true value: p.Value.Data, or DDP's saved copy while an LGP offset
// is applied (between a training Forward and the end of its Backward).
func (d *DDP) TrueValue(p *nn.Param) []float32 { return d.late.trueValue(p) }

// Pending returns the parameters whose global gradient a hook deferred in the last
// synchronised Backward and that the optimizer has not received yet (none after Flush).
func (d *DDP) Pending() []*nn.Param {
	var ps []*nn.Param
	for _, lb := range d.late.prev {
		ps = append(ps, lb.params...)
	}
	return ps
}

// Flush waits for the late results of the last Backward and adds them to the gradients, so
// that the coming optimizer step applies every global gradient computed so far. Call it
// between Backward and the optimizer step of a run's last iteration, and of any iteration
// after which the true parameters must be complete (before a checkpoint, or an evaluation
// that must see every gradient). It costs that iteration's overlap; without deferrals it
// does nothing.
func (d *DDP) Flush(ctx context.Context) error {
	return d.late.flush(ctx, d.cfg.hook.Name())
}

// EndEpoch tells DDP and the hook that an epoch ended. It is a collective: every rank calls
// it at the same point between steps. It averages the losses Backward saw over the ranks and
// passes them to the hook when it is an EpochObserver.
func (d *DDP) EndEpoch(ctx context.Context) (EpochInfo, error) {
	l := d.late
	mean := math.NaN()
	if l.lossN > 0 {
		mean = l.lossSum / float64(l.lossN)
	}
	buf := []float32{float32(mean), float32(l.firstLoss)}
	if err := comm.AllReduce(ctx, d.group, tagEpochLoss, buf, comm.Auto); err != nil {
		return EpochInfo{}, fmt.Errorf("ddp: end of epoch %d: averaging the loss: %w", l.epochs+1, err)
	}
	inv := 1 / float32(d.group.Size())
	l.epochs++
	info := EpochInfo{Epoch: l.epochs, Loss: float64(buf[0] * inv), FirstLoss: float64(buf[1] * inv), Tag: tagEpochHook}
	l.lossSum, l.lossN, l.firstLoss = 0, 0, math.NaN()
	if h, ok := d.cfg.hook.(EpochObserver); ok {
		if err := h.EndEpoch(ctx, d.group, info); err != nil {
			return info, fmt.Errorf("ddp: end of epoch %d: hook %s: %w", info.Epoch, d.cfg.hook.Name(), err)
		}
	}
	return info, nil
}
