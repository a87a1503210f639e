package hooks

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// This file holds what every sparse hook shares, in GRACE's decomposition: the COO vector
// (what travels), the selections that build it (top-k, threshold), the dense/sparse
// arithmetic (scatter-add, merge), and in memory.go the error-feedback Memory. The
// communicators (Spar-Reduce-Scatter, the sparse Bruck all-gather, the tree reduction) live
// with the hooks that use them.

// COO is a sparse vector in coordinate format: Idx holds strictly increasing int32 positions
// relative to a region both sides of a message know (a block, a bag of blocks, a bucket), and
// Val the values at those positions.
type COO struct {
	Idx []int32
	Val []float32
}

// Len is the number of entries.
func (v COO) Len() int { return len(v.Idx) }

// Reset empties v, keeping its storage.
func (v *COO) Reset() { v.Idx, v.Val = v.Idx[:0], v.Val[:0] }

// Clone returns a copy that shares no storage with v.
func (v COO) Clone() COO {
	return COO{Idx: append([]int32(nil), v.Idx...), Val: append([]float32(nil), v.Val...)}
}

// Append adds one entry; i must exceed the last index.
func (v *COO) Append(i int32, x float32) { v.Idx, v.Val = append(v.Idx, i), append(v.Val, x) }

// wireEntryBytes is the size of one COO entry on the wire: an int32 index and a float32
// value, two words.
const wireEntryBytes = 8

