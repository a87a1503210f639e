package hooks

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// Gaussiank's count correction (the reference's values): when the normal fit selects fewer
// than 3k/4 or more than 5k/4 entries, the threshold is divided (multiplied) by
// gaussiankStep and the selection redone, at most gaussiankMaxSteps times.
const (
	gaussiankStep     = 1.02
	gaussiankMaxSteps = 20
)

// GaussianK is Gaussiank (Shi et al.; Ok-Topk paper's Table 1, docs/ALGORITHMS.md §4): instead of a
// top-k it fits a normal distribution to G = g + ξ (mean μ, sample standard deviation σ) and
// selects |G| >= t, t the magnitude that a fraction density of the fitted normal exceeds
// (gaussianThreshold; Φ⁻¹(1 - density/2)·σ when μ = 0). Real gradients are not normal, so the
// count is then corrected as in the reference: while it is below 3k/4 (above 5k/4) the threshold is divided (multiplied) by
// 1.02, at most 20 times; the count may still miss k (the paper's Fig. 6). The selections of
// all ranks are all-gathered with their sizes (comm.AllGatherBytes: 2·ceil(log2 P) rounds,
// P-1 words of sizes plus 2 words per entry of the other ranks) and scatter-added in rank
// order, the same bits on every rank. Local error feedback (ξ' = G minus the selection): the
// conservation test holds.
type GaussianK struct {
	sparseHook
	mu   sync.Mutex
	last gaussiankInfo
}

var (
	_ ddp.CommHook = (*GaussianK)(nil)
	_ ddp.Stateful = (*GaussianK)(nil)
)

// gaussiankInfo describes one call, for the tests.
type gaussiankInfo struct {
	k, count, steps int
	fit, threshold  float64 // the normal fit's threshold, the one used after the correction
}

// NewGaussianK returns a Gaussiank hook.
func NewGaussianK(density float64, denseWarmup int) (*GaussianK, error) {
	h, err := newSparseHook("gaussiank", density, denseWarmup)
	return &GaussianK{sparseHook: h}, err
}

// Run communicates one bucket.
func (h *GaussianK) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	return h.run(ctx, g, b, h.step)
}

func (h *GaussianK) lastInfo() gaussiankInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// gaussianThreshold fits a normal N(μ, σ²) to x (mean and sample standard deviation, as
// torch.std, accumulated in float64) and returns the magnitude t that a fraction density of
// that normal exceeds: P(|X| >= t) = Q((t-μ)/σ) + Q((t+μ)/σ) = density, with Q the upper tail,
// solved by bisection. For μ = 0 this is Φ⁻¹(1 - density/2)·σ, the reference's threshold; the
// reference's μ + Φ⁻¹(1 - density/2)·σ for any μ selects too few when μ ≠ 0 (a mean of 0.3σ
// loses a fifth of k at density 0.01).
func gaussianThreshold(x []float32, density float64) float64 {
	var sum float64
	for _, v := range x {
		sum += float64(v)
	}
	mean := sum / float64(len(x))
	var ss float64
	for _, v := range x {
		d := float64(v) - mean
		ss += d * d
	}
	std := 0.0
	if len(x) > 1 {
		std = math.Sqrt(ss / float64(len(x)-1))
	}
	if !(std > 0) || math.IsInf(std, 0) {
		return math.Abs(mean)
	}
	tail := func(t float64) float64 { // P(|X| >= t)
		return 0.5*math.Erfc((t-mean)/(std*math.Sqrt2)) + 0.5*math.Erfc((t+mean)/(std*math.Sqrt2))
	}
	lo, hi := 0.0, math.Abs(mean)+40*std
	for range 200 {
		mid := lo + (hi-lo)/2
		if mid == lo || mid == hi {
			break
		}
		if tail(mid) > density {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

func (h *GaussianK) step(ctx context.Context, g comm.Group, tag uint32, flat []float32, st *BucketState) error {
	p, n := g.Size(), len(flat)
	k := h.k(n)
	st.Residual.Compensate(flat)
	info := gaussiankInfo{k: k, fit: gaussianThreshold(flat, h.Density)}
	ws := getWireScratch()
	defer putWireScratch(ws)
	th := info.fit
	ws.sel = Threshold(ws.sel, flat, float32(th))
	low, high := 3*k/4, 5*k/4
	for ; info.steps < gaussiankMaxSteps && ws.sel.Len() < low; info.steps++ {
		th /= gaussiankStep
		ws.sel = Threshold(ws.sel, flat, float32(th))
	}
	for ; info.steps < gaussiankMaxSteps && ws.sel.Len() > high; info.steps++ {
		th *= gaussiankStep
		ws.sel = Threshold(ws.sel, flat, float32(th))
	}
	info.threshold, info.count = th, ws.sel.Len()
	st.Residual.Update(flat, ws.sel.Idx)
	ws.msg = ws.sel.AppendWire(ws.msg[:0])
	all, err := comm.AllGatherBytes(ctx, g, tag, ws.msg)
	if err != nil {
		return fmt.Errorf("all-gather-v of the selections: %w", err)
	}
	clear(flat)
	for r, msg := range all {
		if err := ws.in.SetWire(msg, n); err != nil {
			return fmt.Errorf("selection of rank %d: %w", r, err)
		}
		ScatterAdd(flat, ws.in)
	}
	kernels.Scale(1/float32(p), flat)
	h.mu.Lock()
	h.last = info
	h.mu.Unlock()
	return nil
}

func init() {
	Register(Spec{
		Name:    "gaussiank",
		Summary: "Gaussiank: magnitude threshold from a normal fit (Φ⁻¹(1-density/2)·σ at μ = 0), corrected toward k; all-gather-v of the selections; 2⌈log2 P⌉ rounds",
		Options: baselineOptions,
		New:     newBaseline(NewGaussianK),
	})
}
