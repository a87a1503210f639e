package hooks

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// MergedTopK is the layer-wise sparsification family of OMGS-SGD (Shi et al., INFOCOM 2020; docs/ALGORITHMS.md
// §5): TopkA (exact local top-k of g + ξ, all-gather of the P·k COO pairs, scatter-add, local
// error feedback) run on every bucket of a plan that the hook chooses itself (ddp.Planner), in
// backward order so that a group is communicated while the rest of backward runs:
//
//   - lags: one bucket per parameter tensor (LAGS-SGD); the residual is per tensor;
//   - mgs: consecutive tensors merged until a group has at least threshold elements;
//   - omgs: the merge plan of least predicted iteration time under the paper's cost model,
//     fed with a measured profile.Profile (see omgs_plan.go). planner=exact (default) finds the
//     true optimum over the 2^(L-1) plans; planner=paper runs the paper's Algorithm 1, which
//     is not always optimal (a counterexample is in the tests). timeline=ddp (default) models
//     spargo's DDP, where a group is selected on the communication goroutine while backward
//     goes on; timeline=paper the paper's, where selection holds up backward.
//
// Small tensors go dense (DenseBelow, option dense_below, default DefaultDenseBelow): a tensor
// of fewer elements is not sparsified but all-reduced densely, in whatever group the plan puts
// it; the group's top-k (k = density × its other elements) and all-gather cover the rest. At
// density 0.01 top-k per tensor gives a BatchNorm γ or β, or a bias, 1 to 5 entries per step,
// whose residuals then land as large, rare jumps: LAGS diverges on VGG-11 (BENCHMARKS.md).
// Deep Gradient Compression (Lin et al. 2018) sends such tensors densely (its code compresses
// only tensors of two or more dimensions); the OMGS authors merge tensors below 8,192 elements (their MGS threshold, the
// default here) because a layer-wise all-gather of tiny tensors costs start-up time for
// nothing. The dense part keeps no residual (the conservation test holds with it), costs
// 2n(P-1)/P words, and the planner's cost model counts it (omgs_plan.go). dense_below=0 is
// the paper's algorithm: every tensor sparsified. A bucket that does not list its parameters
// (ddp.Bucket.Params nil) is sparsified whole.
//
// Backward order is the profile's measured order of grad-ready events when DDP is given a
// profile (SetProfile), reverse declaration order otherwise. On its first call on rank 0
// the hook logs its plan (slog, info) and, with a profile, the predicted iteration time next to
// the single group of TopK-SGD and the no-merging of LAGS. Its state (per-bucket residuals)
// saves with ddp.Stateful and refuses to restore under a different plan.
type MergedTopK struct {
	sparseHook
	// Threshold is mgs's merge size in elements.
	Threshold int
	// DenseBelow: tensors of fewer elements are all-reduced densely; 0 sparsifies all.
	DenseBelow int
	// Planner ("exact" or "paper") is omgs's; Timeline is the cost model's (omgs plans on it;
	// lags and mgs report their predicted times on it: DDPTimeline).
	Planner  string
	Timeline Timeline

	mu       sync.Mutex
	report   *PlanReport
	planHash float64          // identifies the plan in the saved state; 0 before Plan
	prof     *profile.Profile // SetProfile's, for Plan; nil when none
	profileP int              // the world size omgs's profile was measured at; 0 when none
	logged   bool
	phaseLog
}

// OMGS is the omgs hook: a MergedTopK whose plan rests on a measured profile, so it tells a
// program how to measure one (ProfiledPlanner). lags and mgs only use a profile when
// given one (SetProfile) (for the measured backward order and the logged predictions).
type OMGS struct{ MergedTopK }

var (
	_ ddp.CommHook    = (*MergedTopK)(nil)
	_ ddp.Stateful    = (*MergedTopK)(nil)
	_ ddp.Planner     = (*MergedTopK)(nil)
	_ ProfiledPlanner = (*OMGS)(nil)
)

// DefaultMGSThreshold is the reference implementation's merge threshold in elements.
const DefaultMGSThreshold = 8192

// DefaultDenseBelow is the default of lags, mgs and omgs's dense_below: tensors under 8,192
// elements (the OMGS authors' merge threshold) are all-reduced densely. It covers every
// one-dimensional tensor (bias, BatchNorm, LayerNorm) of VGG and ResNet-18/50 (at most 2,048)
// and of the LSTMs (4·1,500), which Deep Gradient Compression sends densely, and the first
// convolution and the classifier of the CIFAR models; for VGG-11 that is 15,114 of 9,231,114
// elements (0.16 %). See BENCHMARKS.md for the measurements.
const DefaultDenseBelow = 8192

