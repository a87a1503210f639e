package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/spargo-dl/spargo/nn"
)

// BertConfig describes a BERT encoder and its pre-training heads, with the fields of
// Hugging Face's BertConfig.
type BertConfig struct {
	VocabSize        int     // vocab_size (30,522 for the uncased English WordPiece vocabulary)
	Hidden           int     // hidden_size
	Layers           int     // num_hidden_layers
	Heads            int     // num_attention_heads; must divide Hidden
	Intermediate     int     // intermediate_size of the feed-forward block
	MaxPositions     int     // max_position_embeddings
	TypeVocabSize    int     // type_vocab_size (2: sentence A and B)
	HiddenDropout    float64 // hidden_dropout_prob
	AttentionDropout float64 // attention_probs_dropout_prob
	LayerNormEps     float64 // layer_norm_eps (1e-12)
	InitRange        float64 // initializer_range: std of the normal initialisation (0.02)
	PadTokenID       int     // pad_token_id: its word-embedding row starts at 0 and gets no gradient from the lookup
	// NoPoolerNSP leaves out the pooler and the next-sentence head (an MLM-only model,
	// as RoBERTa-style pre-training uses).
	NoPoolerNSP bool
}

// bertSizes are Google's BERT miniatures and BERT-base: layers, hidden size.
var bertSizes = map[string][2]int{
	"tiny":   {2, 128},
	"mini":   {4, 256},
	"small":  {4, 512},
	"medium": {8, 512},
	"base":   {12, 768},
}

// BertPresets lists the names BertPreset accepts.
func BertPresets() []string { return []string{"tiny", "mini", "small", "medium", "base"} }

// BertPreset returns the configuration of a named model: "tiny" (2 layers × 128
// hidden), "mini" (4 × 256), "small" (4 × 512), "medium" (8 × 512) — Google's BERT
// miniatures — or "base" (12 × 768), each with 64-wide heads, a 4·hidden feed-forward
// block, the 30,522-word vocabulary, 512 positions, 2 token types, dropout 0.1,
// LayerNorm eps 1e-12 and initializer range 0.02.
func BertPreset(name string) (BertConfig, error) {
	sz, ok := bertSizes[name]
	if !ok {
		return BertConfig{}, fmt.Errorf("models: unknown BERT preset %q (have %v)", name, BertPresets())
	}
	return BertConfig{
		VocabSize: 30522, Hidden: sz[1], Layers: sz[0], Heads: sz[1] / 64, Intermediate: 4 * sz[1],
		MaxPositions: 512, TypeVocabSize: 2, HiddenDropout: 0.1, AttentionDropout: 0.1,
		LayerNormEps: 1e-12, InitRange: 0.02, PadTokenID: 0,
	}, nil
}

// Validate reports the first inconsistent field.
func (c BertConfig) Validate() error {
	switch {
	case c.VocabSize <= 0 || c.Hidden <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.Intermediate <= 0 || c.MaxPositions <= 0 || c.TypeVocabSize <= 0:
		return fmt.Errorf("models: BERT config %+v: sizes must be positive", c)
	case c.Hidden%c.Heads != 0:
		return fmt.Errorf("models: BERT config: %d heads do not divide hidden size %d", c.Heads, c.Hidden)
	case c.HiddenDropout < 0 || c.HiddenDropout >= 1 || c.AttentionDropout < 0 || c.AttentionDropout >= 1:
		return fmt.Errorf("models: BERT config: dropout %v / %v outside [0, 1)", c.HiddenDropout, c.AttentionDropout)
	case c.LayerNormEps < 0 || c.InitRange < 0:
		return fmt.Errorf("models: BERT config: negative LayerNorm eps %v or initializer range %v", c.LayerNormEps, c.InitRange)
	case c.PadTokenID >= c.VocabSize:
		return fmt.Errorf("models: BERT config: pad token id %d outside the vocabulary of %d", c.PadTokenID, c.VocabSize)
	}
	return nil
}

