package optim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/spec"
)

// optimizerSpec describes one optimizer name ParseOptimizerConfig accepts.
type optimizerSpec struct {
	name, summary string
	options       []spec.Option
	build         func(v *specValues, params []*nn.Param, lr float64) (Optimizer, error)
}

// adamOptions are Adam's and AdamW's options; they differ in the default weight decay.
func adamOptions(defaultWD, wdHelp string) []spec.Option {
	return []spec.Option{
		{Name: "betas", Default: "0.9/0.999", Help: "beta1/beta2", Kind: spec.Floats},
		{Name: "eps", Default: "1e-8", Help: "added to the root of the second moment", Kind: spec.Float},
		{Name: "wd", Default: defaultWD, Help: wdHelp, Kind: spec.Float},
		{Name: "amsgrad", Default: "false", Help: "normalise by the running maximum of the second moment", Kind: spec.Bool},
		{Name: "no_decay", Default: "false", Help: "exempt biases and norm weights from decay (NoDecay: BERT's recipe)", Kind: spec.Bool},
	}
}

func buildAdam(decoupled bool) func(v *specValues, params []*nn.Param, lr float64) (Optimizer, error) {
	return func(v *specValues, params []*nn.Param, lr float64) (Optimizer, error) {
		cfg := AdamConfig{LR: lr, Decoupled: decoupled}
		betas := strings.Split(v.s.Get("betas"), "/")
		if len(betas) != 2 {
			return nil, v.errorf("betas", "%q is not beta1/beta2 (e.g. 0.9/0.999)", v.s.Get("betas"))
		}
		for i, b := range betas {
			cfg.Betas[i], _ = strconv.ParseFloat(b, 64) // canonical: spec.Floats
		}
		var err error
		if cfg.Eps, err = v.nonNegFloat("eps"); err != nil {
			return nil, err
		}
		if cfg.WeightDecay, err = v.nonNegFloat("wd"); err != nil {
			return nil, err
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
		options: []spec.Option{{Name: "momentum", Default: "0", Help: "momentum factor", Kind: spec.Float},
			{Name: "dampening", Default: "0", Help: "dampening of the momentum", Kind: spec.Float},
			{Name: "nesterov", Default: "false", Help: "Nesterov momentum", Kind: spec.Bool},
			{Name: "wd", Default: "0", Help: "weight decay (L2, added to the gradient)", Kind: spec.Float}},
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
	{name: "adam", summary: "torch.optim.Adam (weight decay added to the gradient)",
		options: adamOptions("0", "weight decay (L2, added to the gradient)"), build: buildAdam(false)},
	{name: "adamw", summary: "torch.optim.AdamW (decoupled weight decay)",
		options: adamOptions(strconv.FormatFloat(DefaultAdamWDecay, 'g', -1, 64), "decoupled weight decay"), build: buildAdam(true)},
}

// OptimizerConfig is a parsed, checked optimizer spec: the name and every option, defaults
// filled in. Its String is canonical ("sgd:momentum=0.9" and "sgd:wd=0,momentum=0.90" give
// the same), and New builds the optimizer over a model's parameters.
type OptimizerConfig struct{ boundSpec }

// ParseOptimizerConfig parses and checks an optimizer spec, "name" or "name:key=value,…"
// (OptimizerHelp lists the names and options), so a program's -optim flag picks any of them:
//
//	sgd:momentum=0.9,wd=5e-4,nesterov=true
//	adam:betas=0.9/0.98,eps=1e-6
//	adamw:wd=0.01,no_decay=true     BERT's: biases and LayerNorm weights do not decay
//
// A bad spec gives an error naming the optimizer and the option.
func ParseOptimizerConfig(text string) (OptimizerConfig, error) {
	var names []string
	for _, o := range optimizers {
		names = append(names, o.name)
	}
	s, err := bindSpec("optimizer", text, func(name string) ([]spec.Option, bool) {
		o, ok := optimizerNamed(name)
		return o.options, ok
	}, names)
	if err != nil {
		return OptimizerConfig{}, err
	}
	return checkedOptimizer(s)
}

// checkedOptimizer builds the bound spec s over no parameters: what ParseOptimizerConfig
// checks.
func checkedOptimizer(s spec.Spec) (OptimizerConfig, error) {
	c := OptimizerConfig{boundSpec{s}}
	if _, err := c.New(nil, 0); err != nil {
		return OptimizerConfig{}, err
	}
	return c, nil
}

// SGDSpec is the configuration of torch.optim.SGD with c's momentum, dampening, Nesterov
// flag and weight decay (c.LR is New's): a typed way to the spec a program would otherwise
// write as "sgd:momentum=…,wd=…".
func SGDSpec(c SGDConfig) (OptimizerConfig, error) {
	return ParseOptimizerConfig(fmt.Sprintf("sgd:momentum=%s,dampening=%s,nesterov=%t,wd=%s",
		spec.FormatFloat(c.Momentum), spec.FormatFloat(c.Dampening), c.Nesterov, spec.FormatFloat(c.WeightDecay)))
}

// New builds the optimizer over params with learning rate lr.
func (c OptimizerConfig) New(params []*nn.Param, lr float64) (Optimizer, error) {
	o, ok := optimizerNamed(c.s.Name())
	if !ok {
		return nil, fmt.Errorf("optim: OptimizerConfig %q is not an optimizer (build it with ParseOptimizerConfig)", c.s.Name())
	}
	opt, err := o.build(&specValues{kind: "optimizer", s: c.s}, params, lr)
	if err != nil {
		return nil, fmt.Errorf("%w (in %q)", err, c.s.String())
	}
	return opt, nil
}

// With returns the configuration with option key set to value, checked as
// ParseOptimizerConfig checks a spec.
func (c OptimizerConfig) With(key, value string) (OptimizerConfig, error) {
	o, _ := optimizerNamed(c.s.Name())
	s, err := withOption(c.s, o.options, "optimizer", key, value)
	if err != nil {
		return OptimizerConfig{}, err
	}
	return checkedOptimizer(s)
}

// WithDefault returns the configuration with the numeric option key set to x unless the spec
// gave key itself: a program's -momentum and -wd flags for an sgd spec that leaves them out.
func (c OptimizerConfig) WithDefault(key string, x float64) (OptimizerConfig, error) {
	if c.Given(key) {
		return c, nil
	}
	return c.With(key, spec.FormatFloat(x))
}

// ParseOptimizer builds an optimizer over params with learning rate lr from a spec
// (ParseOptimizerConfig).
func ParseOptimizer(text string, params []*nn.Param, lr float64) (Optimizer, error) {
	c, err := ParseOptimizerConfig(text)
	if err != nil {
		return nil, err
	}
	return c.New(params, lr)
}

func optimizerNamed(name string) (optimizerSpec, bool) {
	for _, o := range optimizers {
		if o.name == name {
			return o, true
		}
	}
	return optimizerSpec{}, false
}

// OptimizerHelp lists the optimizers ParseOptimizer accepts with their options and
// defaults, for a program's -h.
func OptimizerHelp() string {
	return specHelp(optimizers, func(o optimizerSpec) (string, string, []spec.Option) { return o.name, o.summary, o.options }, 10, 9)
}
