package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

func init() {
	commands["plan"] = command{"print the merge plans of omgs, mgs, lags and TopK-SGD and their predicted iteration times, without training", runPlan}
}

const planHelp = `usage: spargo plan (-profile FILE | -measure -model M -workers P -batch B [-size S] [-bptt T])
                  [-model M] [-hook SPEC]... [-density D] [-dense-below N]
                  [-allgather-alpha 22ms] [-allgather-beta 272] [-allreduce-alpha A] [-allreduce-beta B]
                  [-network 1gbit,50us] [-network-workers 16] [-compute-scale 0.1] [-save FILE] [-json]

Prints the bucket plans that the merging hooks (lags, mgs, omgs: OMGS-SGD, Shi et al., INFOCOM 2020) would
choose for a model, with the iteration time the OMGS cost model predicts for each, next to
TopK-SGD's (the whole model as one group) and LAGS's (no merging), without training. The
plans come from the hooks' own planner (hooks.MergedTopK.PlanProfile), the one DDP calls
before the first step, on a profile.Profile: per-tensor backward times, forward time, the top-k
cost γ·n·log2 n and the all-gather and all-reduce costs α + β·bytes.

The profile is read from -profile FILE (saved by examples/vgg -profile, or by -save here) or
measured now with -measure: -workers in-process ranks each run -model on random inputs of
-batch images (-size: their side, default the data set's) or, for the LSTM language models,
-batch columns of -bptt random words, -warmup steps unmeasured and -iters measured, then the
top-k kernel and the all-gather and all-reduce of those ranks are timed (profile.Measure).

Cost overrides apply to a copy of the profile: -compute-scale multiplies the forward and every
backward time (0.1 stands for a GPU ten times faster than the profiled CPU); -allgather-alpha
and -allgather-beta (ns per byte a rank sends) replace the all-gather's fit, -allreduce-alpha
and -allreduce-beta the dense all-reduce's; -network BANDWIDTH[,LATENCY] replaces both with
rings on that link between -network-workers ranks (default: the profile's P): an all-gather of
b bytes per rank costs (P-1)·(latency + b/bandwidth), an all-reduce 2(P-1)·latency +
2(P-1)/P·b/bandwidth.

Without -hook the rows are lags, mgs, omgs (exact planner, DDP timeline), omgs:timeline=paper
and omgs:planner=paper,timeline=paper (the paper's Algorithm 1), at -density and -dense-below
(which also fill those options in given specs that lack them); each row's TopK-SGD and LAGS
times are on that row's timeline, and a topk-sgd row is printed per timeline.
`

// planRow is one row of `spargo plan -json`.
type planRow struct {
	Plan     string `json:"plan"` // the hook spec, or "topk-sgd"
	Timeline string `json:"timeline"`
	Groups   int    `json:"groups"`
	// TensorsPerGroup and ElementsPerGroup are in backward order.
	TensorsPerGroup  []int   `json:"tensors_per_group"`
	ElementsPerGroup []int   `json:"elements_per_group"`
	PredictedMS      float64 `json:"predicted_ms"`
	NonOverlappedMS  float64 `json:"non_overlapped_ms"`
	TopKSGDMS        float64 `json:"topk_sgd_ms"`
	LAGSMS           float64 `json:"lags_ms"`
	// Speedup is TopK-SGD's predicted time over this plan's.
	Speedup float64 `json:"topk_sgd_over_plan"`
	// Algorithm1MS is the time of the paper's Algorithm 1's plan on this row's model (paper
	// timeline only).
	Algorithm1MS float64 `json:"algorithm1_ms,omitempty"`
}

// planOutput is the whole `spargo plan -json` output.
type planOutput struct {
	Model        string    `json:"model,omitempty"`
	ProfileFile  string    `json:"profile_file,omitempty"`
	P            int       `json:"profile_p"`
	Tensors      int       `json:"tensors"`
	Elements     int       `json:"elements"`
	ForwardMS    float64   `json:"forward_ms"`
	BackwardMS   float64   `json:"backward_ms"`
	ComputeScale float64   `json:"compute_scale"`
	TopKGamma    float64   `json:"topk_gamma_s"`
	AllGather    costPair  `json:"allgather"`
	AllReduce    costPair  `json:"allreduce"`
	Rows         []planRow `json:"rows"`
}

