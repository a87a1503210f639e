package models

import (
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
	checkBertGradients(t, m, restore)
}
