package hooks

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// OSP is Overlapped Synchronization Parallel (Chen et al., ICPP 2023; docs/ALGORITHMS.md §7) on
// all-reduce groups instead of the paper's parameter server. A "layer" is one parameter
// tensor (a weight or a bias), as in LAGS.
//
// Per iteration t (the hook's own count of iterations, saved with its state):
//
//  1. Importance (PGP), when the first bucket of t runs: I_l = Σ_j |Ĝ_l[j]·W_l[j]| for every
//     layer l of the model, where W_l is the layer's true value (ddp.ModelView) and Ĝ_l the
//     latest global gradient of l already applied to it: G_{t-1} for layers synchronised
//     routinely at t-1, G_{t-2} for layers whose t-1 gradient is still on the wire. Both are
//     identical on every rank, so every rank computes the same ranking and no bitmap travels.
//  2. Split: walking the layers from the least important (ties: plan order), a layer goes to
//     ICS when it fits in what is left of the budget S(G^u) elements (larger ones are
//     skipped, smaller ones after them may still fit). The rest is G^i.
//  3. Routine Synchronization: each bucket's G^i layers are packed, all-reduced and averaged
//     now; a bucket without ICS layers is all-reduced whole, exactly as the allreduce hook
//     does (so S(G^u) = 0 gives allreduce's bits).
//  4. In-Computation Synchronization: each bucket's G^u layers are packed and, once the
//     iteration's last bucket has been sent, all-reduced on a goroutine of the hook while the
//     training loop steps and runs the next forward and backward; the result reaches DDP as
//     a late result (ddp.Deferred) that the optimizer applies at step t+1. The ICS
//     all-reduces run one at a time, in order, on tag Tag()+1 of their bucket.
//  5. LGP: the deferral asks DDP for the local-gradient correction (LGP, default on), so the
//     next forward and backward use the dense run's values with this rank's local gradient
//     standing in for the pending global one (the paper's P + G^l step, carried through the
//     optimizer's momentum: ddp's late.go); the true values, identical on every rank, get the
//     global gradient one step late. The training loop calls dp.SetCorrector(opt).
//
// The budget S(G^u) (option budget):
//
//   - budget=F, a number: F·(model elements) every iteration, capped at cap·(model elements);
//     for experiments and tests (F = 0 is allreduce).
//   - budget=auto: the paper's Algorithm 1 over epochs, an epoch being the steps between
//     two calls of dp.EndEpoch (a collective the training loop makes after each epoch).
//     Epoch 1 uses 0. At the end of epoch e the hook sets U_max, the elements whose
//     all-reduce fits in one iteration's compute time: from this epoch's measurements on every
//     rank — a least-squares fit time = α + β·elements of its routine all-reduces, and the
//     median compute time T_c, from the end of an iteration's last routine all-reduce to the
//     next iteration's last bucket being handed over (forward, backward, optimizer step) —
//     averaged over the ranks, U_max = (T_c − α)/β, capped at cap·(model elements)
//     (times are read from the group's clock, comm.Now: the simulated one on comm/simnet)
//     (option umax=F fixes U_max = F·model instead). Then S(G^u) = (1 − loss_e/L)·U_max for
//     epoch e+1, clamped to [0, U_max], where L is the loss at the start of training (the
//     mean over the ranks of the first Backward's loss) and loss_e the mean training loss of
//     epoch e (ddp.EpochInfo). Without EndEpoch calls the budget stays 0. The paper leaves
//     open when loss_i is measured; this reading uses the latest full epoch.
//
// Iteration 0 and the first dense_warmup iterations defer nothing. Global gradients are kept
// (for Ĝ) only while the budget is positive; the first iteration with a positive budget after
// a zero one defers nothing (no Ĝ yet).
//
// Cost per iteration: the same words as allreduce (every element is all-reduced once), in one
// or two all-reduces per bucket. Extra memory: Ĝ (one model), the ICS buffers (up to
// cap·model), DDP's copies of local gradients and true values and SGD's LGP differences (a
// few times cap·model at most).
//
// Why the LGP must follow momentum: the paper's LGP adds −lr·g (exact for plain SGD). With
// momentum 0.9 a parameter deferred every iteration lags the dense run by its whole last step,
// about ten times that. VGG-11 on CIFAR-10 (2 workers of batch 16, lr 0.01, momentum 0.9)
// with only its classifier deferred from the second step: with the −lr·g offset the loss rose
// to 7.2 within 20 steps; with the momentum-exact one it stayed under 3.9 (allreduce: 2.8).
// Deferring from the first iterations still costs early progress (the local estimate of the
// newest gradient is noisier than the global one): budget=auto defers nothing in epoch 1, as
// the paper does.
//
// State (ddp.Stateful): Ĝ by parameter name, the ICS results not yet folded into Ĝ, the
// iteration and epoch counters, U_max, S(G^u) and L; the timing samples are not saved.
// Checkpoint after a step whose Backward was followed by dp.Flush (then DDP holds nothing
// pending). A bucket that is not one of DDP's (no ddp.ModelView) is all-reduced whole.
type OSP struct {
	// Budget is the fixed fraction of the model deferred per iteration, or negative for auto.
	Budget float64
	// Cap bounds S(G^u) (and U_max) as a fraction of the model (the paper's 0.8).
	Cap float64
	// UMax fixes U_max as a fraction of the model under auto; negative: measured.
	UMax float64
	// DenseWarmup iterations defer nothing.
	DenseWarmup int64
	// LGP asks DDP for the local-gradient correction of deferred layers.
	LGP bool
	// Algorithm is the all-reduce of both stages.
	Algorithm comm.Algorithm

	mu           sync.Mutex
	bound        bool
	rank, size   int
	layers       []ospLayer
	bucketLayers [][]int // bucket index → layer ids, in the bucket's parameter order
	modelElems   int
	ghat         [][]float32 // Ĝ per layer, nil when unknown
	calls        int64       // iterations begun
	iter         int64       // the running iteration
	deferNow     []bool      // per layer, for the running iteration (nil: nothing)
	jobs         []*icsJob   // ICS not yet folded into Ĝ (submitted or restored)
	queue        []*icsJob   // the running iteration's ICS, submitted after its last bucket
	chain        chan struct{}
	scratch      []float32

	// budget (auto)
	epochs int
	sElems int
	uMax   int
	lossL  float64
	// measurements of the running epoch
	arN, arT, arNN, arNT float64
	arCount              int
	tc                   []float64
	lastRSEnd            time.Duration // comm.Now at the end of the last iteration's routine all-reduces
	rsEnded              bool          // lastRSEnd is set (not after EndEpoch)
	lastFit              [3]float64    // α, β, T_c of the last EndEpoch (seconds, seconds per element)

	traceMu sync.Mutex
	trace   []ICSEvent

	loaded *ospSaved
}

