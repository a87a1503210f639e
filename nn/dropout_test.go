package nn

import (
	"math"
	"testing"
)

// Dropout's mask is random, so it is checked by its properties: the kept fraction, the
// 1/(1-p) scale, a gradient equal to the mask, identity in evaluation, and the same
// masks for the same seed.
func TestDropout(t *testing.T) {
	const p, n = 0.3, 20000
	x := NewTensor(n)
	for i := range x.Data {
		x.Data[i] = 1
	}
	d := NewDropout(p, NewRand(1))
	tape := NewTape()
	xv := tape.Input(x)
	y := d.Forward(xv)
	kept := 0
	for _, v := range y.Value.Data {
		switch {
		case v == 0:
		case math.Abs(float64(v)-1/(1-p)) < 1e-6:
			kept++
		default:
			t.Fatalf("output %g is neither 0 nor 1/(1-p)", v)
		}
	}
	if frac := float64(kept) / n; math.Abs(frac-(1-p)) > 0.02 {
		t.Fatalf("kept fraction %.3f, want %.2f", frac, 1-p)
	}
	if err := tape.BackwardFrom(y, x.Data); err != nil {
		t.Fatal(err)
	}
	for i, g := range xv.Grad.Data {
		if g != y.Value.Data[i] {
			t.Fatalf("grad[%d] = %g, mask %g", i, g, y.Value.Data[i])
		}
	}
	d2 := NewDropout(p, NewRand(1))
	y2 := d2.Forward(NewTape().Const(x))
	for i := range y2.Value.Data {
		if y2.Value.Data[i] != y.Value.Data[i] {
			t.Fatal("same seed gave a different mask")
		}
	}
	d.SetTraining(false)
	if ev := d.Forward(xv); ev != xv {
		t.Fatal("evaluation mode is not the identity")
	}
	bad := NewDropout(1, NewRand(1))
	tp := NewTape()
	bad.Forward(tp.Const(x))
	if tp.Err() == nil {
		t.Fatal("p=1 accepted")
	}
}
