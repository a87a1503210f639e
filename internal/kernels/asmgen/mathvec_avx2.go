package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The exponential, GELU and LSTM-cell kernels for AVX2 + FMA: mathvec.go's and lstm.go's
// formulas eight lanes at a time. AVX2 has no opmasks, embedded broadcasts or
// VSCALEFPS, so
//   - the constants are a second table with each value repeated over 32 bytes, read
//     as ymm memory operands (ky);
//   - the tail of fewer than 8 elements is loaded and stored with VMASKMOVPS, its mask
//     read from a table of eight all-ones and eight zero words (lanes outside it load
//     as 0 and are not stored), so every element goes through the same formula;
//   - 2^n is applied as two factors 2^⌊n/2⌋·2^(n−⌊n/2⌋), each a normal float32 for the
//     clamped n ∈ [−150, 128]: the first product is exact, the second rounds once, as
//     VSCALEFPS does (subnormal results rounded, +Inf past the range), so e^x is the
//     AVX-512 kernel's to the bit.

var mathTableY Mem

// genMathConstsY emits the 32-byte-wide constant table: mathConsts, then the absolute-
// value mask, the exponent bias 127, and the tail-mask words.
func genMathConstsY() {
	mathTableY = GLOBL("mathvec_consts8", RODATA|NOPTR)
	row := func(i int, bits uint32) {
		for l := range 8 {
			DATA(32*i+4*l, U32(bits))
		}
	}
	for i, c := range mathConsts {
		row(i, math.Float32bits(c.v))
	}
	k := len(mathConsts)
	row(k, 0x7fffffff)
	row(k+1, 127)
	row(k+2, 0xffffffff)
	row(k+3, 0)
}

// ky is the 32-byte memory operand of the named constant (absMask, bias: the integer
// 127, or one of mathConsts).
func ky(name string) Mem {
	switch name {
	case "absMask":
		return mathTableY.Offset(32 * len(mathConsts))
	case "bias":
		return mathTableY.Offset(32 * (len(mathConsts) + 1))
	}
	for i, c := range mathConsts {
		if c.name == name {
			return mathTableY.Offset(32 * i)
		}
	}
	panic("asmgen: no constant " + name)
}

// splatY loads the named constant into a fresh ymm register.
func splatY(name string) reg.VecVirtual {
	y := YMM()
	VMOVUPS(ky(name), y)
	return y
}

// streamY emits the loop of an AVX2 kernel: loop8x32's 32 and 8 elements per step,
// then a tail of n mod 8 elements; body(off, mask) processes 8 elements at byte offset
// off from every pointer, mask nil for whole vectors, else the tail's lane mask (loadY
// and storeY take it).
func streamY(name string, n reg.GPVirtual, ptrs []reg.GPVirtual, body func(off int, mask reg.VecVirtual)) {
	loop8x32(name, n, ptrs, func(off, _ int) { body(off, nil) }, name+"_tail")
	Label(name + "_tail")
	TESTQ(n, n)
	JE(LabelRef(name + "_done"))
	// Words 8−n … 15−n of the mask rows: n ones, then zeros.
	t := GP64()
	MOVQ(U32(8), t)
	SUBQ(n, t)
	m, base := YMM(), GP64()
	LEAQ(ky("bias").Offset(32), base)
	VMOVDQU(Mem{Base: base, Index: t, Scale: 4}, m)
	body(0, m)
	Label(name + "_done")
}

// loadY loads 8 floats, or the lanes of mask (the others 0).
func loadY(m Mem, mask reg.VecVirtual, y reg.VecVirtual) {
	if mask == nil {
		VMOVUPS(m, y)
	} else {
		VMASKMOVPS(m, mask, y)
	}
}

// storeY stores 8 floats, or the lanes of mask.
func storeY(y reg.VecVirtual, mask reg.VecVirtual, m Mem) {
	if mask == nil {
		VMOVUPS(y, m)
	} else {
		VMASKMOVPS(y, mask, m)
	}
}

func loadExpRegsY() expRegs { return expRegs{splatY("expLo"), splatY("expHi")} }