// BertForPreTraining is BERT with its masked-LM and next-sentence heads, laid out as
// Hugging Face's BertForPreTraining so that a state dict maps 1:1 onto nn.Parameters:
//
//	bert.embeddings.{word_embeddings,position_embeddings,token_type_embeddings}.weight
//	bert.embeddings.LayerNorm.{weight,bias}
//	bert.encoder.layer.N.attention.self.{query,key,value}.{weight,bias}
//	bert.encoder.layer.N.attention.output.{dense,LayerNorm}.{weight,bias}
//	bert.encoder.layer.N.intermediate.dense.{weight,bias}
//	bert.encoder.layer.N.output.{dense,LayerNorm}.{weight,bias}
//	bert.pooler.dense.{weight,bias}
//	cls.predictions.bias
//	cls.predictions.transform.{dense,LayerNorm}.{weight,bias}
//	cls.seq_relationship.{weight,bias}
//
// The MLM decoder is tied to the word embeddings: it is the same *nn.Param, listed once
// (as bert.embeddings.word_embeddings.weight; HF's cls.predictions.decoder.weight is the
// same tensor), so DDP reduces it once and its grad-ready hook fires after both uses.
// BERT-base has 110,106,428 parameters (109,514,298 with NoPoolerNSP).
type BertForPreTraining struct {
	Config BertConfig
	Bert   *BertModel
	Cls    *BertPreTrainingHeads

	positions []int32 // cached position ids 0..T-1 per sample
}

var _ nn.Container = (*BertForPreTraining)(nil)

// NewBertForPreTraining builds the model and initialises it as Hugging Face's
// BertPreTrainedModel: linear and embedding weights from N(0, InitRange²), the padding
// row and every bias 0, LayerNorm weight 1. It starts in training mode (dropout on).
func NewBertForPreTraining(cfg BertConfig, rng *rand.Rand) (*BertForPreTraining, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bert := newBertModel(cfg, rng)
	lm := &BertLMPredictionHead{
		Bias: nn.NewParam("bias", cfg.VocabSize),
		Transform: &BertPredictionHeadTransform{
			Dense:     bertLinear(cfg.Hidden, cfg.Hidden, cfg.InitRange, rng),
			LayerNorm: nn.NewLayerNorm(cfg.Hidden, cfg.LayerNormEps),
		},
	}
	lm.decoder = &nn.Linear{In: cfg.Hidden, Out: cfg.VocabSize, Weight: bert.Embeddings.Word.Weight, Bias: lm.Bias}
	heads := &BertPreTrainingHeads{Predictions: lm}
	if !cfg.NoPoolerNSP {
		heads.SeqRelationship = bertLinear(cfg.Hidden, 2, cfg.InitRange, rng)
	}
	m := &BertForPreTraining{Config: cfg, Bert: bert, Cls: heads}
	nn.Parameters(m) // fix the dotted names now
	return m, nil
}

// Children returns bert and cls.
func (m *BertForPreTraining) Children() []nn.Child {
	return []nn.Child{{Name: "bert", Module: m.Bert}, {Name: "cls", Module: m.Cls}}
}

// Forward makes the model a Module: x holds input ids as float32 values, shape [N, T],
// with token type 0 and no padding; it returns the MLM logits. ForwardPreTraining is the
// full form.
func (m *BertForPreTraining) Forward(x *nn.Var) *nn.Var {
	t := x.Tape()
	s := x.Shape()
	if len(s) != 2 {
		return t.Fail(fmt.Errorf("models.BertForPreTraining: input shape %v, want [N T] ids", s), 1, m.Config.VocabSize)
	}
	ids := make([]int32, len(x.Value.Data))
	for i, v := range x.Value.Data {
		if v != float32(int32(v)) {
			return t.Fail(fmt.Errorf("models.BertForPreTraining: input position %d holds %v, not an integer id", i, v), s[0]*s[1], m.Config.VocabSize)
		}
		ids[i] = int32(v)
	}
	mlm, _ := m.ForwardPreTraining(t, ids, nil, nil, s[0], s[1])
	return mlm
}

