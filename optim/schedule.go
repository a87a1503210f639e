package optim

import "math"

// Schedule gives the learning rate for a step.
type Schedule interface {
	// LR returns the rate for step `step` (0-based) of epoch `epoch` (0-based), where an
	// epoch has stepsPerEpoch steps.
	LR(epoch, step, stepsPerEpoch int) float64
}

// Constant is a fixed learning rate.
type Constant float64

// LR returns the constant.
func (c Constant) LR(int, int, int) float64 { return float64(c) }

// WarmupStep is Goyal et al.'s warm-up and step decay: the rate rises linearly from WarmupFrom (typically
// Base/P for P workers, Goyal et al.) to Base over the first WarmupEpochs epochs, per
// step; then it is multiplied by Gamma at each epoch in Milestones (e.g. ×0.1 at 150
// and 250).
type WarmupStep struct {
	Base         float64
	WarmupFrom   float64
	WarmupEpochs int
	Milestones   []int
	Gamma        float64
}

// LR returns the scheduled rate.
func (s WarmupStep) LR(epoch, step, stepsPerEpoch int) float64 {
	if epoch < s.WarmupEpochs && stepsPerEpoch > 0 {
		total := float64(s.WarmupEpochs * stepsPerEpoch)
		done := float64(epoch*stepsPerEpoch + step)
		return s.WarmupFrom + (s.Base-s.WarmupFrom)*done/total
	}
	lr := s.Base
	for _, m := range s.Milestones {
		if epoch >= m {
			lr *= s.Gamma
		}
	}
	return lr
}

// StepLR multiplies Base by Gamma every StepSize epochs, as torch.optim.lr_scheduler.StepLR
// stepped once per epoch: Base·Gamma^⌊epoch/StepSize⌋ (StepSize < 1: Base throughout).
type StepLR struct {
	Base     float64
	StepSize int
	Gamma    float64
}

// LR returns the scheduled rate.
func (s StepLR) LR(epoch, _, _ int) float64 {
	lr := s.Base
	if s.StepSize < 1 {
		return lr
	}
	for range epoch / s.StepSize {
		lr *= s.Gamma // chained, as PyTorch's scheduler updates the rate
	}
	return lr
}

// MultiStep multiplies Base by Gamma at every epoch in Milestones, as
// torch.optim.lr_scheduler.MultiStepLR stepped once per epoch (a milestone listed twice
// applies Gamma twice).
type MultiStep struct {
	Base       float64
	Milestones []int
	Gamma      float64
}

// LR returns the scheduled rate.
func (s MultiStep) LR(epoch, _, _ int) float64 {
	return WarmupStep{Base: s.Base, Milestones: s.Milestones, Gamma: s.Gamma}.LR(epoch, 0, 0)
}

// Cosine is cosine annealing with an optional linear warm-up, counted in steps
// t = epoch·stepsPerEpoch + step: for t < WarmupSteps the rate is Base·t/WarmupSteps;
// then it falls along half a cosine from Base to Min at t = TotalSteps and stays at Min:
//
//	Min + (Base−Min)·(1 + cos(π·(t−WarmupSteps)/(TotalSteps−WarmupSteps)))/2
//
// With Min 0 this is transformers' get_cosine_schedule_with_warmup; without warm-up and
// wrapped in EpochWise with TotalSteps = epochs it is torch.optim.lr_scheduler's
// CosineAnnealingLR(T_max=epochs, eta_min=Min) stepped once per epoch.
type Cosine struct {
	Base, Min               float64
	WarmupSteps, TotalSteps int
}

// LR returns the scheduled rate.
func (s Cosine) LR(epoch, step, stepsPerEpoch int) float64 {
	t := epoch*stepsPerEpoch + step
	if t < s.WarmupSteps {
		return s.Base * float64(t) / float64(s.WarmupSteps)
	}
	if t >= s.TotalSteps {
		return s.Min
	}
	p := float64(t-s.WarmupSteps) / float64(s.TotalSteps-s.WarmupSteps)
	return s.Min + (s.Base-s.Min)*0.5*(1+math.Cos(math.Pi*p))
}

// LinearWarmupDecay is BERT's schedule (transformers' get_linear_schedule_with_warmup),
// counted in steps t = epoch·stepsPerEpoch + step: Base·t/WarmupSteps while
// t < WarmupSteps, then Base·(TotalSteps−t)/(TotalSteps−WarmupSteps), reaching 0 at
// TotalSteps and staying there.
type LinearWarmupDecay struct {
	Base                    float64
	WarmupSteps, TotalSteps int
}

// LR returns the scheduled rate.
func (s LinearWarmupDecay) LR(epoch, step, stepsPerEpoch int) float64 {
	t := epoch*stepsPerEpoch + step
	if t < s.WarmupSteps {
		return s.Base * float64(t) / float64(s.WarmupSteps)
	}
	if t >= s.TotalSteps {
		return 0
	}
	return s.Base * float64(s.TotalSteps-t) / float64(s.TotalSteps-s.WarmupSteps)
}

// PTBDecay is Zaremba et al.'s PTB schedule (TensorFlow's ptb_word_lm): Base for the first
// After epochs, then multiplied by Decay once per epoch: Base·Decay^max(epoch+1−After, 0)
// for the 0-based epoch. Their small model uses After 4, Decay 0.5; medium 6 and 0.8
// (1/1.25); large 14 and 1/1.15.
type PTBDecay struct {
	Base, Decay float64
	After       int
}

// LR returns the scheduled rate.
func (s PTBDecay) LR(epoch, _, _ int) float64 {
	return s.Base * math.Pow(s.Decay, float64(max(epoch+1-s.After, 0)))
}

// EpochWise holds a schedule's rate for a whole epoch: it evaluates S at the epoch's first
// step as if every epoch were one step (S.LR(epoch, 0, 1)), so a step-counted schedule such as Cosine counts
// epochs instead, as PyTorch schedulers stepped once per epoch do.
type EpochWise struct{ S Schedule }

// LR returns S's rate for the epoch.
func (e EpochWise) LR(epoch, _, _ int) float64 { return e.S.LR(epoch, 0, 1) }

// Apply sets opt's learning rate to s's rate for the step and returns it: call it before
// each Step.
func Apply(opt Optimizer, s Schedule, epoch, step, stepsPerEpoch int) float64 {
	lr := s.LR(epoch, step, stepsPerEpoch)
	opt.SetLR(lr)
	return lr
}
