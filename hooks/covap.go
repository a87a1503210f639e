package hooks

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// COVAP is the COVAP comm hook (Meng et al., arXiv 2023; docs/ALGORITHMS.md §6): a coarse-grained filter that
// communicates whole pieces of DDP buckets, each once every I iterations, so that the
// communication left per iteration fits behind the backward computation. There is no top-k:
// what travels is a dense all-reduce of the pieces whose turn it is.
//
//   - Shards. After the first iteration, when the bucket sizes are known, a bucket of x elements
//     becomes min(I, max(1, floor(x/m))) contiguous shards of equal size (±1 element), m the
//     median bucket size (the mean of the two middle sizes for an even count). The paper's
//     floor, not the reference's floor(x/m + 0.7); contiguous, not the reference's strided
//     shards (a contiguous shard all-reduces in place). Shards are numbered globally in bucket
//     order: bucket 0's shards are 0…k_0-1, bucket 1's follow, and so on.
//   - Schedule. At iteration s (0-based; DDP's synchronised backward passes, counted per bucket
//     by the hook so that checkpoints keep it) shard i is all-reduced iff (i + s) mod I == 0.
//     A bucket has at most I shards with consecutive numbers, so at most one of them goes per
//     iteration: one all-reduce of one slice, or nothing at all (no message, no round). The
//     output is the average over the ranks on the sent shard and zero elsewhere. Iteration 0
//     is dense (every bucket whole), and so are the first DenseWarmup iterations and, with
//     interval=auto, the profiled ones.
//   - Interval. Fixed (Interval ≥ 1), or measured (CovapIntervalAuto): iteration 0 is a dense
//     warm-up, iterations 1…ProfileIters are dense and profiled, and at the end of the last one
//     every rank sets I = ceil(CCR), clamped to [1, MaxInterval], from the same gathered
//     measurements (see covap_profile.go). Rank 0 logs CCR, I, the shard plan and the load
//     imbalance at info level.
//   - Error feedback with the paper's scheduler. Per element (so per shard), the residual r
//     holds what was computed and not yet sent, in sum units. At iteration s, with
//     c(s) = min(Init + floor(s/AscendSteps)·AscendRange, 1) (the paper gives this form; the
//     defaults 0.5, 50 and 0.1 are the authors' code's), the paper's Algorithm 1 with its
//     scheduler (Feedback = "paper", the default) forms acc = g + c(s)·r on every element, sends
//     acc on the shard whose turn it is and sets r = 0 there, and keeps r = acc on every other
//     element. The coefficient multiplies the old residual each time it is added to a gradient
//     ("before the residuals are added to current gradients", line 2 of Algorithm 1), so a
//     gradient dropped j times reaches the wire scaled by about c^j. Feedback = "reference" is
//     the authors' reducer and docs/ALGORITHMS.md §6's wording: a dropped shard keeps r = c(s)·r + g,
//     a sent one sends g + r unscaled; at I = 2 its coefficient never acts (r is 0 whenever it
//     would be scaled). With c ≡ 1 (Init = 1) both are exact error feedback and the
//     conservation test of docs/ALGORITHMS.md §0 holds; with c < 1 the part (1 - c)·r is dropped by
//     design. Dense iterations send g + c(s)·r (paper) or g + r (reference) and clear r.
//
// Accuracy and the learning rate. The hook is the paper's algorithm: a plain re-implementation
// written from the paper alone (TestCovapMatchesPlainReimplementation: P workers as slices, a
// hand-written MLP, torch.optim.SGD) gives the same averaged gradients, residuals and
// parameters step by step, to float32 rounding, for I = 2–4 and both feedback rules. A dropped
// shard's output is zero, as in the authors' reducer (it returns the bucket times 0), so the
// optimizer applies momentum and weight decay to a zero gradient there. The paper reports
// near-lossless accuracy only at I = 3–4, only at SGD lr 1e-3 (ResNet-101, VGG-19; Adam at 5e-5
// and 1.5e-4 for BERT and GPT-2) and only after complete training; it shows no early-training
// curve and no larger step. A shard sent every I-th iteration reaches the weights up to I-1
// steps late, and with momentum 0.9 late gradients shrink the stable step size: in a one-shard
// quadratic model (heavy ball, I = 2) the largest stable η·λ falls from 2(1+0.9) = 3.8 to 0.44
// at c = 0.5 and 0.22 at c = 1 (9× and 17× smaller); at I = 4 to 0.34 and 0.076 (11× and 50×);
// scripts/covap_stability.py computes them. The scheduler raises c from 0.5 to 1 over the first
// 250 iterations, so the stable range shrinks while training goes on. At lr 0.01 (VGG-11,
// momentum 0.9) I = 2 is unstable from the start; at lr 1e-3 I = 2 trains 2–3 points behind
// dense in train accuracy after 3 short epochs (468 iterations), and I = 4 tracks dense until
// c passes about 0.7 and then stops improving (BENCHMARKS.md, "COVAP at the paper's learning
// rate"). That is the algorithm at this recipe, not a departure from it: no default was tuned.
//
// Cost per iteration: one all-reduce of the shards whose turn it is; over any I consecutive
// iterations every shard goes exactly once, so the words received per rank average
// 2(P-1)/P · n/I (ring, or Rabenseifner for power-of-two P), n the model's elements. How far a
// single iteration strays from that mean is the imbalance the sharding leaves
// (CovapPlan.Imbalance, logged).
//
// State (ddp.Stateful): the residuals, the iteration counter and the plan (interval, the
// bucket's shard count and first shard number, the plan's totals), per bucket. A hook restored
// from a checkpoint continues the schedule where it stopped; a checkpoint taken before the plan
// was fixed restarts the profiling. State saved under another bucket plan is refused.
type COVAP struct {
	// Interval is I ≥ 1, or CovapIntervalAuto to measure it.
	Interval int
	// MaxInterval caps the interval auto chooses: the paper's Limitations section warns that a
	// large interval hurts accuracy through staleness.
	MaxInterval int
	// ProfileIters is how many dense iterations interval=auto measures (after one unmeasured
	// warm-up iteration).
	ProfileIters int
	// Init, AscendSteps and AscendRange define c(s) = min(Init + floor(s/AscendSteps)·AscendRange, 1).
	// Init = CovapAuto and AscendSteps = CovapAuto take the authors' code's defaults for the
	// interval in use: 0.5 and 50, or 0.2 and 100 when I > 8 (the paper gives the scheduler's
	// form but no values).
	Init        float64
	AscendSteps int
	AscendRange float64
	// Feedback is CovapFeedbackPaper or CovapFeedbackReference (see the type's doc).
	Feedback string
	// DenseWarmup: the first DenseWarmup iterations are dense (iteration 0 always is).
	DenseWarmup int
	// Algorithm is the all-reduce (comm.Auto picks by message size).
	Algorithm comm.Algorithm
	// Logger receives the plan line (info, rank 0) and one debug line per call; nil means
	// slog.Default().
	Logger *slog.Logger

	mu      sync.Mutex
	mem     *Memory
	cur     covapIteration
	samples []covapSample // interval=auto: this rank's measured dense iterations
	warm    bool          // interval=auto: the unmeasured warm-up iteration is done
	profile *CovapProfile // interval=auto: what was measured, once decided
	plan    *CovapPlan    // the plan this instance fixed or restored
	last    covapInfo
}

