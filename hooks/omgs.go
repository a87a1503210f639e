package hooks

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// MergedTopK is the layer-wise sparsification family of OMGS-SGD (paper 003; ALGORITHMS.md
// §5): TopkA (exact local top-k of g + ξ, all-gather of the P·k COO pairs, scatter-add, local
// error feedback) run on every bucket of a plan that the hook chooses itself (ddp.Planner), in
// backward order so that a group is communicated while the rest of backward runs:
//
//   - lags: one bucket per parameter tensor (LAGS-SGD); the residual is per tensor;
//   - mgs: consecutive tensors merged until a group has at least threshold elements;
//   - omgs: the merge plan of least predicted iteration time under the paper's cost model,
//     fed with a measured ddp.Profile (see omgs_plan.go). planner=exact (default) finds the
//     true optimum over the 2^(L-1) plans; planner=paper runs the paper's Algorithm 1, which
//     is not always optimal (a counterexample is in the tests). timeline=ddp (default) models
//     spargo's DDP, where a group is selected on the communication goroutine while backward
//     goes on; timeline=paper the paper's, where selection holds up backward.
//
// Backward order is the profile's measured order of grad-ready events when DDP is given a
// profile (ddp.WithProfile), reverse declaration order otherwise. On its first call on rank 0
// the hook logs its plan (slog, info) and, with a profile, the predicted iteration time next to
// the single group of TopK-SGD and the no-merging of LAGS. Its state (per-bucket residuals)
// saves with ddp.Stateful and refuses to restore under a different plan.
type MergedTopK struct {
	sparseHook
	// Threshold is mgs's merge size in elements.
	Threshold int
	// Planner ("exact" or "paper") is omgs's; Timeline is the cost model's (omgs plans on it;
	// lags and mgs report their predicted times on it: DDPTimeline).
	Planner  string
	Timeline Timeline

	mu       sync.Mutex
	report   *PlanReport
	planHash float64 // identifies the plan in the saved state; 0 before Plan
	profileP int     // the world size omgs's profile was measured at; 0 when none
	logged   bool
	phases   map[int]GroupPhases
}

// OMGS is the omgs hook: a MergedTopK whose plan rests on a measured profile, so it tells a
// program how to measure one (ddp.ProfiledPlanner). lags and mgs only use a profile when
// given one (for the measured backward order and the logged predictions).
type OMGS struct{ MergedTopK }

var (
	_ ddp.CommHook        = (*MergedTopK)(nil)
	_ ddp.Stateful        = (*MergedTopK)(nil)
	_ ddp.Planner         = (*MergedTopK)(nil)
	_ ddp.ProfiledPlanner = (*OMGS)(nil)
)

// DefaultMGSThreshold is the reference implementation's merge threshold in elements.
const DefaultMGSThreshold = 8192

// NewLAGS returns the lags hook.
func NewLAGS(density float64, denseWarmup int) (*MergedTopK, error) {
	h, err := newSparseHook("lags", density, denseWarmup)
	return &MergedTopK{sparseHook: h}, err
}

// NewMGS returns the mgs hook.
func NewMGS(density float64, denseWarmup, threshold int) (*MergedTopK, error) {
	h, err := newSparseHook("mgs", density, denseWarmup)
	if err == nil && threshold < 1 {
		err = fmt.Errorf("hooks: mgs: option threshold=%d, want >= 1 element", threshold)
	}
	return &MergedTopK{sparseHook: h, Threshold: threshold}, err
}

