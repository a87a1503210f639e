package train

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
	"github.com/spargo-dl/spargo/plot"
	"github.com/spargo-dl/spargo/spec"
)

// Flags are the training flags every example shares, registered once by Register with the
// same names and help everywhere: the optimizer (-optim, with -lr, -momentum, -wd), the
// learning-rate schedule (-schedule, -warmup) and what the run records (-metrics,
// -log-every, -plot). An example sets its recipe's values in the struct before Register;
// they become the flags' defaults:
//
//	f := train.Flags{LR: 0.1, Momentum: 0.9, WD: 1e-4, Schedule: "cosine"}
//	f.Register(flag.CommandLine)
//	flag.Parse()
//	if err := f.Check(); err != nil { … }
//	opt, err := f.NewOptimizer(dp, hook)                         // after ddp.New
//	sched, err := f.NewSchedule(epochs, stepsPerEpoch, world)
//	// … train.Loop{Optimizer: opt, Schedule: sched, LogEvery: f.LogEvery, …}.Run(ctx)
//	err = f.DrawPlot()                                           // rank 0, -metrics closed
type Flags struct {
	// LR is the base learning rate (-lr): the optimizer's, and the schedule's base.
	LR float64 `json:"lr"`
	// Momentum and WD are -momentum and -wd: SGD's momentum and weight decay when -optim
	// is sgd and its spec does not set them (other optimizers take theirs from the spec).
	Momentum float64 `json:"momentum"`
	WD       float64 `json:"wd"`
	// Optim is the -optim spec (optim.ParseOptimizer); empty means "sgd".
	Optim string `json:"optim,omitempty"`
	// Schedule is the -schedule spec (optim.ParseSchedule); empty means the constant
	// rate, or with Warmup the legacy warm-up.
	Schedule string `json:"schedule,omitempty"`
	// Warmup is -warmup, in epochs. Without -schedule it is Goyal et al.'s recipe: the rate rises
	// linearly per step from LR/workers to LR (Goyal et al.), then stays. With a -schedule
	// that has a warmup option (cosine, linear, warmupstep) it sets that option.
	Warmup int `json:"warmup_epochs"`
	// Metrics is the -metrics JSON-lines file rank 0 writes (empty: none).
	Metrics string `json:"-"`
	// LogEvery is -log-every: a step record in -metrics every LogEvery optimizer steps
	// (0: epoch records only).
	LogEvery int `json:"log_every,omitempty"`
	// Plot is -plot: a PNG of -metrics drawn by rank 0 at the end (plot.File).
	Plot string `json:"-"`

	specs *specs // -optim and -schedule as Check parsed them
}

// Register defines the shared flags on fs; the struct's current values are the defaults.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.Float64Var(&f.LR, "lr", f.LR, "base learning rate (of the optimizer and the -schedule)")
	fs.Float64Var(&f.Momentum, "momentum", f.Momentum, "SGD momentum (for -optim sgd, unless its spec sets momentum=)")
	fs.Float64Var(&f.WD, "wd", f.WD, "SGD weight decay (for -optim sgd, unless its spec sets wd=; adam and adamw take wd= in their spec)")
	fs.StringVar(&f.Optim, "optim", orDefault(f.Optim, "sgd"), "optimizer spec NAME[:key=value,…], e.g. sgd:nesterov=true, adamw:wd=0.01,no_decay=true (-optim help lists them); with -hook osp (LGP) only sgd works")
	fs.StringVar(&f.Schedule, "schedule", f.Schedule, "learning-rate schedule spec NAME[:key=value,…], e.g. cosine:warmup=2, multistep:milestones=150/250 (-schedule help lists them); empty: constant -lr")
	fs.IntVar(&f.Warmup, "warmup", f.Warmup, "epochs of linear warm-up: without -schedule from lr/workers to lr (Goyal et al.'s recipe), with one its warmup= option; 0: none")
	fs.StringVar(&f.Metrics, "metrics", f.Metrics, "write one JSON line per epoch (with -log-every also per N steps) and a summary to this file")
	fs.IntVar(&f.LogEvery, "log-every", f.LogEvery, "with -metrics, also write a step record (step, loss, lr, total_s) every N optimizer steps; 0: epoch records only")
	fs.StringVar(&f.Plot, "plot", f.Plot, "at the end, draw the -metrics file as a PNG at this path (needs -metrics)")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ErrHelp is returned by Check when -optim or -schedule is "help": the caller prints