// costPair is an α-β cost as printed: α in seconds, β in seconds per byte.
type costPair struct {
	Alpha float64 `json:"alpha_s"`
	Beta  float64 `json:"beta_s_per_byte"`
}

// planCosts are the cost overrides of spargo plan; a nil pointer leaves the profile's value.
type planCosts struct {
	computeScale                     float64
	agAlpha, agBeta, arAlpha, arBeta *float64
	networkBits, networkLatency      float64 // 0: no -network
	networkWorkers                   int
}

// apply returns a copy of prof with the overrides applied.
func (c planCosts) apply(prof *profile.Profile) *profile.Profile {
	q := *prof
	q.ParamBackward = slices.Clone(prof.ParamBackward)
	scale := func(d time.Duration) time.Duration { return time.Duration(math.Round(float64(d) * c.computeScale)) }
	q.Forward, q.Backward = scale(prof.Forward), scale(prof.Backward)
	for i, d := range q.ParamBackward {
		q.ParamBackward[i] = scale(d)
	}
	if c.networkBits > 0 {
		p := float64(c.networkWorkers)
		perByte := 8 / c.networkBits
		q.AllGather = profile.AllGatherCost{Alpha: (p - 1) * c.networkLatency, Beta: (p - 1) * perByte}
		q.AllReduce = profile.AllReduceCost{Alpha: 2 * (p - 1) * c.networkLatency, Beta: 2 * (p - 1) / p * perByte}
	}
	set := func(dst *profile.AllGatherCost, alpha, beta *float64) {
		if alpha == nil && beta == nil {
			return
		}
		if alpha != nil {
			dst.Alpha = *alpha
		}
		if beta != nil {
			dst.Beta = *beta
		}
		dst.Samples, dst.MaxRelErr = nil, 0 // no longer a fit of these samples
	}
	set(&q.AllGather, c.agAlpha, c.agBeta)
	set(&q.AllReduce, c.arAlpha, c.arBeta)
	return &q
}

// planMeasure are the options of -measure.
type planMeasure struct {
	model                      string
	workers, batch, size, bptt int
	warmup, iters              int
	density                    float64
	seed                       uint64
}