var (
	_ ddp.CommHook = (*COVAP)(nil)
	_ ddp.Stateful = (*COVAP)(nil)
)

// CovapIntervalAuto is COVAP's Interval for interval=auto.
const CovapIntervalAuto = 0

// CovapAuto is COVAP's Init and AscendSteps for "the authors' code's default for the interval".
const CovapAuto = -1

// Error-feedback rules of COVAP (option feedback).
const (
	CovapFeedbackPaper     = "paper"
	CovapFeedbackReference = "reference"
)

// The scheduler's defaults, from the authors' code (the paper states the form of c(s) but no
// values), with that code's switch to slower ones when I > 8.
const (
	covapInit          = 0.5
	covapAscendSteps   = 50
	covapInitLong      = 0.2
	covapAscendLong    = 100
	covapAscendRange   = 0.1
	covapLongInterval  = 8 // I above this takes the "Long" defaults
	covapMaxInterval   = 16
	covapProfileIters  = 3
	covapTagData       = 0 // tag offsets inside a bucket's range (ddp.TagsPerBucket)
	covapTagProfile    = 1
	varCovapInterval   = "interval"
	varCovapShards     = "shards"
	varCovapFirstShard = "first_shard"
	varCovapShardTotal = "shard_total"
	varCovapBuckets    = "buckets"
)