// NewLAGS returns the lags hook; denseBelow is its dense_below (DefaultDenseBelow, or 0 for
// every tensor sparsified).
func NewLAGS(density float64, denseWarmup, denseBelow int) (*MergedTopK, error) {
	h := &MergedTopK{}
	return h, h.init("lags", density, denseWarmup, denseBelow)
}

// NewMGS returns the mgs hook.
func NewMGS(density float64, denseWarmup, denseBelow, threshold int) (*MergedTopK, error) {
	h := &MergedTopK{Threshold: threshold}
	err := h.init("mgs", density, denseWarmup, denseBelow)
	if err == nil && threshold < 1 {
		err = fmt.Errorf("hooks: mgs: option threshold=%d, want >= 1 element", threshold)
	}
	return h, err
}

// NewOMGS returns the omgs hook; planner is "exact" or "paper" (Algorithm 1, which needs the
// paper's timeline).
func NewOMGS(density float64, denseWarmup, denseBelow int, planner string, tl Timeline) (*OMGS, error) {
	h := &OMGS{MergedTopK{Planner: planner, Timeline: tl}}
	if err := h.init("omgs", density, denseWarmup, denseBelow); err != nil {
		return nil, err
	}
	switch {
	case planner != "exact" && planner != "paper":
		return nil, fmt.Errorf("hooks: omgs: option planner=%q, want exact or paper", planner)
	case tl != DDPTimeline && tl != PaperTimeline:
		return nil, fmt.Errorf("hooks: omgs: timeline %v, want ddp or paper", tl)
	case planner == "paper" && tl != PaperTimeline:
		return nil, fmt.Errorf("hooks: omgs: planner=paper (the paper's Algorithm 1) needs timeline=paper, have timeline=%v", tl)
	}
	return h, nil
}

// init sets the options every merging hook has and checks them.
func (h *MergedTopK) init(name string, density float64, denseWarmup, denseBelow int) error {
	var err error
	h.sparseHook, err = newSparseHook(name, density, denseWarmup)
	h.DenseBelow = denseBelow
	if err != nil {
		return err
	}
	return h.checkDenseBelow()
}

func (h *MergedTopK) checkDenseBelow() error {
	if h.DenseBelow < 0 {
		return fmt.Errorf("hooks: %s: option dense_below=%d, want >= 0 elements", h.name, h.DenseBelow)
	}
	return nil
}

// ProfiledPlanner is a ddp.Planner whose plan rests on a measured profile (omgs). A program
// measures one before ddp.New with profile.Measure(ctx, model, group, step,
// h.ProfileOptions()) (or loads a saved one) and hands it over with SetProfile; Plan, which
// ddp.New calls, returns an error that says so when the hook has none.
type ProfiledPlanner interface {
	ddp.Planner
	// ProfileOptions are the options the planner needs the profile measured with (its
	// density, for the top-k and all-gather sizes).
	ProfileOptions() profile.Options
	// SetProfile gives the planner its profile; the next Plan plans from it.
	SetProfile(*profile.Profile)
}

// ProfileOptions are the options omgs needs its profile measured with (ProfiledPlanner).
func (h *OMGS) ProfileOptions() profile.Options {
	return profile.Options{Density: h.Density}
}

// SetProfile gives the hook the measured profile its next Plan plans from (ProfiledPlanner):
// omgs needs one, lags and mgs take the measured backward order from it and log their
// predicted times. nil removes it.
func (h *MergedTopK) SetProfile(prof *profile.Profile) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.prof = prof
}

// PlanReport describes the plan a hook chose, for the log and the tests. Times are predicted
// by the cost model (zero without a profile).
type PlanReport struct {
	Hook     string
	Timeline Timeline
	// Groups are the group lengths in tensors and Elements their sizes, in backward order.
	Groups   []int
	Elements []int
	// Predicted is this plan's iteration time; Single the single group (TopK-SGD); LAGS no
	// merging; Paper Algorithm 1's plan (on the paper's timeline only); NonOverlapped this
	// plan's communication after the computation.
	Predicted, Single, LAGS, Paper, NonOverlapped time.Duration
}

// Report returns the plan chosen by the last Plan, or nil.
func (h *MergedTopK) Report() *PlanReport {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.report
}