var (
	_ ddp.CommHook      = (*OSP)(nil)
	_ ddp.Stateful      = (*OSP)(nil)
	_ ddp.EpochObserver = (*OSP)(nil)
)

// OSPCap is the paper's bound on S(G^u): 80 % of the model.
const OSPCap = 0.8

// ospTraceLen bounds the ICS trace kept for Trace; ospMaxSamples the compute-time samples
// kept between two EndEpoch calls.
const (
	ospTraceLen   = 4096
	ospMaxSamples = 1 << 14
)

// Tag offsets inside a bucket's tag range.
const (
	ospTagRS = iota
	ospTagICS
)

// NewOSP returns an OSP hook with the defaults: budget auto, cap 0.8, U_max measured, LGP on.
func NewOSP() *OSP {
	return &OSP{Budget: -1, Cap: OSPCap, UMax: -1, LGP: true, lossL: math.NaN()}
}

type ospLayer struct {
	p      *nn.Param
	bucket int
	pos    int
}

// icsJob is one bucket's In-Computation Synchronization; it is the late result's Future.
type icsJob struct {
	iter   int64
	bucket int
	layers []int
	buf    []float32
	tag    uint32
	ctx    context.Context
	done   chan struct{}
	err    error
	ev     ICSEvent
}

// Wait returns the averaged gradients of the job's layers, concatenated.
func (j *icsJob) Wait() ([]float32, error) {
	<-j.done
	return j.buf, j.err
}

