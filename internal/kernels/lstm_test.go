package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestTanhSigmoid32Accuracy(t *testing.T) {
	worstT, worstS := 0.0, 0.0
	for x := float32(-30); x < 30; x += 0.000917 {
		if e := math.Abs(float64(tanh32(x)) - math.Tanh(float64(x))); e > worstT {
			worstT = e
		}
		want := 1 / (1 + math.Exp(-float64(x)))
		if e := math.Abs(float64(sigmoid32(x))-want) / want; e > worstS {
			worstS = e
		}
	}
	if worstT > 2e-7 || worstS > 1e-6 {
		t.Fatalf("tanh32 absolute error %g (want < 2e-7), sigmoid32 relative error %g (want < 1e-6)", worstT, worstS)
	}
	if tanh32(1e-30) != 1e-30 || tanh32(100) != 1 || tanh32(-100) != -1 || !math.IsNaN(float64(tanh32(float32(math.NaN())))) {
		t.Fatal("tanh32: tiny, saturated or NaN inputs mishandled")
	}
	if sigmoid32(-200) != 0 || sigmoid32(200) != 1 {
		t.Fatal("sigmoid32: saturated inputs mishandled")
	}
}

// lstmRef is the float64 reference of one step (forward and backward) for row-major rows.
func lstmRef(pre, cPrev, dy, dcIn []float64, n, hd int) (acts, c, h, dPre, dcOut []float64) {
	sig := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	acts, dPre = make([]float64, n*4*hd), make([]float64, n*4*hd)
	c, h, dcOut = make([]float64, n*hd), make([]float64, n*hd), make([]float64, n*hd)
	for r := 0; r < n; r++ {
		for k := 0; k < hd; k++ {
			b := r * 4 * hd
			i, f, g, o := sig(pre[b+k]), sig(pre[b+hd+k]), math.Tanh(pre[b+2*hd+k]), sig(pre[b+3*hd+k])
			acts[b+k], acts[b+hd+k], acts[b+2*hd+k], acts[b+3*hd+k] = i, f, g, o
			cv := f*cPrev[r*hd+k] + i*g
			t := math.Tanh(cv)
			c[r*hd+k], h[r*hd+k] = cv, o*t
			dh := dy[r*hd+k]
			dc := dcIn[r*hd+k] + dh*o*(1-t*t)
			dPre[b+k] = dc * g * i * (1 - i)
			dPre[b+hd+k] = dc * cPrev[r*hd+k] * f * (1 - f)
			dPre[b+2*hd+k] = dc * i * (1 - g*g)
			dPre[b+3*hd+k] = dh * t * o * (1 - o)
			dcOut[r*hd+k] = dc * f
		}
	}
	return
}

func TestLSTMCellAgainstFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ n, hd int }{{1, 1}, {3, 5}, {20, 200}, {64, 300}} { // the last two run on the pool
		n, hd := tc.n, tc.hd
		r32 := func(k int, scale float64) ([]float32, []float64) {
			a, b := make([]float32, k), make([]float64, k)
			for i := range a {
				a[i] = float32(rng.NormFloat64() * scale)
				b[i] = float64(a[i])
			}
			return a, b
		}
		pre, pre64 := r32(n*4*hd, 2)
		cp, cp64 := r32(n*hd, 1)
		dy, dy64 := r32(n*hd, 1)
		dcIn, dc64 := r32(n*hd, 1)
		acts, c, hh, dPre, dcOut := lstmRef(pre64, cp64, dy64, dc64, n, hd)

		c32, tc32 := make([]float32, n*hd), make([]float32, n*hd)
		h32 := make([]float32, n*2*hd) // strided: ldh = 2·hidden
		LSTMCellForward(pre, cp, c32, tc32, h32, 2*hd, n, hd)
		lstmClose(t, "acts", pre, acts, 1e-6)
		lstmClose(t, "c", c32, c, 1e-6)
		hs := make([]float32, n*hd)
		for r := 0; r < n; r++ {
			copy(hs[r*hd:(r+1)*hd], h32[r*2*hd:])
		}
		lstmClose(t, "h", hs, hh, 1e-6)

		// Backward with dy split into a strided dy and dhRec (their sum is the reference's dy).
		dyS, dhRec := make([]float32, n*3*hd), make([]float32, n*hd)
		for r := 0; r < n; r++ {
			for k := 0; k < hd; k++ {
				dhRec[r*hd+k] = 0.25 * dy[r*hd+k]
				dyS[r*3*hd+k] = dy[r*hd+k] - dhRec[r*hd+k]
			}
		}
		dG := make([]float32, n*4*hd)
		LSTMCellBackward(dG, pre, cp, tc32, dyS, 3*hd, dhRec, dcIn, n, hd)
		lstmClose(t, "dGates", dG, dPre, 1e-5)
		lstmClose(t, "dc", dcIn, dcOut, 1e-5)
	}
}

func TestLSTMCellZeroState(t *testing.T) {
	// cPrev nil is the zero state: the same as passing zeros.
	n, hd := 2, 3
	pre := []float32{0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2, 1.3, -1.4, 1.5, -1.6, 1.7, -1.8, 1.9, 2.0, -2.1, 2.2, -2.3, 2.4}
	a, b := append([]float32(nil), pre...), append([]float32(nil), pre...)
	c1, t1, h1 := make([]float32, n*hd), make([]float32, n*hd), make([]float32, n*hd)
	c2, t2, h2 := make([]float32, n*hd), make([]float32, n*hd), make([]float32, n*hd)
	LSTMCellForward(a, nil, c1, t1, h1, hd, n, hd)
	LSTMCellForward(b, make([]float32, n*hd), c2, t2, h2, hd, n, hd)
	for i := range h1 {
		if h1[i] != h2[i] || c1[i] != c2[i] {
			t.Fatalf("nil cPrev differs from zeros at %d", i)
		}
	}
}

func lstmClose(t *testing.T, name string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i := range got {
		if d := math.Abs(float64(got[i]) - want[i]); d > tol*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], want[i])
		}
	}
}
