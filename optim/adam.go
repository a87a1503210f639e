package optim

import (
	"fmt"
	"math"
	"strings"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// PyTorch's defaults for Adam and AdamW.
const (
	DefaultBeta1      = 0.9
	DefaultBeta2      = 0.999
	DefaultAdamEps    = 1e-8
	DefaultAdamWDecay = 1e-2 // torch.optim.AdamW's weight_decay default (Adam's is 0)
)

// AdamConfig holds torch.optim.Adam / AdamW's hyper-parameters.
//
// A zero Betas selects PyTorch's (0.9, 0.999) and a zero Eps its 1e-8 (neither pair (0, 0)
// nor eps 0 is a useful setting: eps 0 divides by zero where a gradient has always been 0).
type AdamConfig struct {
	LR    float64
	Betas [2]float64
	Eps   float64
	// WeightDecay is the decay of every parameter not in a group that sets its own
	// (NewAdamGroups). Adam adds WeightDecay·p to the gradient (L2); AdamW multiplies p by
	// 1 − lr·WeightDecay before the update (decoupled, Loshchilov & Hutter).
	WeightDecay float64
	// Decoupled selects AdamW.
	Decoupled bool
	// AMSGrad normalises by the running maximum of the second moment (Reddi et al.).
	AMSGrad bool
	// Maximize ascends the objective instead of descending it.
	Maximize bool
}

// ParamGroup is a set of parameters with their own weight decay, as an entry of PyTorch's
// param_groups that overrides "weight_decay".
type ParamGroup struct {
	Params      []*nn.Param
	WeightDecay float64
}

// Adam is torch.optim.Adam, or torch.optim.AdamW with Decoupled, in PyTorch 1.13's
// semantics (its default single-tensor path). At step t (from 1), per element:
//
//	g = grad (−grad with Maximize) + wd·p       (Adam; L2 decay)
//	p = p·(1 − lr·wd)                            (AdamW; decoupled decay)
//	m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//	v̂ = max(v̂, v) with AMSGrad, else v
//	p −= lr/(1−β1^t) · m / (sqrt(v̂)/sqrt(1−β2^t) + eps)
//
// The bias corrections are computed in float64 as PyTorch does, the update in float32
// through kernels.AdamUpdateAll (one parallel pass over all parameters). Every parameter
// is stepped at every Step (PyTorch skips parameters whose grad is None; spargo's are
// never nil), so one step count serves all.
type Adam struct {
	cfg    AdamConfig
	params []*nn.Param
	wd     []float64 // weight decay per parameter (its group's)
	step   int64     // steps taken
	m, v   [][]float32
	vmax   [][]float32 // AMSGrad's running maxima
	coefs  []kernels.AdamCoef
	ws, gs [][]float32 // Step's argument lists, kept to avoid garbage
}

// NewAdam returns torch.optim.Adam over params (cfg.Decoupled selects AdamW). It returns an
// error, naming the setting, for values PyTorch also refuses.
func NewAdam(params []*nn.Param, cfg AdamConfig) (*Adam, error) {
	return NewAdamGroups([]ParamGroup{{Params: params, WeightDecay: cfg.WeightDecay}}, cfg)
}

// NewAdamW returns torch.optim.AdamW over params: NewAdam with cfg.Decoupled set.
func NewAdamW(params []*nn.Param, cfg AdamConfig) (*Adam, error) {
	cfg.Decoupled = true
	return NewAdam(params, cfg)
}

// NewAdamGroups returns an Adam (or AdamW, with cfg.Decoupled) whose parameter groups have
// their own weight decay (cfg.WeightDecay is then unused); NoDecayGroups builds BERT's two
// groups. A parameter may appear in one group only.
func NewAdamGroups(groups []ParamGroup, cfg AdamConfig) (*Adam, error) {
	if cfg.Betas == [2]float64{} {
		cfg.Betas = [2]float64{DefaultBeta1, DefaultBeta2}
	}
	if cfg.Eps == 0 {
		cfg.Eps = DefaultAdamEps
	}
	name := cfg.name()
	switch {
	case !(cfg.LR >= 0):
		return nil, fmt.Errorf("optim.%s: invalid learning rate %v", name, cfg.LR)
	case !(cfg.Eps >= 0):
		return nil, fmt.Errorf("optim.%s: invalid eps %v", name, cfg.Eps)
	case !(cfg.Betas[0] >= 0 && cfg.Betas[0] < 1):
		return nil, fmt.Errorf("optim.%s: invalid beta1 %v (want 0 ≤ beta1 < 1)", name, cfg.Betas[0])
	case !(cfg.Betas[1] >= 0 && cfg.Betas[1] < 1):
		return nil, fmt.Errorf("optim.%s: invalid beta2 %v (want 0 ≤ beta2 < 1)", name, cfg.Betas[1])
	}
	o := &Adam{cfg: cfg}
	seen := map[*nn.Param]int{}
	for gi, g := range groups {
		if !(g.WeightDecay >= 0) {
			return nil, fmt.Errorf("optim.%s: group %d: invalid weight decay %v", name, gi, g.WeightDecay)
		}
		for _, p := range g.Params {
			if p == nil || p.Value == nil || p.Grad == nil || len(p.Value.Data) != len(p.Grad.Data) {
				return nil, fmt.Errorf("optim.%s: group %d: parameter %s has no value or a gradient of another size", name, gi, paramName(p))
			}
			if prev, dup := seen[p]; dup {
				return nil, fmt.Errorf("optim.%s: parameter %s is in group %d and group %d", name, p.Name, prev, gi)
			}
			seen[p] = gi
			o.params = append(o.params, p)
			o.wd = append(o.wd, g.WeightDecay)
		}
	}
	n := len(o.params)
	o.m, o.v, o.coefs = make([][]float32, n), make([][]float32, n), make([]kernels.AdamCoef, n)
	if cfg.AMSGrad {
		o.vmax = make([][]float32, n)
	}
	o.allocState()
	return o, nil
}

func paramName(p *nn.Param) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q", p.Name)
}