// Plan chooses the buckets (ddp.Planner): groups of parameter indices in backward order.
func (h *MergedTopK) Plan(params []*nn.Param) ([][]int, error) {
	h.mu.Lock()
	prof := h.prof
	h.mu.Unlock()
	if len(params) == 0 {
		return nil, fmt.Errorf("hooks: %s: no parameters to plan", h.name)
	}
	order := make([]int, len(params))
	for i := range order {
		order[i] = len(params) - 1 - i
	}
	if prof != nil {
		if err := prof.Check(params); err != nil {
			return nil, fmt.Errorf("hooks: %s: the profile does not fit the model: %w", h.name, err)
		}
		order = prof.Order()
	}
	sizes := make([]int, len(order))
	for j, i := range order {
		sizes[j] = params[i].Len()
	}
	rep, err := h.planReport(order, sizes, prof)
	if err != nil {
		return nil, err
	}
	var plan [][]int
	hash := fnv.New64a()
	j := 0
	for _, n := range rep.Groups {
		group := slices.Clone(order[j : j+n])
		for _, i := range group {
			fmt.Fprintf(hash, "%s,", params[i].Name)
		}
		hash.Write([]byte{';'})
		plan = append(plan, group)
		j += n
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.report, h.logged = rep, false
	h.profileP = 0
	if prof != nil && h.name == "omgs" {
		h.profileP = prof.P
	}
	h.planHash = float64(hash.Sum64()>>12) + 1 // exact in a float64, never 0
	return plan, nil
}

// PlanProfile returns the plan Plan would choose for a model that prof fits, from the
// profile alone (its parameters' names and sizes), with the predicted times: what
// `spargo plan` prints. It leaves the hook's own plan and state alone.
func (h *MergedTopK) PlanProfile(prof *profile.Profile) (*PlanReport, error) {
	if prof == nil {
		return nil, fmt.Errorf("hooks: %s: PlanProfile needs a profile", h.name)
	}
	if len(prof.Sizes) != len(prof.Params) || len(prof.ParamBackward) != len(prof.Params) {
		return nil, fmt.Errorf("hooks: %s: the profile has %d parameters, %d sizes and %d backward times", h.name, len(prof.Params), len(prof.Sizes), len(prof.ParamBackward))
	}
	if len(prof.Params) == 0 {
		return nil, fmt.Errorf("hooks: %s: no parameters to plan", h.name)
	}
	order := prof.Order()
	sizes := make([]int, len(order))
	for j, i := range order {
		sizes[j] = prof.Sizes[i]
	}
	return h.planReport(order, sizes, prof)
}

// planReport plans the tensors of sizes (backward order; order are their indices in the
// model) on prof, which may be nil for lags and mgs, and fills the report.
func (h *MergedTopK) planReport(order, sizes []int, prof *profile.Profile) (*PlanReport, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	if err := h.checkDenseBelow(); err != nil {
		return nil, err
	}
	rep := &PlanReport{Hook: h.name, Timeline: h.Timeline}
	var model MergeModel
	if prof != nil {
		model = NewMergeModel(prof, order, h.Density, h.Timeline)
		model.DenseBelow = h.DenseBelow
		if h.name == "omgs" && len(prof.AllReduce.Samples) == 0 && slices.ContainsFunc(sizes, func(n int) bool { return n < h.DenseBelow }) {
			return nil, fmt.Errorf("hooks: %s: dense_below=%d sends small tensors densely, and the profile has no all-reduce timings "+
				"(it was saved before spargo measured them): measure the profile again, or give dense_below=0", h.name, h.DenseBelow)
		}
	}
	switch h.name {
	case "lags":
		rep.Groups = PlanLAGS(len(order))
	case "mgs":
		rep.Groups = PlanThreshold(sizes, h.Threshold)
	case "omgs":
		if prof == nil {
			return nil, fmt.Errorf("hooks: omgs: no measured profile: omgs plans its buckets from measured costs; " +
				"measure them before ddp.New with profile.Measure(ctx, model, group, step, hook.ProfileOptions()) and give the result " +
				"to the hook with SetProfile (examples/vgg does so for -hook omgs, and -profile FILE saves it for reuse)")
		}
		var err error
		if h.Planner == "paper" {
			rep.Groups, _, err = FindMergedLayers(model)
		} else {
			rep.Groups, err = OptimalMerge(model)
		}
		if err != nil {
			return nil, fmt.Errorf("hooks: omgs: %w", err)
		}
	default:
		return nil, fmt.Errorf("hooks: %s is not a merging hook", h.name)
	}
	if prof != nil {
		secs := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
		rep.Predicted = secs(model.Predict(rep.Groups))
		rep.NonOverlapped = secs(model.NonOverlapped(rep.Groups))
		rep.Single = secs(model.Predict(PlanSingle(len(order))))
		rep.LAGS = secs(model.Predict(PlanLAGS(len(order))))
		if h.Timeline == PaperTimeline {
			if p, _, err := FindMergedLayers(model); err == nil {
				rep.Paper = secs(model.Predict(p))
			}
		}
	}
	j := 0
	for _, n := range rep.Groups {
		elems := 0
		for _, s := range sizes[j : j+n] {
			elems += s
		}
		rep.Elements = append(rep.Elements, elems)
		j += n
	}
	return rep, nil
}

// varPlan is the state variable that ties a bucket's residual to the plan it was saved under.
const varPlan = "plan"

// Run communicates one bucket (TopkA's step), records its phases and, on the first call on
// rank 0, logs the plan.
func (h *MergedTopK) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	start := time.Now()
	h.logPlan(g)
	if err := h.checkPlan(g, b); err != nil {
		return ddp.Ready(nil, err)
	}
	var marks stepMarks
	n := len(b.Flat())
	dense, nd := h.denseSegments(b)
	k := 0
	if nd < n {
		k = h.k(n - nd)
	}
	fut := h.run(ctx, g, b, func(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState) error {
		return mergedStep(ctx, g, tag, flat, st, dense, nd, k, &marks)
	})
	h.record(b.Index(), n, nd, k, start, marks)
	return fut
}

