// Package optim owns the optimizers and learning-rate schedules.
//
//	opt := optim.NewSGD(params, optim.SGDConfig{LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4})
//	sched := optim.WarmupStep{Base: 0.1, WarmupFrom: 0.1 / 4, WarmupEpochs: 5, Milestones: []int{150, 250}, Gamma: 0.1}
//	for epoch := range epochs {
//		for step := range stepsPerEpoch {
//			opt.SetLR(sched.LR(epoch, step, stepsPerEpoch))
//			… backward …
//			opt.Step()
//		}
//	}
//
// SGD matches torch.optim.SGD exactly (momentum, dampening, Nesterov, weight decay
// added to the gradient before momentum); the tests replay PyTorch goldens. So do Adam and
// AdamW (NewAdam, NewAdamW; NewAdamGroups with NoDecayGroups for BERT's recipe, biases and
// norm weights without decay). Both satisfy Optimizer, which schedules and checkpoints use.
//
// Schedules: Constant, StepLR, MultiStep, WarmupStep, Cosine (optional warm-up),
// LinearWarmupDecay (BERT's), checked against torch.optim.lr_scheduler. Programs parse
// optimizer and schedule flags once with ParseOptimizerConfig ("adamw:wd=0.01,no_decay=true")
// and ParseScheduleConfig ("cosine:warmup=2"), in package spec's grammar: the configurations
// have a canonical String (defaults filled in, numbers in one form) and build with New.
// SGDSpec is the typed way to an SGD configuration; ParseOptimizer and ParseSchedule parse and
// build in one call; OptimizerHelp and ScheduleHelp list the choices.
package optim

