package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// lnGuard is the sentinel written past the end of every LayerNorm buffer: NaN, so an
// input read past the end would poison the results and an output written past it
// shows as a changed bit pattern.
const lnGuard = 0x7fc0dead

// lnBuf returns a slice of n elements (filled by fill) followed by 17 sentinels
// in its backing array.
func lnBuf(n int, fill func(i int) float32) []float32 {
	s := make([]float32, n+17)
	for i := range s {
		if i < n {
			s[i] = fill(i)
		} else {
			s[i] = math.Float32frombits(lnGuard)
		}
	}
	return s[:n]
}

func lnCheckGuard(t *testing.T, name string, s []float32) {
	t.Helper()
	for i, v := range s[len(s):cap(s)] {
		if math.Float32bits(v) != lnGuard {
			t.Fatalf("%s: element %d past the end written (%v)", name, len(s)+i, v)
		}
	}
}

// LayerNormForward and LayerNormBackward on every implementation the CPU runs agree
// with a float64 evaluation of the same formulas, written and accumulated, over row
// lengths around the 16-lane vectors and BERT's 128 and 768, without touching memory
// past the end of any buffer. The saved mean and rstd are within one float32 rounding
// of the float64 statistics, so the float64 accumulation is kept on every path.
func TestLayerNormMatchesFloat64(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(11, 12))
		for _, d := range []int{1, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 128, 129, 768, 777} {
			for _, rows := range []int{1, 5} {
				testLayerNormCase(t, rng, rows, d)
			}
		}
	})
}