func (c AdamConfig) name() string {
	if c.Decoupled {
		return "AdamW"
	}
	return "Adam"
}

func (o *Adam) allocState() {
	for i, p := range o.params {
		o.m[i] = make([]float32, p.Len())
		o.v[i] = make([]float32, p.Len())
		if o.vmax != nil {
			o.vmax[i] = make([]float32, p.Len())
		}
	}
}

// Config returns the optimizer's settings (LR as last set).
func (o *Adam) Config() AdamConfig { return o.cfg }

// Steps returns the number of steps taken (PyTorch's state["step"]).
func (o *Adam) Steps() int64 { return o.step }

// LR returns the current learning rate.
func (o *Adam) LR() float64 { return o.cfg.LR }

// SetLR changes the learning rate (schedules call it before each step); with AdamW it
// also scales the decoupled decay, as in PyTorch.
func (o *Adam) SetLR(lr float64) { o.cfg.LR = lr }

// ZeroGrad clears the gradients of the optimizer's parameters.
func (o *Adam) ZeroGrad() {
	for _, p := range o.params {
		kernels.Zero(p.Grad.Data)
	}
}

// Step applies one update from the parameters' current gradients.
func (o *Adam) Step() {
	o.step++
	c := o.cfg
	b1, b2 := c.Betas[0], c.Betas[1]
	t := float64(o.step)
	bc1 := 1 - math.Pow(b1, t)
	bc2 := 1 - math.Pow(b2, t)
	base := kernels.AdamCoef{
		Beta1: float32(b1), Beta2: float32(b2), OneMinusBeta1: float32(1 - b1), OneMinusBeta2: float32(1 - b2),
		StepSize: float32(c.LR / bc1), BC2Sqrt: float32(math.Sqrt(bc2)), Eps: float32(c.Eps),
		Decay: 1, AMSGrad: c.AMSGrad, Maximize: c.Maximize,
	}
	o.ws, o.gs = o.ws[:0], o.gs[:0]
	for i, p := range o.params {
		o.ws, o.gs = append(o.ws, p.Value.Data), append(o.gs, p.Grad.Data)
		k := base
		if c.Decoupled {
			k.Decay = float32(1 - c.LR*o.wd[i])
		} else {
			k.L2 = float32(o.wd[i])
		}
		o.coefs[i] = k
	}
	kernels.AdamUpdateAll(o.ws, o.gs, o.m, o.v, o.vmax, o.coefs)
}

// State keys: the moments under "exp_avg:<name>", "exp_avg_sq:<name>" and (AMSGrad)
// "max_exp_avg_sq:<name>", PyTorch's names; the step count under "adam:step" as two float32
// values, hi and lo with step = hi·2^24 + lo, both exact. Parameter names have no colon.
const (
	adamStepKey  = "adam:step"
	expAvgKey    = "exp_avg:"
	expAvgSqKey  = "exp_avg_sq:"
	maxExpAvgKey = "max_exp_avg_sq:"
)

