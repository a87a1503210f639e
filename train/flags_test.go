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

// -warmup alone is the seeds' warm-up from lr/workers (the schedule the examples built
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
	if m["optim"] != "adam" || m["schedule"] != "cosine" || m["lr"] != "0.1" {
		t.Errorf("meta %v", m)
	}
	if _, ok := (&Flags{Optim: "sgd"}).MetaConfig()["optim"]; ok {
		t.Error("the default optimizer is in the checkpoint meta: older checkpoints would not resume")
	}
}
