package nn

import (
	"math"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// Softmax returns the softmax of x over its last dimension (PyTorch's
// torch.softmax(x, dim=-1)), for x of any rank ≥ 1.
func Softmax(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail(s, nil)
	}
	if len(s) == 0 || s[len(s)-1] == 0 {
		return t.failf(s, "nn.Softmax: input shape %v has no last dimension to normalise over", s)
	}
	k := s[len(s)-1]
	rows := x.Value.Len() / k
	y := t.newVar(t.tensor(s), false)
	kernels.SoftmaxRows(y.Value.Data, x.Value.Data, nil, rows, k, 0)
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		kernels.SoftmaxRowsBackward(dx, y.Value.Data, dy, rows, k, !fresh)
	}, x)
	return y
}

// Tanh applies the hyperbolic tangent elementwise (BERT's pooler activation).
func Tanh(x *Var) *Var {
	t := x.tape
	if x.broken {
		return t.fail(x.Value.Shape, nil)
	}
	y := t.newVar(t.tensor(x.Value.Shape), false)
	for i, v := range x.Value.Data {
		y.Value.Data[i] = float32(math.Tanh(float64(v)))
	}
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		for i, v := range y.Value.Data {
			g := dy[i] * (1 - v*v)
			if fresh {
				dx[i] = g
			} else {
				dx[i] += g
			}
		}
	}, x)
	return y
}

// SelectRows returns the given rows of a 2-D x ([R, D] → [len(rows), D]); a row may be
// taken more than once. BERT's pooler uses it to pick the [CLS] position of each
// sequence.
func SelectRows(x *Var, rows []int) *Var {
	t := x.tape
	s := x.Value.Shape
	out := []int{len(rows), 1}
	if len(s) == 2 {
		out[1] = s[1]
	}
	if x.broken {
		return t.fail(out, nil)
	}
	if len(s) != 2 {
		return t.failf(out, "nn.SelectRows: input shape %v, want [rows cols]", s)
	}
	d := s[1]
	for i, r := range rows {
		if r < 0 || r >= s[0] {
			return t.failf(out, "nn.SelectRows: index %d at position %d is outside [0, %d) for input shape %v", r, i, s[0], s)
		}
	}
	y := t.newVar(t.tensor(out), false)
	for i, r := range rows {
		copy(y.Value.Data[i*d:(i+1)*d], x.Value.Data[r*d:(r+1)*d])
	}
	saved := append([]int(nil), rows...)
	t.record(y, func(dy []float32) {
		dx := x.grad()
		for i, r := range saved {
			kernels.Axpy(1, dy[i*d:(i+1)*d], dx[r*d:(r+1)*d])
		}
	}, x)
	return y
}
