package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The AVX2 + FMA side of the exponential, GELU, LSTM-cell and LayerNorm kernels: the
// primitives the shared bodies (mathvec.go, lstm.go, layernorm.go through simd.go's avx2)
// run on, and the kernels whose tails differ from AVX-512's (expSum, max, the LayerNorm
// statistics and column sums). AVX2 has no opmasks, embedded broadcasts or VSCALEFPS, so
//   - the constants are a second table with each value repeated over 32 bytes, read
//     as ymm memory operands (ky);
//   - the tail of fewer than 8 elements is loaded and stored with VMASKMOVPS, its mask
//     read from a table of eight all-ones and eight zero words (lanes outside it load
//     as 0 and are not stored), so every element goes through the same formula;
//   - 2^n is applied as two factors 2^⌊n/2⌋·2^(n−⌊n/2⌋), each a normal float32 for the
//     clamped n ∈ [−150, 128]: the first product is exact, the second rounds once, as
//     VSCALEFPS does (subnormal results rounded, +Inf past the range).

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
func streamY(name string, n reg.GPVirtual, ptrs []reg.GPVirtual, body func(off int, mask reg.Register)) {
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
func loadY(m Mem, mask reg.Register, y reg.VecVirtual) {
	if mask == nil {
		VMOVUPS(m, y)
	} else {
		VMASKMOVPS(m, mask, y)
	}
}

// storeY stores 8 floats, or the lanes of mask.
func storeY(y reg.VecVirtual, mask reg.Register, m Mem) {
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
	genGelu(avx2, false)
	genGelu(avx2, true)
	genGeluBwd(avx2, false)
	genGeluBwd(avx2, true)
	genLSTM(avx2)
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
	streamY(name, n, []reg.GPVirtual{d, x}, func(off int, mask reg.Register) {
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
	sumAccPD(acc, 0)
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
	streamY(name, n, []reg.GPVirtual{x}, func(off int, mask reg.Register) {
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
	VMOVSS(reduceYWith(acc, VMAXPS, VMAXSS), retAddr(0))
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

// LayerNorm rows on AVX2 (layernorm.go's kernels on ymm, tails masked as above).

func genLayerNormAVX2() {
	genLNStatsAVX2()
	genLNApply(avx2)
	genLNBwdStats(avx2)
	genLNBwdDx(avx2, false)
	genLNBwdDx(avx2, true)
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
	streamY(name+"_sum", n, []reg.GPVirtual{x}, func(off int, mask reg.Register) {
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
	streamY(name+"_dev", n2, []reg.GPVirtual{x2}, func(off int, mask reg.Register) {
		v := YMM()
		loadY(Mem{Base: x2, Disp: off}, mask, v)
		lo, hi := widenY(v)
		VSUBPD(ymu, lo, lo)
		VSUBPD(ymu, hi, hi)
		if mask != nil {
			// Lanes past n (x − mean = −mean there) add 0: the mask widened to 64 bits.
			mlo, mhi, h := YMM(), YMM(), XMM()
			VPMOVSXDQ(mask.(reg.VecVirtual).AsX(), mlo)
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
