// Package overlap measures what OMGS-SGD's layer-wise hooks (lags, mgs, omgs) exist for: the
// communication a comm hook leaves after backward. It trains a model through DDP with each
// hook in turn and reads DDP's statistics of every iteration on rank 0: the backward time, the
// iteration time (every group reduced), the non-overlapped time between the two
// (IterationStats.End - BackwardEnd) and how many groups were done before backward was, with
// an optional trace of one iteration (per group: gradients ready, hook called, selected,
// all-gathered, done).
//
// The same code runs with P in-process workers (RunLocal) and as one rank per process of a
// launched job (Run on the group from cluster.Init), so in-process and network numbers come from
// one measurement. `spargo bench overlap` is its command line; the VGG example's
// BenchmarkNonOverlapped its go test -bench form.
//
//	hs, err := overlap.ParseHooks("topka:density=0.01", "omgs:density=0.01")
//	cfg := overlap.Config{Model: entry, Hooks: hs, SingleBucket: true, Batch: 16, Warmup: 1, Iters: 5}
//	rep, err := overlap.RunLocal(ctx, 4, cfg) // rank 0's report
//	rep.WriteText(os.Stdout)
package overlap

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// Config is one measurement: every hook of Hooks on the same model, data and seed.
type Config struct {
	// Model is a catalogue entry (models.Lookup): an image classifier (Input.Size > 0) fed
	// random images, or an LSTM language model (*models.LSTMLM) fed token windows.
	Model models.Entry
	// Hooks are the comm hooks (ParseHooks), measured one after the other.
	Hooks []Hook
	// SingleBucket gives hooks that do not plan their own buckets (topka, allreduce, …) the
	// whole model as one bucket: TopK-SGD's single group. False: DDP's size-capped plan
	// (1 MiB first, 25 MiB after). Planner hooks (lags, mgs, omgs) always use their own plan.
	SingleBucket bool
	// Batch is per rank: images, or columns of a language model's window.
	Batch int
	// BPTT is a language model's window length in tokens (ignored for images).
	BPTT int
	// Tokens, for a language model, is the training stream (e.g. PTB's) whose windows are
	// fed: each rank takes its contiguous shard in Batch columns and steps through its
	// windows. Nil: uniformly random tokens.
	Tokens []int32
	// Warmup iterations run unmeasured per hook, then Iters are measured.
	Warmup, Iters int
	// ProfileWarmup and ProfileIterations are the profile's steps (profile.Measure), when a
	// hook needs one (omgs); 0 takes 1 and 3.
	ProfileWarmup, ProfileIterations int
	// Seed seeds the weights (the same on every rank) and the data (rank-dependent).
	Seed uint64
	// Trace keeps the last measured iteration's groups on rank 0 (HookReport.Trace).
	Trace bool
}

// Defaults of Config's profile steps: a VGG-16 step takes seconds on a loaded 2-core machine,
// and the backward timings settle within a few steps.
const (
	DefaultProfileWarmup     = 1
	DefaultProfileIterations = 3
)

// Report is rank 0's result of Run.
type Report struct {
	Model   string `json:"model"`
	Params  int    `json:"params"`
	Tensors int    `json:"tensors"`
	Workers int    `json:"workers"`
	// Input says what was fed (random images, random tokens, PTB windows).
	Input  string `json:"input"`
	Batch  int    `json:"batch"`
	BPTT   int    `json:"bptt,omitempty"`
	Warmup int    `json:"warmup"`
	Iters  int    `json:"iters"`
	// Transport is filled in by the caller (RunLocal: "in-process").
	Transport string       `json:"transport"`
	Hooks     []HookReport `json:"hooks"`
}

