package nn

import "github.com/spargo-dl/spargo/internal/kernels"

// GELU applies the Gaussian error linear unit in its exact form, x·Φ(x) =
// x/2·(1 + erf(x/√2)) — PyTorch's nn.GELU() default (approximate="none") and BERT's
// "gelu" activation.
type GELU struct{}

// Forward applies GELU elementwise.
func (GELU) Forward(x *Var) *Var { return Gelu(x) }

// Gelu applies the exact GELU elementwise to x of any shape.
func Gelu(x *Var) *Var {
	t := x.tape
	if x.broken {
		return t.fail(x.Value.Shape, nil)
	}
	y := t.newVar(t.tensor(x.Value.Shape), false)
	if !t.GradEnabled() {
		kernels.GeluForward(y.Value.Data, x.Value.Data)
		return y
	}
	// Φ(x) kept for the backward pass: one exponential per element there instead of two.
	cdf := t.buf(len(x.Value.Data))
	kernels.GeluForwardCDF(y.Value.Data, cdf, x.Value.Data)
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		kernels.GeluBackwardCDF(dx, x.Value.Data, cdf, dy, !fresh)
	}, x)
	return y
}