// segment is a range [lo, hi) of a bucket's flat gradient.
type segment struct{ lo, hi int }

// denseSegments returns the ranges of b's tensors under DenseBelow elements (consecutive
// ones joined) and their total length.
func (h *MergedTopK) denseSegments(b ddp.Bucket) ([]segment, int) {
	var segs []segment
	total := 0
	offs := b.Offsets()
	for i, p := range b.Params() {
		n := p.Len()
		if h.DenseBelow <= 0 || n >= h.DenseBelow || n == 0 {
			continue
		}
		lo := offs[i]
		if len(segs) > 0 && segs[len(segs)-1].hi == lo {
			segs[len(segs)-1].hi += n
		} else {
			segs = append(segs, segment{lo, lo + n})
		}
		total += n
	}
	return segs, total
}

// mergedStep is one call of lags, mgs or omgs on a bucket whose dense segments hold nd of its
// elements: the dense part (g + ξ there) is all-reduced and its residual emptied; the rest
// takes TopkA's step with k entries per rank. The dense part is zeroed before the step, so the
// selection never takes it (at worst it takes zeros there, which send nothing and leave no
// residual); then the averaged dense values are written back.
func mergedStep(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState, dense []segment, nd, k int, marks *stepMarks) error {
	if nd == len(flat) {
		_, err := denseAverage(ctx, g, tag+tagDense, flat, st.Residual)
		return err
	}
	if nd == 0 {
		return topkaStep(ctx, g, tag, flat, st, k, marks)
	}
	part := make([]float32, 0, nd)
	for _, s := range dense {
		xi := st.Residual[s.lo:s.hi]
		xi.Compensate(flat[s.lo:s.hi])
		xi.MarkAllSent()
		part = append(part, flat[s.lo:s.hi]...)
		clear(flat[s.lo:s.hi])
	}
	if err := comm.AllReduce(ctx, g, tag+tagDense, part, comm.Auto); err != nil {
		return fmt.Errorf("all-reduce of the small tensors: %w", err)
	}
	if err := topkaStep(ctx, g, tag, flat, st, k, marks); err != nil {
		return err
	}
	kernels.Scale(1/float32(g.Size()), part)
	for _, s := range dense {
		part = part[copy(flat[s.lo:s.hi], part):]
	}
	return nil
}

