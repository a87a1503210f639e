package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// Vectorised exponential and exact-GELU kernels (AVX-512F) for the softmax,
// cross-entropy and GELU layers. They evaluate the formulas of the scalar exp32
// and erfc32 in fastmath.go — the degree-6 Taylor polynomial of e^r after the
// reduction x = n·ln2 + r, and Numerical Recipes' erfcc Chebyshev fit — with fused
// multiply-adds, and scale by 2^n with VSCALEFPS, which rounds subnormal results
// and overflows to +Inf as the scalar version's math.Exp fallback does.

// mathConsts are the float32 constants of the kernels, one table in RODATA read
// by embedded broadcasts (kc).
var mathConsts = []struct {
	name string
	v    float32
}{
	// e^x: x is clamped to [expLo, expHi] first (e^−104 rounds to 0, e^89 to +Inf),
	// so the reduction never sees a huge |x|.
	{"expLo", -104}, {"expHi", 89},
	{"log2e", 1.44269504088896341}, {"ln2hi", 0.693145751953125}, {"ln2lo", 1.428606765330187045e-06},
	{"c720", 1.0 / 720}, {"c120", 1.0 / 120}, {"c24", 1.0 / 24}, {"c6", 1.0 / 6}, {"half", 0.5}, {"one", 1},
	{"two", 2}, {"zero", 0}, {"negInf", float32(math.Inf(-1))},
	// GELU: erfc(−x/√2) and φ(x) = e^(−x²/2)/√(2π).
	{"negRsqrt2", -math.Sqrt2 / 2}, {"negHalf", -0.5}, {"invSqrt2Pi", 0.3989422804014327},
	// erfcc's polynomial in t, highest degree first.
	{"e9", 0.17087277}, {"e8", -0.82215223}, {"e7", 1.48851587}, {"e6", -1.13520398}, {"e5", 0.27886807},
	{"e4", -0.18628806}, {"e3", 0.09678418}, {"e2", 0.37409196}, {"e1", 1.00002368}, {"e0", -1.26551223},
	// tanh (lstm.go): e^(−2|x|), and below |x| = 1/16 tanh32's odd Taylor polynomial
	// x·(1 + x²(−1/3 + x²(2/15 − 17/315·x²))); negZero is the sign bit.
	{"negTwo", -2}, {"negZero", float32(math.Copysign(0, -1))}, {"tanhSmall", 0.0625},
	{"t7", -17.0 / 315}, {"t5", 2.0 / 15}, {"t3", -1.0 / 3},
}

var mathTable Mem

// genMathConsts emits the constant table (once, before the kernels that use it)
// and the absolute-value mask.
func genMathConsts() {
	mathTable = GLOBL("mathvec_consts", RODATA|NOPTR)
	for i, c := range mathConsts {
		DATA(4*i, U32(math.Float32bits(c.v))) // bits: no decimal round trip, and −Inf
	}
	DATA(4*len(mathConsts), U32(0x7fffffff))
}

// kc is the memory operand of the named constant (absMask: 0x7fffffff).
func kc(name string) Mem {
	if name == "absMask" {
		return mathTable.Offset(4 * len(mathConsts))
	}
	for i, c := range mathConsts {
		if c.name == name {
			return mathTable.Offset(4 * i)
		}
	}
	panic("asmgen: no constant " + name)
}

// splat broadcasts the named constant into a fresh zmm register.
func splat(name string) reg.VecVirtual {
	z := ZMM()
	VBROADCASTSS(kc(name), z)
	return z
}

// expRegs are the constants the exponential keeps in registers: the clamp bounds
// must be the first source of VMAXPS / VMINPS, so that a NaN x (the second source)
// is what they return.
type expRegs struct{ lo, hi reg.VecVirtual }

func loadExpRegs() expRegs { return expRegs{splat("expLo"), splat("expHi")} }

