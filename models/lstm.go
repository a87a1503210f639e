package models

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/spargo-dl/spargo/nn"
)

// LSTMLMConfig describes an LSTM language model: PyTorch's word_language_model RNNModel
// with an LSTM and an untied decoder, which is also the model of SparDL's LSTM-PTB (from Ok-Topk's code,
// LSTM/models/lstm.py).
type LSTMLMConfig struct {
	Vocab  int // words (the decoder's outputs)
	Embed  int // embedding size (the LSTM's input)
	Hidden int // LSTM hidden size
	Layers int
	// Dropout is applied to the embeddings, between the LSTM layers and to the LSTM's
	// output, in training mode.
	Dropout float64
	// InitRange: the embedding and decoder weights start in U(−InitRange, InitRange), the
	// decoder bias at 0 (word_language_model's and Ok-Topk's init_weights); the LSTM keeps
	// PyTorch's default. 0 means 0.1.
	InitRange float64
}

// lstmLMPresets are the language models of the catalogue ("lstm-" + key).
var lstmLMPresets = map[string]LSTMLMConfig{
	// SparDL's PTB model: embedding 1500, 2-layer LSTM 1500, keep probability 0.35.
	"ptb": {Vocab: 10000, Embed: 1500, Hidden: 1500, Layers: 2, Dropout: 0.65},
	// Zaremba et al. (2014), "Recurrent neural network regularization": small and medium.
	"ptb-small":  {Vocab: 10000, Embed: 200, Hidden: 200, Layers: 2, Dropout: 0},
	"ptb-medium": {Vocab: 10000, Embed: 650, Hidden: 650, Layers: 2, Dropout: 0.5},
}

// LSTMLMPreset returns the configuration of a preset: "ptb" (SparDL's 1500-unit model,
// 66,034,000 parameters), "ptb-small" or "ptb-medium" (Zaremba et al.'s 200 and 650
// units). The "lstm-" prefix of the catalogue names is accepted too.
func LSTMLMPreset(name string) (LSTMLMConfig, error) {
	key := strings.TrimPrefix(strings.ToLower(name), "lstm-")
	cfg, ok := lstmLMPresets[key]
	if !ok {
		return LSTMLMConfig{}, fmt.Errorf("models: unknown LSTM language model %q (have %s)", name, strings.Join(LSTMLMPresets(), ", "))
	}
	return cfg, nil
}

// LSTMLMPresets returns the preset names, sorted.
func LSTMLMPresets() []string {
	var ns []string
	for k := range lstmLMPresets {
		ns = append(ns, k)
	}
	sort.Strings(ns)
	return ns
}

// LSTMLM is the language model: ids [T, N] → embedding → dropout → LSTM → dropout →
// decoder, logits [T·N, Vocab] (row t·N + j is the prediction after word t of column j).
// Parameter names are word_language_model's (encoder.weight, rnn.weight_ih_l0, …,
// decoder.weight, decoder.bias), so its state dicts load by name.
type LSTMLM struct {
	Config  LSTMLMConfig
	Encoder *nn.Embedding
	RNN     *nn.LSTM
	Decoder *nn.Linear
	Drop    *nn.Dropout

	// State, when not nil, is the hidden state Forward starts from and leaves the final
	// state in: truncated back-propagation through time over consecutive bptt windows
	// (no gradient crosses a window). Nil: every Forward starts from zeros. See NewState.
	State *nn.LSTMState
}

var (
	_ nn.Container      = (*LSTMLM)(nil)
	_ nn.TrainingSetter = (*LSTMLM)(nil)
)