// checkPlan ties the bucket's state to the plan: restored state saved under another plan is
// refused.
func (h *MergedTopK) checkPlan(g comm.Group, b ddp.Bucket) error {
	h.mu.Lock()
	hash, profP := h.planHash, h.profileP
	h.mu.Unlock()
	if profP != 0 && profP != g.Size() {
		return fmt.Errorf("hooks: %s: the profile was measured with %d ranks, this group has %d: its all-gather costs do not apply; measure the profile again on this group", h.name, profP, g.Size())
	}
	if hash == 0 {
		return nil // not planned by DDP (a test's bucket)
	}
	st, err := h.memory().Bucket(g, b)
	if err != nil {
		return fmt.Errorf("hooks: %s: bucket %d: %w", h.name, b.Index(), err)
	}
	if st.HasVar(varPlan) && st.Var(varPlan, 0) != hash {
		return fmt.Errorf("hooks: %s: bucket %d: the restored state was saved under a different bucket plan (another model, hook option or profile)", h.name, b.Index())
	}
	st.SetVar(varPlan, hash)
	return nil
}

// logPlan logs the plan once, on rank 0.
func (h *MergedTopK) logPlan(g comm.Group) {
	h.mu.Lock()
	rep := h.report
	done := h.logged || rep == nil || g.Rank() != 0
	h.logged = true
	h.mu.Unlock()
	if done {
		return
	}
	args := []any{"groups", len(rep.Groups), "tensors_per_group", rep.Groups, "elements_per_group", rep.Elements}
	if rep.Predicted > 0 {
		args = append(args, "timeline", rep.Timeline.String(), "predicted_iteration", rep.Predicted,
			"predicted_non_overlapped", rep.NonOverlapped, "topk_sgd_single_group", rep.Single, "lags_no_merging", rep.LAGS)
		if rep.Paper > 0 {
			args = append(args, "paper_algorithm1", rep.Paper)
		}
	}
	slog.Info(h.name+": bucket plan", args...)
}

// mergedOptions are the options of lags, mgs and omgs: the baselines' and dense_below, then
// extra.
func mergedOptions(extra ...Option) []Option {
	return append(append(slices.Clone(baselineOptions),
		Option{Name: "dense_below", Default: fmt.Sprint(DefaultDenseBelow),
			Help: "tensors with fewer elements are all-reduced densely, not sparsified (biases, BatchNorm); 0: sparsify every tensor"}),
		extra...)
}

// parseMerged reads the baselines' options and dense_below.
func parseMerged(o Values) (density float64, denseWarmup, denseBelow int, err error) {
	if density, denseWarmup, err = parseBaseline(o); err != nil {
		return 0, 0, 0, err
	}
	denseBelow, err = o.Int("dense_below")
	return density, denseWarmup, denseBelow, err
}

func init() {
	Register(Spec{
		Name:    "lags",
		Summary: "LAGS-SGD: TopkA per parameter tensor, each sent as soon as its gradient is ready; residual per tensor",
		Options: mergedOptions(),
		New: func(o Values) (ddp.CommHook, error) {
			density, warm, below, err := parseMerged(o)
			if err != nil {
				return nil, err
			}
			return NewLAGS(density, warm, below)
		},
	})
	Register(Spec{
		Name:    "mgs",
		Summary: "MGS-SGD: TopkA on consecutive tensors (backward order) merged until a group has threshold elements",
		Options: mergedOptions(
			Option{Name: "threshold", Default: fmt.Sprint(DefaultMGSThreshold), Help: "merge tensors until a group has this many elements"}),
		New: func(o Values) (ddp.CommHook, error) {
			density, warm, below, err := parseMerged(o)
			if err != nil {
				return nil, err
			}
			th, err := o.Int("threshold")
			if err != nil {
				return nil, err
			}
			return NewMGS(density, warm, below, th)
		},
	})
	Register(Spec{
		Name:    "omgs",
		Summary: "OMGS-SGD: TopkA on the merge plan of least predicted iteration time; needs a measured profile (profile.Measure, then SetProfile)",
		Options: mergedOptions(
			Option{Name: "planner", Default: "exact", Help: "exact (optimum over all merge plans) | paper (the paper's Algorithm 1, not always optimal; needs timeline=paper)"},
			Option{Name: "timeline", Default: "ddp", Help: "ddp (selection on DDP's communication goroutine) | paper (selection holds up backward, the paper's model)"}),
		New: func(o Values) (ddp.CommHook, error) {
			density, warm, below, err := parseMerged(o)
			if err != nil {
				return nil, err
			}
			planner, err := o.Enum("planner", "exact", "paper")
			if err != nil {
				return nil, err
			}
			tls, err := o.Enum("timeline", "ddp", "paper")
			if err != nil {
				return nil, err
			}
			tl := DDPTimeline
			if tls == "paper" {
				tl = PaperTimeline
			}
			return NewOMGS(density, warm, below, planner, tl)
		},
	})
}
