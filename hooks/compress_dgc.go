package hooks

import (
	"math"
)

// dgc is Deep Gradient Compression (Lin et al., ICLR 2018) per bucket on every rank:
//
//  1. local gradient clipping: when Clip > 0, g is rescaled to norm at most Clip·P^(-1/2) (the
//     paper's threshold scaled by N^(-1/2));
//  2. momentum correction: u = m·u + g and the velocity v = v + u (v is the error-feedback
//     residual, u the vector "momentum"): the hook applies the momentum, so train with the
//     optimizer's momentum off (-momentum 0) and Momentum here;
//  3. top-k of |v| (exact, not the paper's sampled threshold), k = max(1, ⌊n·density⌋),
//     sent as k COO pairs and all-gathered, v = 0 at the sent positions;
//  4. momentum factor masking: u = 0 at the sent positions;
//  5. warm-up: with Warmup = W > 0 calls per stage, the density is 25 %, 6.25 %, 1.5625 % and
//     0.4 % during the first 4W calls of each bucket (the paper's exponential warm-up from 75 %
//     to 99.6 % sparsity), then Density (never below it).
//
// The result is the mean of the P sparse vectors. Words: 2k(P-1) received per rank, exactly
// (every rank sends k pairs, zeros included). With Momentum = 0 and no clipping the error
// feedback is exact (conservation); with momentum the residual holds velocity, not gradient.
type dgc struct {
	cooCompressor
	density, momentum, clip float64
	warmup                  int
}

// dgcWarmup are the densities of the warm-up stages (the paper's 75 %, 93.75 %, 98.4375 %,
// 99.6 % sparsity).
var dgcWarmup = []float64{0.25, 0.0625, 0.015625, 0.004}

func newDGC(density, momentum, clip float64, warmup int) *dgc {
	d := &dgc{density: density, momentum: momentum, clip: clip, warmup: warmup}
	d.cooCompressor = cooCompressor{formula: "2k", count: d.count, steady: func(n int) int { return topKOfDensity(n, density) },
		pick: func(x []float32, c CompressCall) COO { return TopK(COO{}, x, d.count(len(x), c)) }}
	return d
}

// topKOfDensity is k = max(1, ⌊n·d⌋), at most n.
func topKOfDensity(n int, d float64) int { return min(n, max(1, int(float64(n)*d))) }

// count is k on call c: the warm-up's density or Density.
func (d *dgc) count(n int, c CompressCall) int {
	density := d.density
	if d.warmup > 0 && c.Call >= 0 {
		if stage := c.Call / int64(d.warmup); stage < int64(len(dgcWarmup)) {
			density = max(density, dgcWarmup[stage])
		}
	}
	return topKOfDensity(n, density)
}

// Prepare clips g and replaces it with the corrected momentum u = m·u + g.
func (d *dgc) Prepare(g []float32, v Vectors, c CompressCall) {
	if d.clip > 0 {
		var s float64
		for _, x := range g {
			s += float64(x) * float64(x)
		}
		if bound := d.clip / math.Sqrt(float64(c.Size)); math.Sqrt(s) > bound {
			scale := float32(bound / math.Sqrt(s))
			for i := range g {
				g[i] *= scale
			}
		}
	}
	if d.momentum == 0 {
		return
	}
	u := v.Get("momentum")
	m := float32(d.momentum)
	for i, x := range g {
		u[i] = m*u[i] + x
		g[i] = u[i]
	}
}

// Finish is the momentum factor masking: u = 0 where the message sent a value.
func (d *dgc) Finish(sent []float32, v Vectors) {
	if d.momentum == 0 {
		return
	}
	u := v.Get("momentum")
	for i, x := range sent {
		if x != 0 {
			u[i] = 0
		}
	}
}

func init() {
	registerCompressed("dgc", "Deep Gradient Compression (Lin et al. 2018): momentum correction and factor masking, local clipping, "+
		"density warm-up, top-k pairs all-gathered; 2k(P-1) words (use the optimizer without momentum)",
		[]Option{
			{Name: "density", Default: "0.001", Help: "k/n after the warm-up, in (0, 1] (the paper's 99.9 % sparsity)"},
			{Name: "momentum", Default: "0.9", Help: "m of the momentum correction, in [0, 1); 0: plain error feedback"},
			{Name: "clip", Default: "0", Help: "local gradient clipping: bucket norm at most clip/√P; 0: off"},
			{Name: "warmup", Default: "0", Help: "calls per warm-up stage (4 stages: density 25 %, 6.25 %, 1.5625 %, 0.4 %); 0: none"},
		}, AllGathered, true,
		func(o Values) (Compressor, error) {
			var f [3]float64
			for i, name := range []string{"density", "momentum", "clip"} {
				var err error
				if f[i], err = o.Float(name); err != nil {
					return nil, err
				}
			}
			w, err := o.Int("warmup")
			switch {
			case err != nil:
				return nil, err
			case !(f[0] > 0 && f[0] <= 1):
				return nil, optionError("dgc", "density", f[0], "a number in (0, 1]")
			case !(f[1] >= 0 && f[1] < 1):
				return nil, optionError("dgc", "momentum", f[1], "a number in [0, 1)")
			case !(f[2] >= 0) || math.IsInf(f[2], 1):
				return nil, optionError("dgc", "clip", f[2], "a finite number >= 0")
			case w < 0:
				return nil, optionError("dgc", "warmup", w, ">= 0")
			}
			return newDGC(f[0], f[1], f[2], w), nil
		})
}