// covapIteration tracks the buckets of the iteration in progress on this rank: DDP calls them
// in index order, and all must agree on the iteration and on whether a plan is in force.
type covapIteration struct {
	s         int64
	next      int  // the bucket index expected next
	planned   bool // bucket 0 ran under a plan
	interval  int
	nextShard int // planned: the first shard number the next bucket must have
	// unplanned (dense, discovering the layout and, with auto, profiling), and planned after a
	// restore until the plan is rebuilt:
	sizes  []int
	shards []int
	states []*BucketState
	comm   []time.Duration
}

// covapInfo describes one call, for the debug log and the tests.
type covapInfo struct {
	bucket      int
	s           int64
	dense       bool
	shard       int // sent shard of the bucket, -1 when none (dense: -1)
	lo, hi      int // its elements
	coefficient float32
}

// CovapPlan is COVAP's shard plan for a bucket layout and an interval.
type CovapPlan struct {
	Interval int
	Sizes    []int // elements per bucket
	Shards   []int // shards per bucket
	First    []int // global number of each bucket's first shard
	Median   float64
	// Load[q] is the elements all-reduced at every iteration s ≡ q (mod I): the sizes of the
	// shards i with (i + q) mod I == 0. Their sum is n.
	Load []int
	// Imbalance is max(Load) / (n/I): 1 when every iteration moves the same volume.
	Imbalance float64
}

// NewCovapPlan shards the buckets (sizes in bucket order) for interval I.
func NewCovapPlan(sizes []int, interval int) *CovapPlan {
	p := &CovapPlan{Interval: interval, Sizes: slices.Clone(sizes), Median: median(sizes)}
	p.Shards = covapShardCounts(sizes, interval)
	total, n := 0, 0
	for b, k := range p.Shards {
		p.First = append(p.First, total)
		total += k
		n += sizes[b]
	}
	p.Load = make([]int, interval)
	for q := range interval {
		for b, k := range p.Shards {
			if j := covapSentShard(p.First[b], k, interval, int64(q)); j >= 0 {
				lo, hi := covapShardBounds(sizes[b], k, j)
				p.Load[q] += hi - lo
			}
		}
	}
	if n > 0 {
		p.Imbalance = float64(slices.Max(p.Load)) * float64(interval) / float64(n)
	}
	return p
}

// TotalShards is the number of shards over all buckets.
func (p *CovapPlan) TotalShards() int {
	if len(p.Shards) == 0 {
		return 0
	}
	return p.First[len(p.First)-1] + p.Shards[len(p.Shards)-1]
}

// median is the median of sizes (the mean of the two middle values for an even count).
func median(sizes []int) float64 {
	if len(sizes) == 0 {
		return 0
	}
	s := slices.Clone(sizes)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return float64(s[len(s)/2])
	}
	return (float64(s[len(s)/2-1]) + float64(s[len(s)/2])) / 2
}

