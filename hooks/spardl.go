package hooks

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// Residual collection modes of SparDL (the ablation of the paper's Fig. 17).
const (
	// ResidualGlobal is the paper's global residual collection: nothing is lost.
	ResidualGlobal = "global"
	// ResidualLocal keeps only each rank's local residual: its own values outside its own
	// per-block top-k_b.
	ResidualLocal = "local"
	// ResidualPartial keeps the local and the end-procedure residuals: a position that reached
	// no final set is kept whole; one that did keeps only its local residual, so the partial
	// sums dropped on the way (the in-procedure residuals) are lost.
	ResidualPartial = "partial"
)

// TeamsAuto is SparDL's Teams value for teams=auto.
const TeamsAuto = 0

// autoTrials is how many calls teams=auto times each candidate team count; the fastest of a
// candidate's calls counts (the first may pay for allocations).
const autoTrials = 3

// Tag offsets inside a bucket's tag range (ddp.TagsPerBucket).
const (
	tagSRS = iota
	tagSAG
	tagGather
	tagDense
	tagAuto
)

// SparDL is the SparDL comm hook (Zhao et al., ICDE 2024; docs/ALGORITHMS.md §2). Per bucket of n elements on P
// ranks in d teams of N = P/d:
//
//  1. G = g + ξ, cut into N blocks of c = ceil(n/N); per-block budget k_b = max(1, int(c·density)).
//  2. Spar-Reduce-Scatter in each team: ceil(log2 N) rounds, one bag of blocks per round, each
//     block sparsified to its top-k_b just before it is sent; rank r ends with block r.
//  3. With d > 1, Spar-All-Gather across teams between the ranks holding the same block:
//     R-SAG (d a power of two; log2 d steps, top-k_b after each) or B-SAG (top-h, one sparse
//     Bruck all-gather, top-k_b of the union; h adapts by the paper's Algorithm 2).
//  4. A sparse Bruck all-gather of the final blocks in each team; output sum / P.
//  5. Global residual collection: a position outside the final set keeps the rank's own G; a
//     position inside keeps what this rank discarded there while forwarding (plus its share
//     of what SAG discarded). The conservation test of docs/ALGORITHMS.md §0 holds.
//
// Cost at d = 1 when every block has at least k_b non-zeros: exactly 2·ceil(log2 P) rounds and
// 4(P-1)·k_b words received per rank (= 4k(P-1)/P). With d > 1 the paper's Table I rows.
type SparDL struct {
	// Density is k/n, in (0, 1].
	Density float64
	// Teams is d (it must divide P), or TeamsAuto to time every divisor of P on the first
	// calls of each bucket and keep the fastest.
	Teams int
	// Residual is ResidualGlobal, ResidualLocal or ResidualPartial.
	Residual string
	// DenseWarmup is how many first calls of each bucket use a dense all-reduce.
	DenseWarmup int
	// Buckets is BucketsModel (the default of NewSparDL and of the spec) or BucketsDDP; see
	// Plan.
	Buckets string
	// Logger receives the debug lines (team count, B-SAG's h and union size per call) and
	// the teams=auto choice; nil means slog.Default().
	Logger *slog.Logger

	mem  *Memory
	mu   sync.Mutex
	last spardlInfo
}

// spardlInfo describes one call, for the debug log and the tests.
type spardlInfo struct {
	bucket      int
	dense       bool
	d, n, c, kb int
	h, union    int // B-SAG only
}

var (
	_ ddp.CommHook = (*SparDL)(nil)
	_ ddp.Stateful = (*SparDL)(nil)
	_ ddp.Planner  = (*SparDL)(nil)
)

// The bucket layouts SparDL can ask DDP for (option buckets).
const (
	// BucketsModel is one bucket holding the whole model, as in the paper: SparDL
	// sparsifies the whole gradient after backward, so k and the per-block budgets are
	// spent where the large values are, whatever layer holds them. Nothing overlaps
	// backward.
	BucketsModel = "model"
	// BucketsDDP keeps DDP's size-capped buckets (1 MiB first, then 25 MiB, or
	// WithBucketCap's), communicated while backward goes on; each bucket gets its own
	// budget of density·n.
	BucketsDDP = "ddp"
)