// HelpText and exits 0.
var ErrHelp = errors.New("help requested")

// HelpText lists the optimizers and schedules the -optim and -schedule specs accept.
func HelpText() string {
	return "-optim NAME[:key=value,…]:\n" + optim.OptimizerHelp() + "\n-schedule NAME[:key=value,…]:\n" + optim.ScheduleHelp()
}

// Check validates the flags that can be checked before the run's shape is known: the specs'
// names and options, and the flags that need -metrics. It parses -optim (with -momentum and
// -wd) and -schedule (with -warmup) once and keeps them for NewOptimizer and NewSchedule. It
// returns ErrHelp for -optim help or -schedule help.
func (f *Flags) Check() error {
	if f.Optim == "help" || f.Schedule == "help" {
		return ErrHelp
	}
	if f.Plot != "" && f.Metrics == "" {
		return fmt.Errorf("-plot %s needs -metrics FILE.jsonl: the plot is drawn from the metrics file", f.Plot)
	}
	if f.LogEvery < 0 {
		return fmt.Errorf("-log-every %d: want 0 (epoch records only) or a number of steps", f.LogEvery)
	}
	if f.LogEvery > 0 && f.Metrics == "" {
		return fmt.Errorf("-log-every %d needs -metrics FILE.jsonl: step records are written there", f.LogEvery)
	}
	if f.Warmup < 0 {
		return fmt.Errorf("-warmup %d: want 0 or more epochs", f.Warmup)
	}
	if !(f.LR >= 0) {
		return fmt.Errorf("-lr %v: want a non-negative learning rate", f.LR)
	}
	_, err := f.parsed()
	return err
}

// CheckWithHook is the end of a program's flag check: Check, then the program's -hook spec
// parsed for workers ranks (ParseHook), which it keeps for Setup.Hook and its checkpoints.
func (f *Flags) CheckWithHook(spec string, workers int) (hooks.Config, error) {
	if err := f.Check(); err != nil {
		return hooks.Config{}, err
	}
	return ParseHook(spec, workers)
}

// specs is what Check parsed, and from which flag values.
type specs struct {
	from     specsKey
	optim    optim.OptimizerConfig // with -momentum and -wd for sgd
	schedule optim.ScheduleConfig  // with -warmup; the legacy warm-up's from= is set per run
}

type specsKey struct {
	optim, schedule string
	momentum, wd    float64
	warmup          int
}

// parsed returns the parsed -optim and -schedule, parsing them when the flags changed since
// the last parse (or were never parsed).
func (f *Flags) parsed() (*specs, error) {
	key := specsKey{optim: f.Optim, schedule: f.Schedule, momentum: f.Momentum, wd: f.WD, warmup: f.Warmup}
	if f.specs != nil && f.specs.from == key {
		return f.specs, nil
	}
	opt, err := optimizerConfig(f.Optim, f.Momentum, f.WD)
	if err != nil {
		return nil, err
	}
	sched, err := f.parseSchedule()
	if err != nil {
		return nil, err
	}
	f.specs = &specs{from: key, optim: opt, schedule: sched}
	return f.specs, nil
}

