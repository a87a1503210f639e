package models

import (
	"fmt"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

// NewTokenStep fills in the benchmarks' shapes, runs a step of each kind of token model
// and rejects what it cannot build.
func TestNewTokenStep(t *testing.T) {
	for _, tc := range []struct {
		name              string
		cfg               TokenStepConfig
		batch, seq, vocab int
		wantType          string
	}{
		{"lstm-ptb-small", TokenStepConfig{Batch: 3, Seq: 4}, 3, 4, 10000, "*models.LSTMLM"},
		{"LSTM-IMDB", TokenStepConfig{Batch: 2, Seq: 6, Vocab: 50}, 2, 6, 50, "*models.LSTMClassifier"},
		{"bert-tiny", TokenStepConfig{Batch: 2, Seq: 16, Vocab: 100}, 2, 16, 100, "*models.BertForPreTraining"},
	} {
		s, err := NewTokenStep(tc.name, tc.cfg, nn.NewRand(0), nn.NewRand(1))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if s.Batch != tc.batch || s.Seq != tc.seq || s.Vocab != tc.vocab || s.Tokens() != tc.batch*tc.seq || s.Name != strings.ToLower(tc.name) ||
			fmt.Sprintf("%T", s.Model) != tc.wantType {
			t.Errorf("%s: %+v", tc.name, s)
		}
		tape := nn.NewTape()
		for i := range 2 { // the LSTM LM's second step starts from the first one's state
			tape.Reset()
			if err := tape.Backward(s.Loss(tape)); err != nil {
				t.Fatalf("%s step %d: %v", tc.name, i, err)
			}
		}
	}

	// The defaults, checked where building the model is cheap.
	for name, want := range map[string][3]int{"lstm-ptb-small": {20, 35, 10000}, "lstm-imdb": {32, 500, 50001}, "bert-tiny": {16, 128, 8000}} {
		s, err := NewTokenStep(name, TokenStepConfig{}, nn.NewRand(0), nn.NewRand(1))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := [3]int{s.Batch, s.Seq, s.Vocab}; got != want {
			t.Errorf("%s defaults: batch, seq, vocab %v, want %v", name, got, want)
		}
	}

	for _, tc := range []struct {
		name string
		cfg  TokenStepConfig
		want string
	}{
		{"resnet20", TokenStepConfig{}, "resnet20 is an image classifier"},
		{"nosuch", TokenStepConfig{}, `unknown model "nosuch"`},
		{"lstm-ptb", TokenStepConfig{Batch: -1}, "batch -1"},
		{"bert-base", TokenStepConfig{Seq: 513}, "seq 513: above the model's 512 positions"},
		{"bert-mini", TokenStepConfig{Seq: 3}, "seq 3: want at least 4"},
		{"bert-tiny", TokenStepConfig{Vocab: 5}, "vocab 5: want more than 5"},
		{"lstm-imdb", TokenStepConfig{Vocab: 1}, "vocab 1: want at least 2"},
	} {
		if _, err := NewTokenStep(tc.name, tc.cfg, nn.NewRand(0), nn.NewRand(1)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %+v: error %v, want %q", tc.name, tc.cfg, err, tc.want)
		}
	}
}