// State returns the optimizer's state for checkpoints: copies of the moments by parameter
// name and the step count (keys above). It is empty before the first step.
func (o *Adam) State() map[string][]float32 {
	st := map[string][]float32{}
	if o.step == 0 {
		return st
	}
	st[adamStepKey] = []float32{float32(o.step >> 24), float32(o.step & (1<<24 - 1))}
	for i, p := range o.params {
		st[expAvgKey+p.Name] = append([]float32(nil), o.m[i]...)
		st[expAvgSqKey+p.Name] = append([]float32(nil), o.v[i]...)
		if o.vmax != nil {
			st[maxExpAvgKey+p.Name] = append([]float32(nil), o.vmax[i]...)
		}
	}
	return st
}

// LoadState restores a state saved by State, so that the optimizer continues exactly where
// the saved one stopped. An empty state resets it to a fresh optimizer. A missing or
// wrongly sized moment, a malformed step count, or a moment of a parameter this optimizer
// does not have is an error naming the key; on error the optimizer is unchanged.
func (o *Adam) LoadState(st map[string][]float32) error {
	name := o.cfg.name()
	if len(st) == 0 {
		o.step = 0
		o.allocState()
		return nil
	}
	sv, ok := st[adamStepKey]
	if !ok {
		return fmt.Errorf("optim.%s.LoadState: no %q entry", name, adamStepKey)
	}
	if len(sv) != 2 || sv[0] < 0 || sv[1] < 0 || sv[1] >= 1<<24 || sv[0] != float32(math.Trunc(float64(sv[0]))) ||
		sv[1] != float32(math.Trunc(float64(sv[1]))) || int64(sv[0])*(1<<24)+int64(sv[1]) == 0 {
		return fmt.Errorf("optim.%s.LoadState: %q = %v is not a step count", name, adamStepKey, sv)
	}
	step := int64(sv[0])<<24 + int64(sv[1])
	prefixes := []string{expAvgKey, expAvgSqKey}
	if o.vmax != nil {
		prefixes = append(prefixes, maxExpAvgKey)
	}
	byName := map[string]*nn.Param{}
	for _, p := range o.params {
		byName[p.Name] = p
		for _, pre := range prefixes {
			b, ok := st[pre+p.Name]
			if !ok {
				return fmt.Errorf("optim.%s.LoadState: no %q entry for parameter %s", name, pre+p.Name, p.Name)
			}
			if len(b) != p.Len() {
				return fmt.Errorf("optim.%s.LoadState: %q has %d elements, parameter %s has %d", name, pre+p.Name, len(b), p.Name, p.Len())
			}
		}
	}
	for k := range st {
		for _, pre := range []string{expAvgKey, expAvgSqKey, maxExpAvgKey} {
			if pn, ok := strings.CutPrefix(k, pre); ok && byName[pn] == nil {
				return fmt.Errorf("optim.%s.LoadState: %q belongs to no parameter of this optimizer", name, k)
			}
		}
	}
	o.step = step
	for i, p := range o.params {
		copy(o.m[i], st[expAvgKey+p.Name])
		copy(o.v[i], st[expAvgSqKey+p.Name])
		if o.vmax != nil {
			copy(o.vmax[i], st[maxExpAvgKey+p.Name])
		}
	}
	return nil
}

// NoDecay reports whether a parameter of this name is exempt from weight decay in the
// usual transformer recipe (BERT, transformers' no_decay = ["bias", "LayerNorm.weight"]):
// its last dotted component ends in "bias" ("fc.bias", "attn.in_proj_bias"), or its name
// contains "norm" in any case ("encoder.0.LayerNorm.weight", "ln.layer_norm.weight",
// "final_norm.weight"). Embeddings and every other weight decay.
func NoDecay(name string) bool {
	last := name[strings.LastIndexByte(name, '.')+1:]
	return strings.HasSuffix(strings.ToLower(last), "bias") || strings.Contains(strings.ToLower(name), "norm")
}

// NoDecayGroups splits params, in order, into the two groups of BERT's recipe: those that
// decay by wd and those NoDecay exempts (decay 0). Either group may be empty.
func NoDecayGroups(params []*nn.Param, wd float64) []ParamGroup {
	decay, none := ParamGroup{WeightDecay: wd}, ParamGroup{}
	for _, p := range params {
		if NoDecay(p.Name) {
			none.Params = append(none.Params, p)
		} else {
			decay.Params = append(decay.Params, p)
		}
	}
	return []ParamGroup{decay, none}
}