// Plan implements ddp.Planner. With BucketsModel it returns one bucket with every
// parameter, in the order their gradients become ready (reverse declaration order, as DDP's
// own buckets); with BucketsDDP it returns nil, which keeps DDP's size-capped plan.
//
// Measured on the convergence check (VGG-11, 4 workers × 16, BENCHMARKS.md): one bucket
// trains like a plain PyTorch simulation of the paper's procedure on the flattened model
// (train loss 1.56 vs 1.54 after 3 epochs), while DDP's three buckets of VGG-11 (76 k, 2.4 M
// and 6.8 M elements, each with its own 1 % budget) train worse (1.61 and 1.66).
func (h *SparDL) Plan(params []*nn.Param) ([][]int, error) { return bucketPlan(h.Buckets, params), nil }

// bucketPlan is the plan of a buckets option (BucketsModel or BucketsDDP) for params: one
// bucket with every parameter, in the order their gradients become ready (reverse
// declaration order, as DDP's own buckets), or nil, which keeps DDP's size-capped plan.
func bucketPlan(buckets string, params []*nn.Param) [][]int {
	if buckets == BucketsDDP {
		return nil
	}
	all := make([]int, len(params))
	for i := range all {
		all[i] = len(params) - 1 - i
	}
	return [][]int{all}
}

// NewSparDL returns a SparDL hook; see the type's fields for the options.
func NewSparDL(density float64, teams int, residual string, denseWarmup int) (*SparDL, error) {
	h := &SparDL{Density: density, Teams: teams, Residual: residual, DenseWarmup: denseWarmup, Buckets: BucketsModel}
	if err := h.check(); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *SparDL) check() error {
	if !(h.Density > 0 && h.Density <= 1) {
		return fmt.Errorf("hooks: spardl: option density=%v, want a number in (0, 1]", h.Density)
	}
	if h.Buckets != "" && h.Buckets != BucketsModel && h.Buckets != BucketsDDP {
		return fmt.Errorf("hooks: spardl: option buckets=%q, want %s or %s", h.Buckets, BucketsModel, BucketsDDP)
	}
	if h.Teams < 0 {
		return fmt.Errorf("hooks: spardl: option teams=%d, want a positive divisor of the world size or auto", h.Teams)
	}
	switch h.Residual {
	case ResidualGlobal, ResidualLocal, ResidualPartial:
	default:
		return fmt.Errorf("hooks: spardl: option residual=%q, want one of global|local|partial", h.Residual)
	}
	if h.DenseWarmup < 0 {
		return fmt.Errorf("hooks: spardl: option dense_warmup=%d, want >= 0", h.DenseWarmup)
	}
	return nil
}

// Name returns "spardl".
func (h *SparDL) Name() string { return "spardl" }

func (h *SparDL) memory() *Memory { return lazyMemory(&h.mu, &h.mem, "spardl") }

// State returns the residuals and per-bucket scalars (ddp.Stateful).
func (h *SparDL) State() (map[string][]float32, error) { return h.memory().State() }

// LoadState restores State's output (ddp.Stateful).
func (h *SparDL) LoadState(st map[string][]float32) error { return h.memory().LoadState(st) }

func (h *SparDL) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

// Run communicates one bucket and returns the averaged sparse gradient.
func (h *SparDL) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	out, err := h.run(ctx, g, b)
	return result("spardl", b, out, err)
}