import (
	"fmt"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// SGDConfig holds torch.optim.SGD's hyper-parameters.
type SGDConfig struct {
	LR          float64
	Momentum    float64
	Dampening   float64
	WeightDecay float64
	Nesterov    bool
}

// SGD is stochastic gradient descent with momentum, as torch.optim.SGD:
//
//	d = grad + wd·p
//	buf = d (first step) or momentum·buf + (1−dampening)·d
//	d = d + momentum·buf (Nesterov) or buf
//	p −= lr·d
type SGD struct {
	cfg    SGDConfig
	params []*nn.Param
	bufs   [][]float32 // momentum buffers, nil until the first step
	index  map[*nn.Param]int
	// LGP differences by parameter index (ddp.Corrector), only for parameters whose
	// gradients a comm hook deferred recently.
	lgps       map[int]*lgp
	lgpScratch []float32

	// Per-step argument lists for kernels.SGDUpdateAll, kept to avoid garbage.
	ws, gs [][]float32
	first  []bool
}

// NewSGD returns an SGD optimizer over params. It returns an error for settings
// PyTorch also refuses (negative values, Nesterov without momentum or with dampening).
func NewSGD(params []*nn.Param, cfg SGDConfig) (*SGD, error) {
	switch {
	case cfg.LR < 0:
		return nil, fmt.Errorf("optim.SGD: invalid learning rate %v", cfg.LR)
	case cfg.Momentum < 0:
		return nil, fmt.Errorf("optim.SGD: invalid momentum %v", cfg.Momentum)
	case cfg.WeightDecay < 0:
		return nil, fmt.Errorf("optim.SGD: invalid weight decay %v", cfg.WeightDecay)
	case cfg.Nesterov && (cfg.Momentum <= 0 || cfg.Dampening != 0):
		return nil, fmt.Errorf("optim.SGD: Nesterov momentum requires a momentum and zero dampening")
	}
	index := make(map[*nn.Param]int, len(params))
	for i, p := range params {
		index[p] = i
	}
	return &SGD{cfg: cfg, params: params, bufs: make([][]float32, len(params)), index: index}, nil
}

// LR returns the current learning rate.
func (o *SGD) LR() float64 { return o.cfg.LR }

// SetLR changes the learning rate (schedules call it before each step).
func (o *SGD) SetLR(lr float64) { o.cfg.LR = lr }

// ZeroGrad clears the gradients of the optimizer's parameters (as nn.ZeroGrad, with
// large gradients cleared in parallel).
func (o *SGD) ZeroGrad() {
	for _, p := range o.params {
		kernels.Zero(p.Grad.Data)
	}
}

// Step applies one update from the parameters' current gradients, fused into one
// pass over all parameters (kernels.SGDUpdateAll, split into fixed chunks over the
// worker pool; the split does not change the result).
func (o *SGD) Step() {
	mom := float32(o.cfg.Momentum)
	o.ws, o.gs, o.first = o.ws[:0], o.gs[:0], o.first[:0]
	for i, p := range o.params {
		o.ws = append(o.ws, p.Value.Data)
		o.gs = append(o.gs, p.Grad.Data)
		first := false
		if mom != 0 && o.bufs[i] == nil {
			o.bufs[i] = make([]float32, p.Len())
			first = true
		}
		o.first = append(o.first, first)
	}
	kernels.SGDUpdateAll(o.ws, o.gs, o.bufs, o.first, float32(o.cfg.LR), float32(o.cfg.WeightDecay),
		mom, float32(o.cfg.Dampening), o.cfg.Nesterov)
	o.stepLGP()
}

// lgp is one parameter's LGP state (ddp's late results, ddp.Corrector): the difference
// between the dense-equivalent trajectory and the true one, which SGD's update, linear in the
// gradient, carries exactly. The dense-equivalent trajectory takes its weight decay from the
// true values: the difference is then due to the gradients' timing alone and vanishes once
// every deferred gradient has been applied (a lag's weight-decay share is second order and
// would take 1/(lr·wd) steps to fade).
type lgp struct {
	diff   []float32 // Diverge's sum for the coming Step (nil: none)
	buf    []float32 // Δ momentum buffer (with momentum)
	offset []float32 // Δ value: dense-equivalent minus true
	// the last Step's coefficients of a gradient's change: in the buffer and in the value
	lr, cBuf, cU float32
	idle         int     // Steps since the last Diverge or Revise
	peak         float32 // the largest |offset| seen
}

// lgpIdleSteps and lgpNegligible decide when a difference has died out: after that many
// Steps without news, once every |offset| and |lr·Δbuffer| is below lgpNegligible times the
// larger of the parameter's largest |value| and the largest |offset| seen (rounding is all
// that is left).
const (
	lgpIdleSteps  = 2
	lgpNegligible = 1e-6
)

// Diverge adds diff to how much p's dense-equivalent gradient exceeds the gradient the next
// Step applies to it (ddp.Corrector). It returns false, and records nothing, when p is not
// one of the optimizer's parameters or diff's length differs.
func (o *SGD) Diverge(p *nn.Param, diff []float32) bool {
	i, ok := o.index[p]
	if !ok || len(diff) != p.Len() {
		return false
	}
	st := o.lgpState(i)
	if st.diff == nil {
		st.diff = make([]float32, p.Len())
	}
	kernels.Add(st.diff, st.diff, diff)
	st.idle = 0
	return true
}

// Revise corrects the difference given for p before the last Step by delta (ddp.Corrector):
// the Δ buffer and Δ value move as that Step would have moved them.
func (o *SGD) Revise(p *nn.Param, delta []float32) {
	i, ok := o.index[p]
	if !ok || len(delta) != p.Len() {
		return
	}
	st := o.lgpState(i)
	if st.buf != nil {
		kernels.Axpy(st.cBuf, delta, st.buf)
	}
	kernels.Axpy(-st.lr*st.cU, delta, st.offset)
	st.notePeak()
	st.idle = 0
}

// Offset returns p's dense-equivalent value minus its true value after the last Step, or nil
// when there is none (ddp.Corrector).
func (o *SGD) Offset(p *nn.Param) []float32 {
	if i, ok := o.index[p]; ok && o.lgps[i] != nil {
		return o.lgps[i].offset
	}
	return nil
}

func (o *SGD) lgpState(i int) *lgp {
	if o.lgps == nil {
		o.lgps = map[int]*lgp{}
	}
	st := o.lgps[i]
	if st == nil {
		n := o.params[i].Len()
		// Coefficients of a Step that has not happened: a Revise before any Step changes the
		// value by −lr·grad.
		st = &lgp{offset: make([]float32, n), lr: float32(o.cfg.LR), cBuf: 1, cU: 1}
		o.lgps[i] = st
	}
	return st
}

// stepLGP advances every LGP difference through the Step just taken, with the same rule:
// Δd = diff; Δbuf = Δd on the first step, else momentum·Δbuf + (1−dampening)·Δd;
// Δvalue −= lr·(Δd + momentum·Δbuf with Nesterov, Δbuf with momentum, Δd without).
func (o *SGD) stepLGP() {
	lr := float32(o.cfg.LR)
	mom, damp := float32(o.cfg.Momentum), float32(o.cfg.Dampening)
	for i, st := range o.lgps {
		p := o.params[i]
		n := p.Len()
		if cap(o.lgpScratch) < n {
			o.lgpScratch = make([]float32, n)
		}
		dd := o.lgpScratch[:n]
		clear(dd)
		if st.diff != nil {
			copy(dd, st.diff)
		}
		cBuf, cU := float32(1), float32(1)
		u := dd
		if mom != 0 {
			if st.buf == nil {
				st.buf = make([]float32, n)
			}
			if o.first[i] {
				copy(st.buf, dd)
			} else {
				cBuf = 1 - damp
				kernels.Scale(mom, st.buf)
				kernels.Axpy(cBuf, dd, st.buf)
			}
			if o.cfg.Nesterov {
				kernels.Axpy(mom, st.buf, dd)
				cU = 1 + mom*cBuf
			} else {
				u, cU = st.buf, cBuf
			}
		}
		kernels.Axpy(-lr, u, st.offset)
		st.notePeak()
		st.lr, st.cBuf, st.cU = lr, cBuf, cU
		if st.diff != nil {
			clear(st.diff)
			st.diff = nil
		} else {
			st.idle++
		}
		if st.idle >= lgpIdleSteps && negligible(lr, st, p.Value.Data) {
			delete(o.lgps, i)
		}
	}
}

// notePeak records the largest |offset| so far.
func (st *lgp) notePeak() {
	for _, v := range st.offset {
		st.peak = max(st.peak, abs32(v))
	}
}

// negligible reports whether st's offset and coming moves are down to rounding.
func negligible(lr float32, st *lgp, w []float32) bool {
	scale := st.peak
	for _, v := range w {
		scale = max(scale, abs32(v))
	}
	var dmax float32
	for _, v := range st.offset {
		dmax = max(dmax, abs32(v))
	}
	for _, v := range st.buf {
		dmax = max(dmax, abs32(lr*v))
	}
	return dmax <= lgpNegligible*scale
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

// State returns the momentum buffers by parameter name, for checkpoints, and the LGP
// differences under "lgp:<name>.offset", "lgp:<name>.buf" and "lgp:<name>.coef" (the last
// step's lr and coefficients, the idle count and the peak |offset|).
func (o *SGD) State() map[string][]float32 {
	st := map[string][]float32{}
	for i, p := range o.params {
		if o.bufs[i] != nil {
			st[p.Name] = append([]float32(nil), o.bufs[i]...)
		}
	}
	for i, l := range o.lgps {
		pre := lgpKey + o.params[i].Name
		st[pre+".offset"] = append([]float32(nil), l.offset...)
		if l.buf != nil {
			st[pre+".buf"] = append([]float32(nil), l.buf...)
		}
		st[pre+".coef"] = []float32{l.lr, l.cBuf, l.cU, float32(l.idle), l.peak}
	}
	return st
}

// lgpKey prefixes the LGP entries of State (parameter names have no colon).
const lgpKey = "lgp:"

// LoadState restores momentum buffers and LGP differences saved by State; a buffer whose size
// does not match its parameter is an error naming it.
func (o *SGD) LoadState(st map[string][]float32) error {
	for i, p := range o.params {
		b, ok := st[p.Name]
		if !ok {
			o.bufs[i] = nil
			continue
		}
		if len(b) != p.Len() {
			return fmt.Errorf("optim.SGD.LoadState: %s has %d elements, state has %d", p.Name, p.Len(), len(b))
		}
		o.bufs[i] = append([]float32(nil), b...)
	}
	o.lgps = nil
	for i, p := range o.params {
		pre := lgpKey + p.Name
		off, ok := st[pre+".offset"]
		if !ok {
			continue
		}
		coef, buf := st[pre+".coef"], st[pre+".buf"]
		if len(off) != p.Len() || len(coef) != 5 || (buf != nil && len(buf) != p.Len()) {
			return fmt.Errorf("optim.SGD.LoadState: LGP state of %s does not fit its %d elements", p.Name, p.Len())
		}
		l := o.lgpState(i)
		l.offset = append(l.offset[:0], off...)
		if buf != nil {
			l.buf = append([]float32(nil), buf...)
		}
		l.lr, l.cBuf, l.cU, l.idle, l.peak = coef[0], coef[1], coef[2], int(coef[3]), coef[4]
	}
	return nil
}