// ForwardPreTraining runs BERT on a batch of n sequences of length seq. inputIDs,
// tokenTypeIDs and attentionMask hold n·seq entries each, sample-major, as Hugging
// Face's input_ids, token_type_ids and attention_mask (1 real token, 0 padding);
// tokenTypeIDs nil means all 0, attentionMask nil means no padding.
//
// It returns the MLM logits, shape [n·seq, VocabSize] (HF's prediction_scores viewed as
// rows, one per position), and the NSP logits, shape [n, 2] (nil with NoPoolerNSP).
// Bad input (a length, an id out of range, seq beyond MaxPositions) is an error on the
// tape.
func (m *BertForPreTraining) ForwardPreTraining(t *nn.Tape, inputIDs, tokenTypeIDs, attentionMask []int32, n, seq int) (mlm, nsp *nn.Var) {
	cfg := m.Config
	seqOut := m.Bert.ForwardIDs(t, inputIDs, tokenTypeIDs, attentionMask, n, seq, &m.positions)
	if m.Bert.Pooler != nil && m.Cls.SeqRelationship != nil {
		nsp = m.Cls.SeqRelationship.Forward(m.Bert.Pooler.Forward(seqOut))
	}
	flat := nn.Reshape(seqOut, n*seq, cfg.Hidden)
	mlm = m.Cls.Predictions.Forward(flat)
	return mlm, nsp
}

// ForwardMaskedLM is ForwardPreTraining with the MLM head run only at positions (flat
// indices into the n·seq positions, sample-major: the masked ones), as Google's BERT
// gathers masked_lm_positions before its output layer: mlm has shape [len(positions),
// VocabSize], one row per position in that order. With the labels of those positions the
// loss equals ForwardPreTraining's with IgnoreIndex elsewhere, while the decoder (the
// largest matrix product of a small BERT) costs in proportion to the masked positions.
func (m *BertForPreTraining) ForwardMaskedLM(t *nn.Tape, inputIDs, tokenTypeIDs, attentionMask []int32, n, seq int, positions []int) (mlm, nsp *nn.Var) {
	cfg := m.Config
	seqOut := m.Bert.ForwardIDs(t, inputIDs, tokenTypeIDs, attentionMask, n, seq, &m.positions)
	if m.Bert.Pooler != nil && m.Cls.SeqRelationship != nil {
		nsp = m.Cls.SeqRelationship.Forward(m.Bert.Pooler.Forward(seqOut))
	}
	if len(positions) == 0 {
		return t.Fail(fmt.Errorf("models.BertForPreTraining: no masked positions in a batch of %d × %d", n, seq), 1, cfg.VocabSize), nsp
	}
	picked := nn.SelectRows(nn.Reshape(seqOut, n*seq, cfg.Hidden), positions)
	return m.Cls.Predictions.Forward(picked), nsp
}

// Loss returns BertForPreTraining's total loss: the masked-LM cross-entropy over the
// positions whose label is not nn.IgnoreIndex (−100) plus, when the model has the NSP
// head, the next-sentence cross-entropy (labels 0 = is next, 1 = random; −100 skips a
// pair). mlmLabels has one entry per MLM logits row, nspLabels one per sequence.
func (m *BertForPreTraining) Loss(mlm, nsp *nn.Var, mlmLabels, nspLabels []int) *nn.Var {
	loss := nn.CrossEntropyIgnore(mlm, mlmLabels, nn.IgnoreIndex)
	if nsp == nil {
		if nspLabels != nil && !m.Config.NoPoolerNSP {
			return mlm.Tape().Fail(fmt.Errorf("models.BertForPreTraining.Loss: %d NSP labels but no NSP logits", len(nspLabels)))
		}
		return loss
	}
	return nn.Add(loss, nn.CrossEntropyIgnore(nsp, nspLabels, nn.IgnoreIndex))
}

// bertLinear is a Linear initialised as BERT's: weight N(0, std²), bias 0.
func bertLinear(in, out int, std float64, rng *rand.Rand) *nn.Linear {
	l := &nn.Linear{In: in, Out: out, Weight: nn.NewParam("weight", out, in), Bias: nn.NewParam("bias", out)}
	nn.Normal(l.Weight.Value.Data, std, rng)
	return l
}

