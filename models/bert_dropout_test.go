package models

import (
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

// Finite differences through a whole tiny BertForPreTraining loss with dropout on (0.3 on
// the hidden states and the attention probabilities): every forward restores the dropout
// layers' generators (nn.RandSources, as checkpoints do), so each draws the same masks.
func TestBertGradientsWithDropout(t *testing.T) {
	cfg := tinyTestConfig()
	cfg.HiddenDropout, cfg.AttentionDropout, cfg.InitRange = 0.3, 0.3, 0.3
	m, _ := NewBertForPreTraining(cfg, nn.NewRand(2))
	rng := nn.NewRand(3)
	ps := nn.Parameters(m)
	for _, p := range ps {
		if strings.Contains(p.Name, "LayerNorm") || strings.HasSuffix(p.Name, "bias") {
			nn.Normal(p.Value.Data, 0.3, rng)
		}
	}
	srcs := nn.RandSources(m)
	if len(srcs) != 1+3*cfg.Layers { // embeddings; per layer attention probabilities, two hidden dropouts
		t.Fatalf("%d dropout generators, want %d", len(srcs), 1+3*cfg.Layers)
	}
	saved := map[string][]byte{}
	for k, s := range srcs {
		b, err := s.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		saved[k] = b
	}
	restore := func() {
		for k, s := range srcs {
			if err := s.UnmarshalBinary(saved[k]); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := []int32{2, 5, 7, 0, 3, 3, 1, 19, 4, 4, 0, 0}
	types := []int32{0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0}
	mask := []int32{1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0}
	mlmLabels := []int{-100, 4, -100, -100, 9, -100, 0, -100, 3, -100, -100, -100}
	nspLabels := []int{0, 1, 1}
	lossOf := func(tape *nn.Tape) *nn.Var {
		restore()
		mlm, nsp := m.ForwardPreTraining(tape, ids, types, mask, 3, 4)
		return m.Loss(mlm, nsp, mlmLabels, nspLabels)
	}
	nn.ZeroGrad(ps)
	tape := nn.NewTape()
	if err := tape.Backward(lossOf(tape)); err != nil {
		t.Fatal(err)
	}
	f := func() float64 { return float64(lossOf(nn.NewTape()).Item()) }
	const eps = 1e-2
	for _, p := range ps {
		step := max(1, p.Len()/6)
		for i := 0; i < p.Len(); i += step {
			o := p.Value.Data[i]
			p.Value.Data[i] = o + eps
			lp := f()
			p.Value.Data[i] = o - eps
			lm := f()
			p.Value.Data[i] = o
			num := (lp - lm) / (2 * eps)
			if got := float64(p.Grad.Data[i]); math.Abs(num-got) > 2e-2*(1e-2+math.Abs(num)) {
				t.Errorf("d loss/d %s[%d] = %.6g, finite difference %.6g", p.Name, i, got, num)
			}
		}
	}
}