// covapShardCounts is the sharding rule: a bucket of x elements becomes
// min(I, max(1, floor(x/m))) shards, m the median bucket size; never more shards than
// elements. floor(x/m) is computed exactly in integers (m may be a half-integer).
func covapShardCounts(sizes []int, interval int) []int {
	s := slices.Clone(sizes)
	slices.Sort(s)
	counts := make([]int, len(sizes))
	for b, x := range sizes {
		k := 1
		if len(s) > 0 {
			// x/m = 2x/(2m); 2m = 2·s[mid] (odd count) or s[mid-1] + s[mid] (even count).
			twoM := 2 * s[len(s)/2]
			if len(s)%2 == 0 {
				twoM = s[len(s)/2-1] + s[len(s)/2]
			}
			if twoM > 0 {
				k = max(1, 2*x/twoM)
			}
		}
		counts[b] = max(1, min(k, interval, x))
	}
	return counts
}

// covapSentShard returns the shard (0…shards-1) of a bucket whose shards are numbered
// first…first+shards-1 that goes at iteration s — the j with (first + j + s) mod I == 0 — or -1.
func covapSentShard(first, shards, interval int, s int64) int {
	j := int((int64(interval) - (int64(first)+s)%int64(interval)) % int64(interval))
	if j < shards {
		return j
	}
	return -1
}

// covapShardBounds returns shard j of k over n elements: [j·n/k, (j+1)·n/k).
func covapShardBounds(n, k, j int) (lo, hi int) {
	return j * n / k, (j + 1) * n / k
}

// covapCoefficient is the error-feedback scheduler: c(s) = min(init + floor(s/steps)·range, 1).
func covapCoefficient(s int64, init float64, steps int, ascend float64) float32 {
	return float32(math.Min(init+float64(s/int64(steps))*ascend, 1))
}

// NewCOVAP returns a COVAP hook; see the type's fields for the options.
func NewCOVAP(interval, maxInterval, profileIters int, init float64, ascendSteps int, ascendRange float64, feedback string, denseWarmup int, alg comm.Algorithm) (*COVAP, error) {
	h := &COVAP{Interval: interval, MaxInterval: maxInterval, ProfileIters: profileIters, Init: init, AscendSteps: ascendSteps,
		AscendRange: ascendRange, Feedback: feedback, DenseWarmup: denseWarmup, Algorithm: alg}
	if err := h.check(); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *COVAP) check() error {
	switch {
	case h.Interval < 0:
		return fmt.Errorf("hooks: covap: option interval=%d, want a positive integer or auto", h.Interval)
	case h.MaxInterval < 1:
		return fmt.Errorf("hooks: covap: option max_interval=%d, want >= 1", h.MaxInterval)
	case h.ProfileIters < 1:
		return fmt.Errorf("hooks: covap: option profile_iters=%d, want >= 1", h.ProfileIters)
	case h.Init != CovapAuto && !(h.Init >= 0 && h.Init <= 1):
		return fmt.Errorf("hooks: covap: option init=%v, want a number in [0, 1] or auto", h.Init)
	case h.AscendSteps != CovapAuto && h.AscendSteps < 1:
		return fmt.Errorf("hooks: covap: option ascend_steps=%d, want >= 1 or auto", h.AscendSteps)
	case !(h.AscendRange >= 0) || math.IsInf(h.AscendRange, 0):
		return fmt.Errorf("hooks: covap: option ascend_range=%v, want a number >= 0", h.AscendRange)
	case h.Feedback != CovapFeedbackPaper && h.Feedback != CovapFeedbackReference:
		return fmt.Errorf("hooks: covap: option feedback=%q, want one of paper|reference", h.Feedback)
	case h.DenseWarmup < 0:
		return fmt.Errorf("hooks: covap: option dense_warmup=%d, want >= 0", h.DenseWarmup)
	}
	return nil
}