// AppendWire appends v's wire form to b: Len() little-endian int32 indices, then Len()
// little-endian float32 values. There is no header: the receiver learns the number of
// entries from the message length (comm.SendRecv returns it), so an entry costs exactly the
// two words of the cost formulas.
func (v COO) AppendWire(b []byte) []byte {
	for _, i := range v.Idx {
		b = binary.LittleEndian.AppendUint32(b, uint32(i))
	}
	for _, x := range v.Val {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// SetWire decodes a wire message into v (reusing its storage). It checks what a peer could
// get wrong: the length, indices outside [0, limit) and indices that do not increase.
func (v *COO) SetWire(b []byte, limit int) error {
	if len(b)%wireEntryBytes != 0 {
		return fmt.Errorf("sparse message of %d bytes is not a whole number of %d-byte entries", len(b), wireEntryBytes)
	}
	m := len(b) / wireEntryBytes
	v.Reset()
	vals := b[4*m:]
	prev := int64(-1)
	for e := range m {
		i := int32(binary.LittleEndian.Uint32(b[4*e:]))
		if int64(i) <= prev || int64(i) >= int64(limit) {
			return fmt.Errorf("sparse message entry %d: index %d is not in (%d, %d)", e, i, prev, limit)
		}
		prev = int64(i)
		v.Append(i, math.Float32frombits(binary.LittleEndian.Uint32(vals[4*e:])))
	}
	return nil
}

// checkIndexable refuses a bucket whose positions do not fit the int32 indices of COO.
func checkIndexable(hook string, n int) error {
	if n > math.MaxInt32 {
		return fmt.Errorf("hooks: %s: bucket of %d elements: positions do not fit int32 indices (limit %d); use smaller buckets", hook, n, math.MaxInt32)
	}
	return nil
}

// TopK sets dst to the k entries of x with the largest magnitude (exact, ties to the lower
// index, indices increasing: kernels.TopKAbs) and returns it; indices are positions in x.
// Exactly min(k, len(x)) entries, zeros included, so the size is known in advance.
func TopK(dst COO, x []float32, k int) COO {
	dst.Reset()
	dst.Idx = kernels.TopKAbs(dst.Idx, x, k)
	dst.Val = gatherInto(dst.Val, x, dst.Idx)
	return dst
}

// TopKNonZero is TopK without the entries that are exactly zero: a block with fewer than k
// non-zeros sends fewer entries.
func TopKNonZero(dst COO, x []float32, k int) COO {
	return dropZeros(TopK(dst, x, k))
}

// Threshold sets dst to the entries of x with |x| >= th (and NaNs), zeros excluded, indices
// increasing (kernels.FilterAbs), and returns it.
func Threshold(dst COO, x []float32, th float32) COO {
	dst.Reset()
	if !(th > 0) {
		th = math.SmallestNonzeroFloat32 // zeros never count as selected
	}
	dst.Idx = kernels.FilterAbs(dst.Idx, x, th)
	dst.Val = gatherInto(dst.Val, x, dst.Idx)
	return dst
}

// NonZeros is Threshold at the smallest positive float32: every non-zero entry of x.
func NonZeros(dst COO, x []float32) COO { return Threshold(dst, x, math.SmallestNonzeroFloat32) }

func gatherInto(val []float32, x []float32, idx []int32) []float32 {
	val = append(val[:0], make([]float32, len(idx))...)
	kernels.Gather(val, x, idx)
	return val
}

// dropZeros removes the entries whose value is exactly zero, in place.
func dropZeros(v COO) COO {
	m := 0
	for e, x := range v.Val {
		if x != 0 {
			v.Idx[m], v.Val[m] = v.Idx[e], x
			m++
		}
	}
	v.Idx, v.Val = v.Idx[:m], v.Val[:m]
	return v
}

// ScatterAdd adds v into dense: dense[v.Idx[e]] += v.Val[e] (kernels.ScatterAdd).
func ScatterAdd(dense []float32, v COO) { kernels.ScatterAdd(dense, v.Idx, v.Val) }

// ScatterSet writes v into dense: dense[v.Idx[e]] = v.Val[e].
func ScatterSet(dense []float32, v COO) {
	for e, i := range v.Idx {
		dense[i] = v.Val[e]
	}
}

// Merge appends to dst the union of a and b, summing the values at equal indices as
// a + b (kernels.MergeCOO), and returns it. dst must not share storage with a or b.
func Merge(dst, a, b COO) COO {
	dst.Reset()
	dst.Idx, dst.Val = kernels.MergeCOO(dst.Idx, dst.Val, a.Idx, a.Val, b.Idx, b.Val)
	return dst
}

// TopKOf keeps the k entries of v with the largest magnitude (the exact top-k of a sparse
// vector, ties to the lower index), writing them to kept and the others to dropped, both
// with increasing indices.
func TopKOf(kept, dropped COO, v COO, k int) (COO, COO) {
	kept.Reset()
	dropped.Reset()
	if k >= v.Len() {
		kept.Idx = append(kept.Idx, v.Idx...)
		kept.Val = append(kept.Val, v.Val...)
		return kept, dropped
	}
	pos := kernels.TopKAbs(nil, v.Val, k) // positions within v, increasing
	p := 0
	for e := range v.Idx {
		if p < len(pos) && int(pos[p]) == e {
			kept.Append(v.Idx[e], v.Val[e])
			p++
		} else {
			dropped.Append(v.Idx[e], v.Val[e])
		}
	}
	return kept, dropped
}

// eachIn walks the increasing indices b against the increasing indices a and calls
// fn(e, found) for every entry e of b, found telling whether b[e] is in a.
func eachIn(a []int32, b []int32, fn func(e int, found bool)) {
	i := 0
	for e, x := range b {
		for i < len(a) && a[i] < x {
			i++
		}
		fn(e, i < len(a) && a[i] == x)
	}
}

// denseAverage is the dense fallback every sparse hook shares (dense_warmup): it all-reduces
// the compensated gradient G = g + ξ, empties the residual and averages.
func denseAverage(ctx context.Context, g comm.Group, tag uint32, flat []float32, xi Residual) ([]float32, error) {
	xi.Compensate(flat)
	xi.MarkAllSent()
	if err := comm.AllReduce(ctx, g, tag, flat, comm.Auto); err != nil {
		return nil, err
	}
	kernels.Scale(1/float32(g.Size()), flat)
	return flat, nil
}