// bertEmbedding is an Embedding initialised as BERT's: N(0, std²).
func bertEmbedding(num, dim int, std float64, rng *rand.Rand) *nn.Embedding {
	e := &nn.Embedding{Num: num, Dim: dim, Weight: nn.NewParam("weight", num, dim), PaddingIdx: -1}
	nn.Normal(e.Weight.Value.Data, std, rng)
	return e
}

// BertModel is the encoder: embeddings, Layers transformer layers and the pooler
// (nil with NoPoolerNSP).
type BertModel struct {
	Embeddings *BertEmbeddings
	Encoder    *BertEncoder
	Pooler     *BertPooler
}

var _ nn.Container = (*BertModel)(nil)

func newBertModel(cfg BertConfig, rng *rand.Rand) *BertModel {
	emb := &BertEmbeddings{
		Word:      bertEmbedding(cfg.VocabSize, cfg.Hidden, cfg.InitRange, rng),
		Position:  bertEmbedding(cfg.MaxPositions, cfg.Hidden, cfg.InitRange, rng),
		TokenType: bertEmbedding(cfg.TypeVocabSize, cfg.Hidden, cfg.InitRange, rng),
		LayerNorm: nn.NewLayerNorm(cfg.Hidden, cfg.LayerNormEps),
		Dropout:   nn.NewDropout(cfg.HiddenDropout, rng),
	}
	if cfg.PadTokenID >= 0 {
		emb.Word.PaddingIdx = cfg.PadTokenID
		w := emb.Word.Weight.Value.Data
		clear(w[cfg.PadTokenID*cfg.Hidden : (cfg.PadTokenID+1)*cfg.Hidden])
	}
	enc := &BertEncoder{Layer: nn.NewSequential()}
	for range cfg.Layers {
		enc.Layer.Append(newBertLayer(cfg, rng))
	}
	b := &BertModel{Embeddings: emb, Encoder: enc}
	if !cfg.NoPoolerNSP {
		b.Pooler = &BertPooler{Dense: bertLinear(cfg.Hidden, cfg.Hidden, cfg.InitRange, rng)}
	}
	return b
}

// Children returns embeddings, encoder and (if present) pooler.
func (b *BertModel) Children() []nn.Child {
	cs := []nn.Child{{Name: "embeddings", Module: b.Embeddings}, {Name: "encoder", Module: b.Encoder}}
	if b.Pooler != nil {
		cs = append(cs, nn.Child{Name: "pooler", Module: b.Pooler})
	}
	return cs
}

// Forward runs the encoder on x = embeddings of shape [N, T, Hidden] without a mask.
func (b *BertModel) Forward(x *nn.Var) *nn.Var { return b.Encoder.ForwardMask(x, nil) }

// ForwardIDs embeds the ids and runs the encoder, returning the sequence output
// [n, seq, Hidden]. positions caches the position ids between calls (may be nil).
func (b *BertModel) ForwardIDs(t *nn.Tape, inputIDs, tokenTypeIDs, attentionMask []int32, n, seq int, positions *[]int32) *nn.Var {
	e := b.Embeddings
	h := e.Word.Dim
	out := []int{max(n, 1), max(seq, 1), h}
	if n <= 0 || seq <= 0 {
		return t.Fail(fmt.Errorf("models.BertModel: batch %d × sequence %d is empty", n, seq), out...)
	}
	if seq > e.Position.Num {
		return t.Fail(fmt.Errorf("models.BertModel: sequence length %d exceeds the %d position embeddings", seq, e.Position.Num), out...)
	}
	for _, a := range []struct {
		name string
		ids  []int32
	}{{"input ids", inputIDs}, {"token type ids", tokenTypeIDs}, {"attention mask", attentionMask}} {
		if a.ids != nil && len(a.ids) != n*seq || a.ids == nil && a.name == "input ids" {
			return t.Fail(fmt.Errorf("models.BertModel: %d %s for batch %d × sequence %d, want %d", len(a.ids), a.name, n, seq, n*seq), out...)
		}
	}
	var local []int32
	if positions == nil {
		positions = &local
	}
	if len(*positions) != n*seq {
		*positions = make([]int32, n*seq)
		for i := range *positions {
			(*positions)[i] = int32(i % seq)
		}
	}
	types := tokenTypeIDs
	if types == nil {
		types = make([]int32, n*seq)
	}
	x := nn.Add(nn.Add(e.Word.Lookup(t, inputIDs, n, seq), e.Position.Lookup(t, *positions, n, seq)), e.TokenType.Lookup(t, types, n, seq))
	x = e.Dropout.Forward(e.LayerNorm.Forward(x))
	return b.Encoder.ForwardMask(x, attentionMask)
}