func runPlan(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo plan", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var specs hookList
	fs.Var(&specs, "hook", "a merging hook spec: lags, mgs or omgs with options (repeat for several; default: lags, mgs and omgs's three planner/timeline variants)")
	profileFile := fs.String("profile", "", "read the profile from this JSON file (profile.Profile.Save; examples/vgg -profile)")
	measure := fs.Bool("measure", false, "measure the profile now on -workers in-process ranks (needs -model)")
	model := fs.String("model", "", "a model of spargo models: checked against -profile, or measured with -measure")
	workers := fs.Int("workers", 4, "-measure: in-process ranks (they share this machine's cores)")
	batch := fs.Int("batch", 16, "-measure: images per rank, or columns per rank for an LSTM language model")
	size := fs.Int("size", 0, "-measure: image side instead of the data set's (ImageNet ResNets take any size from 32)")
	bptt := fs.Int("bptt", 35, "-measure: words per column for an LSTM language model")
	warmup := fs.Int("warmup", 2, "-measure: unmeasured steps")
	iters := fs.Int("iters", 5, "-measure: measured steps (their per-tensor backward times are averaged)")
	seed := fs.Uint64("seed", 0, "-measure: seed of the weights and the random inputs")
	save := fs.String("save", "", "-measure: save the measured profile to this file")
	density := fs.Float64("density", 0.001, "density of the default rows, and of given specs that set none (the OMGS paper's CNNs: 0.001; its LSTM: 0.005)")
	denseBelow := fs.Int("dense-below", hooks.DefaultDenseBelow, "dense_below of the default rows and of given specs that set none (0: sparsify every tensor, the paper's algorithm)")
	computeScale := fs.Float64("compute-scale", 1, "multiply the forward and backward times by this (0.1: a GPU ten times faster)")
	agAlpha := fs.Duration("allgather-alpha", 0, "all-gather start-up α instead of the profile's (e.g. 22ms)")
	agBeta := fs.Float64("allgather-beta", 0, "all-gather β in ns per byte a rank sends instead of the profile's (e.g. 272)")
	arAlpha := fs.Duration("allreduce-alpha", 0, "dense all-reduce α instead of the profile's")
	arBeta := fs.Float64("allreduce-beta", 0, "dense all-reduce β in ns per byte of a rank's buffer instead of the profile's")
	network := fs.String("network", "", "BANDWIDTH[,LATENCY]: all-gather and all-reduce as rings on this link (e.g. 1gbit,50us; latency default 50us)")
	networkWorkers := fs.Int("network-workers", 0, "ranks of the -network rings (default: the profile's P)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	if helped, err := parseFlags(fs, args, stdout, planHelp); helped || err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	costs := planCosts{computeScale: *computeScale}
	switch {
	case (*profileFile == "") == !*measure:
		return errors.New("plan: give -profile FILE or -measure (one of them)")
	case *measure && *model == "":
		return errors.New("plan: -measure needs -model")
	case !*measure && (given["workers"] || given["batch"] || given["size"] || given["bptt"] || given["warmup"] || given["iters"] || given["save"] || given["seed"]):
		return errors.New("plan: -workers, -batch, -size, -bptt, -warmup, -iters, -seed and -save go with -measure")
	case !(*density > 0 && *density <= 1):
		return fmt.Errorf("plan: -density %v: want a number in (0, 1]", *density)
	case *denseBelow < 0:
		return fmt.Errorf("plan: -dense-below %d: want 0 or more elements", *denseBelow)
	case !(*computeScale > 0) || math.IsInf(*computeScale, 0):
		return fmt.Errorf("plan: -compute-scale %v: want a positive number", *computeScale)
	case *network != "" && (given["allgather-alpha"] || given["allgather-beta"] || given["allreduce-alpha"] || given["allreduce-beta"]):
		return errors.New("plan: -network sets the all-gather and all-reduce costs: give it or -allgather-*/-allreduce-*, not both")
	case given["network-workers"] && *network == "":
		return errors.New("plan: -network-workers goes with -network")
	case given["network-workers"] && *networkWorkers < 2:
		return fmt.Errorf("plan: -network-workers %d: want at least 2", *networkWorkers)
	}
	for _, o := range []struct {
		name string
		v    float64
		unit float64
		dst  **float64
	}{
		{"allgather-alpha", agAlpha.Seconds(), 1, &costs.agAlpha}, {"allgather-beta", *agBeta, 1e-9, &costs.agBeta},
		{"allreduce-alpha", arAlpha.Seconds(), 1, &costs.arAlpha}, {"allreduce-beta", *arBeta, 1e-9, &costs.arBeta},
	} {
		if !given[o.name] {
			continue
		}
		if !(o.v >= 0) || math.IsInf(o.v, 0) {
			return fmt.Errorf("plan: -%s %v: want 0 or more", o.name, o.v)
		}
		v := o.v * o.unit
		*o.dst = &v
	}
	if *network != "" {
		bw, lat, _ := strings.Cut(*network, ",")
		var err error
		if costs.networkBits, err = parseBandwidth(bw); err != nil {
			return fmt.Errorf("plan: -network %q: %w", *network, err)
		}
		costs.networkLatency = 50e-6
		if lat != "" {
			d, err := time.ParseDuration(strings.TrimSpace(lat))
			if err != nil || d < 0 {
				return fmt.Errorf("plan: -network %q: latency %q: want a duration such as 50us", *network, lat)
			}
			costs.networkLatency = d.Seconds()
		}
	}

	rows, planners, err := planRows(specs, *density, *denseBelow)
	if err != nil {
		return err
	}

	var prof *profile.Profile
	if *measure {
		m := planMeasure{model: *model, workers: *workers, batch: *batch, size: *size, bptt: *bptt, warmup: *warmup, iters: *iters,
			density: planners[0].Density, seed: *seed}
		if prof, err = measurePlanProfile(m); err != nil {
			return fmt.Errorf("plan: -measure: %w", err)
		}
		if *save != "" {
			if err := prof.Save(*save); err != nil {
				return fmt.Errorf("plan: %w", err)
			}
		}
	} else {
		if prof, err = profile.Load(*profileFile); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		if *model != "" {
			m, err := models.New(*model, nn.NewRand(0))
			if err != nil {
				return fmt.Errorf("plan: -model: %w", err)
			}
			if err := prof.Check(nn.Parameters(m)); err != nil {
				return fmt.Errorf("plan: -profile %s does not fit -model %s: %w", *profileFile, *model, err)
			}
		}
	}
	if costs.networkBits > 0 && costs.networkWorkers == 0 {
		costs.networkWorkers = *networkWorkers
		if costs.networkWorkers == 0 {
			costs.networkWorkers = prof.P
		}
		if costs.networkWorkers < 2 {
			return fmt.Errorf("plan: -network: the profile was measured with P = %d; give -network-workers", prof.P)
		}
	}
	q := costs.apply(prof)
	out := planOutput{Model: *model, ProfileFile: *profileFile, P: prof.P, Tensors: len(q.Params),
		ForwardMS: ms(q.Forward), BackwardMS: ms(q.Backward), ComputeScale: costs.computeScale, TopKGamma: q.TopK.Gamma,
		AllGather: costPair{q.AllGather.Alpha, q.AllGather.Beta}, AllReduce: costPair{q.AllReduce.Alpha, q.AllReduce.Beta}}
	for _, n := range q.Sizes {
		out.Elements += n
	}
	if out.Rows, err = planTable(q, rows, planners); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", " ")
		return enc.Encode(out)
	}
	printPlans(stdout, q, out, costs)
	return nil
}