// HookReport is one hook's measurement on rank 0's DDP timeline. Times are medians over the
// measured iterations, in milliseconds from the start of backward.
type HookReport struct {
	Hook string `json:"hook"`
	// Plan is where the buckets came from: "hook" (the hook's own planner), "single" (the
	// whole model in one bucket) or "size-capped" (DDP's default).
	Plan string `json:"plan"`
	// Profiled: the hook planned on a measured profile (omgs; lags and mgs get the same
	// profile when one was measured, for the measured backward order).
	Profiled      bool  `json:"profiled"`
	Groups        int   `json:"groups"`
	GroupElements []int `json:"group_elements"`
	// DoneInBackward is the mean, over the measured iterations, of the groups whose result
	// was ready before backward returned.
	DoneInBackward  float64 `json:"done_in_backward"`
	BackwardMS      float64 `json:"backward_ms"`
	IterationMS     float64 `json:"iteration_ms"`
	NonOverlappedMS float64 `json:"non_overlapped_ms"`
	// The per-iteration values the medians come from.
	BackwardEach      []float64 `json:"backward_ms_each"`
	IterationEach     []float64 `json:"iteration_ms_each"`
	NonOverlappedEach []float64 `json:"non_overlapped_ms_each"`
	Trace             *Trace    `json:"trace,omitempty"`
}

// Trace is the last measured iteration on rank 0.
type Trace struct {
	BackwardEndMS float64      `json:"backward_end_ms"`
	EndMS         float64      `json:"end_ms"`
	Groups        []TraceGroup `json:"groups"`
}

// TraceGroup is one group's moments in ms from the start of backward. SelectedMS and SentMS
// are nil for a dense call and for hooks that do not record their phases (hooks.GroupTracer).
// SentMS includes waiting for the other ranks' selections.
type TraceGroup struct {
	Bucket     int      `json:"bucket"`
	Elements   int      `json:"elements"`
	ReadyMS    float64  `json:"ready_ms"`
	HookMS     float64  `json:"hook_ms"`
	SelectedMS *float64 `json:"selected_ms,omitempty"`
	SentMS     *float64 `json:"sent_ms,omitempty"`
	DoneMS     float64  `json:"done_ms"`
}

// check validates cfg and fills in the profile defaults.
func (cfg *Config) check() error {
	switch {
	case cfg.Model.Build == nil:
		return errors.New("overlap: no model")
	case len(cfg.Hooks) == 0:
		return errors.New("overlap: no hook to measure")
	case cfg.Batch < 1:
		return fmt.Errorf("overlap: batch %d: want at least 1", cfg.Batch)
	case cfg.Iters < 1:
		return fmt.Errorf("overlap: iterations %d: want at least 1", cfg.Iters)
	case cfg.Warmup < 0:
		return fmt.Errorf("overlap: warm-up %d: want 0 or more", cfg.Warmup)
	case cfg.ProfileWarmup < 0 || cfg.ProfileIterations < 0:
		return fmt.Errorf("overlap: profile steps %d + %d: want 0 or more", cfg.ProfileWarmup, cfg.ProfileIterations)
	}
	if cfg.ProfileWarmup == 0 {
		cfg.ProfileWarmup = DefaultProfileWarmup
	}
	if cfg.ProfileIterations == 0 {
		cfg.ProfileIterations = DefaultProfileIterations
	}
	for i, h := range cfg.Hooks {
		if h.Config.Name() == "" {
			return fmt.Errorf("overlap: hook %d (%q) has no configuration: build Hooks with ParseHooks", i, h.Label)
		}
	}
	return nil
}

// Hook is one comm hook to measure: its parsed spec and the label its report row carries.
type Hook struct {
	Label  string
	Config hooks.Config
}

// ParseHooks parses comm hook specs (hooks.ParseConfig), each labelled as written.
func ParseHooks(specs ...string) ([]Hook, error) {
	hs := make([]Hook, len(specs))
	for i, s := range specs {
		c, err := hooks.ParseConfig(s)
		if err != nil {
			return nil, fmt.Errorf("overlap: %w", err)
		}
		hs[i] = Hook{Label: s, Config: c}
	}
	return hs, nil
}