// BertEmbeddings sums word, position and token-type embeddings, then LayerNorm and
// dropout.
type BertEmbeddings struct {
	Word, Position, TokenType *nn.Embedding
	LayerNorm                 *nn.LayerNorm
	Dropout                   *nn.Dropout
}

var _ nn.Container = (*BertEmbeddings)(nil)

// Children returns word_embeddings, position_embeddings, token_type_embeddings,
// LayerNorm and dropout.
func (e *BertEmbeddings) Children() []nn.Child {
	return []nn.Child{{Name: "word_embeddings", Module: e.Word}, {Name: "position_embeddings", Module: e.Position},
		{Name: "token_type_embeddings", Module: e.TokenType}, {Name: "LayerNorm", Module: e.LayerNorm}, {Name: "dropout", Module: e.Dropout}}
}

// Forward normalises already-summed embeddings x (LayerNorm, dropout).
func (e *BertEmbeddings) Forward(x *nn.Var) *nn.Var { return e.Dropout.Forward(e.LayerNorm.Forward(x)) }

// BertEncoder is the stack of transformer layers, named layer.0, layer.1, ….
type BertEncoder struct{ Layer *nn.Sequential }

var _ nn.Container = (*BertEncoder)(nil)

// Children returns layer.
func (e *BertEncoder) Children() []nn.Child { return []nn.Child{{Name: "layer", Module: e.Layer}} }

// Forward runs every layer on x [N, T, Hidden] without a mask.
func (e *BertEncoder) Forward(x *nn.Var) *nn.Var { return e.ForwardMask(x, nil) }

// ForwardMask runs every layer with the padding mask (N·T entries of 0/1, or nil).
func (e *BertEncoder) ForwardMask(x *nn.Var, mask []int32) *nn.Var {
	for _, c := range e.Layer.Children() {
		x = c.Module.(*BertLayer).ForwardMask(x, mask)
	}
	return x
}

// BertLayer is one transformer layer: self-attention with its output block, then the
// feed-forward block (intermediate dense + GELU, output dense), each closed by dropout,
// a residual connection and LayerNorm (post-LN, as BERT).
type BertLayer struct {
	Attention    *BertAttention
	Intermediate *BertIntermediate
	Output       *BertOutput
}

var _ nn.Container = (*BertLayer)(nil)

// NewBertLayer returns one layer of the given configuration, initialised as BERT's.
func NewBertLayer(cfg BertConfig, rng *rand.Rand) (*BertLayer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newBertLayer(cfg, rng), nil
}

func newBertLayer(cfg BertConfig, rng *rand.Rand) *BertLayer {
	self := nn.NewMultiHeadSelfAttention(cfg.Hidden, cfg.Heads, false, cfg.AttentionDropout, rng)
	for _, l := range []*nn.Linear{self.Query, self.Key, self.Value} {
		nn.Normal(l.Weight.Value.Data, cfg.InitRange, rng)
		l.Bias.Value.Zero()
	}
	addNorm := func(in int) *BertOutput {
		return &BertOutput{Dense: bertLinear(in, cfg.Hidden, cfg.InitRange, rng),
			LayerNorm: nn.NewLayerNorm(cfg.Hidden, cfg.LayerNormEps), Dropout: nn.NewDropout(cfg.HiddenDropout, rng)}
	}
	return &BertLayer{
		Attention:    &BertAttention{Self: self, Output: addNorm(cfg.Hidden)},
		Intermediate: &BertIntermediate{Dense: bertLinear(cfg.Hidden, cfg.Intermediate, cfg.InitRange, rng)},
		Output:       addNorm(cfg.Intermediate),
	}
}