// NewOMGS returns the omgs hook; planner is "exact" or "paper" (Algorithm 1, which needs the
// paper's timeline).
func NewOMGS(density float64, denseWarmup int, planner string, tl Timeline) (*OMGS, error) {
	h, err := newSparseHook("omgs", density, denseWarmup)
	if err != nil {
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
	return &OMGS{MergedTopK{sparseHook: h, Planner: planner, Timeline: tl}}, nil
}

// ProfileOptions are the options omgs needs its profile measured with (ddp.ProfiledPlanner).
func (h *OMGS) ProfileOptions() ddp.ProfileOptions {
	return ddp.ProfileOptions{Density: h.Density}
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
func (h *MergedTopK) Plan(params []*nn.Param, prof *ddp.Profile) ([][]int, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
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
	rep := &PlanReport{Hook: h.name, Timeline: h.Timeline}
	var model MergeModel
	if prof != nil {
		model = NewMergeModel(prof, order, h.Density, h.Timeline)
	}
	switch h.name {
	case "lags":
		rep.Groups = PlanLAGS(len(order))
	case "mgs":
		rep.Groups = PlanThreshold(sizes, h.Threshold)
	case "omgs":
		if prof == nil {
			return nil, fmt.Errorf("hooks: omgs: no measured profile: omgs plans its buckets from measured costs; " +
				"measure them before ddp.New with ddp.MeasureProfile(ctx, model, group, step, hook.ProfileOptions()) and pass the result " +
				"with ddp.WithProfile (examples/vgg does so for -hook omgs, and -profile FILE saves it for reuse)")
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
	var plan [][]int
	hash := fnv.New64a()
	j := 0
	for _, n := range rep.Groups {
		group := slices.Clone(order[j : j+n])
		elems := 0
		for _, i := range group {
			elems += params[i].Len()
			fmt.Fprintf(hash, "%s,", params[i].Name)
		}
		hash.Write([]byte{';'})
		rep.Elements = append(rep.Elements, elems)
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

// varPlan is the state variable that ties a bucket's residual to the plan it was saved under.
const varPlan = "plan"

// GroupPhases is one group's last call, its phases measured from the moment DDP called the
// hook: selection done (Selected), all-gather done (Gathered), result ready (Done).
type GroupPhases struct {
	Bucket                   int
	Elements                 int
	K                        int
	Dense                    bool // a dense_warmup call: no phases
	Selected, Gathered, Done time.Duration
}

// Phases returns the last call of every bucket, in bucket order.
func (h *MergedTopK) Phases() []GroupPhases {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]GroupPhases, 0, len(h.phases))
	for _, t := range h.phases {
		out = append(out, t)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Bucket < out[b].Bucket })
	return out
}

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
	k := h.k(n)
	fut := h.run(ctx, g, b, func(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState) error {
		return topkaStep(ctx, g, tag, flat, st, k, &marks)
	})
	tr := GroupPhases{Bucket: b.Index(), Elements: n, K: k, Done: time.Since(start), Dense: marks.selected.IsZero()}
	if !tr.Dense {
		tr.Selected, tr.Gathered = marks.selected.Sub(start), marks.gathered.Sub(start)
	}
	h.mu.Lock()
	if h.phases == nil {
		h.phases = map[int]GroupPhases{}
	}
	h.phases[b.Index()] = tr
	h.mu.Unlock()
	return fut
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

// GroupTrace is one group of the last iteration on DDP's timeline, from the start of
// backward: its gradients ready, DDP calling the hook, selection done, all-gather done,
// result ready.
type GroupTrace struct {
	Bucket                               int
	Elements                             int
	Ready, Start, Sparsified, Sent, Done time.Duration
}

// Trace combines DDP's statistics of the last iteration (DDP.Stats) with the hook's phases:
// one entry per bucket, on one timeline.
func (h *MergedTopK) Trace(st ddp.IterationStats) []GroupTrace {
	phases := map[int]GroupPhases{}
	for _, t := range h.Phases() {
		phases[t.Bucket] = t
	}
	var out []GroupTrace
	for _, b := range st.Buckets {
		t := phases[b.Index]
		out = append(out, GroupTrace{Bucket: b.Index, Elements: b.Elements, Ready: b.Ready, Start: b.CommStart,
			Sparsified: b.CommStart + t.Selected, Sent: b.CommStart + t.Gathered, Done: b.CommEnd})
	}
	return out
}

func init() {
	Register(Spec{
		Name:    "lags",
		Summary: "LAGS-SGD: TopkA per parameter tensor, each sent as soon as its gradient is ready; residual per tensor",
		Options: baselineOptions,
		New: func(o Values) (ddp.CommHook, error) {
			density, warm, err := parseBaseline(o)
			if err != nil {
				return nil, err
			}
			return NewLAGS(density, warm)
		},
	})
	Register(Spec{
		Name:    "mgs",
		Summary: "MGS-SGD: TopkA on consecutive tensors (backward order) merged until a group has threshold elements",
		Options: append(slices.Clone(baselineOptions),
			Option{Name: "threshold", Default: fmt.Sprint(DefaultMGSThreshold), Help: "merge tensors until a group has this many elements"}),
		New: func(o Values) (ddp.CommHook, error) {
			density, warm, err := parseBaseline(o)
			if err != nil {
				return nil, err
			}
			th, err := o.Int("threshold")
			if err != nil {
				return nil, err
			}
			return NewMGS(density, warm, th)
		},
	})
	Register(Spec{
		Name:    "omgs",
		Summary: "OMGS-SGD: TopkA on the merge plan of least predicted iteration time; needs a measured profile (ddp.MeasureProfile, ddp.WithProfile)",
		Options: append(slices.Clone(baselineOptions),
			Option{Name: "planner", Default: "exact", Help: "exact (optimum over all merge plans) | paper (the paper's Algorithm 1, not always optimal; needs timeline=paper)"},
			Option{Name: "timeline", Default: "ddp", Help: "ddp (selection on DDP's communication goroutine) | paper (selection holds up backward, the paper's model)"}),
		New: func(o Values) (ddp.CommHook, error) {
			density, warm, err := parseBaseline(o)
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
			return NewOMGS(density, warm, planner, tl)
		},
	})
}