// planRows parses the rows' hook specs (the default set when none), filling in density and
// dense_below where a spec sets none; all rows must share them (one cost model).
func planRows(specs []string, density float64, denseBelow int) ([]string, []*hooks.MergedTopK, error) {
	rows := slices.Clone(specs)
	if len(rows) == 0 {
		rows = []string{"lags", "mgs", "omgs", "omgs:timeline=paper", "omgs:planner=paper,timeline=paper"}
	}
	var planners []*hooks.MergedTopK
	for i, s := range rows {
		if name, _, _ := strings.Cut(s, ":"); name != "lags" && name != "mgs" && name != "omgs" {
			return nil, nil, fmt.Errorf("plan: -hook %q: %s does not merge tensors into groups; spargo plan takes lags, mgs and omgs", s, name)
		}
		row, err := withDensity(s, density)
		if err != nil {
			return nil, nil, fmt.Errorf("plan: -hook %q: %w", s, err)
		}
		full := row.label
		if !row.config.Given("dense_below") {
			full += ",dense_below=" + strconv.Itoa(denseBelow) // withDensity's label has options
			if row.config, err = row.config.With("dense_below", strconv.Itoa(denseBelow)); err != nil {
				return nil, nil, fmt.Errorf("plan: -hook %q: %w", s, err)
			}
		}
		h, err := row.config.New()
		if err != nil {
			return nil, nil, fmt.Errorf("plan: -hook: %w", err)
		}
		mt := hooks.Merged(h)
		if mt == nil {
			return nil, nil, fmt.Errorf("plan: -hook %q: %s is not a merging hook", s, h.Name())
		}
		if i > 0 && (mt.Density != planners[0].Density || mt.DenseBelow != planners[0].DenseBelow) {
			return nil, nil, fmt.Errorf("plan: -hook %s: density %g, dense_below %d; the first row has %g, %d: the rows share one cost model, give them the same",
				full, mt.Density, mt.DenseBelow, planners[0].Density, planners[0].DenseBelow)
		}
		rows[i] = full
		planners = append(planners, mt)
	}
	return rows, planners, nil
}

