package optim

import (
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

func TestParseOptimizer(t *testing.T) {
	ps := []*nn.Param{nn.NewParam("fc.weight", 2), nn.NewParam("fc.bias", 2)}
	o, err := ParseOptimizer("sgd:momentum=0.9,wd=5e-4,nesterov=true", ps, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := o.(*SGD); !ok || s.cfg != (SGDConfig{LR: 0.1, Momentum: 0.9, WeightDecay: 5e-4, Nesterov: true}) {
		t.Errorf("sgd: %#v", o)
	}
	o, err = ParseOptimizer("adam:betas=0.8/0.98,eps=1e-6,amsgrad=true", ps, 1e-3)
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := o.(*Adam); !ok || a.cfg != (AdamConfig{LR: 1e-3, Betas: [2]float64{0.8, 0.98}, Eps: 1e-6, AMSGrad: true}) || a.wd[0] != 0 {
		t.Errorf("adam: %#v", o)
	}
	o, err = ParseOptimizer("adamw", ps, 1e-3)
	if err != nil {
		t.Fatal(err)
	}
	if a := o.(*Adam); !a.cfg.Decoupled || a.wd[0] != 0.01 || a.wd[1] != 0.01 {
		t.Errorf("adamw defaults: %+v, decay %v", a.cfg, a.wd)
	}
	o, err = ParseOptimizer("adamw:wd=0.1,no_decay=true", ps, 1e-3)
	if err != nil {
		t.Fatal(err)
	}
	if a := o.(*Adam); a.params[0].Name != "fc.weight" || a.wd[0] != 0.1 || a.params[1].Name != "fc.bias" || a.wd[1] != 0 {
		t.Errorf("adamw no_decay: decay %v", a.wd)
	}
	for _, tc := range []struct{ spec, want string }{
		{"", `unknown optimizer ""`},
		{"adagrad", `unknown optimizer "adagrad" in "adagrad" (known: sgd, adam, adamw)`},
		{"adam:betas=0.9", `optimizer adam: option betas: "0.9" is not beta1/beta2`},
		{"adam:betas=0.9/x", `optimizer adam: option betas: "0.9/x" is not numbers separated by / ("x" is not a number)`},
		{"adam:betas=0.9/0.99/0.5", `option betas: "0.9/0.99/0.5" is not beta1/beta2`},
		{"sgd:wd=1e-4,wd=1e-4", `optim: optimizer sgd: option wd given twice`},
		{"sgd+adam", `optimizer sgd in "sgd+adam" wraps nothing`},
		{"adam:momentum=0.9", `optimizer adam has no option "momentum" (options: betas, eps, wd, amsgrad, no_decay)`},
		{"adam:betas=0.9/1", "invalid beta2 1"},
		{"adamw:amsgrad=yes", `optimizer adamw: option amsgrad: "yes" is not true or false`},
		{"adamw:wd=-1", "option wd: -1 is negative"},
		{"sgd:nesterov=true", "Nesterov momentum requires a momentum"},
		{"sgd:lr=0.1", `optimizer sgd has no option "lr" (options: momentum, dampening, nesterov, wd)`},
	} {
		if _, err := ParseOptimizer(tc.spec, ps, 0.1); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseOptimizer(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
	h := OptimizerHelp()
	for _, o := range optimizers {
		for _, op := range o.options {
			if !strings.Contains(h, o.name+"\n") || !strings.Contains(h, "    "+op.Name+" ") {
				t.Errorf("OptimizerHelp lacks %s %s", o.name, op.Name)
			}
		}
	}
}

func mustOptimizer(t *testing.T, s string) OptimizerConfig {
	t.Helper()
	c, err := ParseOptimizerConfig(s)
	if err != nil {
		t.Fatalf("ParseOptimizerConfig(%q): %v", s, err)
	}
	return c
}

// The same optimizer written differently has one canonical String; different ones differ.
func TestOptimizerConfigCanonical(t *testing.T) {
	sgd, err := SGDSpec(SGDConfig{LR: 3, Momentum: 0.9, WeightDecay: 5e-4})
	if err != nil {
		t.Fatal(err)
	}
	for want, same := range map[string][]string{
		"sgd:momentum=0,dampening=0,nesterov=false,wd=0":                       {"sgd", "sgd:momentum=0", "sgd:wd=0.0,momentum=0e0", " sgd : nesterov=F"},
		"sgd:momentum=0.9,dampening=0,nesterov=false,wd=0.0005":                {"sgd:momentum=0.9,wd=5e-4", "sgd:wd=0.0005,momentum=0.90", sgd.String()},
		"adamw:betas=0.9/0.999,eps=1e-08,wd=0.01,amsgrad=false,no_decay=false": {"adamw", "adamw:wd=1e-2,betas=0.90/0.999,eps=1e-8"},
		"adam:betas=0.9/0.999,eps=1e-08,wd=0,amsgrad=true,no_decay=false":      {"adam:amsgrad=1", "adam:amsgrad=true,wd=0"},
	} {
		for _, s := range same {
			if got := mustOptimizer(t, s).String(); got != want {
				t.Errorf("ParseOptimizerConfig(%q).String() = %q, want %q", s, got, want)
			}
		}
	}
	if a, w := mustOptimizer(t, "adam").String(), mustOptimizer(t, "adamw").String(); a == w {
		t.Errorf("adam and adamw share %q", a)
	}
	// Built from the canonical form, the optimizer is the same.
	ps := []*nn.Param{nn.NewParam("fc.weight", 2)}
	o, err := sgd.New(ps, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.(*SGD).cfg; got != (SGDConfig{LR: 0.1, Momentum: 0.9, WeightDecay: 5e-4}) {
		t.Errorf("SGDSpec's optimizer: %+v", got)
	}
	if sgd.Name() != "sgd" || sgd.Option("wd") != "0.0005" || !sgd.Given("wd") {
		t.Errorf("SGDSpec: name %q wd %q given %v", sgd.Name(), sgd.Option("wd"), sgd.Given("wd"))
	}
}

// WithDefault fills in what the spec left out (a program's -momentum and -wd) and keeps what it set.
func TestOptimizerConfigWithDefault(t *testing.T) {
	c := mustOptimizer(t, "sgd:momentum=0.5,nesterov=true")
	c, err := c.WithDefault("momentum", 0.9)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = c.WithDefault("wd", 1e-4); err != nil {
		t.Fatal(err)
	}
	if got, want := c.String(), "sgd:momentum=0.5,dampening=0,nesterov=true,wd=0.0001"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if _, err := mustOptimizer(t, "adam").WithDefault("momentum", 0.9); err == nil || !strings.Contains(err.Error(), `optimizer adam has no option "momentum"`) {
		t.Errorf("adam WithDefault(momentum) = %v", err)
	}
	if _, err := mustOptimizer(t, "sgd").With("momentum", "-1"); err == nil || !strings.Contains(err.Error(), "option momentum: -1 is negative") {
		t.Errorf("With(momentum=-1) = %v", err)
	}
	if _, err := (OptimizerConfig{}).New(nil, 0.1); err == nil || !strings.Contains(err.Error(), "ParseOptimizerConfig") {
		t.Errorf("zero OptimizerConfig's New = %v", err)
	}
}
