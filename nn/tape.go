package nn

import (
	"errors"
	"fmt"
)

// Var is a tensor recorded on a Tape: a leaf (input or parameter) or the output of an op.
// Its Value and Grad buffers belong to the tape's pool and stay valid until the tape's
// next Reset.
type Var struct {
	Value *Tensor
	// Grad is the gradient of the backward seed with respect to this value; nil until
	// some gradient reaches it. For a parameter leaf it is the parameter's own Grad.
	Grad *Tensor

	tape      *Tape
	param     *Param
	needsGrad bool
	broken    bool // produced after an error; ops pass it through silently
}

// Tape returns the tape the variable is recorded on.
func (v *Var) Tape() *Tape { return v.tape }

// Shape returns the value's shape.
func (v *Var) Shape() []int { return v.Value.Shape }

// NeedsGrad reports whether backward computes a gradient for v.
func (v *Var) NeedsGrad() bool { return v.needsGrad }

// Item returns the single element of a one-element value (a loss).
func (v *Var) Item() float32 {
	if len(v.Value.Data) != 1 {
		return float32NaN()
	}
	return v.Value.Data[0]
}

// grad returns v's gradient buffer, allocating a zeroed one from the tape's pool on
// first use.
func (v *Var) grad() []float32 {
	if v.Grad == nil {
		v.Grad = v.tape.tensor(v.Value.Shape)
		clear(v.Grad.Data)
	}
	return v.Grad.Data
}

// gradOverwrite returns v's gradient buffer for a backward pass that writes every element of it.
// fresh is true when the buffer was just allocated (its contents are garbage and the caller must
// overwrite, not accumulate); otherwise the caller must accumulate into it.
func (v *Var) gradOverwrite() (g []float32, fresh bool) {
	if v.Grad == nil {
		v.Grad = v.tape.tensor(v.Value.Shape)
		return v.Grad.Data, true
	}
	return v.Grad.Data, false
}

// node is one recorded op: a closure that propagates out.Grad to its inputs, and the
// parameter leaves it read (their pending use counts drop after it runs).
type node struct {
	out      *Var
	backward func(dy []float32)
	params   []*Param
}

// Tape records ops as a program runs forward (define-by-run) and replays them in
// reverse on Backward. It also pools every activation and gradient buffer: Reset
// returns them for reuse, so a training loop that calls Reset once per step reaches a
// steady state without allocating tensor memory.
//
// A tape is used by one goroutine at a time.
//
// Errors: an op given bad input (a wrong shape, a label out of range) records the
// first such error on the tape and returns a placeholder; every later op passes it
// through, and Backward and Err report it. No op panics on user input.
type Tape struct {
	nodes  []node
	pool   map[int][][]float32 // free buffers by length
	inUse  [][]float32
	ipool  map[int][][]int32
	iInUse [][]int32
	vars   []Var
	nvars  int
	uses   map[*Param]int
	order  []*Param // params in first-use order
	hooks  []*hookEntry
	nextID int
	noGrad bool
	done   bool
	err    error
	Stats  TapeStats
}

// TapeStats counts pool behaviour, for allocation tests and benchmarks.
type TapeStats struct {
	BufferAllocs int // buffers that had to be allocated (pool miss)
	BufferReuses int // buffers served from the pool
}

type hookEntry struct {
	id int
	fn func(*Param)
}

// HookHandle removes a hook registered with OnGradReady.
type HookHandle struct {
	t  *Tape
	id int
}

// Remove unregisters the hook. It is safe to call more than once.
func (h HookHandle) Remove() {
	if h.t == nil {
		return
	}
	hs := h.t.hooks[:0]
	for _, e := range h.t.hooks {
		if e.id != h.id {
			hs = append(hs, e)
		}
	}
	h.t.hooks = hs
}

// NewTape returns an empty tape.
func NewTape() *Tape {
	return &Tape{
		pool:  map[int][][]float32{},
		ipool: map[int][][]int32{},
		uses:  map[*Param]int{},
	}
}