// ICSEvent records one In-Computation Synchronization (Trace).
type ICSEvent struct {
	// Iteration is the hook's iteration whose gradients these are; Bucket the bucket.
	Iteration int64
	Bucket    int
	Params    int
	Elements  int
	// Queued: the bucket's routine part was done; Start, End: the all-reduce ran.
	Queued, Start, End time.Time
	Err                error
}

// Name returns "osp".
func (h *OSP) Name() string { return "osp" }

// Trace returns the latest In-Computation Synchronizations (at most 4096), oldest first.
func (h *OSP) Trace() []ICSEvent {
	h.traceMu.Lock()
	defer h.traceMu.Unlock()
	return slices.Clone(h.trace)
}

func (h *OSP) check() error {
	switch {
	case !(h.Cap > 0 && h.Cap <= 1):
		return fmt.Errorf("hooks: osp: option cap=%v, want a fraction in (0, 1]", h.Cap)
	case h.Budget > 1 || math.IsNaN(h.Budget):
		return fmt.Errorf("hooks: osp: option budget=%v, want auto or a fraction in [0, 1]", h.Budget)
	case h.UMax > 1 || math.IsNaN(h.UMax):
		return fmt.Errorf("hooks: osp: option umax=%v, want auto or a fraction in [0, 1]", h.UMax)
	case h.DenseWarmup < 0:
		return fmt.Errorf("hooks: osp: option dense_warmup=%d, want >= 0", h.DenseWarmup)
	}
	return nil
}

// Run communicates one bucket: the routine part now, the ICS part late.
func (h *OSP) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	f, err := h.run(ctx, g, b)
	if err != nil {
		h.mu.Lock()
		h.failQueue(err)
		h.mu.Unlock()
		return ddp.Ready(nil, fmt.Errorf("hooks: osp: bucket %d: %w", b.Index(), err))
	}
	return f
}

