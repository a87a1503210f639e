package nn

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// scaleOp is y = w ⊙ x written as a Custom op, the way a bridge to another library writes one.
func scaleOp(t *Tape, x *Var, w *Param, fail error) *Var {
	wv := t.Param(w)
	y := t.Alloc(x.Shape()...)
	for i := range y.Data {
		y.Data[i] = w.Value.Data[i] * x.Value.Data[i]
	}
	return t.Custom(y, func(dy []float32) error {
		if fail != nil {
			return fail
		}
		dx, dw := make([]float32, len(dy)), make([]float32, len(dy))
		for i, g := range dy {
			dx[i] = g * w.Value.Data[i]
			dw[i] = g * x.Value.Data[i]
		}
		if x.NeedsGrad() {
			if err := x.AccumulateGrad(dx); err != nil {
				return err
			}
		}
		return wv.AccumulateGrad(dw)
	}, x, wv)
}

// A Custom op between built-in ones: gradients reach its input and parameter (added to what
// is there), and its parameter's grad-ready hook fires once, after its backward and before
// the backward of the op that produced its input.
func TestCustomOpGradientsAndHooks(t *testing.T) {
	tape := NewTape()
	w := NewParam("w", 3)
	copy(w.Value.Data, []float32{2, -1, 0.5})
	w.Grad.Data[0] = 10 // gradients accumulate, as for built-in ops
	lin := NewLinear(3, 3, false, NewRand(1))
	var order []string
	tape.OnGradReady(func(p *Param) { order = append(order, p.local) })

	x, _ := FromSlice([]float32{1, 2, 3}, 1, 3)
	h := lin.Forward(tape.Input(x)) // [1 3]
	y := scaleOp(tape, h, w, nil)
	if err := tape.BackwardFrom(y, []float32{1, 1, 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if want := float32(1)*h.Value.Data[i] + []float32{10, 0, 0}[i]; w.Grad.Data[i] != want {
			t.Errorf("dw[%d] = %v, want %v", i, w.Grad.Data[i], want)
		}
		if want := w.Value.Data[i]; h.Grad.Data[i] != want {
			t.Errorf("dh[%d] = %v, want %v", i, h.Grad.Data[i], want)
		}
	}
	if !slices.Equal(order, []string{"w", "weight"}) {
		t.Fatalf("grad-ready order %v, want [w weight]", order)
	}
}

// An error from a Custom op's backward stops Backward: it is returned and kept by Err, the
// ops recorded before it do not run, and no hook fires for their parameters.
func TestCustomOpBackwardError(t *testing.T) {
	tape := NewTape()
	w := NewParam("w", 2)
	lin := NewLinear(2, 2, false, NewRand(1))
	fired := 0
	tape.OnGradReady(func(*Param) { fired++ })
	x, _ := FromSlice([]float32{1, 2}, 1, 2)
	boom := errors.New("boom")
	y := scaleOp(tape, lin.Forward(tape.Const(x)), w, boom)
	if err := tape.BackwardFrom(y, []float32{1, 1}); !errors.Is(err, boom) {
		t.Fatalf("Backward: %v, want boom", err)
	}
	if !errors.Is(tape.Err(), boom) || fired != 0 {
		t.Fatalf("Err %v, %d hooks fired", tape.Err(), fired)
	}
	for _, g := range lin.Weight.Grad.Data {
		if g != 0 {
			t.Fatal("the Linear's backward ran after the failure")
		}
	}
	tape.Reset()
	if tape.Err() != nil {
		t.Fatal("Reset kept the error")
	}
}

func TestCustomOpBadUse(t *testing.T) {
	tape := NewTape()
	x := tape.Const(NewTensor(2))
	if v := tape.Custom(nil, func([]float32) error { return nil }, x); v == nil || tape.Err() == nil || !strings.Contains(tape.Err().Error(), "nil value") {
		t.Fatalf("nil value: %v", tape.Err())
	}
	first := tape.Err()
	// Later ops pass the first error on.
	if tape.Custom(NewTensor(2), func([]float32) error { return nil }, x); tape.Err() != first {
		t.Fatalf("error replaced by %v", tape.Err())
	}
	tape.Reset()
	bad := &Tensor{Data: make([]float32, 3), Shape: []int{2}}
	tape.Custom(bad, func([]float32) error { return nil })
	if tape.Err() == nil || !strings.Contains(tape.Err().Error(), "needs 2 elements") {
		t.Fatalf("bad value: %v", tape.Err())
	}
	tape.Reset()
	other := NewTape().Const(NewTensor(2))
	tape.Custom(NewTensor(2), func([]float32) error { return nil }, other)
	if tape.Err() == nil || !strings.Contains(tape.Err().Error(), "another tape") {
		t.Fatalf("foreign input: %v", tape.Err())
	}
	tape.Reset()
	v := tape.Input(NewTensor(2))
	if err := v.AccumulateGrad(make([]float32, 3)); err == nil {
		t.Fatal("AccumulateGrad took a gradient of the wrong length")
	}
	if f := tape.Fail(errors.New("user error"), 4, 5); tape.Err() == nil || !slices.Equal(f.Shape(), []int{4, 5}) {
		t.Fatalf("Fail: %v %v", tape.Err(), f.Shape())
	}
}

// With gradients off a Custom op records nothing: its backward never runs.
func TestCustomOpNoGrad(t *testing.T) {
	tape := NewTape()
	tape.SetGradEnabled(false)
	w := NewParam("w", 2)
	y := scaleOp(tape, tape.Input(NewTensor(2)), w, errors.New("must not run"))
	if y.NeedsGrad() || len(tape.nodes) != 0 {
		t.Fatalf("recorded with gradients off: needsGrad %v, %d nodes", y.NeedsGrad(), len(tape.nodes))
	}
}
