package nn

import (
	"fmt"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// This file is the tape's extension point for ops computed outside this package: a bridge
// to another framework (nn/gorgonia runs a gorgonia expression graph as one op) or a
// hand-written kernel. Such an op takes part in backward, in the grad-ready hooks and so in
// DDP's buckets exactly like a built-in one.

// Custom records an op whose value was computed outside nn and returns its output Var.
//
// value is the op's output; it is not copied and must stay valid and unchanged until the
// tape's next Reset (Alloc returns memory with exactly that lifetime). inputs are every Var
// the op read, parameter reads among them: read a parameter with Tape.Param and pass the
// returned Var, so that the parameter counts one use and its grad-ready hooks fire right
// after this op's backward if it was the last one to read it.
//
// backward receives the gradient of the output (shaped like value; read it, do not keep
// it) and must add each input's gradient with AccumulateGrad, skipping inputs whose
// NeedsGrad is false. It runs on the goroutine that called Backward. An error it returns
// stops Backward, which returns it (hooks of this op's parameters do not fire), and Err
// reports it until Reset.
//
// When an earlier op failed (the tape's Err is set) Custom passes that error on and
// returns a placeholder; a nil value is recorded as an error. With gradients disabled
// (evaluation) nothing is recorded and backward is never called.
func (t *Tape) Custom(value *Tensor, backward func(dy []float32) error, inputs ...*Var) *Var {
	shape := []int{}
	if value != nil {
		shape = value.Shape
	}
	for _, in := range inputs {
		if in == nil {
			return t.fail(shape, fmt.Errorf("nn.Tape.Custom: nil input Var"))
		}
		if in.broken {
			return t.fail(shape, nil)
		}
		if in.tape != t {
			return t.fail(shape, fmt.Errorf("nn.Tape.Custom: an input Var was recorded on another tape"))
		}
	}
	if t.err != nil {
		return t.fail(shape, nil)
	}
	if value == nil {
		return t.fail(shape, fmt.Errorf("nn.Tape.Custom: nil value"))
	}
	if numel(value.Shape) != len(value.Data) {
		return t.fail(shape, fmt.Errorf("nn.Tape.Custom: value shape %v needs %d elements, has %d", value.Shape, numel(value.Shape), len(value.Data)))
	}
	if backward == nil {
		return t.fail(shape, fmt.Errorf("nn.Tape.Custom: nil backward function"))
	}
	y := t.newVar(value, false)
	t.record(y, func(dy []float32) {
		if err := backward(dy); err != nil && t.err == nil {
			t.err = err
		}
	}, inputs...)
	return y
}

// Alloc returns a tensor of the given shape from the tape's pool, for the value of a Custom
// op. Its contents are undefined; it stays valid until the tape's next Reset, which takes it
// back for reuse.
func (t *Tape) Alloc(shape ...int) *Tensor { return t.tensor(shape) }

// Fail records err as the tape's first error and returns a zero placeholder of the given
// shape, so the forward program can go on to the point where its caller checks Err — the
// pattern every built-in op follows for bad input. A nil err only passes an earlier error on.
func (t *Tape) Fail(err error, shape ...int) *Var { return t.fail(shape, err) }

// AccumulateGrad adds g (shaped like v's value) to v's gradient, allocating a zero gradient
// on first use; for a parameter leaf it adds to the parameter's Grad. Custom ops call it from
// their backward function.
func (v *Var) AccumulateGrad(g []float32) error {
	if len(g) != v.Value.Len() {
		return fmt.Errorf("nn.Var.AccumulateGrad: gradient has %d elements, value shape %v has %d", len(g), v.Value.Shape, v.Value.Len())
	}
	if dx, fresh := v.gradOverwrite(); fresh {
		kernels.Copy(dx, g)
	} else {
		kernels.AxpyParallel(1, g, dx)
	}
	return nil
}