func (h *OSP) run(ctx context.Context, g comm.Group, b ddp.Bucket) (ddp.Future, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	flat, world := b.Flat(), g.Size()
	mv, ok := b.(ddp.ModelView)
	if !ok || len(b.Params()) == 0 {
		if err := comm.AllReduce(ctx, g, b.Tag()+ospTagRS, flat, h.Algorithm); err != nil {
			return nil, err
		}
		kernels.Scale(1/float32(world), flat)
		return ddp.Ready(flat, nil), nil
	}

	h.mu.Lock()
	if err := h.bind(g, mv); err != nil {
		h.mu.Unlock()
		return nil, err
	}
	idx := b.Index()
	if idx >= len(h.bucketLayers) || len(h.bucketLayers[idx]) != len(b.Params()) {
		h.mu.Unlock()
		return nil, fmt.Errorf("the bucket has %d parameters, the plan the hook learnt has %v: build one hook per DDP", len(b.Params()), len(h.bucketLayers))
	}
	if idx == 0 {
		if err := h.beginIteration(ctx, mv); err != nil {
			h.mu.Unlock()
			return nil, err
		}
	}
	if b.IsLast() && h.rsEnded && h.Budget < 0 {
		if len(h.tc) == ospMaxSamples {
			h.tc = append(h.tc[:0], h.tc[1:]...)
		}
		h.tc = append(h.tc, (comm.Now(g) - h.lastRSEnd).Seconds())
	}
	var icsPos []int
	if h.deferNow != nil {
		for pos, l := range h.bucketLayers[idx] {
			if h.deferNow[l] {
				icsPos = append(icsPos, pos)
			}
		}
	}
	iter := h.iter
	h.mu.Unlock()

	params, offs := b.Params(), b.Offsets()
	var job *icsJob
	rsElems := len(flat)
	t0 := comm.Now(g) // the group's clock: simulated time on comm/simnet
	if len(icsPos) == 0 {
		if err := comm.AllReduce(ctx, g, b.Tag()+ospTagRS, flat, h.Algorithm); err != nil {
			return nil, fmt.Errorf("routine all-reduce of %d elements: %w", len(flat), err)
		}
		kernels.Scale(1/float32(world), flat)
	} else {
		ics := make([]bool, len(params))
		job = &icsJob{iter: iter, bucket: idx, tag: b.Tag() + ospTagICS, ctx: ctx, done: make(chan struct{})}
		n := 0
		for _, pos := range icsPos {
			ics[pos] = true
			job.layers = append(job.layers, h.bucketLayers[idx][pos])
			n += params[pos].Len()
		}
		job.buf = make([]float32, 0, n)
		for _, pos := range icsPos {
			job.buf = append(job.buf, flat[offs[pos]:offs[pos]+params[pos].Len()]...)
		}
		rsElems = len(flat) - n
		rs := h.scratch[:0]
		for pos, p := range params {
			if !ics[pos] {
				rs = append(rs, flat[offs[pos]:offs[pos]+p.Len()]...)
			}
		}
		h.scratch = rs
		if err := comm.AllReduce(ctx, g, b.Tag()+ospTagRS, rs, h.Algorithm); err != nil {
			return nil, fmt.Errorf("routine all-reduce of %d elements: %w", len(rs), err)
		}
		kernels.Scale(1/float32(world), rs)
		for pos, p := range params {
			if !ics[pos] {
				rs = rs[copy(flat[offs[pos]:offs[pos]+p.Len()], rs):]
			}
		}
		job.ev = ICSEvent{Iteration: iter, Bucket: idx, Params: len(icsPos), Elements: n, Queued: time.Now()}
	}
	dur := (comm.Now(g) - t0).Seconds()

	h.mu.Lock()
	defer h.mu.Unlock()
	if rsElems > 0 && h.Budget < 0 {
		x := float64(rsElems)
		h.arN, h.arT, h.arNN, h.arNT, h.arCount = h.arN+x, h.arT+dur, h.arNN+x*x, h.arNT+x*dur, h.arCount+1
	}
	if h.ghat != nil {
		for pos, l := range h.bucketLayers[idx] {
			if job == nil || !slices.Contains(icsPos, pos) {
				h.ghat[l] = append(h.ghat[l][:0], flat[offs[pos]:offs[pos]+params[pos].Len()]...)
			}
		}
	}
	if job != nil {
		h.queue = append(h.queue, job)
		h.jobs = append(h.jobs, job)
	}
	if b.IsLast() {
		h.lastRSEnd, h.rsEnded = comm.Now(g), true
		h.submit(g)
	}
	if job == nil {
		return ddp.Ready(flat, nil), nil
	}
	return ddp.Defer(ddp.Ready(flat, nil), ddp.Deferred{Params: icsPos, Result: job, Correct: h.LGP}), nil
}

// bind learns the model from DDP's view on the first call and checks later calls.
func (h *OSP) bind(g comm.Group, mv ddp.ModelView) error {
	if h.bound {
		if h.rank != g.Rank() || h.size != g.Size() {
			return fmt.Errorf("this hook instance serves rank %d of %d and was called by rank %d of %d: build one hook per rank (hooks.Parse per worker)", h.rank, h.size, g.Rank(), g.Size())
		}
		return nil
	}
	h.bound, h.rank, h.size = true, g.Rank(), g.Size()
	h.layers, h.bucketLayers, h.modelElems = nil, nil, 0
	for bi, ps := range mv.PlanParams() {
		var ids []int
		for pos, p := range ps {
			ids = append(ids, len(h.layers))
			h.layers = append(h.layers, ospLayer{p: p, bucket: bi, pos: pos})
			h.modelElems += p.Len()
		}
		h.bucketLayers = append(h.bucketLayers, ids)
	}
	if h.loaded != nil {
		sv := h.loaded
		h.loaded = nil
		return h.restore(sv)
	}
	return nil
}

// submit starts the running iteration's ICS after the previous iterations'.
func (h *OSP) submit(g comm.Group) {
	batch := h.queue
	h.queue = nil
	if len(batch) == 0 {
		return
	}
	prev, done := h.chain, make(chan struct{})
	h.chain = done
	go h.runICS(g, batch, prev, done)
}