func testLayerNormCase(t *testing.T, rng *rand.Rand, rows, d int) {
	t.Helper()
	const eps = 1e-12
	n := rows * d
	x := lnBuf(n, func(int) float32 { return float32(3 + 5*rng.Float64()) })
	dy := lnBuf(n, func(int) float32 { return float32(2*rng.Float64() - 1) })
	gamma := lnBuf(d, func(int) float32 { return float32(0.5 + rng.Float64()) })
	beta := lnBuf(d, func(int) float32 { return float32(rng.Float64() - 0.5) })
	y := lnBuf(n, func(int) float32 { return 0 })
	mean, rstd := lnBuf(rows, func(int) float32 { return 0 }), lnBuf(rows, func(int) float32 { return 0 })
	LayerNormForward(y, x, gamma, beta, mean, rstd, rows, d, eps)

	// float64 reference.
	wantY, wantDx := make([]float64, n), make([]float64, n)
	wantDg, wantDb := make([]float64, d), make([]float64, d)
	for r := range rows {
		xr := x[r*d : (r+1)*d]
		var s, ss float64
		for _, v := range xr {
			s += float64(v)
		}
		mu := s / float64(d)
		for _, v := range xr {
			ss += (float64(v) - mu) * (float64(v) - mu)
		}
		inv := 1 / math.Sqrt(ss/float64(d)+eps)
		if e := math.Abs(float64(mean[r])-mu) / math.Max(math.Abs(mu), 1e-30); e > 1.0/(1<<23) {
			t.Fatalf("rows %d d %d row %d: mean %v, float64 %v (relative error %.3g)", rows, d, r, mean[r], mu, e)
		}
		if e := math.Abs(float64(rstd[r])-inv) / inv; e > 1.0/(1<<23) {
			t.Fatalf("rows %d d %d row %d: rstd %v, float64 %v (relative error %.3g)", rows, d, r, rstd[r], inv, e)
		}
		var s1, s2 float64
		for i, v := range xr {
			xh := (float64(v) - mu) * inv
			wantY[r*d+i] = xh*float64(gamma[i]) + float64(beta[i])
			g := float64(dy[r*d+i])
			s1 += g * float64(gamma[i])
			s2 += g * float64(gamma[i]) * xh
			wantDg[i] += g * xh
			wantDb[i] += g
		}
		s1, s2 = s1/float64(d), s2/float64(d)
		for i, v := range xr {
			xh := (float64(v) - mu) * inv
			wantDx[r*d+i] = inv * (float64(dy[r*d+i])*float64(gamma[i]) - s1 - xh*s2)
		}
	}
	// x̂ is O(1); float32 sums over d terms of O(1) err by a few d·2⁻²⁴ at most.
	tol := 4e-6 + 2e-7*float64(d)
	within := func(what string, got []float32, want []float64, shift float64) {
		t.Helper()
		for i, g := range got {
			if e := math.Abs(float64(g) - shift - want[i]); !(e <= tol*(1+math.Abs(want[i]))) {
				t.Fatalf("rows %d d %d: %s[%d] = %v, float64 %v (error %.3g, tolerance %.3g)", rows, d, what, i, float64(g)-shift, want[i], e, tol)
			}
		}
	}
	within("y", y, wantY, 0)
	// The row's dx is scaled by rstd (up to 1/0.3 here): compare dx/rstd·rstd's scale.
	for _, acc := range []bool{false, true} {
		dx := lnBuf(n, func(int) float32 {
			if acc {
				return 0.5
			}
			return float32(math.NaN()) // must be overwritten
		})
		dg := lnBuf(d, func(int) float32 { return 0.25 })
		db := lnBuf(d, func(int) float32 { return -0.25 })
		LayerNormBackward(dx, dy, x, gamma, mean, rstd, rows, d, acc, dg, db)
		shift := 0.0
		if acc {
			shift = 0.5
		}
		within("dx", dx, wantDx, shift)
		within("dgamma", dg, wantDg, 0.25)
		within("dbeta", db, wantDb, -0.25)
		for _, b := range []struct {
			name string
			s    []float32
		}{{"dx", dx}, {"dgamma", dg}, {"dbeta", db}} {
			lnCheckGuard(t, b.name, b.s)
		}
	}
	// dx only, and the parameter gradients only.
	dx := lnBuf(n, func(int) float32 { return 0 })
	LayerNormBackward(dx, dy, x, gamma, mean, rstd, rows, d, false, nil, nil)
	within("dx (no dgamma)", dx, wantDx, 0)
	dg, db := lnBuf(d, func(int) float32 { return 0 }), lnBuf(d, func(int) float32 { return 0 })
	LayerNormBackward(nil, dy, x, gamma, mean, rstd, rows, d, false, dg, db)
	within("dgamma (no dx)", dg, wantDg, 0)
	within("dbeta (no dx)", db, wantDb, 0)
	for _, b := range []struct {
		name string
		s    []float32
	}{{"y", y}, {"mean", mean}, {"rstd", rstd}, {"dx", dx}, {"dgamma", dg}, {"dbeta", db}} {
		lnCheckGuard(t, b.name, b.s)
	}
}

// BenchmarkLayerNorm times LayerNormForward and LayerNormBackward (dx, dgamma and
// dbeta) on every implementation the CPU runs, at BERT-tiny's 16 × 128 tokens of
// width 128.
func BenchmarkLayerNorm(b *testing.B) {
	const rows, d = 16 * 128, 128
	r := rand.New(rand.NewPCG(3, 4))
	x, dy, y, dx := randSlice(r, rows*d), randSlice(r, rows*d), make([]float32, rows*d), make([]float32, rows*d)
	gamma, beta, dg, db := randSlice(r, d), randSlice(r, d), make([]float32, d), make([]float32, d)
	mean, rstd := make([]float32, rows), make([]float32, rows)
	for _, name := range availableImpls() {
		b.Run(name, func(b *testing.B) {
			defer setImpl(name)()
			b.Run("forward", func(b *testing.B) {
				for b.Loop() {
					LayerNormForward(y, x, gamma, beta, mean, rstd, rows, d, 1e-12)
				}
			})
			b.Run("backward", func(b *testing.B) {
				for b.Loop() {
					LayerNormBackward(dx, dy, x, gamma, mean, rstd, rows, d, false, dg, db)
				}
			})
		})
	}
}
