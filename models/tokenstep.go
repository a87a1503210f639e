package models

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/spargo-dl/spargo/nn"
)

// TokenStep is one training step of a catalogue model that reads tokens (an LSTM language
// model, the LSTM-IMDB classifier, a BERT preset) on a fixed batch of random tokens: the
// model, the batch's shape and the loss. It is the step this package's benchmarks
// (BenchmarkLSTMLMStep, BenchmarkBertTinyMLMStep) and `spargo bench train` time:
//
//	s, err := models.NewTokenStep("bert-tiny", models.TokenStepConfig{}, nn.NewRand(0), nn.NewRand(9))
//	params := nn.Parameters(s.Model)
//	tape := nn.NewTape()
//	// each step:
//	tape.Reset()
//	nn.ZeroGrad(params)
//	err = tape.Backward(s.Loss(tape))
//
// The batches (per family, with the defaults NewTokenStep fills in):
//
//   - LSTM language models ("lstm-ptb-small", "lstm-ptb-medium", "lstm-ptb"): a bptt
//     window of Seq × Batch random word ids (35 × 20 columns, examples/lstm's per-worker
//     batch; the preset's 10,000 words) with random next-word targets, the cross-entropy
//     over all Seq·Batch positions; the model's State carries the hidden state from one
//     step to the next, as in training (no gradient crosses a window).
//   - "lstm-imdb": Batch random reviews of Seq ids (32 × 500, examples/lstm -task imdb's
//     defaults; ids 1 … Vocab−1, 0 being the padding id, no padding), random labels, the
//     cross-entropy of the classifier's logits at the last token.
//   - BERT ("bert-tiny" … "bert-base"): examples/bert's pre-training step on PTB: a
//     vocabulary of 8,000 (the preset's 30,522 with Vocab set so), Batch sequences of Seq
//     ids (16 × 128) drawn from 5 … Vocab−1, sentence B from the middle, the last Seq/8
//     positions of every odd sequence padded (16 of 128), every 7th position from position
//     3 on masked unless it is padding (18 of 128) with a random label, the MLM head only at
//     those positions (ForwardMaskedLM), the NSP head with labels 0, 1, 0, …, and Loss.
//     Dropout stays on.
type TokenStep struct {
	Name  string    // the catalogue name
	Model nn.Module // *LSTMLM, *LSTMClassifier or *BertForPreTraining
	// Batch is the number of sequences per step (an LSTM language model's columns), Seq the
	// tokens of each (its bptt window), padding included; Vocab the model's vocabulary.
	Batch, Seq, Vocab int
	// Loss records the forward pass on t and returns the scalar loss; call it once per
	// step after t.Reset().
	Loss func(t *nn.Tape) *nn.Var
}

// Tokens is the number of token positions of one step: Batch × Seq.
func (s *TokenStep) Tokens() int { return s.Batch * s.Seq }

// TokenStepConfig sets the shape of a TokenStep's batch; 0 picks the model's default
// (see TokenStep).
type TokenStepConfig struct {
	Batch int // sequences per step: 20 LSTM LM columns, 32 IMDB reviews, 16 BERT sequences
	Seq   int // tokens per sequence: a bptt window of 35, 500 for IMDB, 128 for BERT
	Vocab int // 10,000 for the LSTM LMs (the presets'), 50,001 for IMDB, 8,000 for BERT
}

// bertMaskFrom and bertMaskEvery place BERT's masked positions: p ≥ 3 with p % 7 == 3.
const bertMaskFrom, bertMaskEvery = 3, 7

