package nn

import (
	"fmt"
	"math/rand/v2"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// ReLU applies max(x, 0) elementwise.
type ReLU struct{}

// Forward applies the rectifier.
func (ReLU) Forward(x *Var) *Var { return Relu(x) }

// Relu applies max(x, 0) elementwise.
func Relu(x *Var) *Var {
	t := x.tape
	if x.broken {
		return t.fail(x.Value.Shape, nil)
	}
	y := t.newVar(t.tensor(x.Value.Shape), false)
	kernels.ReluForward(y.Value.Data, x.Value.Data)
	t.record(y, func(dy []float32) {
		if dx, fresh := x.gradOverwrite(); fresh {
			kernels.ReluBackwardSet(dx, y.Value.Data, dy)
		} else {
			kernels.ReluBackward(dx, y.Value.Data, dy)
		}
	}, x)
	return y
}

// Flatten reshapes [N, d1, d2, …] to [N, d1·d2·…].
type Flatten struct{}

// Forward flattens all but the first dimension.
func (Flatten) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if len(s) == 0 {
		return t.failf([]int{1, 1}, "nn.Flatten: scalar input")
	}
	return Reshape(x, s[0], numel(s[1:]))
}

// Reshape returns x with a new shape of the same size. The value is shared, not copied.
func Reshape(x *Var, shape ...int) *Var {
	t := x.tape
	if x.broken {
		return t.fail(shape, nil)
	}
	if numel(shape) != x.Value.Len() {
		return t.failf(shape, "nn.Reshape: %v to %v changes the element count", x.Value.Shape, shape)
	}
	y := t.newVar(&Tensor{Data: x.Value.Data, Shape: append([]int(nil), shape...)}, false)
	t.record(y, func(dy []float32) {
		if dx, fresh := x.gradOverwrite(); fresh {
			kernels.Copy(dx, dy)
		} else {
			kernels.AxpyParallel(1, dy, dx)
		}
	}, x)
	return y
}

// Add returns a + b for values of equal shape.
func Add(a, b *Var) *Var {
	t := a.tape
	if a.broken || b.broken {
		return t.fail(a.Value.Shape, nil)
	}
	if !sameShape(a.Value.Shape, b.Value.Shape) {
		return t.failf(a.Value.Shape, "nn.Add: shapes %v and %v differ", a.Value.Shape, b.Value.Shape)
	}
	y := t.newVar(t.tensor(a.Value.Shape), false)
	kernels.Add(y.Value.Data, a.Value.Data, b.Value.Data)
	t.record(y, func(dy []float32) {
		for _, v := range [2]*Var{a, b} {
			if !v.needsGrad {
				continue
			}
			if dx, fresh := v.gradOverwrite(); fresh {
				kernels.Copy(dx, dy)
			} else {
				kernels.AxpyParallel(1, dy, dx)
			}
		}
	}, a, b)
	return y
}

// Dropout zeroes each element with probability P during training and scales the rest
// by 1/(1-P); in evaluation it is the identity. Masks come from the layer's own seeded
// generator, so runs are reproducible.
type Dropout struct {
	P        float64
	src      *rand.PCG
	rng      *rand.Rand
	training bool
}

var (
	_ TrainingSetter = (*Dropout)(nil)
	_ RandOwner      = (*Dropout)(nil)
)

// NewDropout returns a dropout layer in training mode with its own generator.
func NewDropout(p float64, rng *rand.Rand) *Dropout {
	src := rand.NewPCG(rng.Uint64(), rng.Uint64())
	return &Dropout{P: p, src: src, rng: rand.New(src), training: true}
}

// RandSource returns the generator of the layer's masks (RandOwner), for checkpoints.
func (d *Dropout) RandSource() *rand.PCG { return d.src }

// SetTraining enables (true) or disables dropout.
func (d *Dropout) SetTraining(training bool) { d.training = training }

// Forward applies the dropout mask.
func (d *Dropout) Forward(x *Var) *Var {
	t := x.tape
	if x.broken {
		return t.fail(x.Value.Shape, nil)
	}
	if d.P < 0 || d.P >= 1 {
		return t.fail(x.Value.Shape, fmt.Errorf("nn.Dropout: probability %v outside [0, 1)", d.P))
	}
	if !d.training || d.P == 0 {
		return x
	}
	y := t.newVar(t.tensor(x.Value.Shape), false)
	mask := t.buf(x.Value.Len())
	scale := float32(1 / (1 - d.P))
	for i, v := range x.Value.Data {
		if d.rng.Float64() < d.P {
			mask[i] = 0
		} else {
			mask[i] = scale
		}
		y.Value.Data[i] = v * mask[i]
	}
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		if fresh {
			kernels.Mul(dx, dy, mask)
			return
		}
		for i, g := range dy {
			dx[i] += g * mask[i]
		}
	}, x)
	return y
}
