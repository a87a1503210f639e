package optim

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

// WarmupStep is the seeds' recipe: the rate rises linearly from WarmupFrom (typically
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
