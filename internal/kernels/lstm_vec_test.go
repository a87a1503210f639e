package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The fused LSTM row kernels (vecOps.lstmFwd, lstmBwd) of every implementation runnable
// here (the generic Go loops and, on AVX2 or AVX-512 machines, asmgen/lstm.go's and
// mathvec_avx2.go's) against float64 references: the gate nonlinearities on a dense
// grid, special values, every length 0…70 and 1000 through the kernels' loops and tail
// with a guard after each output, and every combination of absent (nil) operands.

func sigmoidRef(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// TestLSTMGateAccuracy bounds the forward kernel's sigmoid (gates i, f, o) and tanh
// (gate g) against float64 on a grid of [−30, 30] (the bounds tanh32 and sigmoid32
// document: tanh within 2e-7 absolute, sigmoid within 1e-6 relative), and tanh near 0,
// where the Taylor branch must keep its relative accuracy.
func TestLSTMGateAccuracy(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		var grid []float32
		for x := float32(-30); x < 30; x += 0.000917 {
			grid = append(grid, x)
		}
		for x := float32(1e-30); x < 0.2; x *= 1.01 {
			grid = append(grid, x, -x)
		}
		hd := len(grid)
		g := make([]float32, 4*hd)
		for k := range 4 {
			copy(g[k*hd:], grid)
		}
		c, tc, h := make([]float32, hd), make([]float32, hd), make([]float32, hd)
		impl.vec.lstmFwd(g, nil, c, tc, h)
		var worstS, worstT, worstSmall float64
		for k, x := range grid {
			s := sigmoidRef(float64(x))
			for _, b := range []int{0, 1, 3} {
				worstS = max(worstS, math.Abs(float64(g[b*hd+k])-s)/s)
			}
			th := math.Tanh(float64(x))
			worstT = max(worstT, math.Abs(float64(g[2*hd+k])-th))
			if math.Abs(float64(x)) < 0.125 {
				worstSmall = max(worstSmall, math.Abs(float64(g[2*hd+k])-th)/math.Abs(th))
			}
		}
		t.Logf("largest error on [-30, 30]: sigmoid %.3g relative, tanh %.3g absolute, %.3g relative for |x| < 1/8",
			worstS, worstT, worstSmall)
		if worstS > 1e-6 || worstT > 2e-7 || worstSmall > 1e-6 {
			t.Fatalf("sigmoid relative error %g (want < 1e-6), tanh absolute %g (want < 2e-7), tanh relative near 0 %g (want < 1e-6)",
				worstS, worstT, worstSmall)
		}
	})
}

// TestLSTMGateSpecialValues: infinities, NaN, signed zero, the tails where e^x under- or
// overflows, and the tanh branch boundary, in every lane position of a 16-wide vector.
func TestLSTMGateSpecialValues(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negZero := float32(math.Copysign(0, -1))
	special := []float32{nan, inf, -inf, 0, negZero, 1e-30, -1e-30, 0.0625, -0.0625, 0.06249999,
		20, -20, 60, -60, 87.5, -87.5, 88.5, -88.5, 89, -89, 104, -104, 200, -200, 1e30, -1e30}
	forEachImpl(t, func(t *testing.T) {
		for shift := range 16 {
			hd := len(special) + shift
			x := make([]float32, hd)
			copy(x[shift:], special)
			g := make([]float32, 4*hd)
			for k := range 4 {
				copy(g[k*hd:], x)
			}
			c, tc, h := make([]float32, hd), make([]float32, hd), make([]float32, hd)
			impl.vec.lstmFwd(g, nil, c, tc, h)
			for k, v := range x {
				s, th := g[k], g[2*hd+k]
				switch {
				case v != v:
					if s == s || th == th {
						t.Fatalf("sigmoid(NaN) = %v, tanh(NaN) = %v", s, th)
					}
				case v == 0:
					if s != 0.5 || math.Float32bits(th) != math.Float32bits(v) {
						t.Fatalf("sigmoid(%v) = %v, tanh = %v (want 0.5 and the same signed zero)", v, s, th)
					}
				default:
					ws := sigmoidRef(float64(v))
					wt := math.Tanh(float64(v))
					// sigmoid: relative where normal; below the smallest normal float32
					// (x < −87.3) absolute, as e^−x overflows past x = −88.72 and gives 0.
					okS := math.Abs(float64(s)-ws) <= 1e-6*ws || ws < 0x1p-126 && math.Abs(float64(s)-ws) <= 0x1p-126
					okT := math.Abs(float64(th)-wt) <= max(2e-7, 1e-6*math.Abs(wt)) && math.Abs(float64(th)) <= 1
					if math.Abs(wt) < 0.0625 {
						okT = okT && math.Abs(float64(th)-wt) <= 1e-6*math.Abs(wt)
					}
					if math.Abs(float64(v)) >= 20 {
						okT = okT && th == float32(math.Copysign(1, float64(v)))
					}
					if !okS || !okT {
						t.Fatalf("x=%v (lane %d): sigmoid %v (want %v), tanh %v (want %v)", v, k%16, s, ws, th, wt)
					}
				}
			}
		}
	})
}

