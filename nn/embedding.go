package nn

import (
	"fmt"
	"math/rand/v2"
)

// Embedding maps integer ids to rows of a [Num, Dim] weight table, as PyTorch's
// nn.Embedding: Lookup(ids) has shape [ids..., Dim]. Its gradient is dense, like PyTorch's
// default (sparse=False): rows not looked up get zero.
type Embedding struct {
	Num, Dim int
	Weight   *Param
	// PaddingIdx, when ≥ 0, is an id whose row gets no gradient (PyTorch's padding_idx).
	PaddingIdx int
}

var _ ParamOwner = (*Embedding)(nil)

// NewEmbedding returns an embedding table initialised as PyTorch's: N(0, 1), no padding id.
func NewEmbedding(num, dim int, rng *rand.Rand) *Embedding {
	e := &Embedding{Num: num, Dim: dim, Weight: NewParam("weight", num, dim), PaddingIdx: -1}
	Normal(e.Weight.Value.Data, 1, rng)
	return e
}

// OwnParams returns the weight table.
func (e *Embedding) OwnParams() []*Param { return []*Param{e.Weight} }

// Lookup returns the rows of ids, shaped [shape..., Dim]; shape defaults to [len(ids)].
// An id outside [0, Num) is an error on the tape naming its position.
func (e *Embedding) Lookup(t *Tape, ids []int32, shape ...int) *Var {
	if len(shape) == 0 {
		shape = []int{len(ids)}
	}
	out := append(append(make([]int, 0, len(shape)+1), shape...), e.Dim)
	n := 1
	for _, s := range shape {
		n *= s
	}
	if n != len(ids) {
		return t.failf(out, "nn.Embedding(%d×%d): %d ids for shape %v", e.Num, e.Dim, len(ids), shape)
	}
	for i, id := range ids {
		if id < 0 || int(id) >= e.Num {
			return t.failf(out, "nn.Embedding(%d×%d): id %d at position %d is outside [0, %d)", e.Num, e.Dim, id, i, e.Num)
		}
	}
	w := t.Param(e.Weight)
	y := t.newVar(t.tensor(out), false)
	d := e.Dim
	for i, id := range ids {
		copy(y.Value.Data[i*d:(i+1)*d], w.Value.Data[int(id)*d:(int(id)+1)*d])
	}
	// The ids may be a caller's buffer that changes before backward: keep a copy.
	saved := t.ibuf(len(ids))
	copy(saved, ids)
	t.record(y, func(dy []float32) {
		g := w.grad()
		for i, id := range saved {
			if int(id) == e.PaddingIdx {
				continue
			}
			row := g[int(id)*d : (int(id)+1)*d]
			src := dy[i*d : (i+1)*d]
			for j := range row {
				row[j] += src[j]
			}
		}
	}, w)
	return y
}

// Forward makes Embedding a Module: x holds the ids as float32 values (exact integers up to
// 2^24), as a data loader that produces float tensors gives them. Lookup is the direct form.
func (e *Embedding) Forward(x *Var) *Var {
	t := x.tape
	ids := t.ibuf(len(x.Value.Data))
	for i, v := range x.Value.Data {
		if v != float32(int32(v)) || v < 0 || v >= 1<<24 {
			return t.failf(append(append([]int{}, x.Value.Shape...), e.Dim),
				"nn.Embedding(%d×%d): input position %d holds %v, not an integer id", e.Num, e.Dim, i, v)
		}
		ids[i] = int32(v)
	}
	return e.Lookup(t, ids, x.Value.Shape...)
}

// String describes the layer for Summary.
func (e *Embedding) String() string { return fmt.Sprintf("Embedding(%d, %d)", e.Num, e.Dim) }