// planTable plans q with every row's hook, with a topk-sgd row before the first row of each
// timeline.
func planTable(q *profile.Profile, rows []string, planners []*hooks.MergedTopK) ([]planRow, error) {
	var out []planRow
	seen := map[hooks.Timeline]bool{}
	for i, h := range planners {
		rep, err := h.PlanProfile(q)
		if err != nil {
			return nil, fmt.Errorf("plan: %s: %w", rows[i], err)
		}
		if !seen[rep.Timeline] {
			seen[rep.Timeline] = true
			r, err := topkSGDRow(q, h.Density, h.DenseBelow, rep.Timeline)
			if err != nil {
				return nil, fmt.Errorf("plan: %w", err)
			}
			out = append(out, r)
		}
		out = append(out, reportRow(rows[i], rep))
	}
	return out, nil
}

// reportRow is the row of a plan report.
func reportRow(plan string, rep *hooks.PlanReport) planRow {
	return planRow{Plan: plan, Timeline: rep.Timeline.String(), Groups: len(rep.Groups),
		TensorsPerGroup: rep.Groups, ElementsPerGroup: rep.Elements, PredictedMS: ms(rep.Predicted),
		NonOverlappedMS: ms(rep.NonOverlapped), TopKSGDMS: ms(rep.Single), LAGSMS: ms(rep.LAGS),
		Speedup: float64(rep.Single) / float64(rep.Predicted), Algorithm1MS: ms(rep.Paper)}
}

// topkSGDRow is TopK-SGD's row on timeline tl: mgs with a threshold above the model's size
// makes the one group of the whole model.
func topkSGDRow(q *profile.Profile, density float64, denseBelow int, tl hooks.Timeline) (planRow, error) {
	elements := 0
	for _, n := range q.Sizes {
		elements += n
	}
	h, err := hooks.NewMGS(density, 0, denseBelow, elements+1)
	if err != nil {
		return planRow{}, err
	}
	h.Timeline = tl
	rep, err := h.PlanProfile(q)
	if err != nil {
		return planRow{}, fmt.Errorf("topk-sgd: %w", err)
	}
	r := reportRow("topk-sgd", rep)
	r.Algorithm1MS = 0
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func printPlans(w io.Writer, q *profile.Profile, out planOutput, c planCosts) {
	name := out.Model
	if name == "" {
		name = out.ProfileFile
	}
	fmt.Fprintf(w, "%s: %d tensors, %d elements; profile measured at P=%d (%d warm-up + %d measured steps)\n",
		name, out.Tensors, out.Elements, q.P, q.Warmup, q.Iterations)
	fmt.Fprintf(w, "compute ×%g: forward %.1f ms, backward %.1f ms; top-k %.4g ns·n·log2 n\n",
		c.computeScale, out.ForwardMS, out.BackwardMS, q.TopK.Gamma*1e9)
	fmt.Fprintf(w, "all-gather α = %.4g ms, β = %.4g ns/B; ", 1e3*q.AllGather.Alpha, 1e9*q.AllGather.Beta)
	if len(q.AllReduce.Samples) == 0 && q.AllReduce.Alpha == 0 && q.AllReduce.Beta == 0 {
		fmt.Fprint(w, "all-reduce not in the profile")
	} else {
		fmt.Fprintf(w, "all-reduce α = %.4g ms, β = %.4g ns/B", 1e3*q.AllReduce.Alpha, 1e9*q.AllReduce.Beta)
	}
	if c.networkBits > 0 {
		fmt.Fprintf(w, " (rings of %d ranks on %s, latency %v)", c.networkWorkers, formatBandwidth(c.networkBits),
			time.Duration(c.networkLatency*1e9))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)
	width := len("plan")
	for _, r := range out.Rows {
		width = max(width, len(r.Plan))
	}
	fmt.Fprintf(w, "%-*s %-8s %6s %12s %12s %12s %14s %17s  %s\n", width, "plan", "timeline", "groups", "predicted_ms",
		"topk_sgd_ms", "lags_ms", "topk_sgd/plan", "non_overlapped_ms", "tensors per group (backward order)")
	for _, r := range out.Rows {
		fmt.Fprintf(w, "%-*s %-8s %6d %12.1f %12.1f %12.1f %14.3f %17.1f  %s\n", width, r.Plan, r.Timeline, r.Groups, r.PredictedMS,
			r.TopKSGDMS, r.LAGSMS, r.Speedup, r.NonOverlappedMS, groupList(r.TensorsPerGroup))
	}
}

// groupList prints group lengths joined by '+', eliding the middle of long lists.
func groupList(groups []int) string {
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = strconv.Itoa(g)
	}
	if len(parts) > 12 {
		parts = append(append(parts[:5:5], "…"), parts[len(parts)-5:]...)
	}
	return strings.Join(parts, "+")
}