// NewLSTMLM builds the model initialised from rng.
func NewLSTMLM(cfg LSTMLMConfig, rng *rand.Rand) (*LSTMLM, error) {
	if cfg.Vocab < 1 || cfg.Embed < 1 || cfg.Hidden < 1 || cfg.Layers < 1 {
		return nil, fmt.Errorf("models: LSTM language model %+v: vocabulary, embedding, hidden size and layers must be at least 1", cfg)
	}
	if cfg.InitRange == 0 {
		cfg.InitRange = 0.1
	}
	rnn, err := nn.NewLSTM(cfg.Embed, cfg.Hidden, cfg.Layers, cfg.Dropout, rng)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	m := &LSTMLM{Config: cfg, Encoder: nn.NewEmbedding(cfg.Vocab, cfg.Embed, rng), RNN: rnn,
		Decoder: nn.NewLinear(cfg.Hidden, cfg.Vocab, true, rng), Drop: nn.NewDropout(cfg.Dropout, rng)}
	nn.Uniform(m.Encoder.Weight.Value.Data, cfg.InitRange, rng)
	nn.Uniform(m.Decoder.Weight.Value.Data, cfg.InitRange, rng)
	clear(m.Decoder.Bias.Value.Data)
	nn.Parameters(m) // dotted names from the start
	return m, nil
}

// Children returns encoder, rnn, decoder and drop.
func (m *LSTMLM) Children() []nn.Child {
	return []nn.Child{{Name: "encoder", Module: m.Encoder}, {Name: "rnn", Module: m.RNN}, {Name: "decoder", Module: m.Decoder}, {Name: "drop", Module: m.Drop}}
}

// SetTraining is a no-op: nn.SetTraining reaches the dropout layers through Children.
func (m *LSTMLM) SetTraining(bool) {}

// NewState returns a zero hidden state for batches of n columns; set it as m.State to
// carry the state over windows, and Zero it at the start of each pass over the data.
func (m *LSTMLM) NewState(n int) *nn.LSTMState { return m.RNN.NewLSTMState(n) }

// Forward takes the ids as float32 values [T, N] (exact integers) and returns the logits
// [T·N, Vocab], starting from m.State (zeros when nil) and leaving the final state there.
func (m *LSTMLM) Forward(x *nn.Var) *nn.Var {
	t := x.Tape()
	s := x.Shape()
	if len(s) != 2 {
		return t.Fail(fmt.Errorf("models.LSTMLM: input shape %v, want [T N] word ids", s), 1, m.Config.Vocab)
	}
	emb := m.Drop.Forward(m.Encoder.Forward(x))
	out := m.Drop.Forward(m.RNN.Run(emb, m.State))
	return m.Decoder.Forward(nn.Reshape(out, s[0]*s[1], m.Config.Hidden))
}

// LSTMClassifierConfig describes a sequence classifier: embedding, LSTM, and a Linear layer
// on the last layer's output at each sequence's last real token.
type LSTMClassifierConfig struct {
	Vocab, Embed, Hidden, Layers, Classes int
}

// LSTMIMDB is SparDL's LSTM-IMDB classifier: vocabulary 50,001 (50,000 words and the
// padding id 0), embedding 50, one LSTM layer of 100, Linear 100 → 2: 2,561,052
// parameters.
var LSTMIMDB = LSTMClassifierConfig{Vocab: 50001, Embed: 50, Hidden: 100, Layers: 1, Classes: 2}

// LSTMClassifier is embedding → LSTM → Linear on the output at the last real token (what
// PyTorch's packed sequences give as h_n). Names: embedding.weight, rnn.*, fc.*. Layers
// keep PyTorch's default initialisation.
type LSTMClassifier struct {
	Config    LSTMClassifierConfig
	Embedding *nn.Embedding
	RNN       *nn.LSTM
	FC        *nn.Linear

	// Lengths, when not nil, are the real lengths of the N sequences of the next Forward's
	// input (the rest is padding after them; 0 counts as 1): each is classified from its
	// output at its last real token. Nil: from the last step.
	Lengths []int
}

var _ nn.Container = (*LSTMClassifier)(nil)

// NewLSTMClassifier builds the classifier initialised from rng.
func NewLSTMClassifier(cfg LSTMClassifierConfig, rng *rand.Rand) (*LSTMClassifier, error) {
	if cfg.Vocab < 1 || cfg.Embed < 1 || cfg.Hidden < 1 || cfg.Layers < 1 || cfg.Classes < 2 {
		return nil, fmt.Errorf("models: LSTM classifier %+v: sizes must be at least 1 and classes at least 2", cfg)
	}
	rnn, err := nn.NewLSTM(cfg.Embed, cfg.Hidden, cfg.Layers, 0, rng)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	m := &LSTMClassifier{Config: cfg, Embedding: nn.NewEmbedding(cfg.Vocab, cfg.Embed, rng), RNN: rnn, FC: nn.NewLinear(cfg.Hidden, cfg.Classes, true, rng)}
	nn.Parameters(m)
	return m, nil
}