// emitExpY replaces the 8 lanes of x by e^x (emitExp's steps).
func emitExpY(x reg.VecVirtual, r expRegs) {
	VMAXPS(x, r.lo, x) // a NaN x is the second source: kept
	VMINPS(x, r.hi, x)
	n := YMM()
	VMULPS(ky("log2e"), x, n)
	VROUNDPS(U8(8), n, n) // to nearest, no precision exception
	VFNMADD231PS(ky("ln2hi"), n, x)
	VFNMADD231PS(ky("ln2lo"), n, x)
	p := splatY("c720")
	for _, c := range []string{"c120", "c24", "c6", "half", "one", "one"} {
		VFMADD213PS(ky(c), x, p)
	}
	lo, hi := YMM(), YMM()
	VCVTPS2DQ(n, hi) // exact: n is integral
	VPSRAD(U8(1), hi, lo)
	VPSUBD(lo, hi, hi)
	for _, e := range []reg.VecVirtual{lo, hi} {
		VPADDD(ky("bias"), e, e)
		VPSLLD(U8(23), e, e)
	}
	VMULPS(lo, p, p)
	VMULPS(hi, p, x)
}

// emitPhiY returns Φ(v) for the 8 lanes of v (v is kept), emitPhi's steps.
func emitPhiY(v reg.VecVirtual, g geluRegs) reg.VecVirtual {
	a, z, t := YMM(), YMM(), YMM()
	VMULPS(ky("negRsqrt2"), v, a)
	VANDPS(ky("absMask"), a, z)
	VMOVAPS(g.one, t)
	VFMADD231PS(ky("half"), z, t)
	VDIVPS(t, g.one, t)
	p := splatY("e9")
	for _, c := range []string{"e8", "e7", "e6", "e5", "e4", "e3", "e2", "e1", "e0"} {
		VFMADD213PS(ky(c), t, p)
	}
	VFNMADD231PS(z, z, p)
	emitExpY(p, g.exp)
	VMULPS(t, p, p)
	neg, q := YMM(), YMM()
	VCMPPS(U8(0x11), ky("zero"), a, neg) // a < 0 (LT_OQ)
	VSUBPS(p, g.two, q)
	VBLENDVPS(neg, q, p, p) // 2 − r there
	VMULPS(ky("half"), p, p)
	return p
}

func genMathVecAVX2() {
	genMathConstsY()
	genExpSumAVX2()
	genMaxAVX2()
	genGeluAVX2(false)
	genGeluAVX2(true)
	genGeluBwdAVX2(false)
	genGeluBwdAVX2(true)
	genLSTMFwdAVX2(false)
	genLSTMFwdAVX2(true)
	for _, prev := range []bool{false, true} {
		for _, rec := range []bool{false, true} {
			genLSTMBwdAVX2(prev, rec)
		}
	}
	genLayerNormAVX2()
}

// genExpSumAVX2 emits expSumAVX2, expSumAVX512 on ymm: element 8u+j of each group of
// 32 goes to the float64 accumulators 2(u mod 2) (j < 4) and 2(u mod 2)+1, so the order
// depends only on n.
func genExpSumAVX2() {
	const name = "expSumAVX2"
	TEXT(name, NOSPLIT, "func(dst, x *float32, n int, shift float32) float64")
	Doc(name+" writes dst[i] = e^(x[i]-shift) for i < n and returns their sum, accumulated",
		"in float64 in a fixed order (AVX2, FMA).")
	d, x, n := gp("dst"), gp("x"), gp("n")
	ys := YMM()
	VBROADCASTSS(paramAddr("shift"), ys)
	r := loadExpRegsY()
	acc := zeroedY(4)
	streamY(name, n, []reg.GPVirtual{d, x}, func(off int, mask reg.VecVirtual) {
		v := YMM()
		loadY(Mem{Base: x, Disp: off}, mask, v)
		VSUBPS(ys, v, v)
		emitExpY(v, r)
		if mask != nil {
			VANDPS(mask, v, v) // lanes past n add 0
		}
		storeY(v, mask, Mem{Base: d, Disp: off})
		lo, hi, h := YMM(), YMM(), XMM()
		VCVTPS2PD(v.AsX(), lo)
		VEXTRACTF128(U8(1), v, h)
		VCVTPS2PD(h, hi)
		a := acc[2*((off/32)%2):]
		VADDPD(lo, a[0], a[0])
		VADDPD(hi, a[1], a[1])
	})
	VADDPD(acc[1], acc[0], acc[0])
	VADDPD(acc[3], acc[2], acc[2])
	VADDPD(acc[2], acc[0], acc[0])
	h := XMM()
	VEXTRACTF128(U8(1), acc[0], h)
	VADDPD(h, acc[0].AsX(), h)
	t := XMM()
	VMOVHLPS(h, h, t)
	VADDSD(t, h, h)
	VMOVSD(h, retAddr(0))
	VZEROUPPER()
	RET()
}