// schedule returns the scheduler's constants for interval I (auto defaults resolved).
func (h *COVAP) schedule(interval int) (init float64, steps int, ascend float64) {
	init, steps = h.Init, h.AscendSteps
	long := interval > covapLongInterval
	if init == CovapAuto {
		init = covapInit
		if long {
			init = covapInitLong
		}
	}
	if steps == CovapAuto {
		steps = covapAscendSteps
		if long {
			steps = covapAscendLong
		}
	}
	return init, steps, h.AscendRange
}

// Name returns "covap".
func (h *COVAP) Name() string { return "covap" }

func (h *COVAP) memory() *Memory {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mem == nil {
		h.mem = NewMemory("covap")
	}
	return h.mem
}

// State returns the residuals, iteration counters and the plan (ddp.Stateful).
func (h *COVAP) State() (map[string][]float32, error) { return h.memory().State() }

// LoadState restores State's output (ddp.Stateful). The profiling, if it was in progress,
// starts over.
func (h *COVAP) LoadState(st map[string][]float32) error {
	if err := h.memory().LoadState(st); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur, h.samples, h.warm, h.profile, h.plan = covapIteration{}, nil, false, nil, nil
	return nil
}

func (h *COVAP) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

// Plan returns the shard plan once it is fixed (after the first iteration with a fixed
// interval, after the profiling with auto), or nil.
func (h *COVAP) Plan() *CovapPlan {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.plan
}

// Profile returns what interval=auto measured, or nil before it decided (and with a fixed
// interval).
func (h *COVAP) Profile() *CovapProfile {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.profile
}

func (h *COVAP) lastInfo() covapInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// Run communicates one bucket: the shard whose turn it is, or nothing, or all of it in a dense
// iteration.
func (h *COVAP) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	out, err := h.run(ctx, g, b)
	if err != nil {
		return ddp.Ready(nil, fmt.Errorf("hooks: covap: bucket %d: %w", b.Index(), err))
	}
	return ddp.Ready(out, nil)
}

func (h *COVAP) run(ctx context.Context, g comm.Group, b ddp.Bucket) ([]float32, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	st, err := h.memory().Bucket(g, b)
	if err != nil {
		return nil, err
	}
	s := st.Calls
	if err := h.track(b, st, s); err != nil {
		return nil, err
	}
	st.Calls++
	flat := b.Flat()
	if h.cur.planned && s > 0 && s >= int64(h.DenseWarmup) {
		return flat, h.compressed(ctx, g, b, st, s)
	}
	interval := h.Interval
	if h.cur.planned {
		interval = h.cur.interval
	}
	init, steps, ascend := h.schedule(max(interval, 1))
	c := covapCoefficient(s, init, steps, ascend)
	if h.Feedback == CovapFeedbackReference {
		c = 1
	}
	kernels.Axpy(c, st.Residual, flat)
	clear(st.Residual)
	start := comm.Now(g) // the group's clock: simulated time on comm/simnet
	if err := comm.AllReduce(ctx, g, b.Tag()+covapTagData, flat, h.Algorithm); err != nil {
		return nil, err
	}
	took := comm.Now(g) - start
	kernels.Scale(1/float32(g.Size()), flat)
	h.setLast(covapInfo{bucket: b.Index(), s: s, dense: true, shard: -1, coefficient: c})
	if !h.cur.planned {
		if err := h.discover(ctx, g, b, st, took); err != nil {
			return nil, err
		}
	}
	return flat, nil
}