// Children returns attention, intermediate and output.
func (l *BertLayer) Children() []nn.Child {
	return []nn.Child{{Name: "attention", Module: l.Attention}, {Name: "intermediate", Module: l.Intermediate}, {Name: "output", Module: l.Output}}
}

// Forward runs the layer on x [N, T, Hidden] without a mask.
func (l *BertLayer) Forward(x *nn.Var) *nn.Var { return l.ForwardMask(x, nil) }

// ForwardMask runs the layer on x [N, T, Hidden] with a padding mask (N·T entries of
// 0/1, or nil) and returns [N, T, Hidden].
func (l *BertLayer) ForwardMask(x *nn.Var, mask []int32) *nn.Var {
	s := x.Shape()
	if len(s) != 3 {
		return x.Tape().Fail(fmt.Errorf("models.BertLayer: input shape %v, want [N T hidden]", s), s...)
	}
	rows := s[0] * s[1]
	flat := nn.Reshape(x, rows, s[2])
	ctx := nn.Reshape(l.Attention.Self.ForwardMask(x, mask), rows, s[2])
	h := l.Attention.Output.ForwardResidual(ctx, flat)
	out := l.Output.ForwardResidual(l.Intermediate.Forward(h), h)
	return nn.Reshape(out, s...)
}

// BertAttention is self-attention (self) followed by its output block (output).
type BertAttention struct {
	Self   *nn.MultiHeadSelfAttention
	Output *BertOutput
}

var _ nn.Container = (*BertAttention)(nil)

// Children returns self and output.
func (a *BertAttention) Children() []nn.Child {
	return []nn.Child{{Name: "self", Module: a.Self}, {Name: "output", Module: a.Output}}
}

// Forward applies attention and its output block with the residual, on x [N, T, Hidden].
func (a *BertAttention) Forward(x *nn.Var) *nn.Var {
	s := x.Shape()
	if len(s) != 3 {
		return x.Tape().Fail(fmt.Errorf("models.BertAttention: input shape %v, want [N T hidden]", s), s...)
	}
	flat := nn.Reshape(x, s[0]*s[1], s[2])
	ctx := nn.Reshape(a.Self.Forward(x), s[0]*s[1], s[2])
	return nn.Reshape(a.Output.ForwardResidual(ctx, flat), s...)
}

// BertIntermediate is the feed-forward expansion: dense to Intermediate features, GELU.
type BertIntermediate struct{ Dense *nn.Linear }

var _ nn.Container = (*BertIntermediate)(nil)

// Children returns dense.
func (b *BertIntermediate) Children() []nn.Child { return []nn.Child{{Name: "dense", Module: b.Dense}} }

// Forward applies GELU(dense(x)) to x [rows, Hidden].
func (b *BertIntermediate) Forward(x *nn.Var) *nn.Var { return nn.Gelu(b.Dense.Forward(x)) }

// BertOutput is the block that closes attention (BertSelfOutput) and the feed-forward
// part (BertOutput): LayerNorm(dropout(dense(x)) + residual).
type BertOutput struct {
	Dense     *nn.Linear
	LayerNorm *nn.LayerNorm
	Dropout   *nn.Dropout
}

var _ nn.Container = (*BertOutput)(nil)

// Children returns dense, LayerNorm and dropout.
func (b *BertOutput) Children() []nn.Child {
	return []nn.Child{{Name: "dense", Module: b.Dense}, {Name: "LayerNorm", Module: b.LayerNorm}, {Name: "dropout", Module: b.Dropout}}
}

// Forward applies the block without a residual: LayerNorm(dropout(dense(x))).
func (b *BertOutput) Forward(x *nn.Var) *nn.Var {
	return b.LayerNorm.Forward(b.Dropout.Forward(b.Dense.Forward(x)))
}

// ForwardResidual returns LayerNorm(dropout(dense(x)) + residual) for x [rows, in] and
// residual [rows, Hidden].
func (b *BertOutput) ForwardResidual(x, residual *nn.Var) *nn.Var {
	return b.LayerNorm.Forward(nn.Add(b.Dropout.Forward(b.Dense.Forward(x)), residual))
}