// genMaxAVX2 emits maxAVX2, maxAVX512 on ymm: four accumulators from −Inf, the tail's
// missing lanes −Inf.
func genMaxAVX2() {
	const name = "maxAVX2"
	TEXT(name, NOSPLIT, "func(x *float32, n int) float32")
	Doc(name+" returns the largest of x[i], i < n, n >= 1 (AVX2); a NaN may be skipped, callers",
		"propagate NaN through the values they compute from x.")
	x, n := gp("x"), gp("n")
	ninf := splatY("negInf")
	acc := make([]reg.VecVirtual, 4)
	for i := range acc {
		acc[i] = YMM()
		VMOVAPS(ninf, acc[i])
	}
	streamY(name, n, []reg.GPVirtual{x}, func(off int, mask reg.VecVirtual) {
		a := acc[off/32]
		if mask == nil {
			VMAXPS(Mem{Base: x, Disp: off}, a, a)
			return
		}
		v := YMM()
		VMASKMOVPS(Mem{Base: x, Disp: off}, mask, v)
		VBLENDVPS(mask, v, ninf, v)
		VMAXPS(v, a, a)
	})
	VMAXPS(acc[1], acc[0], acc[0])
	VMAXPS(acc[3], acc[2], acc[2])
	VMAXPS(acc[2], acc[0], acc[0])
	h := XMM()
	VEXTRACTF128(U8(1), acc[0], h)
	VMAXPS(h, acc[0].AsX(), h)
	t := XMM()
	VMOVHLPS(h, h, t)
	VMAXPS(t, h, h)
	VMOVSHDUP(h, t)
	VMAXSS(t, h, h)
	VMOVSS(h, retAddr(0))
	VZEROUPPER()
	RET()
}

func loadGeluRegsY() geluRegs {
	return geluRegs{exp: loadExpRegsY(), one: splatY("one"), two: splatY("two")}
}

