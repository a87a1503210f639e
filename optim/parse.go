package optim

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// scheduleOption is one key of a schedule spec.
type scheduleOption struct {
	name, def, help string
}

// scheduleSpec describes one schedule name ParseSchedule accepts.
type scheduleSpec struct {
	name, summary string
	options       []scheduleOption
	build         func(v *specValues) (Schedule, error)
}

// specValues are a parsed spec's options (defaults filled in) and the run's shape.
type specValues struct {
	kind                  string // "schedule" or "optimizer"
	schedule              string // the name
	m                     map[string]string
	set                   map[string]bool // given in the spec
	base                  float64
	epochs, stepsPerEpoch int
}

func (v *specValues) errorf(opt, format string, args ...any) error {
	return fmt.Errorf("optim: %s %s: option %s: %s", v.kind, v.schedule, opt, fmt.Sprintf(format, args...))
}

func (v *specValues) float(name string) (float64, error) {
	x, err := strconv.ParseFloat(v.m[name], 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, v.errorf(name, "%q is not a number", v.m[name])
	}
	return x, nil
}

func (v *specValues) nonNegFloat(name string) (float64, error) {
	x, err := v.float(name)
	if err == nil && x < 0 {
		err = v.errorf(name, "%v is negative", x)
	}
	return x, err
}

func (v *specValues) int(name string, min int) (int, error) {
	x, err := strconv.Atoi(v.m[name])
	if err != nil {
		return 0, v.errorf(name, "%q is not an integer", v.m[name])
	}
	if x < min {
		return 0, v.errorf(name, "%d is below %d", x, min)
	}
	return x, nil
}

func (v *specValues) milestones() ([]int, error) {
	var ms []int
	if v.m["milestones"] == "" {
		return nil, nil
	}
	for _, f := range strings.Split(v.m["milestones"], "/") {
		x, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || x < 0 {
			return nil, v.errorf("milestones", "%q is not a non-negative epoch (write milestones=150/250)", f)
		}
		ms = append(ms, x)
	}
	return ms, nil
}

// needSteps checks that the run's length is known, for schedules counted in steps.
func (v *specValues) needSteps() error {
	if v.epochs < 1 || v.stepsPerEpoch < 1 {
		return fmt.Errorf("optim: schedule %s needs the run's length: epochs %d and steps per epoch %d must be at least 1",
			v.schedule, v.epochs, v.stepsPerEpoch)
	}
	return nil
}

// warmupTotal reads warmup (epochs, fractional allowed) or warmup_steps, and total_steps
// (default epochs·stepsPerEpoch), for schedules counted in steps.
func (v *specValues) warmupTotal() (warmup, total int, err error) {
	if err := v.needSteps(); err != nil {
		return 0, 0, err
	}
	total = v.epochs * v.stepsPerEpoch
	if v.set["total_steps"] {
		if total, err = v.int("total_steps", 1); err != nil {
			return 0, 0, err
		}
	}
	switch {
	case v.set["warmup"] && v.set["warmup_steps"]:
		return 0, 0, fmt.Errorf("optim: schedule %s: give warmup (epochs) or warmup_steps, not both", v.schedule)
	case v.set["warmup_steps"]:
		warmup, err = v.int("warmup_steps", 0)
	default:
		var w float64
		if w, err = v.nonNegFloat("warmup"); err == nil {
			warmup = int(math.Round(w * float64(v.stepsPerEpoch)))
		}
	}
	if err == nil && warmup >= total {
		err = fmt.Errorf("optim: schedule %s: the warm-up (%d steps) must be shorter than the run (%d steps)", v.schedule, warmup, total)
	}
	return warmup, total, err
}