// track checks that the buckets of an iteration come in index order, agree on the iteration
// number and on whether a plan is in force, and that a planned bucket's shard numbering
// continues its predecessor's.
func (h *COVAP) track(b ddp.Bucket, st *BucketState, s int64) error {
	planned := st.HasVar(varCovapInterval)
	idx := b.Index()
	if idx == 0 {
		h.cur = covapIteration{s: s, planned: planned}
		if planned {
			h.cur.interval = int(st.Var(varCovapInterval, 0))
		}
	} else {
		switch {
		case idx != h.cur.next:
			return fmt.Errorf("called for bucket %d, expected bucket %d: COVAP needs DDP's buckets in index order, every iteration from bucket 0", idx, h.cur.next)
		case s != h.cur.s:
			return fmt.Errorf("bucket %d is at iteration %d, bucket 0 at %d: state saved under a different bucket plan", idx, s, h.cur.s)
		case planned != h.cur.planned:
			return fmt.Errorf("bucket %d has a shard plan=%v, bucket 0 %v: state saved under a different bucket plan", idx, planned, h.cur.planned)
		}
	}
	h.cur.next = idx + 1
	if !planned {
		return nil
	}
	interval, shards, first := int(st.Var(varCovapInterval, 0)), int(st.Var(varCovapShards, 0)), int(st.Var(varCovapFirstShard, -1))
	total, buckets := int(st.Var(varCovapShardTotal, 0)), int(st.Var(varCovapBuckets, 0))
	switch {
	case interval != h.cur.interval || interval < 1:
		return fmt.Errorf("interval %d, bucket 0's is %d: state saved under a different bucket plan", interval, h.cur.interval)
	case first != h.cur.nextShard || shards < 1 || shards > interval || shards > max(1, len(b.Flat())):
		return fmt.Errorf("restored shards %d…%d, expected them from shard %d with at most %d: state saved under a different bucket plan", first, first+shards-1, h.cur.nextShard, min(interval, len(b.Flat())))
	case idx >= buckets:
		return fmt.Errorf("the plan was made for %d buckets, this is bucket %d: state saved under a different bucket plan", buckets, idx)
	case b.IsLast() && (idx+1 != buckets || first+shards != total):
		return fmt.Errorf("the plan ends at bucket %d with %d shards, the shard plan was made for %d buckets and %d shards: state saved under a different bucket plan", idx, first+shards, buckets, total)
	}
	h.cur.nextShard = first + shards
	if h.plan == nil { // restored from a checkpoint: rebuild the plan from the sizes and check it
		h.cur.sizes = append(h.cur.sizes, len(b.Flat()))
		h.cur.shards = append(h.cur.shards, shards)
		if b.IsLast() {
			plan := NewCovapPlan(h.cur.sizes, interval)
			if !slices.Equal(plan.Shards, h.cur.shards) {
				return fmt.Errorf("restored shards per bucket %v, the buckets' sizes %v give %v: state saved under a different bucket plan", h.cur.shards, h.cur.sizes, plan.Shards)
			}
			h.mu.Lock()
			h.plan = plan
			h.mu.Unlock()
		}
	}
	return nil
}

// compressed is a call under the plan: the shard whose turn it is, or nothing.
func (h *COVAP) compressed(ctx context.Context, g comm.Group, b ddp.Bucket, st *BucketState, s int64) error {
	flat, r := b.Flat(), st.Residual
	interval, shards, first := h.cur.interval, int(st.Var(varCovapShards, 1)), int(st.Var(varCovapFirstShard, 0))
	init, steps, ascend := h.schedule(interval)
	c := covapCoefficient(s, init, steps, ascend)
	j := covapSentShard(first, shards, interval, s)
	lo, hi := 0, 0
	if j >= 0 {
		lo, hi = covapShardBounds(len(flat), shards, j)
	}
	if h.Feedback == CovapFeedbackReference {
		kernels.Axpy(c, r[:lo], flat[:lo]) // dropped: r ← c·r + g
		kernels.Axpy(c, r[hi:], flat[hi:])
		kernels.Add(flat[lo:hi], flat[lo:hi], r[lo:hi]) // sent: g + r
	} else {
		kernels.Axpy(c, r, flat) // acc = g + c·r everywhere
	}
	copy(r, flat)
	clear(r[lo:hi])
	clear(flat[:lo])
	clear(flat[hi:])
	if hi > lo {
		if err := comm.AllReduce(ctx, g, b.Tag()+covapTagData, flat[lo:hi], h.Algorithm); err != nil {
			return fmt.Errorf("iteration %d, shard %d of %d (elements %d…%d): %w", s, j, shards, lo, hi-1, err)
		}
		kernels.Scale(1/float32(g.Size()), flat[lo:hi])
	}
	info := covapInfo{bucket: b.Index(), s: s, shard: j, lo: lo, hi: hi, coefficient: c}
	h.setLast(info)
	if lg := h.logger(); lg.Enabled(ctx, slog.LevelDebug) {
		lg.DebugContext(ctx, "covap", "bucket", info.bucket, "iteration", s, "rank", g.Rank(), "shard", j, "of", shards,
			"elements", hi-lo, "coefficient", c)
	}
	return nil
}