// BertPooler turns each sequence's first ([CLS]) position into a sentence vector:
// tanh(dense(h_CLS)).
type BertPooler struct{ Dense *nn.Linear }

var _ nn.Container = (*BertPooler)(nil)

// Children returns dense.
func (p *BertPooler) Children() []nn.Child { return []nn.Child{{Name: "dense", Module: p.Dense}} }

// Forward pools x [N, T, Hidden] to [N, Hidden].
func (p *BertPooler) Forward(x *nn.Var) *nn.Var {
	s := x.Shape()
	if len(s) != 3 {
		return x.Tape().Fail(fmt.Errorf("models.BertPooler: input shape %v, want [N T hidden]", s), 1, p.Dense.Out)
	}
	first := make([]int, s[0])
	for i := range first {
		first[i] = i * s[1]
	}
	return nn.Tanh(p.Dense.Forward(nn.SelectRows(nn.Reshape(x, s[0]*s[1], s[2]), first)))
}

// BertPreTrainingHeads holds the MLM head (predictions) and the NSP classifier
// (seq_relationship, nil with NoPoolerNSP).
type BertPreTrainingHeads struct {
	Predictions     *BertLMPredictionHead
	SeqRelationship *nn.Linear
}

var _ nn.Container = (*BertPreTrainingHeads)(nil)

// Children returns predictions and (if present) seq_relationship.
func (h *BertPreTrainingHeads) Children() []nn.Child {
	cs := []nn.Child{{Name: "predictions", Module: h.Predictions}}
	if h.SeqRelationship != nil {
		cs = append(cs, nn.Child{Name: "seq_relationship", Module: h.SeqRelationship})
	}
	return cs
}

// Forward returns the MLM logits of x [rows, Hidden].
func (h *BertPreTrainingHeads) Forward(x *nn.Var) *nn.Var { return h.Predictions.Forward(x) }

// BertLMPredictionHead is the MLM head: transform (dense, GELU, LayerNorm), then the
// decoder, whose weight is the word-embedding table, plus its own bias.
type BertLMPredictionHead struct {
	Bias      *nn.Param
	Transform *BertPredictionHeadTransform

	decoder *nn.Linear // Weight tied to the word embeddings; not a child, so listed once
}

var (
	_ nn.Container  = (*BertLMPredictionHead)(nil)
	_ nn.ParamOwner = (*BertLMPredictionHead)(nil)
)

// OwnParams returns the decoder bias (cls.predictions.bias); the decoder weight belongs
// to the word embeddings.
func (h *BertLMPredictionHead) OwnParams() []*nn.Param { return []*nn.Param{h.Bias} }

// Children returns transform.
func (h *BertLMPredictionHead) Children() []nn.Child {
	return []nn.Child{{Name: "transform", Module: h.Transform}}
}

// DecoderWeight returns the tied decoder weight, [VocabSize, Hidden].
func (h *BertLMPredictionHead) DecoderWeight() *nn.Param { return h.decoder.Weight }

// Forward maps x [rows, Hidden] to vocabulary logits [rows, VocabSize].
func (h *BertLMPredictionHead) Forward(x *nn.Var) *nn.Var {
	return h.decoder.Forward(h.Transform.Forward(x))
}

// BertPredictionHeadTransform is dense, GELU, LayerNorm.
type BertPredictionHeadTransform struct {
	Dense     *nn.Linear
	LayerNorm *nn.LayerNorm
}

var _ nn.Container = (*BertPredictionHeadTransform)(nil)

// Children returns dense and LayerNorm.
func (tr *BertPredictionHeadTransform) Children() []nn.Child {
	return []nn.Child{{Name: "dense", Module: tr.Dense}, {Name: "LayerNorm", Module: tr.LayerNorm}}
}

// Forward applies LayerNorm(GELU(dense(x))).
func (tr *BertPredictionHeadTransform) Forward(x *nn.Var) *nn.Var {
	return tr.LayerNorm.Forward(nn.Gelu(tr.Dense.Forward(x)))
}