// genGeluAVX2 emits geluAVX2 or geluCDFAVX2 (genGelu's kernels on ymm).
func genGeluAVX2(withCDF bool) {
	name, sig := "geluAVX2", "func(y, x *float32, n int)"
	if withCDF {
		name, sig = "geluCDFAVX2", "func(y, cdf, x *float32, n int)"
	}
	TEXT(name, NOSPLIT, sig)
	if withCDF {
		Doc(name + " computes cdf[i] = Φ(x[i]) and y[i] = x[i]·Φ(x[i]), the exact GELU, for i < n (AVX2, FMA).")
	} else {
		Doc(name + " computes y[i] = x[i]·Φ(x[i]), the exact GELU, for i < n (AVX2, FMA).")
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
	g := loadGeluRegsY()
	streamY(name, n, ptrs, func(off int, mask reg.VecVirtual) {
		v := YMM()
		loadY(Mem{Base: x, Disp: off}, mask, v)
		phi := emitPhiY(v, g)
		if withCDF {
			storeY(phi, mask, Mem{Base: c, Disp: off})
		}
		VMULPS(phi, v, v)
		storeY(v, mask, Mem{Base: y, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genGeluBwdAVX2 emits geluBwdSetAVX2 / geluBwdAccAVX2 (genGeluBwd's kernels on ymm).
func genGeluBwdAVX2(acc bool) {
	name, op := "geluBwdSetAVX2", "="
	if acc {
		name, op = "geluBwdAccAVX2", "+="
	}
	TEXT(name, NOSPLIT, "func(dx, x, cdf, dy *float32, n int)")
	Doc(name + " computes dx[i] " + op + " dy[i]·(cdf[i] + x[i]·φ(x[i])), the exact GELU's derivative with Φ(x) = cdf given, for i < n (AVX2, FMA).")
	dx, x, c, dy, n := gp("dx"), gp("x"), gp("cdf"), gp("dy"), gp("n")
	r := loadExpRegsY()
	streamY(name, n, []reg.GPVirtual{dx, x, c, dy}, func(off int, mask reg.VecVirtual) {
		v, w, s, yc := YMM(), YMM(), YMM(), YMM()
		loadY(Mem{Base: x, Disp: off}, mask, v)
		loadY(Mem{Base: c, Disp: off}, mask, yc)
		VMULPS(v, v, w)
		VMULPS(ky("negHalf"), w, w)
		emitExpY(w, r) // e^(−x²/2)
		VMULPS(ky("invSqrt2Pi"), v, s)
		VFMADD213PS(yc, w, s) // Φ + x·φ
		yg := YMM()
		loadY(Mem{Base: dy, Disp: off}, mask, yg)
		VMULPS(yg, s, s)
		if acc {
			yd := YMM()
			loadY(Mem{Base: dx, Disp: off}, mask, yd)
			VADDPS(yd, s, s)
		}
		storeY(s, mask, Mem{Base: dx, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// emitSigmoidY replaces the 8 lanes of x by 1/(1 + e^−x) (emitSigmoid).
func emitSigmoidY(x reg.VecVirtual, r expRegs, one reg.VecVirtual) {
	VXORPS(ky("negZero"), x, x)
	emitExpY(x, r)
	VADDPS(one, x, x)
	VDIVPS(x, one, x)
}

// emitTanhY returns tanh of the 8 lanes of x (x is kept), emitTanh's steps.
func emitTanhY(x reg.VecVirtual, r expRegs, one reg.VecVirtual) reg.VecVirtual {
	a, e, num, y := YMM(), YMM(), YMM(), YMM()
	VANDPS(ky("absMask"), x, a)
	VMULPS(ky("negTwo"), a, e)
	emitExpY(e, r)
	VSUBPS(e, one, num) // 1 − e
	VADDPS(e, one, e)   // 1 + e
	VDIVPS(e, num, y)
	s := YMM()
	VANDPS(ky("negZero"), x, s)
	VORPS(s, y, y) // the sign of x
	x2, p := YMM(), YMM()
	VMULPS(x, x, x2)
	VMOVUPS(ky("t7"), p)
	VFMADD213PS(ky("t5"), x2, p)
	VFMADD213PS(ky("t3"), x2, p)
	VFMADD213PS(one, x2, p)
	VMULPS(p, x, p)
	small := YMM()
	VCMPPS(U8(0x11), ky("tanhSmall"), a, small) // a < 1/16 (LT_OQ: false for NaN)
	VBLENDVPS(small, p, y, y)                   // x·p there
	return y
}

// genLSTMFwdAVX2 emits lstmFwdAVX2 or lstmFwdPrevAVX2 (genLSTMFwd's kernels on ymm).
func genLSTMFwdAVX2(prev bool) {
	name, sig, cpDoc := "lstmFwdAVX2", "func(gates, c, tc, h *float32, n int)", "0"
	if prev {
		name, sig, cpDoc = "lstmFwdPrevAVX2", "func(gates, cPrev, c, tc, h *float32, n int)", "f·cPrev[k]"
	}
	TEXT(name, NOSPLIT, sig)
	Doc(name+" applies one LSTM row's gates for k < n: gates[k], gates[n+k], gates[3n+k] become",
		"their sigmoids i, f, o and gates[2n+k] its tanh g, then c[k] = "+cpDoc+" + i·g, tc[k] = tanh(c[k]),",
		"h[k] = o·tc[k] (AVX2, FMA).")
	g := gp("gates")
	ptrs := []reg.GPVirtual{g}
	var cp reg.GPVirtual
	if prev {
		cp = gp("cPrev")
		ptrs = append(ptrs, cp)
	}
	c, tc, h, n := gp("c"), gp("tc"), gp("h"), gp("n")
	ptrs = append(ptrs, c, tc, h)
	b1, b3 := blockBytes(n)
	r := loadExpRegsY()
	one := splatY("one")
	streamY(name, n, ptrs, func(off int, mask reg.VecVirtual) {
		var z [4]reg.VecVirtual
		for k := range z {
			z[k] = YMM()
			loadY(gateAddr(g, b1, b3, k, off), mask, z[k])
			if k == 2 {
				z[k] = emitTanhY(z[k], r, one)
			} else {
				emitSigmoidY(z[k], r, one)
			}
			storeY(z[k], mask, gateAddr(g, b1, b3, k, off))
		}
		cv := YMM()
		VMULPS(z[2], z[0], cv) // i·g
		if prev {
			yc := YMM()
			loadY(Mem{Base: cp, Disp: off}, mask, yc)
			VFMADD231PS(yc, z[1], cv) // + f·cPrev
		}
		storeY(cv, mask, Mem{Base: c, Disp: off})
		t := emitTanhY(cv, r, one)
		storeY(t, mask, Mem{Base: tc, Disp: off})
		VMULPS(t, z[3], t)
		storeY(t, mask, Mem{Base: h, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genLSTMBwdAVX2 emits lstmBwd{Prev}{Rec}AVX2 (genLSTMBwd's kernels on ymm).
func genLSTMBwdAVX2(prev, rec bool) {
	name, params := "lstmBwd", "d, a"
	if prev {
		name, params = name+"Prev", params+", cPrev"
	}
	params += ", tc, dy"
	if rec {
		name, params = name+"Rec", params+", dhRec"
	}
	name += "AVX2"
	TEXT(name, NOSPLIT, fmt.Sprintf("func(%s, dc *float32, n int)", params))
	cpDoc, dhDoc := "0", "dy"
	if prev {
		cpDoc = "cPrev"
	}
	if rec {
		dhDoc = "dy + dhRec"
	}
	Doc(name+" is the backward of one LSTM row for k < n, with acts a = (i, f, g, o) in four",
		"blocks of n, dh = "+dhDoc+", tc = tanh(c) and cp = "+cpDoc+": dc' = dc + dh·o·(1 − tc²);",
		"d = (dc'·g·i·(1−i), dc'·cp·f·(1−f), dc'·i·(1−g²), dh·tc·o·(1−o)); dc = dc'·f (AVX2, FMA).")
	d, a := gp("d"), gp("a")
	ptrs := []reg.GPVirtual{d, a}
	var cp, dr reg.GPVirtual
	if prev {
		cp = gp("cPrev")
		ptrs = append(ptrs, cp)
	}
	tc, dy := gp("tc"), gp("dy")
	ptrs = append(ptrs, tc, dy)
	if rec {
		dr = gp("dhRec")
		ptrs = append(ptrs, dr)
	}
	dc, n := gp("dc"), gp("n")
	ptrs = append(ptrs, dc)
	b1, b3 := blockBytes(n)
	one := splatY("one")
	var zero reg.VecVirtual
	if !prev {
		zero = YMM()
		VXORPS(zero, zero, zero)
	}
	streamY(name, n, ptrs, func(off int, mask reg.VecVirtual) {
		dh, t := YMM(), YMM()
		loadY(Mem{Base: dy, Disp: off}, mask, dh)
		if rec {
			yr := YMM()
			loadY(Mem{Base: dr, Disp: off}, mask, yr)
			VADDPS(yr, dh, dh)
		}
		var z [4]reg.VecVirtual
		for k := range z {
			z[k] = YMM()
			loadY(gateAddr(a, b1, b3, k, off), mask, z[k])
		}
		i, f, g, o := z[0], z[1], z[2], z[3]
		loadY(Mem{Base: tc, Disp: off}, mask, t)
		// dc' = dc + dh·o·(1 − t²)
		u, w, dcv := YMM(), YMM(), YMM()
		VMOVAPS(one, u)
		VFNMADD231PS(t, t, u)
		VMULPS(o, dh, w)
		VMULPS(u, w, w)
		loadY(Mem{Base: dc, Disp: off}, mask, dcv)
		VADDPS(w, dcv, dcv)
		oneMinus := func(v reg.VecVirtual) reg.VecVirtual {
			m := YMM()
			VSUBPS(v, one, m)
			return m
		}
		di := YMM()
		VMULPS(g, dcv, di)
		VMULPS(i, di, di)
		VMULPS(oneMinus(i), di, di)
		storeY(di, mask, gateAddr(d, b1, b3, 0, off))
		df, cpv := YMM(), zero
		if prev {
			cpv = YMM()
			loadY(Mem{Base: cp, Disp: off}, mask, cpv)
		}
		VMULPS(cpv, dcv, df)
		VMULPS(f, df, df)
		VMULPS(oneMinus(f), df, df)
		storeY(df, mask, gateAddr(d, b1, b3, 1, off))
		dg, u2 := YMM(), YMM()
		VMULPS(i, dcv, dg)
		VMOVAPS(one, u2)
		VFNMADD231PS(g, g, u2) // 1 − g²
		VMULPS(u2, dg, dg)
		storeY(dg, mask, gateAddr(d, b1, b3, 2, off))
		do := YMM()
		VMULPS(t, dh, do)
		VMULPS(o, do, do)
		VMULPS(oneMinus(o), do, do)
		storeY(do, mask, gateAddr(d, b1, b3, 3, off))
		VMULPS(f, dcv, dcv)
		storeY(dcv, mask, Mem{Base: dc, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// LayerNorm rows on AVX2 (layernorm.go's kernels on ymm, tails masked as above).

func genLayerNormAVX2() {
	genLNStatsAVX2()
	genLNApplyAVX2()
	genLNBwdStatsAVX2()
	genLNBwdDxAVX2(false)
	genLNBwdDxAVX2(true)
	genLNParamGradAVX2()
}

// widenY converts the 8 floats of y to two ymm of 4 float64 (lanes 0–3, 4–7).
func widenY(y reg.VecVirtual) (lo, hi reg.VecVirtual) {
	lo, hi = YMM(), YMM()
	h := XMM()
	VCVTPS2PD(y.AsX(), lo)
	VEXTRACTF128(U8(1), y, h)
	VCVTPS2PD(h, hi)
	return lo, hi
}

// sumAccPD adds four ymm float64 accumulators ((a0+a1)+(a2+a3), then halving) and
// stores the float64 result to return value i.
func sumAccPD(acc []reg.VecVirtual, i int) {
	VADDPD(acc[1], acc[0], acc[0])
	VADDPD(acc[3], acc[2], acc[2])
	VADDPD(acc[2], acc[0], acc[0])
	h := XMM()
	VEXTRACTF128(U8(1), acc[0], h)
	VADDPD(h, acc[0].AsX(), h)
	t := XMM()
	VMOVHLPS(h, h, t)
	VADDSD(t, h, h)
	VMOVSD(h, retAddr(i))
}

// genLNStatsAVX2 emits lnStatsAVX2: lnStatsAVX512's two float64 passes, element
// 8u+j of each group of 32 in accumulator 2(u mod 2) (j < 4) or 2(u mod 2)+1.
func genLNStatsAVX2() {
	const name = "lnStatsAVX2"
	TEXT(name, NOSPLIT, "func(x *float32, n int) (mean, ss float64)")
	Doc(name+" returns mean = sum x[i] / n and ss = sum (x[i]-mean)² for i < n, n >= 1, from the",
		"values widened to float64 and summed in float64 in a fixed order (AVX2, FMA).")
	x, n := gp("x"), gp("n")
	x2, n2 := GP64(), GP64()
	MOVQ(x, x2)
	MOVQ(n, n2)
	acc := zeroedY(4)
	streamY(name+"_sum", n, []reg.GPVirtual{x}, func(off int, mask reg.VecVirtual) {
		v := YMM()
		loadY(Mem{Base: x, Disp: off}, mask, v) // lanes past n are 0
		lo, hi := widenY(v)
		a := acc[2*((off/32)%2):]
		VADDPD(lo, a[0], a[0])
		VADDPD(hi, a[1], a[1])
	})
	sumAccPD(acc, 0)
	mean := XMM()
	VMOVSD(retAddr(0), mean)
	fn := XMM()
	VCVTSI2SDQ(n2, fn, fn)
	VDIVSD(fn, mean, mean)
	VMOVSD(mean, retAddr(0))
	ymu := YMM()
	VBROADCASTSD(mean, ymu)
	acc = zeroedY(4)
	streamY(name+"_dev", n2, []reg.GPVirtual{x2}, func(off int, mask reg.VecVirtual) {
		v := YMM()
		loadY(Mem{Base: x2, Disp: off}, mask, v)
		lo, hi := widenY(v)
		VSUBPD(ymu, lo, lo)
		VSUBPD(ymu, hi, hi)
		if mask != nil {
			// Lanes past n (x − mean = −mean there) add 0: the mask widened to 64 bits.
			mlo, mhi, h := YMM(), YMM(), XMM()
			VPMOVSXDQ(mask.AsX(), mlo)
			VEXTRACTF128(U8(1), mask, h)
			VPMOVSXDQ(h, mhi)
			VANDPD(mlo, lo, lo)
			VANDPD(mhi, hi, hi)
		}
		a := acc[2*((off/32)%2):]
		VFMADD231PD(lo, lo, a[0])
		VFMADD231PD(hi, hi, a[1])
	})
	sumAccPD(acc, 1)
	VZEROUPPER()
	RET()
}

func genLNApplyAVX2() {
	const name = "lnApplyAVX2"
	TEXT(name, NOSPLIT, "func(y, x, gamma, beta *float32, n int, mu, inv float32)")
	Doc(name + " computes y[i] = (x[i]-mu)*inv*gamma[i] + beta[i] for i < n (AVX2, the last step fused).")
	y, x, g, b, n := gp("y"), gp("x"), gp("gamma"), gp("beta"), gp("n")
	ymu, yinv := bcastY("mu"), bcastY("inv")
	streamY(name, n, []reg.GPVirtual{y, x, g, b}, func(off int, mask reg.VecVirtual) {
		vx, vg, vb := YMM(), YMM(), YMM()
		loadY(Mem{Base: x, Disp: off}, mask, vx)
		loadY(Mem{Base: g, Disp: off}, mask, vg)
		loadY(Mem{Base: b, Disp: off}, mask, vb)
		VSUBPS(ymu, vx, vx)
		VMULPS(yinv, vx, vx)
		VFMADD231PS(vg, vx, vb)
		storeY(vb, mask, Mem{Base: y, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// lnGradHatY is lnGradHat on ymm: dy·gamma and x̂ = (x−mu)·inv, both 0 outside the
// mask.
func lnGradHatY(dy, x, g reg.GPVirtual, off int, mask, ymu, yinv reg.VecVirtual) (gg, xh reg.VecVirtual) {
	gg, xh = YMM(), YMM()
	vg := YMM()
	loadY(Mem{Base: dy, Disp: off}, mask, gg)
	loadY(Mem{Base: x, Disp: off}, mask, xh)
	loadY(Mem{Base: g, Disp: off}, mask, vg)
	VMULPS(vg, gg, gg)
	VSUBPS(ymu, xh, xh)
	VMULPS(yinv, xh, xh)
	if mask != nil {
		VANDPS(mask, xh, xh)
	}
	return gg, xh
}

func genLNBwdStatsAVX2() {
	const name = "lnBwdStatsAVX2"
	TEXT(name, NOSPLIT, "func(dy, x, gamma *float32, n int, mu, inv float32) (s1, s2 float32)")
	Doc(name+" returns s1 = sum dy[i]*gamma[i] and s2 = sum dy[i]*gamma[i]*(x[i]-mu)*inv for i < n",
		"(AVX2, FMA); fixed summation order.")
	dy, x, g, n := gp("dy"), gp("x"), gp("gamma"), gp("n")
	ymu, yinv := bcastY("mu"), bcastY("inv")
	s1, s2 := zeroedY(4), zeroedY(4)
	streamY(name, n, []reg.GPVirtual{dy, x, g}, func(off int, mask reg.VecVirtual) {
		gg, xh := lnGradHatY(dy, x, g, off, mask, ymu, yinv)
		VADDPS(gg, s1[off/32], s1[off/32])
		VFMADD231PS(xh, gg, s2[off/32])
	})
	VMOVSS(reduceY(s1), retAddr(0))
	VMOVSS(reduceY(s2), retAddr(1))
	VZEROUPPER()
	RET()
}

func genLNBwdDxAVX2(acc bool) {
	name, op := "lnBwdDxSetAVX2", "="
	if acc {
		name, op = "lnBwdDxAccAVX2", "+="
	}
	TEXT(name, NOSPLIT, "func(dx, dy, x, gamma *float32, n int, mu, inv, s1, s2 float32)")
	Doc(name + " computes dx[i] " + op + " inv*(dy[i]*gamma[i] - s1 - (x[i]-mu)*inv*s2) for i < n (AVX2, FMA).")
	dx, dy, x, g, n := gp("dx"), gp("dy"), gp("x"), gp("gamma"), gp("n")
	ymu, yinv, ys1, ys2 := bcastY("mu"), bcastY("inv"), bcastY("s1"), bcastY("s2")
	streamY(name, n, []reg.GPVirtual{dx, dy, x, g}, func(off int, mask reg.VecVirtual) {
		gg, xh := lnGradHatY(dy, x, g, off, mask, ymu, yinv)
		VSUBPS(ys1, gg, gg)       // − s1
		VFNMADD231PS(ys2, xh, gg) // − x̂·s2
		if acc {
			o := YMM()
			loadY(Mem{Base: dx, Disp: off}, mask, o)
			VFMADD231PS(yinv, gg, o)
			storeY(o, mask, Mem{Base: dx, Disp: off})
			return
		}
		VMULPS(yinv, gg, gg)
		storeY(gg, mask, Mem{Base: dx, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genLNParamGradAVX2 emits lnParamGradAVX2: 32 columns (four 8-lane strips, four
// independent FMA chains) of the dgamma / dbeta column sums over all rows, in row
// order; the Go wrapper runs the columns past the last whole 32 through the Go loop.
func genLNParamGradAVX2() {
	const name = "lnParamGradAVX2"
	TEXT(name, NOSPLIT, "func(sg, sb, dy, x, mean, rstd *float32, rows, d int)")
	Doc(name+" adds, for the columns i < 32, sum over r < rows of dy[r*d+i]*(x[r*d+i]-mean[r])*rstd[r]",
		"to sg[i] and of dy[r*d+i] to sb[i], in row order (AVX2, FMA).")
	sg, sb, dy, x := gp("sg"), gp("sb"), gp("dy"), gp("x")
	mp, rp, rows, d := gp("mean"), gp("rstd"), gp("rows"), gp("d")
	const strips = 4
	var vsg, vsb [strips]reg.VecVirtual
	for j := range strips {
		vsg[j], vsb[j] = YMM(), YMM()
		VMOVUPS(Mem{Base: sg, Disp: 32 * j}, vsg[j])
		VMOVUPS(Mem{Base: sb, Disp: 32 * j}, vsb[j])
	}
	SHLQ(U8(2), d) // row stride in bytes
	Label(name + "_row")
	TESTQ(rows, rows)
	JE(LabelRef(name + "_done"))
	ymu, yinv := YMM(), YMM()
	VBROADCASTSS(Mem{Base: mp}, ymu)
	VBROADCASTSS(Mem{Base: rp}, yinv)
	for j := range strips {
		vd, vx := YMM(), YMM()
		VMOVUPS(Mem{Base: dy, Disp: 32 * j}, vd)
		VMOVUPS(Mem{Base: x, Disp: 32 * j}, vx)
		VSUBPS(ymu, vx, vx)
		VMULPS(vd, vx, vx) // dy·(x−mean)
		VFMADD231PS(yinv, vx, vsg[j])
		VADDPS(vd, vsb[j], vsb[j])
	}
	ADDQ(d, dy)
	ADDQ(d, x)
	ADDQ(U8(4), mp)
	ADDQ(U8(4), rp)
	DECQ(rows)
	JMP(LabelRef(name + "_row"))
	Label(name + "_done")
	for j := range strips {
		VMOVUPS(vsg[j], Mem{Base: sg, Disp: 32 * j})
		VMOVUPS(vsb[j], Mem{Base: sb, Disp: 32 * j})
	}
	VZEROUPPER()
	RET()
}
