package kernels

import "math"

// Scalar float32 exp and erf for the softmax and GELU kernels. The float64 versions
// in package math cost several times more than the products they feed; these keep the
// error well below float32 training noise (see fastmath_test.go for the bounds).

// exp32 returns e^x with a relative error below 1e-6 (a few ulps) for x in [−87, 88]; outside that
// range (and for NaN) it defers to math.Exp.
func exp32(x float32) float32 {
	if !(x > -87 && x < 88) {
		return float32(math.Exp(float64(x)))
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693145751953125
		ln2lo = 1.428606765330187045e-06
	)
	// x = n·ln2 + r with |r| ≤ ln2/2; e^r by its degree-6 Taylor polynomial
	// (remainder r⁷/7! < 7e-8), then scaled by 2^n through the exponent bits.
	fn := x * log2e
	var ni int32
	if fn >= 0 {
		ni = int32(fn + 0.5)
	} else {
		ni = int32(fn - 0.5)
	}
	n := float32(ni)
	r := x - n*ln2hi - n*ln2lo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return p * math.Float32frombits(uint32(ni+127)<<23)
}

// erfc32 returns erfc(x) = 1 − erf(x) with a relative error below 5e-7 for |x| < 2 and
// below 1e-5 on [−9, 9] (the Chebyshev fit of Numerical Recipes' erfcc, fractional
// error 1.2e-7, evaluated in float32; the rounding of x² dominates far out). GELU uses it as Φ(x) = erfc(−x/√2)/2, accurate relative to
// Φ also in the far negative tail, where 1 + erf(x) would cancel.
func erfc32(x float32) float32 {
	if x != x {
		return x
	}
	z := x
	if z < 0 {
		z = -z
	}
	t := 1 / (1 + 0.5*z)
	poly := -1.26551223 + t*(1.00002368+t*(0.37409196+t*(0.09678418+t*(-0.18628806+
		t*(0.27886807+t*(-1.13520398+t*(1.48851587+t*(-0.82215223+t*0.17087277))))))))
	r := t * exp32(-z*z+poly)
	if x < 0 {
		return 2 - r
	}
	return r
}

// The generic exponential kernels (vecOps.expSum, maxOf, gelu, geluBwd); the AVX-512
// path evaluates the same formulas sixteen lanes at a time (asmgen/mathvec.go).

func expSumGeneric(dst, x []float32, shift float32) float64 {
	var z float64
	for i, v := range x {
		e := exp32(v - shift)
		dst[i] = e
		z += float64(e)
	}
	return z
}

func maxGeneric(x []float32) float32 {
	mx := x[0]
	for _, v := range x[1:] {
		mx = max(mx, v)
	}
	return mx
}

// phi32 is Φ(x) = erfc(−x/√2)/2, accurate relative to Φ also in the far negative tail.
func phi32(x float32) float32 { return 0.5 * erfc32(-x*math.Sqrt2/2) }

func geluGeneric(y, cdf, x []float32) {
	for i, v := range x {
		c := phi32(v)
		if cdf != nil {
			cdf[i] = c
		}
		y[i] = v * c
	}
}

func geluBwdGeneric(dx, x, cdf, dy []float32, acc bool) {
	const invSqrt2Pi = 0.3989422804014327
	for i, v := range x {
		g := dy[i] * (cdf[i] + v*invSqrt2Pi*exp32(-0.5*v*v))
		if acc {
			dx[i] += g
		} else {
			dx[i] = g
		}
	}
}