// OnGradReady registers fn to be called during Backward, exactly once per parameter
// that the recorded forward used, as soon as that parameter's gradient is final: right
// after the last op that reads it has run its backward — also when the parameter was
// used several times. Hooks run on the goroutine that calls Backward, in registration
// order.
func (t *Tape) OnGradReady(fn func(p *Param)) HookHandle {
	t.nextID++
	t.hooks = append(t.hooks, &hookEntry{id: t.nextID, fn: fn})
	return HookHandle{t: t, id: t.nextID}
}

// SetGradEnabled turns recording on or off. With recording off (evaluation), ops
// compute values only and keep nothing for backward.
func (t *Tape) SetGradEnabled(on bool) { t.noGrad = !on }

// GradEnabled reports whether the tape records ops for backward (false during evaluation).
func (t *Tape) GradEnabled() bool { return !t.noGrad }

// Err returns the first error an op recorded since the last Reset.
func (t *Tape) Err() error { return t.err }

// UsedParams returns the parameters the recorded forward read, in first-use order.
func (t *Tape) UsedParams() []*Param { return t.order }

// Reset forgets the recorded ops, clears the error and returns every buffer to the
// pool. Values and gradients of Vars from before the Reset must not be used after it.
func (t *Tape) Reset() {
	for _, b := range t.inUse {
		t.pool[len(b)] = append(t.pool[len(b)], b)
	}
	t.inUse = t.inUse[:0]
	for _, b := range t.iInUse {
		t.ipool[len(b)] = append(t.ipool[len(b)], b)
	}
	t.iInUse = t.iInUse[:0]
	for i := range t.nodes {
		t.nodes[i] = node{}
	}
	t.nodes = t.nodes[:0]
	for i := 0; i < t.nvars; i++ {
		t.vars[i] = Var{}
	}
	t.nvars = 0
	clear(t.uses)
	t.order = t.order[:0]
	t.done = false
	t.err = nil
}

// buf returns a buffer of length n from the pool (contents undefined).
func (t *Tape) buf(n int) []float32 {
	free := t.pool[n]
	var b []float32
	if k := len(free); k > 0 {
		b = free[k-1]
		t.pool[n] = free[:k-1]
		t.Stats.BufferReuses++
	} else {
		b = make([]float32, n)
		t.Stats.BufferAllocs++
	}
	t.inUse = append(t.inUse, b)
	return b
}

// ibuf returns an int32 buffer of length n from the pool (contents undefined).
func (t *Tape) ibuf(n int) []int32 {
	free := t.ipool[n]
	var b []int32
	if k := len(free); k > 0 {
		b = free[k-1]
		t.ipool[n] = free[:k-1]
	} else {
		b = make([]int32, n)
		t.Stats.BufferAllocs++
	}
	t.iInUse = append(t.iInUse, b)
	return b
}

// tensor returns a pooled tensor of the given shape (contents undefined).
func (t *Tape) tensor(shape []int) *Tensor {
	return &Tensor{Data: t.buf(numel(shape)), Shape: append([]int(nil), shape...)}
}

func (t *Tape) newVar(value *Tensor, needsGrad bool) *Var {
	if t.nvars == len(t.vars) {
		// Grow by allocating a fresh block; earlier *Var pointers stay valid because
		// the old backing array is not reused until the next Reset.
		t.vars = make([]Var, 2*len(t.vars)+64)
		t.nvars = 0
	}
	v := &t.vars[t.nvars]
	t.nvars++
	*v = Var{Value: value, tape: t, needsGrad: needsGrad && !t.noGrad}
	return v
}

// Const records a tensor that needs no gradient (a batch of inputs). The tensor is
// not copied.
func (t *Tape) Const(x *Tensor) *Var { return t.newVar(x, false) }

