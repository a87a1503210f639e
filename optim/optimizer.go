package optim

// Optimizer is what a training loop, a schedule and a checkpoint need of an optimizer;
// SGD and Adam (AdamW) satisfy it.
type Optimizer interface {
	// Step applies one update from the parameters' current gradients.
	Step()
	// ZeroGrad clears the parameters' gradients.
	ZeroGrad()
	// LR returns the current learning rate.
	LR() float64
	// SetLR changes the learning rate (a Schedule's value, set before each Step).
	SetLR(lr float64)
	// State returns a copy of the optimizer's buffers by key, for checkpoints.
	State() map[string][]float32
	// LoadState restores buffers saved by State; the optimizer then continues exactly
	// where the saved one stopped.
	LoadState(map[string][]float32) error
}

var (
	_ Optimizer = (*SGD)(nil)
	_ Optimizer = (*Adam)(nil)
)