// RunLocal runs the measurement on p in-process workers (comm.NewLocal) and returns rank 0's
// report.
func RunLocal(ctx context.Context, p int, cfg Config) (*Report, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	groups, err := comm.NewLocal(p)
	if err != nil {
		return nil, fmt.Errorf("overlap: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reports := make([]*Report, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			defer g.Close()
			if reports[r], errs[r] = Run(ctx, g, cfg); errs[r] != nil {
				cancel() // unblock the other ranks
			}
		})
	}
	wg.Wait()
	if err := firstCause(errs); err != nil {
		return nil, err
	}
	reports[0].Transport = "in-process"
	return reports[0], nil
}

// firstCause returns the first error that is not a cancellation caused by another rank's
// failure, else the first error.
func firstCause(errs []error) error {
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return errors.Join(errs...)
}

// Run is one rank's part: every rank of g calls it with the same cfg. Rank 0 returns the
// report, the others nil.
func Run(ctx context.Context, g comm.Group, cfg Config) (*Report, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	probe, err := cfg.Model.Build(nn.NewRand(cfg.Seed))
	if err != nil {
		return nil, fmt.Errorf("overlap: model %s: %w", cfg.Model.Name, err)
	}
	params := nn.Parameters(probe)
	data, err := newWorkload(cfg, probe, g.Rank(), g.Size())
	if err != nil {
		return nil, err
	}
	rep := &Report{Model: cfg.Model.Name, Params: nn.NumParams(params), Tensors: len(params), Workers: g.Size(),
		Input: data.describe, Batch: cfg.Batch, Warmup: cfg.Warmup, Iters: cfg.Iters}
	if data.lm {
		rep.BPTT = cfg.BPTT
	}
	// One profile per distinct profile density (omgs's), measured on the probe model before
	// any hook runs, so that every planner hook can plan on it whatever the order.
	profiles := map[float64]*profile.Profile{}
	var first *profile.Profile
	for _, hk := range cfg.Hooks {
		h, err := hk.Config.New()
		if err != nil {
			return nil, fmt.Errorf("overlap: %s: %w", hk.Label, err)
		}
		pp, ok := h.(hooks.ProfiledPlanner)
		if !ok {
			continue
		}
		po := pp.ProfileOptions()
		po.Warmup, po.Iterations = cfg.ProfileWarmup, cfg.ProfileIterations
		if _, done := profiles[po.Density]; done {
			continue
		}
		tape := nn.NewTape()
		nn.SetTraining(probe, true)
		prof, err := profile.Measure(ctx, probe, g, func(backward func(*nn.Var) error) error {
			loss, err := data.loss(tape, probe.Forward)
			if err != nil {
				return err
			}
			return backward(loss)
		}, po)
		if err != nil {
			return nil, fmt.Errorf("overlap: rank %d: profile for %s: %w", g.Rank(), hk.Label, err)
		}
		profiles[po.Density] = prof
		if first == nil {
			first = prof
		}
	}
	for _, hk := range cfg.Hooks {
		runtime.GC() // the previous hook's model and residuals are garbage: do not bill them here
		hr, err := measureHook(ctx, g, cfg, hk, profiles, first)
		if err != nil {
			return nil, fmt.Errorf("overlap: rank %d: %s: %w", g.Rank(), hk.Label, err)
		}
		rep.Hooks = append(rep.Hooks, hr)
	}
	if g.Rank() != 0 {
		return nil, nil
	}
	return rep, nil
}