func (h *OSP) runICS(g comm.Group, batch []*icsJob, prev <-chan struct{}, done chan<- struct{}) {
	if prev != nil {
		<-prev
	}
	for _, j := range batch {
		j.ev.Start = time.Now()
		j.err = comm.AllReduce(j.ctx, g, j.tag, j.buf, h.Algorithm)
		if j.err == nil {
			kernels.Scale(1/float32(g.Size()), j.buf)
		} else {
			j.err = fmt.Errorf("hooks: osp: ICS all-reduce of %d elements: %w", len(j.buf), j.err)
		}
		j.ev.End, j.ev.Err = time.Now(), j.err
		h.traceMu.Lock()
		if len(h.trace) == ospTraceLen {
			h.trace = append(h.trace[:0], h.trace[1:]...)
		}
		h.trace = append(h.trace, j.ev)
		h.traceMu.Unlock()
		close(j.done)
	}
	close(done)
}

// failQueue fails the running iteration's unsubmitted ICS (after an error in Run).
func (h *OSP) failQueue(err error) {
	for _, j := range h.queue {
		j.err = err
		close(j.done)
	}
	h.queue = nil
}

func init() {
	Register(Spec{
		Name: "osp",
		Summary: "OSP (ICPP'23) on all-reduce: every iteration the least important parameter tensors (Σ|g·p| of the last applied " +
			"global gradient and the true parameters, computed alike on every rank), up to S(G^u) elements, are all-reduced " +
			"while the next iteration computes (ICS) and applied one step late; the rest now (RS). LGP: a rank trains on the " +
			"dense run's values with its local gradient for the pending one (dp.SetCorrector(opt)). budget=auto grows S(G^u) per " +
			"epoch (dp.EndEpoch) by the paper's Algorithm 1",
		Options: []Option{
			{Name: "budget", Default: "auto", Help: "S(G^u): auto (Algorithm 1: 0 in epoch 1, then (1 − loss/L)·U_max; needs dp.EndEpoch per epoch) or a fixed fraction of the model in [0, 1] (0 = allreduce)"},
			{Name: "cap", Default: "0.8", Help: "upper bound on U_max and S(G^u), as a fraction of the model (the paper's 80 %)"},
			{Name: "umax", Default: "auto", Help: "U_max under budget=auto: auto (measured α-β of the all-reduces and compute time per iteration) or a fraction of the model"},
			{Name: "dense_warmup", Default: "0", Help: "first N iterations defer nothing"},
			{Name: "lgp", Default: "true", Help: "forward/backward on the dense run's values, the local gradient standing in for the pending global one (needs dp.SetCorrector)"},
			{Name: "algorithm", Default: "auto", Help: "all-reduce of both stages: auto|ring|rabenseifner|recursive_doubling"},
		},
		New: func(o Values) (ddp.CommHook, error) {
			h := NewOSP()
			var err error
			frac := func(name string) (float64, error) {
				if o.String(name) == "auto" {
					return -1, nil
				}
				f, err := o.Float(name)
				if err != nil || f < 0 {
					return 0, fmt.Errorf("hooks: osp: option %s=%q, want auto or a fraction in [0, 1]", name, o.String(name))
				}
				return f, nil
			}
			if h.Budget, err = frac("budget"); err != nil {
				return nil, err
			}
			if h.UMax, err = frac("umax"); err != nil {
				return nil, err
			}
			if h.Cap, err = o.Float("cap"); err != nil {
				return nil, err
			}
			warm, err := o.Int("dense_warmup")
			if err != nil {
				return nil, err
			}
			h.DenseWarmup = int64(warm)
			if h.LGP, err = boolOption(o, "lgp"); err != nil {
				return nil, err
			}
			a, err := o.Enum("algorithm", "auto", "ring", "rabenseifner", "recursive_doubling")
			if err != nil {
				return nil, err
			}
			h.Algorithm = allReduceAlgorithms[a]
			return h, h.check()
		},
	})
}
