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
		{"adam:betas=0.9/x", `option betas: "0.9/x" is not beta1/beta2`},
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
			if !strings.Contains(h, o.name+"\n") || !strings.Contains(h, "    "+op.name+" ") {
				t.Errorf("OptimizerHelp lacks %s %s", o.name, op.name)
			}
		}
	}
}
