package nn

import (
	"math"
	"math/rand/v2"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// Linear applies y = x·Wᵀ + b to x of shape [N, In]. Weight has shape [Out, In], as in
// PyTorch.
type Linear struct {
	In, Out int
	Weight  *Param
	Bias    *Param // nil without bias
}

var _ ParamOwner = (*Linear)(nil)

// NewLinear returns a Linear layer with PyTorch's default initialisation drawn from rng.
func NewLinear(in, out int, bias bool, rng *rand.Rand) *Linear {
	l := &Linear{In: in, Out: out, Weight: NewParam("weight", out, in)}
	KaimingUniformDefault(l.Weight.Value.Data, in, rng)
	if bias {
		l.Bias = NewParam("bias", out)
		Uniform(l.Bias.Value.Data, 1/math.Sqrt(float64(in)), rng)
	}
	return l
}

// OwnParams returns weight and bias.
func (l *Linear) OwnParams() []*Param {
	if l.Bias == nil {
		return []*Param{l.Weight}
	}
	return []*Param{l.Weight, l.Bias}
}

// Forward computes x·Wᵀ + b.
func (l *Linear) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail([]int{1, l.Out}, nil)
	}
	if len(s) != 2 || s[1] != l.In {
		return t.failf([]int{1, l.Out}, "nn.Linear(%d→%d): input shape %v, want [N %d]", l.In, l.Out, s, l.In)
	}
	n := s[0]
	w := t.Param(l.Weight)
	y := t.newVar(t.tensor([]int{n, l.Out}), false)
	kernels.Sgemm(false, true, n, l.Out, l.In, 1, x.Value.Data, l.In, w.Value.Data, l.In, 0, y.Value.Data, l.Out)
	inputs := []*Var{x, w}
	var b *Var
	if l.Bias != nil {
		b = t.Param(l.Bias)
		inputs = append(inputs, b)
		for i := 0; i < n; i++ {
			kernels.Axpy(1, b.Value.Data, y.Value.Data[i*l.Out:(i+1)*l.Out])
		}
	}
	t.record(y, func(dy []float32) {
		// dW += dyᵀ·x ; db += Σ_n dy ; dx += dy·W
		kernels.Sgemm(true, false, l.Out, l.In, n, 1, dy, l.Out, x.Value.Data, l.In, 1, w.grad(), l.In)
		if b != nil {
			db := b.grad()
			for i := 0; i < n; i++ {
				kernels.Axpy(1, dy[i*l.Out:(i+1)*l.Out], db)
			}
		}
		if x.needsGrad {
			kernels.Sgemm(false, false, n, l.In, l.Out, 1, dy, l.Out, w.Value.Data, l.In, 1, x.grad(), l.In)
		}
	}, inputs...)
	return y
}
