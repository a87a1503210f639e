package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The exponential kernels of every implementation runnable here (the generic Go loops
// and, on AVX2 or AVX-512 machines, asmgen/mathvec*.go's) against float64 references.
// Lengths 0…70 and 1000 cover the wide loop, the one-vector loop and the masked tail
// (of the 16-lane and the 8-lane kernels); a guard
// after the slice checks that nothing past n is written.

// vecLengths are the lengths the kernels are tried at.
var vecLengths = func() []int {
	var ns []int
	for n := range 71 {
		ns = append(ns, n)
	}
	return append(ns, 1000)
}()

const guard = float32(-12345)

// guarded returns a slice of n zeros followed (in the same array) by a guard value.
func guarded(n int) []float32 {
	s := make([]float32, n+1)
	s[n] = guard
	return s[:n]
}

func checkGuard(t *testing.T, what string, s []float32) {
	t.Helper()
	if g := s[:len(s)+1][len(s)]; g != guard {
		t.Fatalf("%s (n=%d): element n overwritten with %v", what, len(s), g)
	}
}

func TestExpSumKernel(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(41, 42))
		worst := 0.0
		for _, n := range vecLengths {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.Float64()*200 - 150) // e^(x−shift) from 0 through subnormals to ~e^40
			}
			const shift = 10
			dst := guarded(n)
			got := impl.vec.expSum(dst, x, shift)
			checkGuard(t, "expSum", dst)
			var want float64
			for i, v := range x {
				e := math.Exp(float64(v - shift))
				want += float64(dst[i])
				// Relative error where the result is a normal float32; absolute below that.
				if e >= 0x1p-126 {
					if err := math.Abs(float64(dst[i])-e) / e; err > worst {
						worst = err
					}
				} else if math.Abs(float64(dst[i])-e) > 0x1p-149 {
					t.Fatalf("n=%d: e^%v = %v, want %v", n, v-shift, dst[i], e)
				}
			}
			if math.Abs(got-want) > 1e-12*want {
				t.Fatalf("n=%d: sum %v, the elements sum to %v", n, got, want)
			}
		}
		t.Logf("largest relative error of e^x: %.3g", worst)
		if worst > 1e-6 {
			t.Fatalf("e^x relative error %g, want < 1e-6", worst)
		}
		// Out of range, infinities and NaN, as math.Exp.
		x := []float32{-200, float32(math.Inf(-1)), 88.5, 88.8, 200, float32(math.Inf(1)), float32(math.NaN()), -87.5, -100}
		dst := make([]float32, len(x))
		impl.vec.expSum(dst, x, 0)
		for i, v := range x {
			want := float32(math.Exp(float64(v)))
			if d := dst[i]; !(d == want || math.IsNaN(float64(d)) && math.IsNaN(float64(want)) ||
				want != 0 && !math.IsInf(float64(want), 0) && math.Abs(float64(d-want)) <= 1e-6*float64(want)) {
				t.Errorf("e^%v = %v, want %v", v, d, want)
			}
		}
	})
}

func TestMaxOfKernel(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(43, 44))
		for _, n := range vecLengths[1:] {
			x := randSlice(rng, n)
			for i := range x {
				x[i] -= 5 // all negative: a zero-filled lane would win
			}
			for _, at := range []int{0, n / 2, n - 1} {
				y := clone(x)
				y[at] = 3
				if got := impl.vec.maxOf(y); got != 3 {
					t.Fatalf("n=%d, largest at %d: got %v", n, at, got)
				}
			}
		}
	})
}

// geluRef is the exact GELU and its derivative in float64, through math.Erf.
func geluRef(x float64) (y, dydx float64) {
	phi := 0.5 * math.Erfc(-x/math.Sqrt2)
	return x * phi, phi + x*math.Exp(-x*x/2)/math.Sqrt(2*math.Pi)
}