func (h *SparDL) run(ctx context.Context, g comm.Group, b ddp.Bucket) ([]float32, error) {
	st, call, err := beginCall(h.memory(), g, b, h.check, indexable("spardl", b))
	if err != nil {
		return nil, err
	}
	flat := b.Flat()
	info := spardlInfo{bucket: b.Index(), n: len(flat)}
	if call < int64(h.DenseWarmup) {
		info.dense = true
		h.setLast(info)
		return denseAverage(ctx, g, b.Tag()+tagDense, flat, st.Residual)
	}
	p := g.Size()
	d, exploring, err := h.teamsFor(st, p, call-int64(h.DenseWarmup))
	if err != nil {
		return nil, err
	}
	start := time.Now()
	info, err = h.sparse(ctx, g, b.Tag(), flat, st, d)
	if err != nil {
		return nil, err
	}
	info.bucket = b.Index()
	h.setLast(info)
	if exploring {
		if err := h.recordTrial(ctx, g, b, st, d, time.Since(start), call-int64(h.DenseWarmup)); err != nil {
			return nil, err
		}
	}
	if lg := h.logger(); lg.Enabled(ctx, slog.LevelDebug) {
		attrs := []any{"bucket", info.bucket, "call", call, "rank", g.Rank(), "P", p, "teams", d, "k_b", info.kb}
		if d > 1 && !isPow2(d) {
			attrs = append(attrs, "sag", "B-SAG", "h", info.h, "union", info.union)
		} else if d > 1 {
			attrs = append(attrs, "sag", "R-SAG")
		}
		lg.DebugContext(ctx, "spardl", attrs...)
	}
	return flat, nil
}

func (h *SparDL) setLast(info spardlInfo) {
	h.mu.Lock()
	h.last = info
	h.mu.Unlock()
}

func (h *SparDL) lastInfo() spardlInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

func isPow2(p int) bool { return p > 0 && p&(p-1) == 0 }

func divisors(p int) []int {
	var ds []int
	for d := 1; d <= p; d++ {
		if p%d == 0 {
			ds = append(ds, d)
		}
	}
	return ds
}

// teamsFor returns the team count for a call (i counts the sparse calls of the bucket) and
// whether the call is one of teams=auto's timed trials.
func (h *SparDL) teamsFor(st *BucketState, p int, i int64) (d int, exploring bool, err error) {
	if h.Teams != TeamsAuto {
		if p%h.Teams != 0 {
			return 0, false, fmt.Errorf("option teams=%d does not divide the world size P=%d (divisors: %v)", h.Teams, p, divisors(p))
		}
		return h.Teams, false, nil
	}
	cands := divisors(p)
	if st.HasVar("teams.chosen") && int(st.Var("teams.P", 0)) == p {
		return int(st.Var("teams.chosen", 1)), false, nil
	}
	if len(cands) == 1 {
		return 1, false, nil
	}
	if int(st.Var("teams.P", 0)) != p { // first call, or the world size changed: start over
		st.SetVar("teams.P", float64(p))
		st.SetVar("teams.start", float64(i))
		for k := range st.vars {
			if strings.HasPrefix(k, "teams.time.") || k == "teams.chosen" {
				delete(st.vars, k)
			}
		}
	}
	j := int(i - int64(st.Var("teams.start", 0)))
	if j < 0 || j >= len(cands)*autoTrials {
		j = 0
		st.SetVar("teams.start", float64(i))
	}
	return cands[j/autoTrials], true, nil
}

// recordTrial keeps the fastest call per candidate; after the last trial the ranks sum their
// times with an all-reduce (identical bits everywhere, so every rank picks the same d) and
// keep the fastest team count.
func (h *SparDL) recordTrial(ctx context.Context, g comm.Group, b ddp.Bucket, st *BucketState, d int, took time.Duration, i int64) error {
	key := "teams.time." + strconv.Itoa(d)
	if t := took.Seconds(); !st.HasVar(key) || t < st.Var(key, 0) {
		st.SetVar(key, t)
	}
	cands := divisors(g.Size())
	if int(i-int64(st.Var("teams.start", 0))) != len(cands)*autoTrials-1 {
		return nil
	}
	times := make([]float32, len(cands))
	for c, dd := range cands {
		times[c] = float32(st.Var("teams.time."+strconv.Itoa(dd), 0))
	}
	if err := comm.AllReduce(ctx, g, b.Tag()+tagAuto, times, comm.Auto); err != nil {
		return fmt.Errorf("teams=auto: summing the trial times: %w", err)
	}
	best := 0
	for c := range cands {
		if times[c] < times[best] {
			best = c
		}
	}
	st.SetVar("teams.chosen", float64(cands[best]))
	if g.Rank() == 0 {
		summary := make([]any, 0, 2*len(cands)+6)
		summary = append(summary, "bucket", b.Index(), "P", g.Size(), "teams", cands[best])
		for c, dd := range cands {
			summary = append(summary, "d="+strconv.Itoa(dd)+"_ms", float64(times[c])*1e3/float64(g.Size()))
		}
		h.logger().InfoContext(ctx, "spardl: teams=auto chose d", summary...)
	}
	return nil
}

