package nn

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// AttentionMaskValue is what a padding position (mask 0) adds to the attention scores
// before the softmax: −10000, as Google's BERT and Hugging Face's BertModel up to
// transformers 4.21 (later versions use the dtype's minimum; both give padded keys an
// exactly zero probability in float32 unless a row is all padding).
const AttentionMaskValue = -10000

// MultiHeadSelfAttention is multi-head scaled dot-product self-attention laid out as
// Hugging Face's BertSelfAttention: separate query, key and value projections (Linear
// layers named query, key, value, so bert.encoder.layer.N.attention.self.query.weight
// maps onto Query.Weight), Heads heads of size Hidden/Heads, softmax(QKᵀ/√d + mask)
// with dropout on the probabilities, and the heads' contexts concatenated back to
// Hidden features. Out, when not nil, is a final output projection named out (BERT
// keeps that projection in its own BertSelfOutput block instead and leaves Out nil).
//
// The per-head products run as batched GEMMs over the [N, T, Hidden] activations in
// place (no transposes), and the masked softmax is one kernel.
type MultiHeadSelfAttention struct {
	Hidden, Heads     int
	Query, Key, Value *Linear
	Out               *Linear
	// Dropout is the probability of zeroing an attention probability while training
	// (BERT's attention_probs_dropout_prob, 0.1).
	Dropout float64

	src      *rand.PCG // rng's source: saved and restored by checkpoints (RandOwner)
	rng      *rand.Rand
	training bool
	offN     int // batch size the cached head offsets are for
	offT     int
	qOff     []int // offset of head h of sample n in a [N, T, Hidden] activation
	sOff     []int // offset of the (n, h) score matrix in [N, Heads, T, T]
}

var (
	_ Container      = (*MultiHeadSelfAttention)(nil)
	_ TrainingSetter = (*MultiHeadSelfAttention)(nil)
	_ RandOwner      = (*MultiHeadSelfAttention)(nil)
)

// NewMultiHeadSelfAttention returns self-attention over hidden features with the given
// number of heads (which must divide hidden; Forward reports it otherwise), an output
// projection when outProj is set, and dropout on the attention probabilities. The
// projections get PyTorch's Linear initialisation from rng; the dropout masks come from
// a generator seeded from rng. It starts in training mode.
func NewMultiHeadSelfAttention(hidden, heads int, outProj bool, dropout float64, rng *rand.Rand) *MultiHeadSelfAttention {
	a := &MultiHeadSelfAttention{
		Hidden: hidden, Heads: heads, Dropout: dropout, training: true,
		Query: NewLinear(hidden, hidden, true, rng),
		Key:   NewLinear(hidden, hidden, true, rng),
		Value: NewLinear(hidden, hidden, true, rng),
	}
	if outProj {
		a.Out = NewLinear(hidden, hidden, true, rng)
	}
	a.src = rand.NewPCG(rng.Uint64(), rng.Uint64())
	a.rng = rand.New(a.src)
	return a
}

// RandSource returns the generator of the attention-dropout masks (RandOwner), so that
// checkpoints save it and a resumed run draws the masks an uninterrupted one would.
func (a *MultiHeadSelfAttention) RandSource() *rand.PCG { return a.src }

// Children returns query, key, value and, if present, out.
func (a *MultiHeadSelfAttention) Children() []Child {
	cs := []Child{{"query", a.Query}, {"key", a.Key}, {"value", a.Value}}
	if a.Out != nil {
		cs = append(cs, Child{"out", a.Out})
	}
	return cs
}

// SetTraining turns attention-probability dropout on (true) or off.
func (a *MultiHeadSelfAttention) SetTraining(training bool) { a.training = training }

// Forward attends over x of shape [N, T, Hidden] with no padding mask.
func (a *MultiHeadSelfAttention) Forward(x *Var) *Var { return a.ForwardMask(x, nil) }

// ForwardMask attends over x of shape [N, T, Hidden] and returns [N, T, Hidden].
// mask, when not nil, holds N·T entries, 1 for a real token and 0 for padding (the
// attention_mask of Hugging Face's BERT); a padding key gets AttentionMaskValue added
// to its scores, so no query attends to it.
func (a *MultiHeadSelfAttention) ForwardMask(x *Var, mask []int32) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail(s, nil)
	}
	if len(s) != 3 || s[2] != a.Hidden {
		return t.failf(s, "nn.MultiHeadSelfAttention(hidden %d, heads %d): input shape %v, want [N T %d]", a.Hidden, a.Heads, s, a.Hidden)
	}
	if a.Heads <= 0 || a.Hidden%a.Heads != 0 {
		return t.failf(s, "nn.MultiHeadSelfAttention(hidden %d, heads %d): heads must divide the hidden size (input shape %v)", a.Hidden, a.Heads, s)
	}
	if a.Dropout < 0 || a.Dropout >= 1 {
		return t.failf(s, "nn.MultiHeadSelfAttention(hidden %d, heads %d): dropout %v outside [0, 1)", a.Hidden, a.Heads, a.Dropout)
	}
	n, seq := s[0], s[1]
	if mask != nil {
		if len(mask) != n*seq {
			return t.failf(s, "nn.MultiHeadSelfAttention(hidden %d, heads %d): mask has %d entries for input shape %v, want N·T = %d", a.Hidden, a.Heads, len(mask), s, n*seq)
		}
		for i, m := range mask {
			if m != 0 && m != 1 {
				return t.failf(s, "nn.MultiHeadSelfAttention(hidden %d, heads %d): mask entry %d (sample %d, position %d) is %d, want 0 or 1", a.Hidden, a.Heads, i, i/seq, i%seq, m)
			}
		}
	}
	flat := Reshape(x, n*seq, a.Hidden)
	q, k, v := a.Query.Forward(flat), a.Key.Forward(flat), a.Value.Forward(flat)
	ctx := a.attend(q, k, v, n, seq, mask)
	if a.Out != nil {
		ctx = a.Out.Forward(ctx)
	}
	return Reshape(ctx, n, seq, a.Hidden)
}

