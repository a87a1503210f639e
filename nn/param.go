package nn

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Param is a learnable tensor with a stable dotted name ("features.3.weight") and a
// gradient buffer of the same shape. Gradients accumulate into Grad across backward
// passes until ZeroGrad, as in PyTorch.
type Param struct {
	// Name is the dotted path from the root module; set by Parameters.
	Name  string
	Value *Tensor
	Grad  *Tensor

	local string // name inside the owning layer ("weight")
}

// NewParam returns a parameter with the given local name and a zero value and gradient.
func NewParam(local string, shape ...int) *Param {
	return &Param{Name: local, local: local, Value: NewTensor(shape...), Grad: NewTensor(shape...)}
}

// Len returns the number of elements.
func (p *Param) Len() int { return len(p.Value.Data) }

// Buffer is non-learnable module state that travels with the model (BatchNorm's running
// statistics): DDP broadcasts it at start-up and checkpoints save it.
type Buffer struct {
	Name  string
	Value *Tensor
	local string
}

// NewBuffer returns a zero buffer with a local name.
func NewBuffer(local string, shape ...int) *Buffer {
	return &Buffer{Name: local, local: local, Value: NewTensor(shape...)}
}

// Module is anything with a forward computation on the tape.
type Module interface {
	Forward(x *Var) *Var
}

// ParamOwner is implemented by layers that own parameters directly.
// OwnParams returns them in declaration order.
type ParamOwner interface{ OwnParams() []*Param }

// BufferOwner is implemented by layers that own buffers directly.
type BufferOwner interface{ OwnBuffers() []*Buffer }

// Container is implemented by modules made of named sub-modules.
type Container interface{ Children() []Child }

// Child is a named sub-module.
type Child struct {
	Name   string
	Module Module
}

// TrainingSetter is implemented by layers whose behaviour differs between training and
// evaluation (BatchNorm, Dropout).
type TrainingSetter interface{ SetTraining(training bool) }

// RandOwner is implemented by layers that draw random numbers while training (Dropout):
// RandSource returns the layer's own generator, whose state (MarshalBinary /
// UnmarshalBinary) checkpoints save and restore under the layer's dotted path, so that a
// resumed run draws the same masks as an uninterrupted one.
type RandOwner interface{ RandSource() *rand.PCG }

// RandSources returns the generators of m's RandOwner layers by dotted path (a layer
// reachable twice once, under its first path).
func RandSources(m Module) map[string]*rand.PCG {
	srcs := map[string]*rand.PCG{}
	seen := map[*rand.PCG]bool{}
	Walk(m, func(path string, mod Module) {
		if o, ok := mod.(RandOwner); ok {
			if s := o.RandSource(); s != nil && !seen[s] {
				seen[s] = true
				srcs[path] = s
			}
		}
	})
	return srcs
}

// Walk visits m and its sub-modules depth-first in declaration order with their dotted
// path ("" for the root).
func Walk(m Module, fn func(path string, m Module)) {
	walk("", m, fn)
}

func walk(path string, m Module, fn func(string, Module)) {
	fn(path, m)
	if c, ok := m.(Container); ok {
		for _, ch := range c.Children() {
			walk(join(path, ch.Name), ch.Module, fn)
		}
	}
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// Parameters returns every parameter of m in declaration order and sets each one's
// Name to its dotted path. A module reachable twice (weight sharing) contributes its
// parameters once, under the first path, as in PyTorch. It is idempotent; models call
// it once at construction so names are stable before DDP or an optimizer sees them.
func Parameters(m Module) []*Param {
	var ps []*Param
	seen := map[*Param]bool{}
	Walk(m, func(path string, mod Module) {
		if o, ok := mod.(ParamOwner); ok {
			for _, p := range o.OwnParams() {
				if seen[p] {
					continue
				}
				seen[p] = true
				p.Name = join(path, p.local)
				ps = append(ps, p)
			}
		}
	})
	return ps
}

// Buffers returns every buffer of m in declaration order with dotted names.
func Buffers(m Module) []*Buffer {
	var bs []*Buffer
	seen := map[*Buffer]bool{}
	Walk(m, func(path string, mod Module) {
		if o, ok := mod.(BufferOwner); ok {
			for _, b := range o.OwnBuffers() {
				if seen[b] {
					continue
				}
				seen[b] = true
				b.Name = join(path, b.local)
				bs = append(bs, b)
			}
		}
	})
	return bs
}

// SetTraining switches every layer of m to training (true) or evaluation mode.
func SetTraining(m Module, training bool) {
	Walk(m, func(_ string, mod Module) {
		if s, ok := mod.(TrainingSetter); ok {
			s.SetTraining(training)
		}
	})
}

// ZeroGrad sets the gradients of ps to zero.
func ZeroGrad(ps []*Param) {
	for _, p := range ps {
		clear(p.Grad.Data)
	}
}

// NumParams returns the total number of learnable elements.
func NumParams(ps []*Param) int {
	n := 0
	for _, p := range ps {
		n += p.Len()
	}
	return n
}

// Summary returns one line per parameter: name, shape and element count.
func Summary(m Module) string {
	var b strings.Builder
	ps := Parameters(m)
	for _, p := range ps {
		fmt.Fprintf(&b, "%-40s %-18v %d\n", p.Name, p.Value.Shape, p.Len())
	}
	fmt.Fprintf(&b, "total %d parameters in %d tensors\n", NumParams(ps), len(ps))
	return b.String()
}