// sparse is one SparDL call with d teams; flat holds the local gradient on entry and the
// averaged result on return.
func (h *SparDL) sparse(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState, d int) (spardlInfo, error) {
	p, r, n := g.Size(), g.Rank(), len(flat)
	nt := p / d
	team, pos := r/nt, r%nt
	c := (n + nt - 1) / nt
	kb := max(1, int(float64(c)*h.Density))
	info := spardlInfo{d: d, n: n, c: c, kb: kb}
	if n == 0 {
		return info, nil
	}
	members := make([]int, nt)
	for i := range members {
		members[i] = team*nt + i
	}
	teamG, err := comm.Sub(g, members)
	if err != nil {
		return info, err
	}
	blockLen := func(i int) int { lo, hi := blockBounds(i, c, n); return hi - lo }

	xi := st.Residual
	xi.Compensate(flat) // flat = G = g + ξ, the accumulator of Spar-Reduce-Scatter
	xi.Keep(flat)       // ξ = G, the rank's own values, until the final sets are known
	var locals []COO
	if h.Residual != ResidualGlobal {
		locals = make([]COO, nt)
		for i := range locals {
			lo, hi := blockBounds(i, c, n)
			locals[i] = TopKNonZero(COO{}, flat[lo:hi], kb)
		}
	}

	bsagMode := d > 1 && !isPow2(d)
	finalK := kb
	if bsagMode {
		info.h = h.bsagH(st, d, kb)
		finalK = info.h
	}
	own, err := sparReduceScatter(ctx, teamG, tag+tagSRS, flat, c, kb, finalK)
	if err != nil {
		return info, err
	}
	var shares COO
	if d > 1 {
		across := make([]int, d)
		for x := range across {
			across[x] = x*nt + pos
		}
		posG, err := comm.Sub(g, across)
		if err != nil {
			return info, err
		}
		if bsagMode {
			own, shares, info.union, err = bsag(ctx, posG, tag+tagSAG, own, kb, info.h, blockLen(pos))
			if err == nil {
				h.bsagAdapt(st, d, kb, info.union)
			}
		} else {
			own, shares, err = rsag(ctx, posG, tag+tagSAG, own, kb, blockLen(pos))
		}
		if err != nil {
			return info, err
		}
	}
	blocks, err := bruckSparse(ctx, teamG, tag+tagGather, own, c, blockLen,
		func(i int) int { return min(kb, blockLen(i)) })
	if err != nil {
		return info, fmt.Errorf("final all-gather: %w", err)
	}

	// Residuals. flat holds, per block, what this rank discarded (sparReduceScatter's
	// contract); xi holds G.
	for i, blk := range blocks {
		lo, _ := blockBounds(i, c, n)
		switch h.Residual {
		case ResidualGlobal:
			for _, j := range blk.Idx {
				xi[lo+int(j)] = flat[lo+int(j)]
			}
			if i == pos && shares.Len() > 0 {
				eachIn(blk.Idx, shares.Idx, func(e int, found bool) {
					if found {
						xi[lo+int(shares.Idx[e])] += shares.Val[e]
					}
				})
			}
		case ResidualPartial:
			xi[lo:].MarkApplied(locals[i].Idx, blk.Idx)
		case ResidualLocal:
			xi[lo:].MarkSent(locals[i].Idx)
		}
	}
	clear(flat)
	scale := 1 / float32(p)
	for i, blk := range blocks {
		lo, _ := blockBounds(i, c, n)
		for e, j := range blk.Idx {
			flat[lo+int(j)] = blk.Val[e] * scale
		}
	}
	return info, nil
}