func (h *COVAP) setLast(info covapInfo) {
	h.mu.Lock()
	h.last = info
	h.mu.Unlock()
}

// discover records an unplanned (dense) call: the bucket's size, and with interval=auto its
// communication time. At the iteration's last bucket it fixes the plan: at once for a fixed
// interval, after ProfileIters measured iterations for auto.
func (h *COVAP) discover(ctx context.Context, g comm.Group, b ddp.Bucket, st *BucketState, took time.Duration) error {
	h.cur.sizes = append(h.cur.sizes, len(b.Flat()))
	h.cur.states = append(h.cur.states, st)
	h.cur.comm = append(h.cur.comm, took)
	if !b.IsLast() {
		return nil
	}
	interval := h.Interval
	var prof *CovapProfile
	if interval == CovapIntervalAuto {
		if !h.warm { // the first dense iteration pays for allocations: not measured
			h.warm = true
			return nil
		}
		timed, ok := b.(ddp.Timed)
		if !ok {
			return fmt.Errorf("interval=auto needs DDP's bucket timestamps (ddp.Timed), which this bucket (%T) lacks: set interval=N", b)
		}
		h.samples = append(h.samples, covapSample{comp: timed.ReadyAfter(), comm: slices.Clone(h.cur.comm)})
		if len(h.samples) < h.ProfileIters {
			return nil
		}
		p, err := covapMeasure(ctx, g, b.Tag()+covapTagProfile, h.samples, h.MaxInterval)
		if err != nil {
			return fmt.Errorf("interval=auto: %w", err)
		}
		prof, interval = &p, p.Interval
	}
	plan := NewCovapPlan(h.cur.sizes, interval)
	for i, bs := range h.cur.states {
		bs.SetVar(varCovapInterval, float64(interval))
		bs.SetVar(varCovapShards, float64(plan.Shards[i]))
		bs.SetVar(varCovapFirstShard, float64(plan.First[i]))
		bs.SetVar(varCovapShardTotal, float64(plan.TotalShards()))
		bs.SetVar(varCovapBuckets, float64(len(plan.Sizes)))
	}
	h.mu.Lock()
	h.plan, h.profile = plan, prof
	h.mu.Unlock()
	if g.Rank() == 0 {
		init, steps, ascend := h.schedule(interval)
		attrs := []any{"P", g.Size(), "interval", interval, "buckets", len(plan.Sizes), "shards", plan.TotalShards(),
			"shards_per_bucket", intsString(plan.Shards), "median_bucket", strconv.FormatFloat(plan.Median, 'f', -1, 64), "imbalance", math.Round(plan.Imbalance*1000) / 1000,
			"feedback", h.Feedback, "init", init, "ascend_steps", steps, "ascend_range", ascend}
		if prof != nil {
			attrs = append(attrs, "ccr", math.Round(prof.CCR*1000)/1000, "comp_ms", ms(prof.Comp), "comm_ms", ms(prof.Comm),
				"comm_unaligned_ms", ms(prof.CommUnaligned), "profiled_iterations", prof.Iterations)
			if prof.Clamped {
				attrs = append(attrs, "clamped_to_max_interval", h.MaxInterval)
			}
		}
		h.logger().InfoContext(ctx, "covap: shard plan", attrs...)
	}
	return nil
}