// TestGeluAccuracy bounds the GELU kernels' error against the float64 exact GELU
// (x·erfc(−x/√2)/2 through math.Erfc) on a grid of [−12, 12], where y runs from
// −1e−32 to 12. Measured 2026-11-26 (see the t.Logf line): y within 1.4e-5 (AVX-512)
// and 1.6e-5 (generic) relative and 3.8e-7 absolute (the float32 rounding of y ≈ 12), dy/dx within 1.6e-7 relative to
// max(|dy/dx|, 1). For comparison, PyTorch 1.13's float32 F.gelu on the same grid:
// 3.5e-7 absolute, dy/dx 2.2e-7, but up to 100 % relative below x ≈ −5.5, where
// 1 + erf(x/√2) cancels (erfc keeps Φ's relative accuracy in the tail). The golden and
// parity tests of nn and models compare whole networks with PyTorch at 1e-5 and looser.
func TestGeluAccuracy(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		const n = 24001
		x, dy := make([]float32, n), make([]float32, n)
		for i := range x {
			x[i] = -12 + 24*float32(i)/float32(n-1)
			dy[i] = 1
		}
		y, cdf, y2, dx := guarded(n), guarded(n), guarded(n), guarded(n)
		GeluForwardCDF(y, cdf, x)
		GeluForward(y2, x)
		GeluBackwardCDF(dx, x, cdf, dy, false)
		for _, s := range [][]float32{y, cdf, y2, dx} {
			checkGuard(t, "GELU", s)
		}
		var worstY, worstAbs, worstD float64
		for i, v := range x {
			ry, rd := geluRef(float64(v))
			if math.Float32bits(y[i]) != math.Float32bits(y2[i]) {
				t.Fatalf("x=%v: GeluForward %v, GeluForwardCDF %v", v, y2[i], y[i])
			}
			worstY = max(worstY, math.Abs(float64(y[i])-ry)/max(math.Abs(ry), 1e-30))
			worstAbs = max(worstAbs, math.Abs(float64(y[i])-ry))
			worstD = max(worstD, math.Abs(float64(dx[i])-rd)/max(math.Abs(rd), 1))
		}
		t.Logf("largest error on [-12, 12]: y %.3g relative, %.3g absolute; dy/dx %.3g relative to max(|dy/dx|, 1)",
			worstY, worstAbs, worstD)
		if worstY > 2e-5 || worstAbs > 1e-6 || worstD > 1e-6 {
			t.Fatalf("GELU error: y %g relative (want < 2e-5), %g absolute (want < 1e-6), dy/dx %g (want < 1e-6)",
				worstY, worstAbs, worstD)
		}
	})
}

// Every length through the kernels' loops and tail, NaN and infinities included, and
// the accumulate form.
func TestGeluKernelTails(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(45, 46))
		for _, n := range vecLengths {
			x, dy := randSlice(rng, n), randSlice(rng, n)
			for i := range x {
				x[i] *= 6
			}
			if n >= 3 {
				x[0], x[1], x[2] = float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))
			}
			y, cdf, dx := guarded(n), guarded(n), guarded(n)
			impl.vec.gelu(y, cdf, x)
			dx0 := randSlice(rng, n)
			copy(dx, dx0)
			impl.vec.geluBwd(dx, x, cdf, dy, true)
			for _, s := range [][]float32{y, cdf, dx} {
				checkGuard(t, "gelu", s)
			}
			for i, v := range x {
				ry, rd := geluRef(float64(v))
				rd = float64(dx0[i]) + float64(dy[i])*rd
				switch {
				case math.IsNaN(float64(v)):
					if !math.IsNaN(float64(y[i])) || !math.IsNaN(float64(dx[i])) {
						t.Fatalf("n=%d: GELU(NaN) = %v, dx %v", n, y[i], dx[i])
					}
				case math.IsInf(float64(v), 1):
					if y[i] != v || cdf[i] != 1 {
						t.Fatalf("n=%d: GELU(+Inf) = %v, Φ %v", n, y[i], cdf[i])
					}
				case math.IsInf(float64(v), -1):
					if cdf[i] != 0 { // y = −Inf·0 is NaN, in PyTorch too
						t.Fatalf("n=%d: Φ(−Inf) = %v", n, cdf[i])
					}
				default:
					if math.Abs(float64(y[i])-ry) > 1e-6*(1+math.Abs(ry)) || math.Abs(float64(dx[i])-rd) > 1e-5*(1+math.Abs(rd)) {
						t.Fatalf("n=%d x=%v: y %v (want %v), dx %v (want %v)", n, v, y[i], ry, dx[i], rd)
					}
				}
			}
		}
	})
}

// The AVX2 and AVX-512 kernels compute the generic formulas with fused multiply-adds: every
// implementation runnable here (whatever SPARGO_KERNELS selects) agrees with the
// generic one to a few float32 ulps.
func TestExpKernelsMatchGeneric(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 48))
	const n = 4099
	x, dy := randSlice(rng, n), randSlice(rng, n)
	for i := range x {
		x[i] *= 8
	}
	run := func(v *vecOps) (e []float32, z float64, y, cdf, dx []float32) {
		e, y, cdf, dx = make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		z = v.expSum(e, x, 3)
		v.gelu(y, cdf, x)
		v.geluBwd(dx, x, cdf, dy, false)
		return
	}
	e1, z1, y1, c1, d1 := run(genericVec)
	for _, name := range availableImpls() {
		e2, z2, y2, c2, d2 := run(implTable[name].vec)
		if math.Abs(z1-z2) > 1e-6*z1 {
			t.Fatalf("expSum: generic %v, %s %v", z1, name, z2)
		}
		for i := range x {
			for _, p := range [][2]float32{{e1[i], e2[i]}, {y1[i], y2[i]}, {c1[i], c2[i]}, {d1[i], d2[i]}} {
				if !closeTo(p[1], float64(p[0]), 1e-7, 2e-6) {
					t.Fatalf("x=%v: generic %v, %s %v", x[i], p[0], name, p[1])
				}
			}
		}
	}
}