// measureHook trains with one hook and returns rank 0's statistics (every rank returns them;
// only rank 0's are reported).
func measureHook(ctx context.Context, g comm.Group, cfg Config, hk Hook, profiles map[float64]*profile.Profile, first *profile.Profile) (HookReport, error) {
	hook, err := hk.Config.New()
	if err != nil {
		return HookReport{}, err
	}
	m, err := cfg.Model.Build(nn.NewRand(cfg.Seed))
	if err != nil {
		return HookReport{}, err
	}
	data, err := newWorkload(cfg, m, g.Rank(), g.Size())
	if err != nil {
		return HookReport{}, err
	}
	hr := HookReport{Hook: hk.Label}
	opts := []ddp.Option{ddp.WithCommHook(hook)}
	switch _, planner := hook.(ddp.Planner); {
	case planner:
		hr.Plan = "hook"
		prof := first // lags and mgs: the measured backward order, when a profile exists
		if pp, ok := hook.(hooks.ProfiledPlanner); ok {
			prof = profiles[pp.ProfileOptions().Density]
		}
		if setter, ok := hook.(interface{ SetProfile(*profile.Profile) }); ok && prof != nil {
			setter.SetProfile(prof)
			hr.Profiled = true
		}
	case cfg.SingleBucket:
		hr.Plan = "single"
		opts = append(opts, ddp.WithPlan([][]int{reverseOrder(len(nn.Parameters(m)))}))
	default:
		hr.Plan = "size-capped"
	}
	dp, err := ddp.New(ctx, m, g, opts...)
	if err != nil {
		return HookReport{}, err
	}
	params := dp.Parameters()
	for _, group := range dp.Plan() {
		n := 0
		for _, i := range group {
			n += params[i].Len()
		}
		hr.GroupElements = append(hr.GroupElements, n)
	}
	hr.Groups = len(hr.GroupElements)
	nn.SetTraining(m, true)
	tape := nn.NewTape()
	done := 0
	for it := range cfg.Warmup + cfg.Iters {
		loss, err := data.loss(tape, dp.Forward)
		if err != nil {
			return HookReport{}, err
		}
		nn.ZeroGrad(params)
		if err := dp.Backward(ctx, loss); err != nil {
			return HookReport{}, err
		}
		if it < cfg.Warmup {
			continue
		}
		st := dp.Stats()
		hr.BackwardEach = append(hr.BackwardEach, ms(st.BackwardEnd))
		hr.IterationEach = append(hr.IterationEach, ms(st.End))
		hr.NonOverlappedEach = append(hr.NonOverlappedEach, ms(st.End-st.BackwardEnd))
		for _, b := range st.Buckets {
			if b.CommEnd < st.BackwardEnd {
				done++
			}
		}
	}
	hr.DoneInBackward = float64(done) / float64(cfg.Iters)
	hr.BackwardMS, hr.IterationMS, hr.NonOverlappedMS = median(hr.BackwardEach), median(hr.IterationEach), median(hr.NonOverlappedEach)
	if cfg.Trace {
		hr.Trace = trace(hook, dp.Stats())
	}
	return hr, nil
}

// reverseOrder is 0..n-1 backwards: the order gradients become ready in most models.
func reverseOrder(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = n - 1 - i
	}
	return idx
}

// trace is the last iteration's groups: DDP's bucket statistics, with the selection and
// all-gather moments of hooks that record them.
func trace(hook ddp.CommHook, st ddp.IterationStats) *Trace {
	t := &Trace{BackwardEndMS: ms(st.BackwardEnd), EndMS: ms(st.End)}
	phases := map[int]hooks.GroupTrace{}
	if gt, ok := hook.(hooks.GroupTracer); ok {
		for _, p := range gt.Trace(st) {
			phases[p.Bucket] = p
		}
	}
	for _, b := range st.Buckets {
		g := TraceGroup{Bucket: b.Index, Elements: b.Elements, ReadyMS: ms(b.Ready), HookMS: ms(b.CommStart), DoneMS: ms(b.CommEnd)}
		if p, ok := phases[b.Index]; ok && !p.Dense {
			sel, sent := ms(p.Sparsified), ms(p.Sent)
			g.SelectedMS, g.SentMS = &sel, &sent
		}
		t.Groups = append(t.Groups, g)
	}
	return t
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}