// emitExp replaces the 16 lanes of x by e^x. With a mask, the lanes outside it
// become 0.
func emitExp(x reg.VecVirtual, r expRegs, mask reg.Register) {
	VMAXPS(x, r.lo, x)
	VMINPS(x, r.hi, x)
	n := ZMM()
	VMULPS_BCST(kc("log2e"), x, n)
	VRNDSCALEPS(U8(8), n, n)             // round to nearest, no precision exception
	VFNMADD231PS_BCST(kc("ln2hi"), n, x) // r = x − n·ln2hi − n·ln2lo
	VFNMADD231PS_BCST(kc("ln2lo"), n, x)
	p := ZMM()
	VBROADCASTSS(kc("c720"), p)
	for _, c := range []string{"c120", "c24", "c6", "half", "one", "one"} {
		VFMADD213PS_BCST(kc(c), x, p) // p = r·p + c
	}
	if mask == nil {
		VSCALEFPS(n, p, x) // p·2^n
	} else {
		VSCALEFPS_Z(n, p, mask, x)
	}
}

// geluRegs are the registers the GELU kernels keep across the loop.
type geluRegs struct {
	exp      expRegs
	one, two reg.VecVirtual
}

// emitPhi returns Φ(v) = erfc(−v/√2)/2 for the 16 lanes of v (v is kept): erfc32's
// steps, z = |a|, t = 1/(1 + z/2), r = t·e^(−z² + poly(t)), erfc = 2 − r where a < 0.
func emitPhi(v reg.VecVirtual, g geluRegs) reg.VecVirtual {
	a, z, t := ZMM(), ZMM(), ZMM()
	VMULPS_BCST(kc("negRsqrt2"), v, a)
	VPANDD_BCST(kc("absMask"), a, z)
	VMOVAPS(g.one, t)
	VFMADD231PS_BCST(kc("half"), z, t) // 1 + z/2
	VDIVPS(t, g.one, t)                // t = 1/(1 + z/2)
	p := ZMM()
	VBROADCASTSS(kc("e9"), p)
	for _, c := range []string{"e8", "e7", "e6", "e5", "e4", "e3", "e2", "e1", "e0"} {
		VFMADD213PS_BCST(kc(c), t, p) // p = t·p + c
	}
	VFNMADD231PS(z, z, p) // −z² + poly
	emitExp(p, g.exp, nil)
	VMULPS(t, p, p) // r
	neg := K()
	VCMPPS_BCST(U8(0x11), kc("zero"), a, neg) // a < 0 (LT_OQ)
	VSUBPS(p, g.two, neg, p)                  // 2 − r there
	VMULPS_BCST(kc("half"), p, p)
	return p
}

func genMathVec() {
	genMathConsts()
	genExpSum()
	genMax()
	genGelu(avx512, false)
	genGelu(avx512, true)
	genGeluBwd(avx512, false)
	genGeluBwd(avx512, true)
	genLSTM(avx512)
}

// genExpSum emits expSumAVX512: dst[i] = e^(x[i]−shift) and the sum of the dst[i]
// accumulated in float64 (eight accumulators of 8 lanes, fixed order).
func genExpSum() {
	const name = "expSumAVX512"
	TEXT(name, NOSPLIT, "func(dst, x *float32, n int, shift float32) float64")
	Doc(name+" writes dst[i] = e^(x[i]-shift) for i < n and returns their sum, accumulated",
		"in float64 in a fixed order (AVX-512F).")
	d, x, n := gp("dst"), gp("x"), gp("n")
	zs := bcast("shift")
	r := loadExpRegs()
	acc := zeroed(8)
	stream(name, n, []reg.GPVirtual{d, x}, func(off int, mask reg.Register) {
		zx := ZMM()
		load(Mem{Base: x, Disp: off}, mask, zx)
		VSUBPS(zs, zx, zx)
		emitExp(zx, r, mask)
		store(zx, mask, Mem{Base: d, Disp: off})
		lo, hi, yh := ZMM(), ZMM(), YMM()
		VCVTPS2PD(zx.AsY(), lo)
		VEXTRACTF64X4(U8(1), zx, yh)
		VCVTPS2PD(yh, hi)
		a := acc[2*(off/64):]
		VADDPD(lo, a[0], a[0])
		VADDPD(hi, a[1], a[1])
	})
	for j := 0; j < 8; j += 2 {
		VADDPD(acc[j+1], acc[j], acc[j])
	}
	reduceTree([]reg.VecVirtual{acc[0], acc[2], acc[4], acc[6]}, VADDPD, VADDSD, true, 0)
	VZEROUPPER()
	RET()
}

