package hooks

import (
	"context"
	"fmt"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// GTopk is gTopk (Shi et al.; SparDL paper's Table I): every rank selects its exact local
// top-k of G = g + ξ; a binomial tree reduces them — at level s the ranks with bit s set send
// their k entries to rank r - 2^s, which merges the 2k candidates and keeps the top-k — and
// rank 0 broadcasts the global top-k down a binomial tree. P must be a power of two.
//
// Residual: ξ' = G minus the local selection, plus the selected local values whose index is
// not in the final set (they are re-added). Values dropped inside the tree at indices that do
// reach the final set are lost, so by design the conservation test does not hold for gTopk.
//
// Cost: 2·log2 P rounds on rank 0 (log2 P receives, log2 P broadcast sends); at most 4k·log2 P
// words received per rank (rank 0 receives 2k·log2 P).
type GTopk struct{ sparseHook }

var (
	_ ddp.CommHook = (*GTopk)(nil)
	_ ddp.Stateful = (*GTopk)(nil)
)

// NewGTopk returns a gTopk hook.
func NewGTopk(density float64, denseWarmup int) (*GTopk, error) {
	h, err := newSparseHook("gtopk", density, denseWarmup)
	return &GTopk{h}, err
}

// Run communicates one bucket.
func (h *GTopk) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	if p := g.Size(); !isPow2(p) {
		return ddp.Ready(nil, fmt.Errorf("hooks: gtopk: needs a power-of-two number of workers, have P=%d (use topka, topkdsa or spardl)", p))
	}
	return h.run(ctx, g, b, h.step)
}

func (h *GTopk) step(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState) error {
	p, r, n := g.Size(), g.Rank(), len(flat)
	k := h.k(n)
	st.Residual.Compensate(flat)
	local := TopK(COO{}, flat, k) // exactly k entries: every message has 8k bytes
	cur := local
	var in COO
	buf := make([]byte, k*wireEntryBytes)
	for s := 1; s < p; s <<= 1 {
		if r&s != 0 {
			if _, err := comm.SendRecv(ctx, g, tag, r-s, cur.AppendWire(nil), -1, nil); err != nil {
				return fmt.Errorf("tree reduction level %d (to rank %d): %w", s, r-s, err)
			}
			break
		}
		m, err := comm.SendRecv(ctx, g, tag, -1, nil, r+s, buf)
		if err == nil && m != len(buf) {
			err = fmt.Errorf("got %d bytes, want %d", m, len(buf))
		}
		if err == nil {
			err = in.SetWire(buf, n)
		}
		if err != nil {
			return fmt.Errorf("tree reduction level %d (from rank %d): %w", s, r+s, err)
		}
		cur, _ = TopKOf(COO{}, COO{}, Merge(COO{}, cur, in), k)
	}
	final := make([]byte, k*wireEntryBytes)
	if r == 0 {
		copy(final, cur.AppendWire(nil))
	}
	if err := comm.BroadcastBytes(ctx, g, tag+1, 0, final); err != nil {
		return fmt.Errorf("broadcast of the global top-k: %w", err)
	}
	var fin COO
	if err := fin.SetWire(final, n); err != nil {
		return fmt.Errorf("global top-k from rank 0: %w", err)
	}
	st.Residual.Keep(flat)
	st.Residual.MarkApplied(local.Idx, fin.Idx)
	clear(flat)
	ScatterSet(flat, fin)
	kernels.Scale(1/float32(p), flat)
	return nil
}

func init() {
	Register(Spec{
		Name:    "gtopk",
		Summary: "gTopk: local top-k, tree reduction keeping the top-k of each 2k merge, broadcast; power-of-two P only; 2 log2 P rounds, ≤ 4k log2 P words",
		Options: baselineOptions,
		New:     newBaseline(NewGTopk),
	})
}
