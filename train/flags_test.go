package train

import (
	"errors"
	"flag"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// params returns a fresh copy of the same small parameter set (a linear layer's).
func params() []*nn.Param {
	return nn.Parameters(nn.NewLinear(5, 3, true, nn.NewRand(7)))
}

// stepWith gives every parameter a gradient that depends on its value (so that the momentum
// and weight decay matter) and steps opt, n times.
func stepWith(opt optim.Optimizer, ps []*nn.Param, n int) {
	for i := range n {
		opt.ZeroGrad()
		for _, p := range ps {
			for j, v := range p.Value.Data {
				p.Grad.Data[j] = float32(math.Sin(float64(v)*3+float64(i))) + 0.1*float32(j)
			}
		}
		opt.Step()
	}
}

// The default -optim (sgd, and the empty spec) with -momentum and -wd builds exactly the
// optimizer the examples built before the flag: after a few steps every parameter is the
// same bit for bit. A spec that sets momentum= itself wins over -momentum.
func TestFlagsDefaultOptimizerIsTheOldSGD(t *testing.T) {
	const lr, momentum, wd = 0.01, 0.9, 5e-4
	want := params()
	old, err := optim.NewSGD(want, optim.SGDConfig{LR: lr, Momentum: momentum, WeightDecay: wd})
	if err != nil {
		t.Fatal(err)
	}
	stepWith(old, want, 4)
	for _, spec := range []string{"sgd", "", " sgd "} {
		got := params()
		f := Flags{LR: lr, Momentum: momentum, WD: wd, Optim: spec}
		opt, err := f.NewOptimizerFor(got)
		if err != nil {
			t.Fatalf("-optim %q: %v", spec, err)
		}
		stepWith(opt, got, 4)
		for i := range want {
			for j := range want[i].Value.Data {
				if got[i].Value.Data[j] != want[i].Value.Data[j] {
					t.Fatalf("-optim %q: %s[%d] = %v, the old SGD's %v", spec, want[i].Name, j, got[i].Value.Data[j], want[i].Value.Data[j])
				}
			}
		}
	}
	// momentum=0 in the spec: plain SGD, which moves differently from momentum 0.9.
	got := params()
	opt, err := (&Flags{LR: lr, Momentum: momentum, WD: wd, Optim: "sgd:momentum=0"}).NewOptimizerFor(got)
	if err != nil {
		t.Fatal(err)
	}
	stepWith(opt, got, 4)
	if got[0].Value.Data[0] == want[0].Value.Data[0] {
		t.Error("sgd:momentum=0 trained like momentum 0.9")
	}
	if _, ok := opt.(*optim.SGD); !ok {
		t.Errorf("sgd spec built %T", opt)
	}
	adam, err := (&Flags{LR: 1e-3, Optim: "adamw:wd=0.01"}).NewOptimizerFor(params())
	if _, ok := adam.(*optim.Adam); err != nil || !ok {
		t.Errorf("adamw: %T, %v", adam, err)
	}
}

// -warmup alone is Goyal et al.'s warm-up from lr/workers (the schedule the examples built
// before -schedule), at every step; with a schedule that has a warm-up it sets it; with one
// that has none it is an error naming both flags.
func TestFlagsSchedule(t *testing.T) {
	const lr, epochs, steps, world = 0.1, 4, 5, 2
	s, err := (&Flags{LR: lr, Warmup: 2}).NewSchedule(epochs, steps, world)
	if err != nil {
		t.Fatal(err)
	}
	old := optim.WarmupStep{Base: lr, WarmupFrom: lr / world, WarmupEpochs: 2, Gamma: 0.1}
	for e := range epochs {
		for st := range steps {
			if got, want := s.LR(e, st, steps), old.LR(e, st, steps); got != want {
				t.Fatalf("-warmup 2: epoch %d step %d: lr %v, the old schedule's %v", e, st, got, want)
			}
		}
	}
	if s, err := (&Flags{LR: lr}).NewSchedule(epochs, steps, world); err != nil || s != optim.Constant(lr) {
		t.Errorf("no -schedule: %#v, %v", s, err)
	}
	s, err = (&Flags{LR: lr, Schedule: "cosine", Warmup: 1}).NewSchedule(epochs, steps, world)
	if c, ok := s.(optim.Cosine); err != nil || !ok || c.WarmupSteps != steps || c.TotalSteps != epochs*steps {
		t.Errorf("-schedule cosine -warmup 1: %#v, %v", s, err)
	}
	_, err = (&Flags{LR: lr, Schedule: "multistep:milestones=2", Warmup: 1}).NewSchedule(epochs, steps, world)
	if err == nil || !strings.Contains(err.Error(), `-warmup 1 with -schedule "multistep:milestones=2"`) {
		t.Errorf("-warmup with multistep: %v", err)
	}
	_, err = (&Flags{LR: lr, Schedule: "cosine:warmup=2", Warmup: 1}).NewSchedule(epochs, steps, world)
	if err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("-warmup with cosine:warmup=2: %v", err)
	}
}

