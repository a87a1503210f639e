package hooks

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// Gaussiank loses nothing and double-counts nothing (local error feedback), and every rank
// gets the same bits, for every P from 2 to 16, several densities and distributions.
func TestGaussianKConservationAndConsistency(t *testing.T) {
	for p := 2; p <= 16; p++ {
		n := 97*p + 13
		for _, density := range []float64{0.01, 0.05, 0.3} {
			for dj, d := range okDists {
				spec := fmt.Sprintf("gaussiank:density=%g", density)
				w := newWorld(t, p, spec)
				for it := range 3 {
					gs := d.gen(uint64(100*p+10*it+dj), p, n, density)
					name := fmt.Sprintf("%s/%s/P=%d/call %d", spec, d.name, p, it)
					w.callConserving(t, name, name, gs)
				}
				w.close()
			}
		}
	}
}

// welfordThreshold is the normal fit computed another way: Welford's running mean and
// variance, then Newton's method on P(|X| >= t) = density, with the normal density as the
// derivative.
func welfordThreshold(x []float32, density float64) float64 {
	var mean, m2 float64
	for i, v := range x {
		d := float64(v) - mean
		mean += d / float64(i+1)
		m2 += d * (float64(v) - mean)
	}
	std := math.Sqrt(m2 / float64(len(x)-1))
	cdf := func(z float64) float64 { return 0.5 * (1 + math.Erf(z/math.Sqrt2)) }
	pdf := func(z float64) float64 { return math.Exp(-z*z/2) / math.Sqrt(2*math.Pi) }
	t := math.Abs(mean) + 2*std
	for range 100 {
		a, b := (t-mean)/std, (t+mean)/std
		f := 2 - cdf(a) - cdf(b) - density
		df := -(pdf(a) + pdf(b)) / std
		t -= f / df
	}
	return t
}

// The selection: the threshold starts at the normal fit (checked against an independent
// computation); on normal data, here with a mean of 0.3σ, the fit is right and no correction is
// needed (count within [3k/4, 5k/4]); on heavy-tailed data it misses and the correction moves the count toward k —
// into the band or after 20 steps of 1.02 — and the threshold used is the fit times or over
// 1.02^steps. The cost is exact: 2·ceil(log2 P) rounds and P-1 words of sizes plus 2 words per
// entry of every other rank.
func TestGaussianKSelectionAndCost(t *testing.T) {
	normal := func(seed uint64, p, n int, _ float64) [][]float32 {
		gs := make([][]float32, p)
		for r := range gs {
			rng := rand.New(rand.NewPCG(seed, uint64(r)))
			gs[r] = make([]float32, n)
			for i := range gs[r] {
				gs[r][i] = float32(0.3 + rng.NormFloat64())
			}
		}
		return gs
	}
	dists := append([]gradDist{{"normal", normal}}, okDists...)
	for _, p := range []int{2, 3, 5, 8, 13} {
		const n, density = 20000, 0.01
		k := int(n * density)
		for _, d := range dists {
			w := newWorld(t, p, fmt.Sprintf("gaussiank:density=%g", density))
			gs := d.gen(uint64(p), p, n, density)
			_, stats := w.call(t, 0, gs)
			entries, steps := 0, 0
			for r := range p {
				info := w.hooks[r].(*GaussianK).lastInfo()
				entries += info.count
				steps += info.steps
				if want := welfordThreshold(gs[r], density); math.Abs(info.fit-want) > 1e-9*math.Abs(want) {
					t.Fatalf("%s P=%d rank %d: normal fit %v, independent computation %v", d.name, p, r, info.fit, want)
				}
				if want := info.fit * math.Pow(gaussiankStep, float64(info.steps)); math.Abs(info.threshold-want) > 1e-12*want && math.Abs(info.threshold-info.fit/math.Pow(gaussiankStep, float64(info.steps))) > 1e-12*want {
					t.Fatalf("%s P=%d rank %d: threshold %v is not the fit %v moved by %d steps", d.name, p, r, info.threshold, info.fit, info.steps)
				}
				inBand := info.count >= 3*k/4 && info.count <= 5*k/4
				if !inBand && info.steps != gaussiankMaxSteps {
					t.Fatalf("%s P=%d rank %d: count %d outside [3k/4, 5k/4] after only %d corrections", d.name, p, r, info.count, info.steps)
				}
				if d.name == "normal" && info.steps != 0 {
					t.Errorf("normal data P=%d rank %d: the fit needed %d corrections (count %d, k %d)", p, r, info.steps, info.count, k)
				}
			}
			if d.name == "heavy" && steps == 0 {
				t.Errorf("heavy-tailed data P=%d: the normal fit needed no correction: the test does not exercise it", p)
			}
			for r, s := range stats {
				own := w.hooks[r].(*GaussianK).lastInfo().count
				want := int64(p-1) + 2*int64(entries-own)
				if s.BytesRecv != 4*want || s.Rounds != int64(2*ceilLog2(p)) {
					t.Errorf("%s P=%d rank %d: %v; want %d words and %d rounds", d.name, p, r, s, want, 2*ceilLog2(p))
				}
			}
			w.close()
		}
	}
}