// offsets returns the per-(sample, head) offsets for an [n, seq, Hidden] activation
// and its [n, Heads, seq, seq] scores, cached across calls with the same shape.
func (a *MultiHeadSelfAttention) offsets(n, seq int) (qOff, sOff []int) {
	if a.offN != n || a.offT != seq || len(a.qOff) != n*a.Heads {
		d := a.Hidden / a.Heads
		a.qOff, a.sOff = make([]int, n*a.Heads), make([]int, n*a.Heads)
		for i := range n {
			for h := range a.Heads {
				a.qOff[i*a.Heads+h] = i*seq*a.Hidden + h*d
				a.sOff[i*a.Heads+h] = (i*a.Heads + h) * seq * seq
			}
		}
		a.offN, a.offT = n, seq
	}
	return a.qOff, a.sOff
}

// attend computes softmax(QKᵀ/√d + mask)·V per head for q, k, v of shape [n·seq, Hidden].
func (a *MultiHeadSelfAttention) attend(q, k, v *Var, n, seq int, mask []int32) *Var {
	t := q.tape
	H := a.Hidden
	d := H / a.Heads
	rows := n * a.Heads * seq
	if q.broken || k.broken || v.broken {
		return t.fail([]int{n * seq, H}, nil)
	}
	qOff, sOff := a.offsets(n, seq)
	scale := float32(1 / math.Sqrt(float64(d)))
	// Scores, then probabilities in place: p = softmax(scale·QKᵀ + bias).
	p := t.buf(rows * seq)
	kernels.SgemmBatched(false, true, seq, seq, d, scale, q.Value.Data, qOff, H, k.Value.Data, qOff, H, 0, p, sOff, seq)
	var bias []float32
	if mask != nil {
		bias = t.buf(n * seq)
		for i, m := range mask {
			bias[i] = float32(1-m) * AttentionMaskValue
		}
	}
	kernels.SoftmaxRows(p, p, bias, rows, seq, a.Heads*seq)
	pd := p // probabilities after dropout
	var keep []float32
	if a.training && a.Dropout > 0 {
		keep = t.buf(rows * seq)
		pd = t.buf(rows * seq)
		dropoutMask(keep, a.Dropout, a.rng)
		kernels.Mul(pd, p, keep)
	}
	y := t.newVar(t.tensor([]int{n * seq, H}), false)
	kernels.SgemmBatched(false, false, seq, d, seq, 1, pd, sOff, seq, v.Value.Data, qOff, H, 0, y.Value.Data, qOff, H)
	t.record(y, func(dy []float32) {
		// dPd = dY·Vᵀ ; dV = Pdᵀ·dY ; dS = softmax'(dPd ⊙ keep) ; dQ = scale·dS·K ; dK = scale·dSᵀ·Q
		dp := t.buf(rows * seq)
		kernels.SgemmBatched(false, true, seq, seq, d, 1, dy, qOff, H, v.Value.Data, qOff, H, 0, dp, sOff, seq)
		if v.needsGrad {
			g, fresh := v.gradOverwrite()
			kernels.SgemmBatched(true, false, seq, d, seq, 1, pd, sOff, seq, dy, qOff, H, betaFor(fresh), g, qOff, H)
		}
		if keep != nil {
			kernels.Mul(dp, dp, keep)
		}
		kernels.SoftmaxRowsBackward(dp, p, dp, rows, seq, false)
		if q.needsGrad {
			g, fresh := q.gradOverwrite()
			kernels.SgemmBatched(false, false, seq, d, seq, scale, dp, sOff, seq, k.Value.Data, qOff, H, betaFor(fresh), g, qOff, H)
		}
		if k.needsGrad {
			g, fresh := k.gradOverwrite()
			kernels.SgemmBatched(true, false, seq, d, seq, scale, dp, sOff, seq, q.Value.Data, qOff, H, betaFor(fresh), g, qOff, H)
		}
	}, q, k, v)
	return y
}

// betaFor is the GEMM beta that overwrites a freshly allocated gradient (0) or adds
// to an existing one (1).
func betaFor(fresh bool) float32 {
	if fresh {
		return 0
	}
	return 1
}

// dropoutMask fills keep with 1/(1−p) (kept) or 0 (dropped, probability p), drawing
// two 32-bit uniforms from each 64-bit output of rng.
func dropoutMask(keep []float32, p float64, rng *rand.Rand) {
	threshold := uint32(math.Min(p*(1<<32), math.MaxUint32))
	scale := float32(1 / (1 - p))
	for i := 0; i < len(keep); i += 2 {
		u := rng.Uint64()
		keep[i] = scale
		if uint32(u) < threshold {
			keep[i] = 0
		}
		if i+1 < len(keep) {
			keep[i+1] = scale
			if uint32(u>>32) < threshold {
				keep[i+1] = 0
			}
		}
	}
}

// String describes the layer for Summary.
func (a *MultiHeadSelfAttention) String() string {
	return fmt.Sprintf("MultiHeadSelfAttention(hidden %d, heads %d, dropout %g)", a.Hidden, a.Heads, a.Dropout)
}