func TestFlagsCheck(t *testing.T) {
	for _, tc := range []struct {
		f    Flags
		want string
	}{
		{Flags{LR: 0.1, Plot: "a.png"}, "-plot a.png needs -metrics"},
		{Flags{LR: 0.1, LogEvery: 5}, "-log-every 5 needs -metrics"},
		{Flags{LR: 0.1, LogEvery: -1, Metrics: "m"}, "-log-every -1"},
		{Flags{LR: 0.1, Optim: "sgd:nesterov=maybe"}, "-optim: optim: optimizer sgd: option nesterov"},
		{Flags{LR: 0.1, Schedule: "step"}, "-schedule: optim: schedule step: option size: required"},
		{Flags{LR: 0.1, Metrics: "m", Plot: "p.png", LogEvery: 10, Optim: "adam", Schedule: "linear:warmup=1"}, ""},
	} {
		err := tc.f.Check()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.want)
		}
	}
	if err := (&Flags{Optim: "help"}).Check(); !errors.Is(err, ErrHelp) {
		t.Errorf("-optim help: %v", err)
	}
	if h := HelpText(); !strings.Contains(h, "adamw") || !strings.Contains(h, "cosine") {
		t.Errorf("help text:\n%s", h)
	}
}

// CheckWithHook checks the flags first, then parses the -hook spec for the world size.
func TestFlagsCheckWithHook(t *testing.T) {
	for _, tc := range []struct {
		f          Flags
		hook, want string
		workers    int
	}{
		{Flags{LR: 0.1, Plot: "a.png"}, "nosuchhook", "-plot a.png needs -metrics", 2},
		{Flags{LR: 0.1}, "nosuchhook", `-hook "nosuchhook"`, 2},
		{Flags{LR: 0.1}, "", "", 2},
		{Flags{LR: 0.1}, "spardl:density=0.5", "", 4},
	} {
		c, err := tc.f.CheckWithHook(tc.hook, tc.workers)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v, -hook %q: %v, want %q", tc.f, tc.hook, err, tc.want)
		}
		if want, _ := ParseHook(tc.hook, tc.workers); err == nil && c.String() != want.String() {
			t.Errorf("-hook %q: %s, want %s", tc.hook, c, want)
		}
	}
	if _, err := (&Flags{Schedule: "help"}).CheckWithHook("nosuchhook", 2); !errors.Is(err, ErrHelp) {
		t.Errorf("-schedule help: %v", err)
	}
}

// Register takes the struct's values as defaults, and the flags set the fields.
func TestFlagsRegister(t *testing.T) {
	f := Flags{LR: 0.1, Momentum: 0.9, WD: 1e-4, Schedule: "cosine"}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	f.Register(fs)
	if err := fs.Parse([]string{"-optim", "adam", "-metrics", "m.jsonl", "-log-every", "10", "-plot", "p.png"}); err != nil {
		t.Fatal(err)
	}
	if f.LR != 0.1 || f.Schedule != "cosine" || f.Optim != "adam" || f.LogEvery != 10 || f.Plot != "p.png" || f.Metrics != "m.jsonl" {
		t.Errorf("%+v", f)
	}
	if d := fs.Lookup("optim").DefValue; d != "sgd" {
		t.Errorf("-optim default %q", d)
	}
	m := f.MetaConfig()
	adam, _ := optim.ParseOptimizerConfig("adam")
	cosine, _ := optim.ParseScheduleConfig("cosine")
	if m["optim"] != adam.String() || m["schedule"] != cosine.String() || m["lr"] != "0.1" {
		t.Errorf("meta %v", m)
	}
	if _, ok := (&Flags{Optim: "sgd"}).MetaConfig()["optim"]; ok {
		t.Error("the default optimizer is in the checkpoint meta: older checkpoints would not resume")
	}
}

