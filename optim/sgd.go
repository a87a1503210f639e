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
// added to the gradient before momentum); the tests replay PyTorch goldens.
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
	return &SGD{cfg: cfg, params: params, bufs: make([][]float32, len(params))}, nil
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
}

// State returns the momentum buffers by parameter name, for checkpoints.
func (o *SGD) State() map[string][]float32 {
	st := map[string][]float32{}
	for i, p := range o.params {
		if o.bufs[i] != nil {
			st[p.Name] = append([]float32(nil), o.bufs[i]...)
		}
	}
	return st
}

// LoadState restores momentum buffers saved by State; a buffer whose size does not
// match its parameter is an error naming it.
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
	return nil
}