var schedules = []scheduleSpec{
	{name: "constant", summary: "the base rate throughout",
		build: func(v *specValues) (Schedule, error) { return Constant(v.base), nil }},
	{name: "step", summary: "StepLR: ×gamma every size epochs",
		options: []scheduleOption{{"size", "", "epochs between decays (required)"}, {"gamma", "0.1", "decay factor"}},
		build: func(v *specValues) (Schedule, error) {
			if !v.set["size"] {
				return nil, v.errorf("size", "required (e.g. step:size=30)")
			}
			size, err := v.int("size", 1)
			if err != nil {
				return nil, err
			}
			gamma, err := v.nonNegFloat("gamma")
			return StepLR{Base: v.base, StepSize: size, Gamma: gamma}, err
		}},
	{name: "multistep", summary: "MultiStepLR: ×gamma at each milestone epoch",
		options: []scheduleOption{{"milestones", "", "epochs separated by / (required), e.g. 150/250"}, {"gamma", "0.1", "decay factor"}},
		build: func(v *specValues) (Schedule, error) {
			if !v.set["milestones"] {
				return nil, v.errorf("milestones", "required (e.g. multistep:milestones=150/250)")
			}
			ms, err := v.milestones()
			if err != nil {
				return nil, err
			}
			gamma, err := v.nonNegFloat("gamma")
			return MultiStep{Base: v.base, Milestones: ms, Gamma: gamma}, err
		}},
	{name: "warmupstep", summary: "linear warm-up per step from `from`, then MultiStep (the seeds' VGG recipe)",
		options: []scheduleOption{{"warmup", "0", "warm-up epochs"}, {"from", "0", "rate at the first step"},
			{"milestones", "", "epochs separated by /"}, {"gamma", "0.1", "decay factor"}},
		build: func(v *specValues) (Schedule, error) {
			w, err := v.int("warmup", 0)
			if err != nil {
				return nil, err
			}
			from, err := v.nonNegFloat("from")
			if err != nil {
				return nil, err
			}
			ms, err := v.milestones()
			if err != nil {
				return nil, err
			}
			gamma, err := v.nonNegFloat("gamma")
			return WarmupStep{Base: v.base, WarmupFrom: from, WarmupEpochs: w, Milestones: ms, Gamma: gamma}, err
		}},
	{name: "cosine", summary: "linear warm-up from 0, then cosine annealing to min at the end of the run",
		options: []scheduleOption{{"warmup", "0", "warm-up epochs (fractions allowed)"}, {"warmup_steps", "", "warm-up in steps instead"},
			{"min", "0", "final rate"}, {"per", "step", "step: the rate changes every step; epoch: once per epoch (torch's CosineAnnealingLR)"},
			{"total_steps", "", "length in steps (default epochs × steps per epoch)"}},
		build: func(v *specValues) (Schedule, error) {
			lo, err := v.nonNegFloat("min")
			if err != nil {
				return nil, err
			}
			switch v.m["per"] {
			case "step":
				w, total, err := v.warmupTotal()
				return Cosine{Base: v.base, Min: lo, WarmupSteps: w, TotalSteps: total}, err
			case "epoch":
				if v.set["warmup_steps"] || v.set["total_steps"] {
					return nil, fmt.Errorf("optim: schedule cosine: per=epoch counts epochs: use warmup, not warmup_steps or total_steps")
				}
				w, err := v.int("warmup", 0)
				if err != nil {
					return nil, err
				}
				if v.epochs <= w {
					return nil, fmt.Errorf("optim: schedule cosine: the warm-up (%d epochs) must be shorter than the run (%d epochs)", w, v.epochs)
				}
				return EpochWise{Cosine{Base: v.base, Min: lo, WarmupSteps: w, TotalSteps: v.epochs}}, nil
			}
			return nil, v.errorf("per", "%q is neither step nor epoch", v.m["per"])
		}},
	{name: "ptb", summary: "Zaremba et al.'s PTB decay: the base rate for `after` epochs, then ×decay every epoch",
		options: []scheduleOption{{"after", "4", "epochs at the base rate (the small model's 4; medium 6, large 14)"},
			{"decay", "0.5", "factor per epoch after that (small 0.5; medium 0.8, large 1/1.15)"}},
		build: func(v *specValues) (Schedule, error) {
			after, err := v.int("after", 0)
			if err != nil {
				return nil, err
			}
			decay, err := v.nonNegFloat("decay")
			if err == nil && decay > 1 {
				err = v.errorf("decay", "%v is above 1 (the rate would grow)", decay)
			}
			return PTBDecay{Base: v.base, Decay: decay, After: after}, err
		}},
	{name: "linear", summary: "BERT's: linear warm-up from 0, then linear decay to 0 at the end of the run",
		options: []scheduleOption{{"warmup", "0", "warm-up epochs (fractions allowed)"}, {"warmup_steps", "", "warm-up in steps instead"},
			{"total_steps", "", "length in steps (default epochs × steps per epoch)"}},
		build: func(v *specValues) (Schedule, error) {
			w, total, err := v.warmupTotal()
			return LinearWarmupDecay{Base: v.base, WarmupSteps: w, TotalSteps: total}, err
		}},
}