// Checkpoints store canonical specs, and CanonicalSpec brings one saved as it was typed to
// that form: the same hook (optimizer, schedule) written differently compares equal, a
// different one does not, and what does not parse is left alone.
func TestCanonicalSpec(t *testing.T) {
	for _, tc := range []struct {
		field, a, b string
		same        bool
	}{
		{"hook", "spardl", "spardl:density=0.01", true},
		{"hook", "spardl:teams=2,density=0.01", "spardl:density=0.01,teams=2", true},
		{"hook", "spardl:density=0.01", "spardl:density=0.02", false},
		{"hook", "allreduce", "oktopk", false},
		{"optim", "sgd:nesterov=true,momentum=0.9", "sgd:momentum=0.90,nesterov=true", true},
		{"optim", "adamw", "adamw:wd=0.05", false},
		{"optim", "sgd:nesterov=true", "sgd:momentum=0.9,nesterov=true", true}, // -momentum 0.9 fills it in
		{"schedule", "cosine:warmup=2", "cosine:per=step,warmup=2.0", true},
		{"schedule", "cosine", "linear", false},
	} {
		f := Flags{Momentum: 0.9}
		a, b := f.CanonicalSpec(tc.field, tc.a), f.CanonicalSpec(tc.field, tc.b)
		if (a == b) != tc.same {
			t.Errorf("%s %q → %q, %q → %q: same %v, want %v", tc.field, tc.a, a, tc.b, b, a == b, tc.same)
		}
		if a == tc.a && tc.same {
			t.Errorf("%s %q: not rewritten", tc.field, tc.a)
		}
	}
	for _, tc := range [][2]string{{"hook", "nosuchhook"}, {"hook", ""}, {"lr", "0.1"}, {"optim", "sgd:nesterov=maybe"}} {
		if got := (&Flags{}).CanonicalSpec(tc[0], tc[1]); got != tc[1] {
			t.Errorf("%s %q → %q, want it unchanged", tc[0], tc[1], got)
		}
	}
}

// The parsed -optim keeps -momentum and -wd as numbers (no spec text written in between),
// and Check parses once: NewOptimizerFor after Check reuses what Check parsed until a flag
// changes.
func TestFlagsParseOnce(t *testing.T) {
	f := Flags{LR: 0.1, Momentum: 0.9, WD: 1e-4}
	if err := f.Check(); err != nil {
		t.Fatal(err)
	}
	first := f.specs
	c, err := f.OptimizerConfig()
	if err != nil || f.specs != first {
		t.Fatalf("OptimizerConfig after Check parsed again (%v)", err)
	}
	want, err := optim.SGDSpec(optim.SGDConfig{Momentum: 0.9, WeightDecay: 1e-4})
	if err != nil || c.String() != want.String() {
		t.Fatalf("-optim sgd -momentum 0.9 -wd 1e-4: %s, want %s (%v)", c, want, err)
	}
	f.Momentum = 0.5
	if c, err = f.OptimizerConfig(); err != nil || c.Option("momentum") != "0.5" {
		t.Fatalf("after -momentum changed: %s, %v", c, err)
	}
	// An sgd spec that needs -momentum to be valid (Nesterov needs a momentum) takes it; with
	// -momentum 0 it is refused, and the spec's own momentum wins wherever it is written.
	f.Optim = "sgd:nesterov=true"
	if c, err = f.OptimizerConfig(); err != nil || c.Option("nesterov") != "true" || c.Option("momentum") != "0.5" {
		t.Fatalf("-optim sgd:nesterov=true -momentum 0.5: %s, %v", c, err)
	}
	f.Momentum = 0
	if _, err = f.OptimizerConfig(); err == nil || !strings.Contains(err.Error(), "-optim") {
		t.Fatalf("-optim sgd:nesterov=true -momentum 0: %v", err)
	}
	f.Optim = "sgd:nesterov=true,momentum=0.8"
	if c, err = f.OptimizerConfig(); err != nil || c.Option("momentum") != "0.8" {
		t.Fatalf("-optim sgd:nesterov=true,momentum=0.8 -momentum 0: %s, %v", c, err)
	}
}

// AtLeast names the first flag below its minimum, with its value.
func TestAtLeast(t *testing.T) {
	if err := AtLeast(1, Int("-batch", 4), Int("-epochs", 1)); err != nil {
		t.Errorf("valid flags: %v", err)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{AtLeast(1, Int("-batch", 4), Int("-epochs", 0), Int("-workers", -1)), "-epochs 0: want at least 1"},
		{AtLeast(0, Int("-steps", -1)), "-steps -1: want 0 or more"},
		{AtLeast(2, Int("-seq", 1)), "-seq 1: want at least 2"},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("%v, want %q", tc.err, tc.want)
		}
	}
}
