package optim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/nn"
)

// optimizerSpec describes one optimizer name ParseOptimizer accepts.
type optimizerSpec struct {
	name, summary string
	options       []scheduleOption
	build         func(v *specValues, params []*nn.Param, lr float64) (Optimizer, error)
}

func (v *specValues) bool(name string) (bool, error) {
	b, err := strconv.ParseBool(v.m[name])
	if err != nil {
		return false, v.errorf(name, "%q is not true or false", v.m[name])
	}
	return b, nil
}

var adamOptions = []scheduleOption{
	{"betas", "0.9/0.999", "beta1/beta2"}, {"eps", "1e-8", "added to the root of the second moment"},
	{"wd", "", "weight decay (adam: L2 on the gradient, default 0; adamw: decoupled, default 0.01)"},
	{"amsgrad", "false", "normalise by the running maximum of the second moment"},
	{"no_decay", "false", "exempt biases and norm weights from decay (NoDecay: BERT's recipe)"},
}

func buildAdam(decoupled bool) func(v *specValues, params []*nn.Param, lr float64) (Optimizer, error) {
	return func(v *specValues, params []*nn.Param, lr float64) (Optimizer, error) {
		cfg := AdamConfig{LR: lr, Decoupled: decoupled}
		b1s, b2s, ok := strings.Cut(v.m["betas"], "/")
		var err error
		if !ok {
			return nil, v.errorf("betas", "%q is not beta1/beta2 (e.g. 0.9/0.999)", v.m["betas"])
		}
		v.m["beta1"], v.m["beta2"] = b1s, b2s
		if cfg.Betas[0], err = v.float("beta1"); err != nil {
			return nil, v.errorf("betas", "%q is not beta1/beta2 (e.g. 0.9/0.999)", v.m["betas"])
		}
		if cfg.Betas[1], err = v.float("beta2"); err != nil {
			return nil, v.errorf("betas", "%q is not beta1/beta2 (e.g. 0.9/0.999)", v.m["betas"])
		}
		if cfg.Eps, err = v.nonNegFloat("eps"); err != nil {
			return nil, err
		}
		if !v.set["wd"] && decoupled {
			cfg.WeightDecay = DefaultAdamWDecay
		} else if v.set["wd"] {
			if cfg.WeightDecay, err = v.nonNegFloat("wd"); err != nil {
				return nil, err
			}
		}
		if cfg.AMSGrad, err = v.bool("amsgrad"); err != nil {
			return nil, err
		}
		noDecay, err := v.bool("no_decay")
		if err != nil {
			return nil, err
		}
		groups := []ParamGroup{{Params: params, WeightDecay: cfg.WeightDecay}}
		if noDecay {
			groups = NoDecayGroups(params, cfg.WeightDecay)
		}
		return NewAdamGroups(groups, cfg)
	}
}

var optimizers = []optimizerSpec{
	{name: "sgd", summary: "torch.optim.SGD",
		options: []scheduleOption{{"momentum", "0", "momentum factor"}, {"dampening", "0", "dampening of the momentum"},
			{"nesterov", "false", "Nesterov momentum"}, {"wd", "0", "weight decay (L2, added to the gradient)"}},
		build: func(v *specValues, params []*nn.Param, lr float64) (Optimizer, error) {
			cfg := SGDConfig{LR: lr}
			var err error
			if cfg.Momentum, err = v.nonNegFloat("momentum"); err != nil {
				return nil, err
			}
			if cfg.Dampening, err = v.float("dampening"); err != nil {
				return nil, err
			}
			if cfg.WeightDecay, err = v.nonNegFloat("wd"); err != nil {
				return nil, err
			}
			if cfg.Nesterov, err = v.bool("nesterov"); err != nil {
				return nil, err
			}
			return NewSGD(params, cfg)
		}},
	{name: "adam", summary: "torch.optim.Adam (weight decay added to the gradient)", options: adamOptions, build: buildAdam(false)},
	{name: "adamw", summary: "torch.optim.AdamW (decoupled weight decay)", options: adamOptions, build: buildAdam(true)},
}

// ParseOptimizer builds an optimizer over params with learning rate lr from "name" or
// "name:key=value,…" (OptimizerHelp lists the names and options), so a program's -optim
// flag picks any of them:
//
//	sgd:momentum=0.9,wd=5e-4,nesterov=true
//	adam:betas=0.9/0.98,eps=1e-6
//	adamw:wd=0.01,no_decay=true     BERT's: biases and LayerNorm weights do not decay
//
// A bad spec gives an error naming the optimizer and the option.
func ParseOptimizer(spec string, params []*nn.Param, lr float64) (Optimizer, error) {
	var names []string
	for _, o := range optimizers {
		names = append(names, o.name)
	}
	name, opts, err := splitSpec("optimizer", spec, "", func(name string) ([]scheduleOption, bool) {
		for _, o := range optimizers {
			if o.name == name {
				return o.options, true
			}
		}
		return nil, false
	}, names)
	if err != nil {
		return nil, err
	}
	v := &specValues{kind: "optimizer", schedule: name, m: opts.m, set: opts.set}
	for _, o := range optimizers {
		if o.name == name {
			opt, err := o.build(v, params, lr)
			if err != nil {
				return nil, fmt.Errorf("%w (in %q)", err, spec)
			}
			return opt, nil
		}
	}
	panic("unreachable")
}

// OptimizerHelp lists the optimizers ParseOptimizer accepts with their options and
// defaults, for a program's -h.
func OptimizerHelp() string {
	var b strings.Builder
	for _, o := range optimizers {
		fmt.Fprintf(&b, "%s\n    %s\n", o.name, o.summary)
		for _, op := range o.options {
			def := op.def
			if def == "" {
				def = "-"
			}
			fmt.Fprintf(&b, "    %-10s default %-9s %s\n", op.name, def, op.help)
		}
	}
	return b.String()
}