// Children returns embedding, rnn and fc.
func (m *LSTMClassifier) Children() []nn.Child {
	return []nn.Child{{Name: "embedding", Module: m.Embedding}, {Name: "rnn", Module: m.RNN}, {Name: "fc", Module: m.FC}}
}

// Forward takes ids as float32 values [T, N] (sequence first) and returns the logits
// [N, Classes] from each sequence's output at its last real token (m.Lengths) or, with
// Lengths nil, at the last step.
func (m *LSTMClassifier) Forward(x *nn.Var) *nn.Var {
	t := x.Tape()
	s := x.Shape()
	if len(s) != 2 {
		return t.Fail(fmt.Errorf("models.LSTMClassifier: input shape %v, want [T N] word ids", s), 1, m.Config.Classes)
	}
	steps, n := s[0], s[1]
	if m.Lengths != nil && len(m.Lengths) != n {
		return t.Fail(fmt.Errorf("models.LSTMClassifier: %d lengths for %d sequences", len(m.Lengths), n), n, m.Config.Classes)
	}
	out := m.RNN.Forward(m.Embedding.Forward(x))
	rows := make([]int, n)
	for i := range rows {
		last := steps
		if m.Lengths != nil {
			last = min(max(m.Lengths[i], 1), steps)
		}
		rows[i] = (last-1)*n + i
	}
	return m.FC.Forward(nn.SelectRows(nn.Reshape(out, steps*n, m.Config.Hidden), rows))
}

// SequenceFirst lays n sequences of ids stored [n, maxLen] row-major (datasets.TextBatch's
// X) out as the [maxLen, n] float32 input Forward takes, in a tensor from t's pool.
func SequenceFirst(t *nn.Tape, ids []int32, n, maxLen int) (*nn.Tensor, error) {
	if len(ids) != n*maxLen {
		return nil, fmt.Errorf("models.SequenceFirst: %d ids for %d sequences of %d", len(ids), n, maxLen)
	}
	x := t.Alloc(maxLen, n)
	for i := 0; i < n; i++ {
		for s := 0; s < maxLen; s++ {
			x.Data[s*n+i] = float32(ids[i*maxLen+s])
		}
	}
	return x, nil
}

// lstmEntries are the LSTM language models ("lstm-ptb", "lstm-ptb-small",
// "lstm-ptb-medium") and the LSTM-IMDB classifier ("lstm-imdb").
func lstmEntries() []Entry {
	summaries := map[string]string{
		"ptb":        "SparDL's PTB language model: embedding 1500, 2-layer LSTM 1500, dropout 0.65, untied decoder, vocabulary 10,000",
		"ptb-small":  "Zaremba et al.'s small PTB language model: 2-layer LSTM 200, no dropout, vocabulary 10,000",
		"ptb-medium": "Zaremba et al.'s medium PTB language model: 2-layer LSTM 650, dropout 0.5, vocabulary 10,000",
	}
	var es []Entry
	for _, p := range LSTMLMPresets() {
		es = append(es, Entry{Name: "lstm-" + p, Family: "lstm", Summary: summaries[p],
			Build: func(rng *rand.Rand) (nn.Module, error) {
				cfg, err := LSTMLMPreset(p)
				if err != nil {
					return nil, err
				}
				return NewLSTMLM(cfg, rng)
			}})
	}
	es = append(es, Entry{Name: "lstm-imdb", Family: "lstm",
		Summary: "SparDL's LSTM-IMDB classifier: embedding 50 (vocabulary 50,001), 1-layer LSTM 100, Linear 2",
		Build:   func(rng *rand.Rand) (nn.Module, error) { return NewLSTMClassifier(LSTMIMDB, rng) }})
	return es
}