// optimizerConfig parses an -optim spec; for sgd, momentum and wd (-momentum and -wd, kept
// as numbers: optim.SGDSpec) are the values of the options the spec leaves out.
func optimizerConfig(text string, momentum, wd float64) (optim.OptimizerConfig, error) {
	text = orDefault(strings.TrimSpace(text), "sgd")
	p, err := spec.Parse(text)
	if err != nil || p.Name() != "sgd" || p.Inner() != nil {
		c, err := optim.ParseOptimizerConfig(text)
		if err != nil {
			return optim.OptimizerConfig{}, fmt.Errorf("-optim: %w", err)
		}
		return c, nil
	}
	c, err := optim.SGDSpec(optim.SGDConfig{Momentum: momentum, WeightDecay: wd})
	if err != nil {
		return optim.OptimizerConfig{}, fmt.Errorf("-momentum %v, -wd %v: %w", momentum, wd, err)
	}
	// The spec's own options over them; nesterov last, since it is checked against the
	// momentum and dampening in force.
	keys := p.Keys()
	slices.SortStableFunc(keys, func(a, b string) int { return cmp.Compare(boolInt(a == "nesterov"), boolInt(b == "nesterov")) })
	for _, k := range keys {
		if c, err = c.With(k, p.Get(k)); err != nil {
			return optim.OptimizerConfig{}, fmt.Errorf("-optim: %w", err)
		}
	}
	return c, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (f *Flags) parseSchedule() (optim.ScheduleConfig, error) {
	text := strings.TrimSpace(f.Schedule)
	if text == "" && f.Warmup > 0 {
		// Goyal et al.'s recipe: from lr/P (set by NewSchedule), per step, over Warmup epochs.
		text = "warmupstep"
	}
	s, err := optim.ParseScheduleConfig(text)
	if err != nil {
		return optim.ScheduleConfig{}, fmt.Errorf("-schedule: %w", err)
	}
	if f.Warmup > 0 {
		if s.Given("warmup") {
			return optim.ScheduleConfig{}, fmt.Errorf("-warmup %d with -schedule %q: the warm-up is given twice (put it in the -schedule spec, or leave -warmup out)", f.Warmup, f.Schedule)
		}
		if s, err = s.With("warmup", strconv.Itoa(f.Warmup)); err != nil {
			return optim.ScheduleConfig{}, fmt.Errorf("-warmup %d with -schedule %q: %w (put the warm-up in the -schedule spec, or leave -warmup out)", f.Warmup, f.Schedule, err)
		}
	}
	return s, nil
}

// OptimizerConfig is the run's optimizer: -optim, with -momentum and -wd filling in SGD's
// momentum and weight decay where the spec leaves them out.
func (f *Flags) OptimizerConfig() (optim.OptimizerConfig, error) {
	s, err := f.parsed()
	if err != nil {
		return optim.OptimizerConfig{}, err
	}
	return s.optim, nil
}

// ScheduleConfig is the run's -schedule with -warmup set as its warmup option (without
// -schedule, -warmup is the legacy warmupstep schedule, whose start NewSchedule sets).
func (f *Flags) ScheduleConfig() (optim.ScheduleConfig, error) {
	s, err := f.parsed()
	if err != nil {
		return optim.ScheduleConfig{}, err
	}
	return s.schedule, nil
}

// NewOptimizer builds the -optim optimizer over dp's parameters with -lr and installs it as
// dp's Corrector when it is one (SGD: LGP for hooks that deliver results late, a no-op
// otherwise). hook is the run's comm hook: one that needs a corrector (OSP with LGP on, its
// default) needs an optimizer that predicts its own step, and with any other optimizer
// NewOptimizer says so.
func (f *Flags) NewOptimizer(dp *ddp.DDP, hook ddp.CommHook) (optim.Optimizer, error) {
	opt, err := f.NewOptimizerFor(dp.Parameters())
	if err != nil {
		return nil, err
	}
	corrector, ok := opt.(ddp.Corrector)
	if ddp.NeedsCorrector(hook) && !ok {
		return nil, fmt.Errorf("-optim %s with -hook %s: OSP's local-gradient prediction (lgp=true, its default) is exact only for SGD, "+
			"which predicts its own step; use -optim sgd, or -hook osp:lgp=false", f.Optim, hook.Name())
	}
	if ok {
		dp.SetCorrector(corrector)
	}
	return opt, nil
}

// NewOptimizerFor builds the -optim optimizer over params with -lr (no DDP involved).
func (f *Flags) NewOptimizerFor(params []*nn.Param) (optim.Optimizer, error) {
	c, err := f.OptimizerConfig()
	if err != nil {
		return nil, err
	}
	opt, err := c.New(params, f.LR)
	if err != nil {
		return nil, fmt.Errorf("-optim: %w", err)
	}
	return opt, nil
}

// NewSchedule builds the -schedule (and -warmup) schedule for a run of epochs epochs of
// stepsPerEpoch steps on world ranks, with -lr as its base. Without either flag it is the
// constant -lr.
func (f *Flags) NewSchedule(epochs, stepsPerEpoch, world int) (optim.Schedule, error) {
	c, err := f.ScheduleConfig()
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(f.Schedule) == "" && f.Warmup > 0 {
		if c, err = c.With("from", spec.FormatFloat(f.LR/float64(world))); err != nil {
			return nil, fmt.Errorf("-warmup %d: %w", f.Warmup, err)
		}
	}
	s, err := c.New(f.LR, epochs, stepsPerEpoch)
	if err != nil {
		if f.Warmup > 0 {
			return nil, fmt.Errorf("-warmup %d with -schedule %q: %w (put the warm-up in the -schedule spec, or leave -warmup out)", f.Warmup, f.Schedule, err)
		}
		return nil, fmt.Errorf("-schedule: %w", err)
	}
	return s, nil
}

// MetaConfig returns the flags that change a run's trajectory, for checkpoint.Meta.Config:
// resuming requires them to be the same. -optim and -schedule appear, in their canonical
// form, only when they differ from the defaults (sgd, none), so checkpoints from before these
// flags still resume; CanonicalSpec brings an older checkpoint's raw specs to that form.
func (f *Flags) MetaConfig() map[string]string {
	m := map[string]string{"lr": spec.FormatFloat(f.LR), "momentum": spec.FormatFloat(f.Momentum), "wd": spec.FormatFloat(f.WD), "warmup": strconv.Itoa(f.Warmup)}
	if o := strings.TrimSpace(f.Optim); o != "" && o != "sgd" {
		m["optim"] = f.CanonicalSpec("optim", o)
	}
	if s := strings.TrimSpace(f.Schedule); s != "" {
		m["schedule"] = f.CanonicalSpec("schedule", s)
	}
	return m
}

// CanonicalSpec is checkpoint.Meta's Canonical for the programs' checkpoints: it writes a
// spec in the canonical form checkpoints store (field "hook" for Meta.Hook, "optim" and
// "schedule" in Meta.Config; an sgd spec with these flags' -momentum and -wd where it leaves
// them out, as the run reads it), so that a checkpoint saved with the spec as it was typed
// ("spardl", keys in another order) resumes. Other fields, and specs that do not parse, are
// returned unchanged.
func (f *Flags) CanonicalSpec(field, value string) string {
	var c fmt.Stringer
	var err error
	switch {
	case field == "hook" && value != "":
		c, err = hooks.ParseConfig(value)
	case field == "optim":
		c, err = optimizerConfig(value, f.Momentum, f.WD)
	case field == "schedule":
		c, err = optim.ParseScheduleConfig(value)
	default:
		return value
	}
	if err != nil {
		return value
	}
	return c.String()
}

// DrawPlot draws -metrics as the -plot PNG (plot.File); without -plot it does nothing. Call
// it on rank 0 once the metrics file is complete.
func (f *Flags) DrawPlot() error {
	if f.Plot == "" {
		return nil
	}
	if err := plot.File(f.Metrics, f.Plot); err != nil {
		return fmt.Errorf("-plot: %w", err)
	}
	return nil
}