// Input records a tensor whose gradient Backward computes (into the returned Var's Grad).
func (t *Tape) Input(x *Tensor) *Var { return t.newVar(x, true) }

// Param records a read of parameter p. Ops call it for every parameter they use; each
// call counts as one use for the grad-ready hooks.
func (t *Tape) Param(p *Param) *Var {
	v := t.newVar(p.Value, true)
	v.param = p
	if !t.noGrad {
		v.Grad = p.Grad
		if _, seen := t.uses[p]; !seen {
			t.order = append(t.order, p)
		}
		t.uses[p]++
	}
	return v
}

// record appends an op. out is its output; inputs are the Vars it read (parameter
// leaves among them are tracked for the grad-ready hooks).
func (t *Tape) record(out *Var, backward func(dy []float32), inputs ...*Var) {
	if t.noGrad {
		return
	}
	needs := false
	var params []*Param
	for _, in := range inputs {
		if in.needsGrad {
			needs = true
		}
		if in.param != nil {
			params = append(params, in.param)
		}
	}
	out.needsGrad = needs
	if !needs && params == nil {
		return
	}
	t.nodes = append(t.nodes, node{out: out, backward: backward, params: params})
}

// fail records err as the tape's first error and returns a placeholder Var of the given
// shape so the forward program can continue to the point where the caller checks.
func (t *Tape) fail(shape []int, err error) *Var {
	if t.err == nil {
		t.err = err
	}
	v := t.newVar(t.tensor(shape), false)
	clear(v.Value.Data)
	v.broken = true
	return v
}

// failf is fail with a formatted message.
func (t *Tape) failf(shape []int, format string, args ...any) *Var {
	return t.fail(shape, fmt.Errorf(format, args...))
}

// ErrNoGraph is returned by Backward on a tape that has already run backward since its
// last Reset, or whose recording was off.
var ErrNoGraph = errors.New("nn: tape has no graph to run backward on (already consumed, or recorded with gradients disabled); call Reset and run forward again")

// Backward seeds the gradient of the scalar loss with 1 and propagates it through the
// recorded ops in reverse, accumulating into the parameters' Grad and firing the
// grad-ready hooks. It returns the tape's recorded error, if any, without running, and
// stops at the first error a Custom op's backward returns.
func (t *Tape) Backward(loss *Var) error {
	if loss.Value.Len() != 1 {
		if t.err != nil {
			return t.err
		}
		return fmt.Errorf("nn: Backward needs a scalar loss, got shape %v (use BackwardFrom with an explicit gradient)", loss.Value.Shape)
	}
	return t.BackwardFrom(loss, []float32{1})
}

// BackwardFrom propagates an explicit gradient dy (shaped like v's value) from v, like
// PyTorch's v.backward(dy).
func (t *Tape) BackwardFrom(v *Var, dy []float32) error {
	if t.err != nil {
		return t.err
	}
	if v.tape != t {
		return errors.New("nn: Backward on a Var recorded on another tape")
	}
	if t.done || t.noGrad {
		return ErrNoGraph
	}
	if len(dy) != v.Value.Len() {
		return fmt.Errorf("nn: BackwardFrom: gradient has %d elements, value shape %v has %d", len(dy), v.Value.Shape, v.Value.Len())
	}
	t.done = true
	if v.needsGrad {
		if g, fresh := v.gradOverwrite(); fresh {
			copy(g, dy)
		} else {
			for i := range g {
				g[i] += dy[i]
			}
		}
	}
	for i := len(t.nodes) - 1; i >= 0; i-- {
		n := &t.nodes[i]
		if n.out.Grad != nil {
			n.backward(n.out.Grad.Data)
			if t.err != nil {
				return t.err // a Custom op's backward failed: the gradients are incomplete
			}
		}
		for _, p := range n.params {
			t.uses[p]--
			if t.uses[p] == 0 {
				for _, h := range t.hooks {
					h.fn(p)
				}
			}
		}
	}
	return nil
}