func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())) / 1000 }

func intsString(v []int) string {
	var b strings.Builder
	for i, x := range v {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprint(&b, x)
	}
	return b.String()
}

func init() {
	Register(Spec{
		Name: "covap",
		Summary: "COVAP: bucket shards (oversized buckets cut relative to the median bucket, ≤ I each) all-reduced once every I iterations, " +
			"I = ceil(CCR) from a distributed profiler or fixed; scheduled error feedback; 2(P-1)/P·n/I words per iteration on average",
		Options: []Option{
			{Name: "interval", Default: "auto", Help: "I ≥ 1 (shard i goes at iteration s iff (i+s) mod I == 0), or auto: I = ceil(CCR) measured on dense iterations 1…profile_iters"},
			{Name: "max_interval", Default: fmt.Sprint(covapMaxInterval), Help: "cap on the interval auto chooses"},
			{Name: "profile_iters", Default: fmt.Sprint(covapProfileIters), Help: "dense iterations interval=auto measures, after one warm-up"},
			{Name: "init", Default: "auto", Help: "c(0) of the error-feedback coefficient c(s) = min(init + floor(s/ascend_steps)·ascend_range, 1), which multiplies the residual each time it is added to the gradient; auto: 0.5, or 0.2 when I > 8 (the authors' code's defaults); 1: exact error feedback"},
			{Name: "ascend_steps", Default: "auto", Help: "iterations between rises of c; auto: 50, or 100 when I > 8 (the authors' code's defaults)"},
			{Name: "ascend_range", Default: fmt.Sprint(covapAscendRange), Help: "rise of c every ascend_steps iterations"},
			{Name: "feedback", Default: CovapFeedbackPaper, Help: "paper (acc = g + c·r every iteration) | reference (authors' reducer: r ← c·r + g when dropped, g + r sent unscaled)"},
			{Name: "dense_warmup", Default: "0", Help: "first N iterations use a dense all-reduce (iteration 0 always does)"},
			{Name: "algorithm", Default: "auto", Help: "all-reduce: auto|ring|rabenseifner|recursive_doubling"},
		},
		New: func(o Values) (ddp.CommHook, error) {
			interval := CovapIntervalAuto
			var err error
			if o.String("interval") != "auto" {
				if interval, err = o.Int("interval"); err != nil || interval < 1 {
					return nil, fmt.Errorf("hooks: covap: option interval=%q, want a positive integer or auto", o.String("interval"))
				}
			}
			maxInterval, err := o.Int("max_interval")
			if err != nil {
				return nil, err
			}
			profileIters, err := o.Int("profile_iters")
			if err != nil {
				return nil, err
			}
			init := float64(CovapAuto)
			if o.String("init") != "auto" {
				if init, err = o.Float("init"); err != nil || !(init >= 0 && init <= 1) {
					return nil, fmt.Errorf("hooks: covap: option init=%q, want a number in [0, 1] or auto", o.String("init"))
				}
			}
			steps := CovapAuto
			if o.String("ascend_steps") != "auto" {
				if steps, err = o.Int("ascend_steps"); err != nil || steps < 1 {
					return nil, fmt.Errorf("hooks: covap: option ascend_steps=%q, want a positive integer or auto", o.String("ascend_steps"))
				}
			}
			ascend, err := o.Float("ascend_range")
			if err != nil {
				return nil, err
			}
			feedback, err := o.Enum("feedback", CovapFeedbackPaper, CovapFeedbackReference)
			if err != nil {
				return nil, err
			}
			warm, err := o.Int("dense_warmup")
			if err != nil {
				return nil, err
			}
			a, err := o.Enum("algorithm", "auto", "ring", "rabenseifner", "recursive_doubling")
			if err != nil {
				return nil, err
			}
			return NewCOVAP(interval, maxInterval, profileIters, init, steps, ascend, feedback, warm, allReduceAlgorithms[a])
		},
	})
}