// lstmRowRef is the float64 reference of one row, from float32 inputs; nil cPrev, dy,
// dhRec are zeros. It returns the activations, c, tanh(c), h, dGates and dc out.
func lstmRowRef(pre, cPrev, dy, dhRec, dcIn []float32, hd int) (acts, c, tc, h, d, dcOut []float64) {
	at := func(s []float32, k int) float64 {
		if s == nil {
			return 0
		}
		return float64(s[k])
	}
	acts, d = make([]float64, 4*hd), make([]float64, 4*hd)
	c, tc, h, dcOut = make([]float64, hd), make([]float64, hd), make([]float64, hd), make([]float64, hd)
	for k := range hd {
		i, f := sigmoidRef(float64(pre[k])), sigmoidRef(float64(pre[hd+k]))
		g, o := math.Tanh(float64(pre[2*hd+k])), sigmoidRef(float64(pre[3*hd+k]))
		acts[k], acts[hd+k], acts[2*hd+k], acts[3*hd+k] = i, f, g, o
		c[k] = f*at(cPrev, k) + i*g
		tc[k] = math.Tanh(c[k])
		h[k] = o * tc[k]
		dh := at(dy, k) + at(dhRec, k)
		dc := at(dcIn, k) + dh*o*(1-tc[k]*tc[k])
		d[k] = dc * g * i * (1 - i)
		d[hd+k] = dc * at(cPrev, k) * f * (1 - f)
		d[2*hd+k] = dc * i * (1 - g*g)
		d[3*hd+k] = dh * tc[k] * o * (1 - o)
		dcOut[k] = dc * f
	}
	return
}

// TestLSTMRowKernelTails runs the forward and backward row kernels at every length and
// with every combination of nil cPrev, dy and dhRec, checking all outputs against the
// float64 reference and that nothing past the row is written.
func TestLSTMRowKernelTails(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(51, 52))
		for _, hd := range vecLengths {
			for mask := range 8 {
				withPrev, withDy, withRec := mask&1 != 0, mask&2 != 0, mask&4 != 0
				pre := randSlice(rng, 4*hd)
				for i := range pre {
					pre[i] *= 8
				}
				pick := func(on bool) []float32 {
					if !on {
						return nil
					}
					return randSlice(rng, hd)
				}
				cPrev, dy, dhRec := pick(withPrev), pick(withDy), pick(withRec)
				dcIn := randSlice(rng, hd)
				acts, c, tc, h, d, dcOut := lstmRowRef(pre, cPrev, dy, dhRec, dcIn, hd)

				g := guarded(4 * hd)
				copy(g, pre)
				gc, gtc, gh := guarded(hd), guarded(hd), guarded(hd)
				impl.vec.lstmFwd(g, cPrev, gc, gtc, gh)
				dG, dc := guarded(4*hd), guarded(hd)
				copy(dc, dcIn)
				impl.vec.lstmBwd(dG, g, cPrev, gtc, dy, dhRec, dc)
				for _, s := range [][]float32{g, gc, gtc, gh, dG, dc} {
					checkGuard(t, "lstm row", s)
				}
				for _, o := range []struct {
					name      string
					got       []float32
					want      []float64
					atol, tol float64
				}{
					{"acts", g, acts, 2e-7, 1e-6}, {"c", gc, c, 1e-6, 1e-6}, {"tc", gtc, tc, 1e-6, 1e-6},
					{"h", gh, h, 1e-6, 1e-6}, {"dGates", dG, d, 1e-6, 1e-5}, {"dc", dc, dcOut, 1e-6, 1e-5},
				} {
					for k := range o.got {
						if !closeTo(o.got[k], o.want[k], o.atol, o.tol) {
							t.Fatalf("hidden=%d prev=%v dy=%v rec=%v: %s[%d] = %v, want %v",
								hd, withPrev, withDy, withRec, o.name, k, o.got[k], o.want[k])
						}
					}
				}
			}
		}
	})
}

// TestLSTMKernelsMatchGeneric: every implementation runnable here (whatever
// SPARGO_KERNELS selects) computes the generic formulas to a few float32 ulps; the
// backward's dc' = dc + dh·o·(1 − tc²) may cancel, so its outputs (and those of dc')
// are compared at the inputs' scale (1e-6 absolute).
func TestLSTMKernelsMatchGeneric(t *testing.T) {
	rng := rand.New(rand.NewPCG(53, 54))
	const hd = 1031
	pre, cPrev, dy, dhRec, dcIn := randSlice(rng, 4*hd), randSlice(rng, hd), randSlice(rng, hd), randSlice(rng, hd), randSlice(rng, hd)
	for i := range pre {
		pre[i] *= 8
	}
	run := func(v *vecOps) [][]float32 {
		g, c, tc, h, d, dc := clone(pre), make([]float32, hd), make([]float32, hd), make([]float32, hd), make([]float32, 4*hd), clone(dcIn)
		v.lstmFwd(g, cPrev, c, tc, h)
		v.lstmBwd(d, g, cPrev, tc, dy, dhRec, dc)
		return [][]float32{g, c, tc, h, d, dc}
	}
	want := run(genericVec)
	for _, name := range availableImpls() {
		got := run(implTable[name].vec)
		for s := range want {
			for k := range want[s] {
				atol := 1e-7
				if s >= 4 {
					atol = 1e-6
				}
				if !closeTo(got[s][k], float64(want[s][k]), atol, 2e-6) {
					t.Fatalf("output %d, element %d: generic %v, %s %v", s, k, want[s][k], name, got[s][k])
				}
			}
		}
	}
}
