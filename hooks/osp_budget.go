package hooks

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
)

// BudgetNow returns the running S(G^u) and U_max in elements, and the model's size.
func (h *OSP) BudgetNow() (sGu, uMax, model int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.budget(), h.uMax, h.modelElems
}

// budget returns S(G^u) in elements for the running epoch.
func (h *OSP) budget() int {
	if h.Budget >= 0 {
		return int(min(h.Budget, h.Cap) * float64(h.modelElems))
	}
	return h.sElems
}

// beginIteration folds finished ICS results into Ĝ and decides the iteration's split.
func (h *OSP) beginIteration(ctx context.Context, mv ddp.ModelView) error {
	it := h.calls
	h.calls++
	h.iter = it
	h.deferNow = nil
	s := h.budget()
	// ICS results of iterations up to it-2 have been applied by DDP (it waited for them at
	// the end of iteration it-1's Backward): fold them into Ĝ, on every rank at this point.
	keep := h.jobs[:0]
	for _, j := range h.jobs {
		if j.iter > it-2 {
			keep = append(keep, j)
			continue
		}
		select {
		case <-j.done:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the ICS of iteration %d, bucket %d: %w", j.iter, j.bucket, ctx.Err())
		}
		if j.err != nil {
			return fmt.Errorf("ICS of iteration %d, bucket %d: %w", j.iter, j.bucket, j.err)
		}
		if h.ghat != nil && s > 0 {
			v := j.buf
			for _, l := range j.layers {
				n := h.layers[l].p.Len()
				h.ghat[l] = append(h.ghat[l][:0], v[:n]...)
				v = v[n:]
			}
		}
	}
	clear(h.jobs[len(keep):])
	h.jobs = keep
	if s <= 0 {
		h.ghat = nil
		return nil
	}
	if h.ghat == nil {
		h.ghat = make([][]float32, len(h.layers))
	}
	if it < max(1, h.DenseWarmup) {
		return nil
	}
	type ranked struct {
		id  int
		imp float64
	}
	var cand []ranked
	for l, ly := range h.layers {
		if h.ghat[l] == nil {
			continue // no applied global gradient known: keep it routine
		}
		w := mv.TrueValue(ly.p)
		var imp float64
		for j, gv := range h.ghat[l] {
			imp += math.Abs(float64(gv) * float64(w[j]))
		}
		cand = append(cand, ranked{l, imp})
	}
	sort.SliceStable(cand, func(a, b int) bool { return cand[a].imp < cand[b].imp })
	left, n := s, 0
	for _, c := range cand {
		if sz := h.layers[c.id].p.Len(); sz <= left {
			if h.deferNow == nil {
				h.deferNow = make([]bool, len(h.layers))
			}
			h.deferNow[c.id] = true
			left -= sz
			n++
		}
	}
	slog.Debug("osp: split", "rank", h.rank, "iteration", it, "budget", s, "ics_layers", n, "ics_elements", s-left, "model", h.modelElems)
	return nil
}

// EndEpoch sets the next epoch's budget by the paper's Algorithm 1 (budget=auto).
func (h *OSP) EndEpoch(ctx context.Context, g comm.Group, e ddp.EpochInfo) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.epochs = e.Epoch
	h.rsEnded = false // evaluation and the like are not compute time
	defer func() { h.arN, h.arT, h.arNN, h.arNT, h.arCount, h.tc = 0, 0, 0, 0, 0, h.tc[:0] }()
	if h.Budget >= 0 {
		return nil
	}
	capElems := h.Cap * float64(h.modelElems)
	umax := capElems
	if h.UMax >= 0 {
		umax = min(h.UMax*float64(h.modelElems), capElems)
	} else {
		alpha, beta, tc, ok := h.fit()
		buf := []float32{float32(alpha), float32(beta), float32(tc), 0}
		if ok {
			buf[3] = 1
		}
		if err := comm.AllReduce(ctx, g, e.Tag, buf, comm.Auto); err != nil {
			return fmt.Errorf("hooks: osp: averaging the timing over the ranks: %w", err)
		}
		p := float64(g.Size())
		alpha, beta, tc = float64(buf[0])/p, float64(buf[1])/p, float64(buf[2])/p
		h.lastFit = [3]float64{alpha, beta, tc}
		switch {
		case float64(buf[3]) < p:
			umax = 0 // some rank measured nothing this epoch
			slog.Warn("osp: no timing measured on some rank this epoch: U_max = 0", "epoch", e.Epoch)
		case beta > 0:
			umax = min(max(0, (tc-alpha)/beta), capElems)
		}
	}
	if math.IsNaN(h.lossL) && e.FirstLoss > 0 && !math.IsInf(e.FirstLoss, 0) {
		h.lossL = e.FirstLoss
	}
	frac := 0.0
	if h.lossL > 0 && !math.IsNaN(e.Loss) && !math.IsInf(e.Loss, 0) {
		frac = min(max(1-e.Loss/h.lossL, 0), 1)
	}
	h.uMax = int(umax)
	h.sElems = int(frac * float64(h.uMax)) // of the whole-element U_max that BudgetNow and the log report

	if h.rank == 0 {
		slog.Info("osp: budget for the next epoch", "epoch", e.Epoch+1, "loss", e.Loss, "L", h.lossL,
			"alpha_s", h.lastFit[0], "beta_s_per_elem", h.lastFit[1], "tc_s", h.lastFit[2],
			"u_max", h.uMax, "s_gu", h.sElems, "model", h.modelElems)
	}
	return nil
}

// fit returns this rank's α, β (seconds, seconds per element) of its routine all-reduces and
// its median compute time T_c, and whether it measured anything.
func (h *OSP) fit() (alpha, beta, tc float64, ok bool) {
	if h.arCount == 0 || h.arN == 0 || len(h.tc) == 0 {
		return 0, 0, 0, false
	}
	c := float64(h.arCount)
	if den := c*h.arNN - h.arN*h.arN; h.arCount >= 2 && den > 1e-9*c*h.arNN {
		beta = (c*h.arNT - h.arN*h.arT) / den
		alpha = (h.arT - beta*h.arN) / c
	}
	if !(beta > 0) || math.IsInf(beta, 0) {
		alpha, beta = 0, h.arT/h.arN
	}
	alpha = max(alpha, 0)
	ts := slices.Clone(h.tc)
	slices.Sort(ts)
	tc = ts[len(ts)/2]
	return alpha, beta, tc, true
}