// ParseSchedule builds a schedule from "name" or "name:key=value,…" (ScheduleHelp lists the
// names and options), for a run of base learning rate base, epochs epochs and stepsPerEpoch
// steps per epoch (schedules counted in steps need both). For example
//
//	cosine:warmup=2              warm up for 2 epochs, then cosine to 0 at the end
//	linear:warmup_steps=10000    BERT's
//	step:size=30,gamma=0.1       ×0.1 every 30 epochs
//	multistep:milestones=150/250 ×0.1 at epochs 150 and 250
//
// A bad spec gives an error naming the schedule and the option.
func ParseSchedule(spec string, base float64, epochs, stepsPerEpoch int) (Schedule, error) {
	if !(base >= 0) || math.IsInf(base, 0) {
		return nil, fmt.Errorf("optim: schedule %q: invalid base learning rate %v", spec, base)
	}
	name, opts, err := splitSpec("schedule", spec, "constant", func(name string) ([]scheduleOption, bool) {
		for _, s := range schedules {
			if s.name == name {
				return s.options, true
			}
		}
		return nil, false
	}, scheduleNames())
	if err != nil {
		return nil, err
	}
	v := &specValues{kind: "schedule", schedule: name, m: opts.m, set: opts.set, base: base, epochs: epochs, stepsPerEpoch: stepsPerEpoch}
	for _, s := range schedules {
		if s.name == name {
			return s.build(v)
		}
	}
	panic("unreachable")
}

func scheduleNames() []string {
	var ns []string
	for _, s := range schedules {
		ns = append(ns, s.name)
	}
	return ns
}

// parsedOptions are a spec's option values (defaults filled in) and which were given.
type parsedOptions struct {
	m   map[string]string
	set map[string]bool
}

// splitSpec parses "name" or "name:key=value,…" (an empty name is def) against the options
// lookup returns for the name; errors name the kind, the name and the option.
func splitSpec(kind, spec, def string, lookup func(string) ([]scheduleOption, bool), names []string) (string, parsedOptions, error) {
	name, rest, _ := strings.Cut(strings.TrimSpace(spec), ":")
	name = strings.TrimSpace(name)
	if name == "" {
		name = def
	}
	opts := parsedOptions{m: map[string]string{}, set: map[string]bool{}}
	options, ok := lookup(name)
	if !ok {
		return "", opts, fmt.Errorf("optim: unknown %s %q in %q (known: %s)", kind, name, spec, strings.Join(names, ", "))
	}
	var optNames []string
	for _, o := range options {
		opts.m[o.name] = o.def
		optNames = append(optNames, o.name)
	}
	if strings.TrimSpace(rest) == "" {
		return name, opts, nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, val, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return "", opts, fmt.Errorf("optim: %s %s: option %q is not key=value", kind, name, kv)
		}
		if _, known := opts.m[k]; !known {
			if len(optNames) == 0 {
				return "", opts, fmt.Errorf("optim: %s %s takes no options, got %q", kind, name, k)
			}
			return "", opts, fmt.Errorf("optim: %s %s has no option %q (options: %s)", kind, name, k, strings.Join(optNames, ", "))
		}
		if opts.set[k] {
			return "", opts, fmt.Errorf("optim: %s %s: option %s given twice", kind, name, k)
		}
		opts.m[k], opts.set[k] = strings.TrimSpace(val), true
	}
	return name, opts, nil
}

// ScheduleHelp lists the schedules ParseSchedule accepts with their options and defaults,
// for a program's -h.
func ScheduleHelp() string {
	var b strings.Builder
	for _, s := range schedules {
		fmt.Fprintf(&b, "%s\n    %s\n", s.name, s.summary)
		for _, o := range s.options {
			def := o.def
			if def == "" {
				def = "-"
			}
			fmt.Fprintf(&b, "    %-13s default %-5s %s\n", o.name, def, o.help)
		}
	}
	return b.String()
}
