package hooks

import (
	"context"
	"fmt"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// TopkA is SparCML's TopkA (SparDL paper's Table I): every rank selects its exact local top-k
// of G = g + ξ, the P selections of k pairs are all-gathered (Bruck, ceil(log2 P) rounds), and
// every rank scatter-adds them in rank order (so the replicas get the same bits). Local error
// feedback: ξ' = G minus the selected entries; the conservation test holds. Cost: 2k(P-1)
// words received per rank, exactly: every selection has k entries, zeros included, so no
// sizes are exchanged.
//
// It records the phases of each bucket's last call (Phases, Trace), as lags, mgs and omgs do,
// so that TopK-SGD's single group can be traced next to theirs.
type TopkA struct {
	sparseHook
	phaseLog
}

var (
	_ ddp.CommHook = (*TopkA)(nil)
	_ ddp.Stateful = (*TopkA)(nil)
)

// NewTopkA returns a TopkA hook.
func NewTopkA(density float64, denseWarmup int) (*TopkA, error) {
	h, err := newSparseHook("topka", density, denseWarmup)
	return &TopkA{sparseHook: h}, err
}

// Run communicates one bucket and records its phases.
func (h *TopkA) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	start := time.Now()
	var marks stepMarks
	n := len(b.Flat())
	k := h.k(n)
	fut := h.run(ctx, g, b, func(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState) error {
		return topkaStep(ctx, g, tag, flat, st, k, &marks)
	})
	h.record(b.Index(), n, 0, k, start, marks)
	return fut
}

// stepMarks receives the moments a TopkA step finished its selection and its all-gather
// (lags, mgs and omgs trace their groups with them).
type stepMarks struct{ selected, gathered time.Time }

// topkaStep is TopkA's sparse step with k entries per rank; marks may be nil.
func topkaStep(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState, k int, marks *stepMarks) error {
	p, n := g.Size(), len(flat)
	st.Residual.Compensate(flat)
	ws := getWireScratch()
	defer putWireScratch(ws)
	ws.sel = TopK(ws.sel, flat, k)
	st.Residual.Update(flat, ws.sel.Idx)
	sizes := make([]int, p)
	for i := range sizes {
		sizes[i] = k * wireEntryBytes
	}
	ws.msg = ws.sel.AppendWire(ws.msg[:0])
	if marks != nil {
		marks.selected = time.Now()
	}
	all, err := comm.AllGatherBytesSized(ctx, g, tag, ws.msg, sizes)
	if err != nil {
		return fmt.Errorf("all-gather of the selections: %w", err)
	}
	if marks != nil {
		marks.gathered = time.Now()
	}
	clear(flat)
	v := &ws.in
	for r, msg := range all {
		if err := v.SetWire(msg, n); err != nil {
			return fmt.Errorf("selection of rank %d: %w", r, err)
		}
		ScatterAdd(flat, *v)
	}
	kernels.Scale(1/float32(p), flat)
	return nil
}

func init() {
	Register(Spec{
		Name:    "topka",
		Summary: "SparCML TopkA: local top-k, all-gather of the P·k pairs, scatter-add; 2k(P-1) words, ⌈log2 P⌉ rounds",
		Options: baselineOptions,
		New:     newBaseline(NewTopkA),
	})
}
