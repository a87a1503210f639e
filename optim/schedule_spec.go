package optim

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/spec"
)

// scheduleSpec describes one schedule name ParseScheduleConfig accepts.
type scheduleSpec struct {
	name, summary string
	options       []spec.Option
	build         func(v *specValues) (Schedule, error)
}

// specValues are a parsed spec's options (defaults filled in, canonical) and, for a
// schedule, the run's shape.
type specValues struct {
	kind                  string // "schedule" or "optimizer"
	s                     spec.Spec
	base                  float64
	epochs, stepsPerEpoch int
}

func (v *specValues) errorf(opt, format string, args ...any) error {
	return fmt.Errorf("optim: %s %s: option %s: %s", v.kind, v.s.Name(), opt, fmt.Sprintf(format, args...))
}

// has reports whether option name has a value (given, or a default).
func (v *specValues) has(name string) bool { return v.s.Get(name) != "" }

func (v *specValues) float(name string) (float64, error) {
	x, err := strconv.ParseFloat(v.s.Get(name), 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, v.errorf(name, "%q is not a number", v.s.Get(name))
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
	x, err := strconv.Atoi(v.s.Get(name))
	if err != nil {
		return 0, v.errorf(name, "%q is not an integer", v.s.Get(name))
	}
	if x < min {
		return 0, v.errorf(name, "%d is below %d", x, min)
	}
	return x, nil
}

func (v *specValues) bool(name string) (bool, error) {
	b, err := strconv.ParseBool(v.s.Get(name))
	if err != nil {
		return false, v.errorf(name, "%q is not true or false", v.s.Get(name))
	}
	return b, nil
}

func (v *specValues) milestones() ([]int, error) {
	if !v.has("milestones") {
		return nil, nil
	}
	var ms []int
	for _, f := range strings.Split(v.s.Get("milestones"), "/") {
		x, err := strconv.Atoi(f)
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
			v.s.Name(), v.epochs, v.stepsPerEpoch)
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
	if v.has("total_steps") {
		if total, err = v.int("total_steps", 1); err != nil {
			return 0, 0, err
		}
	}
	switch {
	case v.has("warmup") && v.has("warmup_steps"):
		return 0, 0, fmt.Errorf("optim: schedule %s: give warmup (epochs) or warmup_steps, not both", v.s.Name())
	case v.has("warmup_steps"):
		warmup, err = v.int("warmup_steps", 0)
	case v.has("warmup"):
		var w float64
		if w, err = v.nonNegFloat("warmup"); err == nil {
			warmup = int(math.Round(w * float64(v.stepsPerEpoch)))
		}
	}
	if err == nil && warmup >= total {
		err = fmt.Errorf("optim: schedule %s: the warm-up (%d steps) must be shorter than the run (%d steps)", v.s.Name(), warmup, total)
	}
	return warmup, total, err
}

// The options the step-counted schedules share. warmup has no default (0 unless given) so
// that warmup_steps can replace it.
var (
	warmupEpochsOption = spec.Option{Name: "warmup", Help: "warm-up epochs, fractions allowed (default 0)", Kind: spec.Float}
	warmupStepsOption  = spec.Option{Name: "warmup_steps", Help: "warm-up in steps instead", Kind: spec.Int}
	totalStepsOption   = spec.Option{Name: "total_steps", Help: "length in steps (default epochs × steps per epoch)", Kind: spec.Int}
	gammaOption        = spec.Option{Name: "gamma", Default: "0.1", Help: "decay factor", Kind: spec.Float}
)

var schedules = []scheduleSpec{
	{name: "constant", summary: "the base rate throughout",
		build: func(v *specValues) (Schedule, error) { return Constant(v.base), nil }},
	{name: "step", summary: "StepLR: ×gamma every size epochs",
		options: []spec.Option{{Name: "size", Help: "epochs between decays (required)", Kind: spec.Int}, gammaOption},
		build: func(v *specValues) (Schedule, error) {
			if !v.has("size") {
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
		options: []spec.Option{{Name: "milestones", Help: "epochs separated by / (required), e.g. 150/250", Kind: spec.Ints}, gammaOption},
		build: func(v *specValues) (Schedule, error) {
			if !v.has("milestones") {
				return nil, v.errorf("milestones", "required (e.g. multistep:milestones=150/250)")
			}
			ms, err := v.milestones()
			if err != nil {
				return nil, err
			}
			gamma, err := v.nonNegFloat("gamma")
			return MultiStep{Base: v.base, Milestones: ms, Gamma: gamma}, err
		}},
	{name: "warmupstep", summary: "linear warm-up per step from `from`, then MultiStep (Goyal et al.'s gradual warm-up, as the VGG recipe uses it)",
		options: []spec.Option{{Name: "warmup", Default: "0", Help: "warm-up epochs", Kind: spec.Int},
			{Name: "from", Default: "0", Help: "rate at the first step", Kind: spec.Float},
			{Name: "milestones", Help: "epochs separated by /", Kind: spec.Ints}, gammaOption},
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
		options: []spec.Option{warmupEpochsOption, warmupStepsOption,
			{Name: "min", Default: "0", Help: "final rate", Kind: spec.Float},
			{Name: "per", Default: "step", Help: "step: the rate changes every step; epoch: once per epoch (torch's CosineAnnealingLR)"},
			totalStepsOption},
		build: func(v *specValues) (Schedule, error) {
			lo, err := v.nonNegFloat("min")
			if err != nil {
				return nil, err
			}
			switch v.s.Get("per") {
			case "step":
				w, total, err := v.warmupTotal()
				return Cosine{Base: v.base, Min: lo, WarmupSteps: w, TotalSteps: total}, err
			case "epoch":
				if v.has("warmup_steps") || v.has("total_steps") {
					return nil, fmt.Errorf("optim: schedule cosine: per=epoch counts epochs: use warmup, not warmup_steps or total_steps")
				}
				w := 0
				if v.has("warmup") {
					if w, err = v.int("warmup", 0); err != nil {
						return nil, err
					}
				}
				if v.epochs <= w {
					return nil, fmt.Errorf("optim: schedule cosine: the warm-up (%d epochs) must be shorter than the run (%d epochs)", w, v.epochs)
				}
				return EpochWise{Cosine{Base: v.base, Min: lo, WarmupSteps: w, TotalSteps: v.epochs}}, nil
			}
			return nil, v.errorf("per", "%q is neither step nor epoch", v.s.Get("per"))
		}},
	{name: "ptb", summary: "Zaremba et al.'s PTB decay: the base rate for `after` epochs, then ×decay every epoch",
		options: []spec.Option{{Name: "after", Default: "4", Help: "epochs at the base rate (the small model's 4; medium 6, large 14)", Kind: spec.Int},
			{Name: "decay", Default: "0.5", Help: "factor per epoch after that (small 0.5; medium 0.8, large 1/1.15)", Kind: spec.Float}},
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
		options: []spec.Option{warmupEpochsOption, warmupStepsOption, totalStepsOption},
		build: func(v *specValues) (Schedule, error) {
			w, total, err := v.warmupTotal()
			return LinearWarmupDecay{Base: v.base, WarmupSteps: w, TotalSteps: total}, err
		}},
}

// ScheduleConfig is a parsed, checked schedule spec: the name and every option, defaults
// filled in. Its String is canonical ("cosine:warmup=2" and "cosine:per=step,warmup=2.0"
// give the same), and New builds the schedule for a run.
type ScheduleConfig struct{ boundSpec }

// ParseScheduleConfig parses a schedule spec, "name" or "name:key=value,…" (ScheduleHelp
// lists the names and options; "" is constant). For example
//
//	cosine:warmup=2              warm up for 2 epochs, then cosine to 0 at the end
//	linear:warmup_steps=10000    BERT's
//	step:size=30,gamma=0.1       ×0.1 every 30 epochs
//	multistep:milestones=150/250 ×0.1 at epochs 150 and 250
//
// It checks everything that does not depend on the run's length (New checks the rest: a
// warm-up longer than the run). A bad spec gives an error naming the schedule and the option.
func ParseScheduleConfig(text string) (ScheduleConfig, error) {
	if strings.TrimSpace(text) == "" {
		text = "constant"
	}
	s, err := bindSpec("schedule", text, func(name string) ([]spec.Option, bool) {
		sc, ok := scheduleNamed(name)
		return sc.options, ok
	}, scheduleNames())
	if err != nil {
		return ScheduleConfig{}, err
	}
	return checkedSchedule(s)
}

// checkedSchedule builds the bound spec s for a stand-in run as long as any (one step per
// epoch, so that a warm-up given in epochs is never longer than a total_steps given with it):
// what ParseScheduleConfig checks.
func checkedSchedule(s spec.Spec) (ScheduleConfig, error) {
	c := ScheduleConfig{boundSpec{s}}
	if _, err := c.New(1, 1<<30, 1); err != nil {
		return ScheduleConfig{}, err
	}
	return c, nil
}

// New builds the schedule for a run of base learning rate base, epochs epochs and
// stepsPerEpoch steps per epoch (schedules counted in steps need both).
func (c ScheduleConfig) New(base float64, epochs, stepsPerEpoch int) (Schedule, error) {
	if !(base >= 0) || math.IsInf(base, 0) {
		return nil, fmt.Errorf("optim: schedule %s: invalid base learning rate %v", c, base)
	}
	sc, ok := scheduleNamed(c.s.Name())
	if !ok {
		return nil, fmt.Errorf("optim: ScheduleConfig %q is not a schedule (build it with ParseScheduleConfig)", c.s.Name())
	}
	return sc.build(&specValues{kind: "schedule", s: c.s, base: base, epochs: epochs, stepsPerEpoch: stepsPerEpoch})
}

// With returns the configuration with option key set to value, checked as
// ParseScheduleConfig checks a spec (a program's -warmup flag sets the schedule's warmup).
func (c ScheduleConfig) With(key, value string) (ScheduleConfig, error) {
	sc, _ := scheduleNamed(c.s.Name())
	s, err := withOption(c.s, sc.options, "schedule", key, value)
	if err != nil {
		return ScheduleConfig{}, err
	}
	return checkedSchedule(s)
}

// ParseSchedule builds a schedule from a spec (ParseScheduleConfig) for a run of base
// learning rate base, epochs epochs and stepsPerEpoch steps per epoch.
func ParseSchedule(text string, base float64, epochs, stepsPerEpoch int) (Schedule, error) {
	c, err := ParseScheduleConfig(text)
	if err != nil {
		return nil, err
	}
	return c.New(base, epochs, stepsPerEpoch)
}

func scheduleNamed(name string) (scheduleSpec, bool) {
	for _, s := range schedules {
		if s.name == name {
			return s, true
		}
	}
	return scheduleSpec{}, false
}

func scheduleNames() []string {
	var ns []string
	for _, s := range schedules {
		ns = append(ns, s.name)
	}
	return ns
}

// boundSpec is what OptimizerConfig and ScheduleConfig share: a spec bound to its name's
// options.
type boundSpec struct{ s spec.Spec }

// String is the canonical spec: every option that has a value, in the option list's order.
func (c boundSpec) String() string { return c.s.String() }

// Name is the optimizer's or schedule's name.
func (c boundSpec) Name() string { return c.s.Name() }

// Option returns option key's canonical value ("" when unset or not an option).
func (c boundSpec) Option(key string) string { return c.s.Get(key) }

// Given reports whether the spec set option key itself rather than taking its default.
func (c boundSpec) Given(key string) bool { return c.s.Given(key) }

// bindSpec parses text (package spec's grammar) and binds it to the options lookup returns
// for its name; errors name the kind, the name and the option.
func bindSpec(kind, text string, lookup func(string) ([]spec.Option, bool), names []string) (spec.Spec, error) {
	name, _, _ := strings.Cut(text, ":")
	if name = strings.TrimSpace(name); name == "" {
		return spec.Spec{}, fmt.Errorf("optim: unknown %s %q in %q (known: %s)", kind, name, text, strings.Join(names, ", "))
	}
	p, err := spec.Parse(text)
	if err != nil {
		return spec.Spec{}, fmt.Errorf("optim: %s %w", kind, err)
	}
	options, ok := lookup(p.Name())
	if !ok {
		return spec.Spec{}, fmt.Errorf("optim: unknown %s %q in %q (known: %s)", kind, p.Name(), text, strings.Join(names, ", "))
	}
	if p.Inner() != nil {
		return spec.Spec{}, fmt.Errorf("optim: %s %s in %q wraps nothing ('+' is for comm hook specs)", kind, p.Name(), text)
	}
	b, err := p.Bind(options)
	if err != nil {
		return spec.Spec{}, fmt.Errorf("optim: %s %w", kind, err)
	}
	return b, nil
}

// withOption sets key to value in the bound spec s whose options are options.
func withOption(s spec.Spec, options []spec.Option, kind, key, value string) (spec.Spec, error) {
	var k spec.Kind
	for _, o := range options {
		if o.Name == key {
			k = o.Kind
		}
	}
	out, err := s.With(key, value, k)
	if err != nil {
		return spec.Spec{}, fmt.Errorf("optim: %s %w", kind, err)
	}
	return out, nil
}

// ScheduleHelp lists the schedules ParseSchedule accepts with their options and defaults,
// for a program's -h.
func ScheduleHelp() string {
	return specHelp(schedules, func(s scheduleSpec) (string, string, []spec.Option) { return s.name, s.summary, s.options }, 13, 5)
}

// specHelp lists named specs with their options and defaults.
func specHelp[T any](list []T, describe func(T) (name, summary string, options []spec.Option), nameWidth, defWidth int) string {
	var b strings.Builder
	for _, item := range list {
		name, summary, options := describe(item)
		fmt.Fprintf(&b, "%s\n    %s\n", name, summary)
		for _, o := range options {
			def := o.Default
			if def == "" {
				def = "-"
			}
			fmt.Fprintf(&b, "    %-*s default %-*s %s\n", nameWidth, o.Name, defWidth, def, o.Help)
		}
	}
	return b.String()
}