// genMax emits maxAVX512: the largest of x[0:n] (n ≥ 1; NaNs are not propagated,
// the callers' exponentials carry them).
func genMax() {
	const name = "maxAVX512"
	TEXT(name, NOSPLIT, "func(x *float32, n int) float32")
	Doc(name+" returns the largest of x[i], i < n, n >= 1 (AVX-512F); a NaN may be skipped, callers",
		"propagate NaN through the values they compute from x.")
	x, n := gp("x"), gp("n")
	acc := []reg.VecVirtual{splat("negInf"), ZMM(), ZMM(), ZMM()}
	for _, z := range acc[1:] {
		VMOVAPS(acc[0], z)
	}
	stream(name, n, []reg.GPVirtual{x}, func(off int, mask reg.Register) {
		z := acc[off/64]
		if mask == nil {
			VMAXPS(Mem{Base: x, Disp: off}, z, z)
		} else {
			VMAXPS(Mem{Base: x, Disp: off}, z, mask, z) // lanes outside the mask keep z
		}
	})
	reduceTree(acc, VMAXPS, VMAXSS, false, 0)
	VZEROUPPER()
	RET()
}

// genGelu emits gelu<suffix> (y = x·Φ(x)) or, withCDF, geluCDF<suffix>, which also
// stores Φ(x) for the backward pass. Both compute y as the same x·Φ(x).
func genGelu(s *simd, withCDF bool) {
	name, sig := "gelu"+s.suffix, "func(y, x *float32, n int)"
	if withCDF {
		name, sig = "geluCDF"+s.suffix, "func(y, cdf, x *float32, n int)"
	}
	TEXT(name, NOSPLIT, sig)
	if withCDF {
		Doc(name + " computes cdf[i] = Φ(x[i]) and y[i] = x[i]·Φ(x[i]), the exact GELU, for i < n (" + s.doc + ").")
	} else {
		Doc(name + " computes y[i] = x[i]·Φ(x[i]), the exact GELU, for i < n (" + s.doc + ").")
	}
	y := gp("y")
	ptrs := []reg.GPVirtual{y}
	var c reg.GPVirtual
	if withCDF {
		c = gp("cdf")
		ptrs = append(ptrs, c)
	}
	x, n := gp("x"), gp("n")
	ptrs = append(ptrs, x)
	g := s.geluRegs()
	s.stream(name, n, ptrs, func(off int, mask reg.Register) {
		v := s.vec()
		s.load(Mem{Base: x, Disp: off}, mask, v)
		phi := s.phi(v, g)
		if withCDF {
			s.store(phi, mask, Mem{Base: c, Disp: off})
		}
		VMULPS(phi, v, v)
		s.store(v, mask, Mem{Base: y, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genGeluBwd emits geluBwdSet<suffix> / geluBwdAcc<suffix>: dx = (or +=)
// dy·(Φ(x) + x·φ(x)) with Φ(x) given.
func genGeluBwd(s *simd, acc bool) {
	name, op := "geluBwdSet"+s.suffix, "="
	if acc {
		name, op = "geluBwdAcc"+s.suffix, "+="
	}
	TEXT(name, NOSPLIT, "func(dx, x, cdf, dy *float32, n int)")
	Doc(name + " computes dx[i] " + op + " dy[i]·(cdf[i] + x[i]·φ(x[i])), the exact GELU's derivative with Φ(x) = cdf given, for i < n (" + s.doc + ").")
	dx, x, c, dy, n := gp("dx"), gp("x"), gp("cdf"), gp("dy"), gp("n")
	r := s.expRegs()
	s.stream(name, n, []reg.GPVirtual{dx, x, c, dy}, func(off int, mask reg.Register) {
		v, w, f, zc := s.vec(), s.vec(), s.vec(), s.vec()
		s.load(Mem{Base: x, Disp: off}, mask, v)
		s.load(Mem{Base: c, Disp: off}, mask, zc)
		VMULPS(v, v, w)
		s.mulK("negHalf", w, w)
		s.exp(w, r) // e^(−x²/2)
		s.mulK("invSqrt2Pi", v, f)
		VFMADD213PS(zc, w, f) // Φ + x·φ
		zg := s.vec()
		s.load(Mem{Base: dy, Disp: off}, mask, zg)
		VMULPS(zg, f, f)
		if acc {
			zd := s.vec()
			s.load(Mem{Base: dx, Disp: off}, mask, zd)
			VADDPS(zd, f, f)
		}
		s.store(f, mask, Mem{Base: dx, Disp: off})
	})
	VZEROUPPER()
	RET()
}