// NewTokenStep builds the catalogue model called name with its weights from weights and
// a batch of random tokens from data, laid out as TokenStep describes. It reports an image
// classifier, a negative field of cfg, a BERT sequence longer than the model's positions
// or too short to hold a masked position, and a vocabulary too small for the batch.
func NewTokenStep(name string, cfg TokenStepConfig, weights, data *rand.Rand) (*TokenStep, error) {
	e, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	if e.Input.Size != 0 {
		return nil, fmt.Errorf("models: %s is an image classifier (family %s), not a model that reads tokens", e.Name, e.Family)
	}
	if cfg.Batch < 0 || cfg.Seq < 0 || cfg.Vocab < 0 {
		return nil, fmt.Errorf("models: %s: batch %d, seq %d, vocab %d: want 0 (the default) or more", e.Name, cfg.Batch, cfg.Seq, cfg.Vocab)
	}
	switch {
	case e.Family == "bert":
		return newBertTokenStep(e.Name, cfg, weights, data)
	case e.Name == "lstm-imdb":
		return newIMDBTokenStep(e.Name, cfg, weights, data)
	case e.Family == "lstm":
		return newLSTMLMTokenStep(e.Name, cfg, weights, data)
	}
	return nil, fmt.Errorf("models: %s (family %s) has no token step", e.Name, e.Family)
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func newLSTMLMTokenStep(name string, cfg TokenStepConfig, weights, data *rand.Rand) (*TokenStep, error) {
	mc, err := LSTMLMPreset(name)
	if err != nil {
		return nil, err
	}
	cols, steps := orDefault(cfg.Batch, 20), orDefault(cfg.Seq, 35)
	mc.Vocab = orDefault(cfg.Vocab, mc.Vocab)
	m, err := NewLSTMLM(mc, weights)
	if err != nil {
		return nil, err
	}
	x := nn.NewTensor(steps, cols)
	targets := make([]int, steps*cols)
	for i := range x.Data {
		x.Data[i] = float32(data.IntN(mc.Vocab))
		targets[i] = data.IntN(mc.Vocab)
	}
	m.State = m.NewState(cols)
	return &TokenStep{Name: name, Model: m, Batch: cols, Seq: steps, Vocab: mc.Vocab,
		Loss: func(t *nn.Tape) *nn.Var { return nn.CrossEntropy(m.Forward(t.Const(x)), targets) }}, nil
}

func newIMDBTokenStep(name string, cfg TokenStepConfig, weights, data *rand.Rand) (*TokenStep, error) {
	mc := LSTMIMDB
	n, steps := orDefault(cfg.Batch, 32), orDefault(cfg.Seq, 500)
	mc.Vocab = orDefault(cfg.Vocab, mc.Vocab)
	if mc.Vocab < 2 {
		return nil, fmt.Errorf("models: %s: vocab %d: want at least 2 (the padding id 0 and one word)", name, mc.Vocab)
	}
	m, err := NewLSTMClassifier(mc, weights)
	if err != nil {
		return nil, err
	}
	x := nn.NewTensor(steps, n)
	for i := range x.Data {
		x.Data[i] = float32(1 + data.IntN(mc.Vocab-1))
	}
	labels := make([]int, n)
	for i := range labels {
		labels[i] = data.IntN(mc.Classes)
	}
	return &TokenStep{Name: name, Model: m, Batch: n, Seq: steps, Vocab: mc.Vocab,
		Loss: func(t *nn.Tape) *nn.Var { return nn.CrossEntropy(m.Forward(t.Const(x)), labels) }}, nil
}

func newBertTokenStep(name string, cfg TokenStepConfig, weights, data *rand.Rand) (*TokenStep, error) {
	mc, err := BertPreset(strings.TrimPrefix(name, "bert-"))
	if err != nil {
		return nil, err
	}
	n, seq := orDefault(cfg.Batch, 16), orDefault(cfg.Seq, 128)
	mc.VocabSize = orDefault(cfg.Vocab, 8000)
	const firstID = 5 // ids 0 … 4 are [PAD] and the special tokens
	if mc.VocabSize <= firstID {
		return nil, fmt.Errorf("models: %s: vocab %d: want more than %d (ids 0 … %d are the padding and special tokens)", name, mc.VocabSize, firstID, firstID-1)
	}
	if seq > mc.MaxPositions {
		return nil, fmt.Errorf("models: %s: seq %d: above the model's %d positions", name, seq, mc.MaxPositions)
	}
	if seq <= bertMaskFrom {
		return nil, fmt.Errorf("models: %s: seq %d: want at least %d (a sequence's first masked position is %d)", name, seq, bertMaskFrom+1, bertMaskFrom)
	}
	m, err := NewBertForPreTraining(mc, weights)
	if err != nil {
		return nil, err
	}
	total, pad := n*seq, seq/8
	ids, types, mask := make([]int32, total), make([]int32, total), make([]int32, total)
	var positions, labels []int
	for i := range total {
		s, p := i/seq, i%seq
		ids[i], mask[i] = int32(firstID+data.IntN(mc.VocabSize-firstID)), 1
		if p >= seq/2 {
			types[i] = 1
		}
		if s%2 == 1 && p >= seq-pad {
			ids[i], mask[i], types[i] = 0, 0, 0
		}
		if mask[i] == 1 && p >= bertMaskFrom && p%bertMaskEvery == bertMaskFrom {
			positions = append(positions, i)
			labels = append(labels, data.IntN(mc.VocabSize))
		}
	}
	nsp := make([]int, n)
	for i := range nsp {
		nsp[i] = i % 2
	}
	return &TokenStep{Name: name, Model: m, Batch: n, Seq: seq, Vocab: mc.VocabSize,
		Loss: func(t *nn.Tape) *nn.Var {
			mlm, nspLogits := m.ForwardMaskedLM(t, ids, types, mask, n, seq, positions)
			return m.Loss(mlm, nspLogits, labels, nsp)
		}}, nil
}