// measurePlanProfile measures a profile of m.model on m.workers in-process ranks with random
// inputs.
func measurePlanProfile(m planMeasure) (*profile.Profile, error) {
	entry, err := models.Lookup(m.model)
	if err != nil {
		return nil, err
	}
	switch {
	case m.workers < 1 || m.batch < 1 || m.bptt < 1 || m.size < 0 || m.warmup < 0 || m.iters < 1:
		return nil, fmt.Errorf("-workers %d, -batch %d, -bptt %d, -size %d, -warmup %d, -iters %d: want at least 1 (-size, -warmup: 0 or more)",
			m.workers, m.batch, m.bptt, m.size, m.warmup, m.iters)
	}
	groups, err := comm.NewLocal(m.workers)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, g := range groups {
			g.Close()
		}
	}()
	ctx := context.Background()
	profs := make([]*profile.Profile, m.workers)
	errs := make([]error, m.workers)
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			model, err := entry.Build(nn.NewRand(m.seed))
			if err != nil {
				errs[r] = err
				return
			}
			step, err := randomStep(entry, model, m, uint64(r))
			if err != nil {
				errs[r] = err
				return
			}
			nn.SetTraining(model, true)
			profs[r], errs[r] = profile.Measure(ctx, model, g, step,
				profile.Options{Warmup: m.warmup, Iterations: m.iters, Density: m.density})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return profs[0], nil
}

// randomStep is a profile.Step of model on random inputs: images and labels for an image
// classifier, words and next words for an LSTM language model.
func randomStep(entry models.Entry, model nn.Module, m planMeasure, rank uint64) (profile.Step, error) {
	rng := nn.NewRand(m.seed + 1 + rank)
	tape := nn.NewTape()
	if in := entry.Input; in.Size > 0 {
		side := in.Size
		if m.size > 0 {
			side = m.size
		}
		x := nn.NewTensor(m.batch, in.Channels, side, side)
		for i := range x.Data {
			x.Data[i] = float32(rng.NormFloat64())
		}
		y := make([]int, m.batch)
		for i := range y {
			y[i] = rng.IntN(in.Classes)
		}
		return func(backward func(*nn.Var) error) error {
			tape.Reset()
			return backward(nn.CrossEntropy(model.Forward(tape.Const(x)), y))
		}, nil
	}
	lm, ok := model.(*models.LSTMLM)
	if !ok {
		return nil, fmt.Errorf("-model %s (family %s): -measure feeds images or LSTM language-model words; measure this model's profile with its training program (-profile FILE) and pass it with -profile", entry.Name, entry.Family)
	}
	x := nn.NewTensor(m.bptt, m.batch)
	y := make([]int, m.bptt*m.batch)
	for i := range x.Data {
		x.Data[i] = float32(rng.IntN(lm.Config.Vocab))
		y[i] = rng.IntN(lm.Config.Vocab)
	}
	return func(backward func(*nn.Var) error) error {
		tape.Reset()
		return backward(nn.CrossEntropy(lm.Forward(tape.Const(x)), y))
	}, nil
}
