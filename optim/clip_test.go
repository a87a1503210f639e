package optim

import (
	"math"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

func TestClipGradNorm(t *testing.T) {
	a, b := nn.NewParam("a", 2), nn.NewParam("b", 1)
	copy(a.Grad.Data, []float32{3, 0})
	b.Grad.Data[0] = 4 // total norm 5
	if n := ClipGradNorm([]*nn.Param{a, b}, 10); n != 5 || a.Grad.Data[0] != 3 {
		t.Fatalf("norm %v below the bound: gradients must stay, got %v", n, a.Grad.Data)
	}
	if n := ClipGradNorm([]*nn.Param{a, b}, 1); n != 5 {
		t.Fatalf("norm %v, want 5", n)
	}
	// PyTorch: coef = 1/(5 + 1e-6).
	want := 3 / (5 + 1e-6)
	if math.Abs(float64(a.Grad.Data[0])-want) > 1e-7 || math.Abs(float64(b.Grad.Data[0])-4/(5+1e-6)) > 1e-7 {
		t.Fatalf("clipped to %v %v", a.Grad.Data, b.Grad.Data)
	}
	b.Grad.Data[0] = float32(math.Inf(1))
	if n := ClipGradNorm([]*nn.Param{a, b}, 1); !math.IsInf(n, 1) || a.Grad.Data[0] != float32(want) {
		t.Fatalf("non-finite norm %v changed the gradients", n)
	}
}

func TestPTBSchedule(t *testing.T) {
	// Zaremba et al.'s small model: lr 1, ×0.5 per epoch after the first 4.
	s, err := ParseSchedule("ptb:after=4,decay=0.5", 1, 13, 100)
	if err != nil {
		t.Fatal(err)
	}
	for epoch, want := range []float64{1, 1, 1, 1, 0.5, 0.25, 0.125} {
		if got := s.LR(epoch, 37, 100); got != want {
			t.Errorf("epoch %d: lr %v, want %v", epoch, got, want)
		}
	}
	if _, err := ParseSchedule("ptb:decay=1.5", 1, 13, 100); err == nil {
		t.Error("decay 1.5 accepted")
	}
}
