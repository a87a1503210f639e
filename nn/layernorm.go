package nn

import (
	"fmt"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// LayerNorm normalises over the last dimension, as PyTorch's nn.LayerNorm(Dim, eps):
// y = (x − mean)/sqrt(var + Eps)·weight + bias with the biased variance of each row of
// Dim elements. Weight starts at 1 and bias at 0; they are named weight and bias, so a
// BERT checkpoint's LayerNorm.weight / LayerNorm.bias load unchanged.
type LayerNorm struct {
	Dim    int
	Eps    float64
	Weight *Param
	Bias   *Param
}

var _ ParamOwner = (*LayerNorm)(nil)

// DefaultLayerNormEps is PyTorch's default eps for nn.LayerNorm. BERT uses 1e-12.
const DefaultLayerNormEps = 1e-5

// NewLayerNorm returns a LayerNorm over a last dimension of size dim with the given eps
// (DefaultLayerNormEps is PyTorch's default, BERT uses 1e-12).
func NewLayerNorm(dim int, eps float64) *LayerNorm {
	l := &LayerNorm{Dim: dim, Eps: eps, Weight: NewParam("weight", dim), Bias: NewParam("bias", dim)}
	kernels.Fill(l.Weight.Value.Data, 1)
	return l
}

// OwnParams returns weight and bias.
func (l *LayerNorm) OwnParams() []*Param { return []*Param{l.Weight, l.Bias} }

// Forward normalises each row of the last dimension of x (any rank ≥ 1).
func (l *LayerNorm) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail(s, nil)
	}
	if len(s) == 0 || s[len(s)-1] != l.Dim {
		return t.failf(s, "nn.LayerNorm(%d): input shape %v, want last dimension %d", l.Dim, s, l.Dim)
	}
	if !(l.Eps >= 0) {
		return t.fail(s, fmt.Errorf("nn.LayerNorm(%d): eps %v is negative", l.Dim, l.Eps))
	}
	rows := x.Value.Len() / l.Dim
	w, b := t.Param(l.Weight), t.Param(l.Bias)
	y := t.newVar(t.tensor(s), false)
	mean, rstd := t.buf(rows), t.buf(rows)
	kernels.LayerNormForward(y.Value.Data, x.Value.Data, w.Value.Data, b.Value.Data, mean, rstd, rows, l.Dim, l.Eps)
	t.record(y, func(dy []float32) {
		var dx []float32
		fresh := false
		if x.needsGrad {
			dx, fresh = x.gradOverwrite()
		}
		kernels.LayerNormBackward(dx, dy, x.Value.Data, w.Value.Data, mean, rstd, rows, l.Dim, !fresh, w.grad(), b.grad())
	}, x, w, b)
	return y
}

// String describes the layer for Summary.
func (l *LayerNorm) String() string { return fmt.Sprintf("LayerNorm(%d, eps=%g)", l.Dim, l.Eps) }
