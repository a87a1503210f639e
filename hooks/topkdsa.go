package hooks

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// TopkDSA is SparCML's TopkDSA (SparDL paper's Table I; docs/ALGORITHMS.md §4). The bucket is cut
// into P equal regions (c = ceil(n/P)). Every rank selects its exact local top-k of G = g + ξ
// and sends region j of its selection to rank j with destination rotation (step i sends to
// r+i and receives from r-i: P-1 rounds); rank r sums region r. The non-zero counts of the
// reduced regions are all-gathered (Bruck, ceil(log2 P) rounds, P-1 words); then, if their
// total reaches n/3 (the reference's switch point), the reduced regions travel as a dense
// Bruck all-gather, otherwise as a sparse all-gather-v (ceil(log2 P) rounds). Local error
// feedback (ξ' = G minus the selected entries); the conservation test holds.
//
// Cost per rank: P-1 + 2·ceil(log2 P) rounds (Table I: P + 2 log P); words received in
// [4k(P-1)/P, (2k+n)(P-1)/P] when the selections spread evenly over the regions (the bounds
// of Table I), plus the P-1 words of counts.
type TopkDSA struct{ sparseHook }

var (
	_ ddp.CommHook = (*TopkDSA)(nil)
	_ ddp.Stateful = (*TopkDSA)(nil)
)

// topkdsaDenseFraction: the all-gather goes dense once the reduced non-zeros reach n/3.
const topkdsaDenseFraction = 3

// NewTopkDSA returns a TopkDSA hook.
func NewTopkDSA(density float64, denseWarmup int) (*TopkDSA, error) {
	h, err := newSparseHook("topkdsa", density, denseWarmup)
	return &TopkDSA{h}, err
}

// Run communicates one bucket.
func (h *TopkDSA) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	return h.run(ctx, g, b, h.step)
}

func (h *TopkDSA) step(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState) error {
	p, r, n := g.Size(), g.Rank(), len(flat)
	k := h.k(n)
	c := (n + p - 1) / p
	region := func(i int) (int, int) { return blockBounds(i, c, n) }
	st.Residual.Compensate(flat)
	sel := TopKNonZero(COO{}, flat, k)
	st.Residual.Update(flat, sel.Idx)
	// part(i) is the slice of sel that falls in region i.
	part := func(i int) COO {
		lo, hi := region(i)
		a := sort.Search(sel.Len(), func(e int) bool { return int(sel.Idx[e]) >= lo })
		z := sort.Search(sel.Len(), func(e int) bool { return int(sel.Idx[e]) >= hi })
		return COO{Idx: sel.Idx[a:z], Val: sel.Val[a:z]}
	}
	// Sparse reduce-scatter with destination rotation: own part first, then step i's.
	clear(flat)
	lo, hi := region(r)
	mine := flat[lo:hi]
	own := part(r)
	for e, j := range own.Idx {
		mine[int(j)-lo] += own.Val[e]
	}
	var rel, in COO
	var msg, buf []byte
	for i := 1; i < p; i++ {
		to, from := (r+i)%p, (r-i+p)%p
		tlo, _ := region(to)
		out := part(to)
		rel.Reset()
		for e, j := range out.Idx {
			rel.Append(j-int32(tlo), out.Val[e])
		}
		msg = rel.AppendWire(msg[:0])
		buf = wireBuf(buf, min(k, hi-lo)*wireEntryBytes)
		m, err := comm.SendRecv(ctx, g, tag, to, msg, from, buf)
		if err == nil {
			err = in.SetWire(buf[:m], hi-lo)
		}
		if err != nil {
			return fmt.Errorf("reduce-scatter step %d (to rank %d, from rank %d): %w", i, to, from, err)
		}
		ScatterAdd(mine, in)
	}
	reduced := NonZeros(COO{}, mine)

	// Counts, then a sparse or a dense all-gather: every rank decides the same way.
	count := binary.LittleEndian.AppendUint32(nil, uint32(reduced.Len()))
	four := make([]int, p)
	for i := range four {
		four[i] = 4
	}
	counts, err := comm.AllGatherBytesSized(ctx, g, tag+1, count, four)
	if err != nil {
		return fmt.Errorf("count exchange: %w", err)
	}
	sizes := make([]int, p)
	total := 0
	for i, cb := range counts {
		cnt := int(binary.LittleEndian.Uint32(cb))
		if rlo, rhi := region(i); cnt > rhi-rlo {
			return fmt.Errorf("rank %d reports %d non-zeros in a region of %d elements", i, cnt, rhi-rlo)
		}
		sizes[i] = cnt * wireEntryBytes
		total += cnt
	}
	if topkdsaDenseFraction*total >= n {
		send := make([]float32, c)
		copy(send, mine)
		recv := make([]float32, p*c)
		if err := comm.AllGather(ctx, g, tag+2, send, recv, comm.Bruck); err != nil {
			return fmt.Errorf("dense all-gather: %w", err)
		}
		copy(flat, recv[:n])
	} else {
		all, err := comm.AllGatherBytesSized(ctx, g, tag+2, reduced.AppendWire(nil), sizes)
		if err != nil {
			return fmt.Errorf("sparse all-gather: %w", err)
		}
		clear(flat)
		var v COO
		for i, b := range all {
			rlo, rhi := region(i)
			if err := v.SetWire(b, rhi-rlo); err != nil {
				return fmt.Errorf("region of rank %d: %w", i, err)
			}
			ScatterSet(flat[rlo:rhi], v)
		}
	}
	kernels.Scale(1/float32(p), flat)
	return nil
}

func init() {
	Register(Spec{
		Name:    "topkdsa",
		Summary: "SparCML TopkDSA: local top-k, rotated sparse reduce-scatter over P regions, sparse (or, past n/3 non-zeros, dense) all-gather; P-1+2⌈log2 P⌉ rounds",
		Options: baselineOptions,
		New:     newBaseline(NewTopkDSA),
	})
}