// bsagH returns this call's h (Algorithm 2), initialising the state when the team count
// changed: h = k/P = k_b/d, step = 0.01·k(d-1)/P = 0.01·k_b(d-1)/d, flag false.
func (h *SparDL) bsagH(st *BucketState, d, kb int) int {
	if int(st.Var("bsag.d", 0)) != d || int(st.Var("bsag.kb", 0)) != kb {
		st.SetVar("bsag.d", float64(d))
		st.SetVar("bsag.kb", float64(kb))
		st.SetVar("bsag.h", float64(kb)/float64(d))
		st.SetVar("bsag.step", 0.01*float64(kb)*float64(d-1)/float64(d))
		st.SetVar("bsag.flag", 0)
	}
	floor := (kb + d - 1) / d // ceil(k/P): h never sends fewer than the paper's lower bound
	return max(floor, min(kb, int(math.Round(st.Var("bsag.h", 1)))))
}

// bsagAdapt is Algorithm 2's update after a call whose union had nt entries: the step doubles
// after two consecutive moves in the right direction, reverses and halves otherwise; h stays
// in [k/P, d·k/P] = [k_b/d, k_b].
func (h *SparDL) bsagAdapt(st *BucketState, d, kb, nt int) {
	l := float64(kb)
	step, flag := st.Var("bsag.step", 0), st.Var("bsag.flag", 0) != 0
	if (float64(nt) > l) != (step > 0) {
		if flag {
			step *= 2
			flag = false
		} else {
			flag = true
		}
	} else {
		step = -step / 2
		flag = false
	}
	hv := st.Var("bsag.h", l/float64(d)) + step
	hv = max(l/float64(d), min(l, hv))
	st.SetVar("bsag.h", hv)
	st.SetVar("bsag.step", step)
	if flag {
		st.SetVar("bsag.flag", 1)
	} else {
		st.SetVar("bsag.flag", 0)
	}
}

func init() {
	Register(Spec{
		Name:    "spardl",
		Summary: "SparDL: Spar-Reduce-Scatter, global residual collection, Spar-All-Gather (R-SAG/B-SAG), Bruck all-gather; 2⌈log2 P⌉ rounds and 4k(P-1)/P words at teams=1",
		Options: []Option{
			{Name: "density", Default: "0.01", Help: "k/n, in (0, 1]"},
			{Name: "teams", Default: "1", Help: "d, a divisor of P (power of two: R-SAG, else B-SAG), or auto (time each divisor on the first calls, keep the fastest)"},
			{Name: "residual", Default: "global", Help: "global|local|partial (local and partial: the paper's Fig. 17 ablation)"},
			{Name: "dense_warmup", Default: "0", Help: "first N calls of each bucket use a dense all-reduce"},
			{Name: "buckets", Default: "model", Help: "model: one bucket with the whole model, sparsified after backward (the paper's procedure) | ddp: DDP's size-capped buckets, overlapped with backward, each with its own budget"},
		},
		New: func(o Values) (ddp.CommHook, error) {
			buckets, err := o.Enum("buckets", BucketsModel, BucketsDDP)
			if err != nil {
				return nil, err
			}
			density, err := o.Float("density")
			if err != nil {
				return nil, err
			}
			teams := TeamsAuto
			if o.String("teams") != "auto" {
				if teams, err = o.Int("teams"); err != nil || teams < 1 {
					return nil, fmt.Errorf("hooks: spardl: option teams=%q, want a positive integer dividing the world size, or auto", o.String("teams"))
				}
			}
			residual, err := o.Enum("residual", ResidualGlobal, ResidualLocal, ResidualPartial)
			if err != nil {
				return nil, err
			}
			warm, err := o.Int("dense_warmup")
			if err != nil {
				return nil, err
			}
			h, err := NewSparDL(density, teams, residual, warm)
			if err != nil {
				return nil, err
			}
			h.Buckets = buckets
			return h, nil
		},
	})
}
