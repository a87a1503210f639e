package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// Layer kernels (ReLU backward, SGD, max-pool, and mathvec.go's
// exponential, softmax and GELU kernels), emitted with -layers
// into layers_amd64.s / layers_stub_amd64.go. All AVX-512F, but for the AVX2
// kernels that follow genMathVecAVX2.

func genLayers() {
	genReluBwdSet()
	genSGD(avx512, false)
	genSGD(avx512, true)
	genSGDPlain(avx512)
	genMaxPool2x2()
	genMathVec()
	genMathVecAVX2()
	genLayerNorm()
	// The AVX2 SGD steps read their tail masks from the table genMathVecAVX2 emits.
	genSGD(avx2, false)
	genSGD(avx2, true)
	genSGDPlain(avx2)
	genMaxPoolWindowAVX2()
	genBatchNormNHWCAVX2()
}

// bcast broadcasts a float32 parameter into a fresh zmm register.
func bcast(name string) reg.VecVirtual {
	z := ZMM()
	VBROADCASTSS(paramAddr(name), z)
	return z
}

// reduce4 sums four zmm accumulators ((a0+a1)+(a2+a3), then a halving tree) and
// stores the scalar to return value i.
func reduce4(acc []reg.VecVirtual, i int) { reduceTree(acc, VADDPS, VADDSS, false, i) }

// reduceTree combines four zmm accumulators with the packed operation op
// ((a0∘a1)∘(a2∘a3), then halving 512 → 256 → 128 bits, and on to one element, the
// last step with the scalar op1) and stores the result, a float64 when f64, a float32
// otherwise, to return value i.
func reduceTree(acc []reg.VecVirtual, op, op1 func(...Op), f64 bool, i int) {
	op(acc[1], acc[0], acc[0])
	op(acc[3], acc[2], acc[2])
	op(acc[2], acc[0], acc[0])
	hi := YMM()
	VEXTRACTF64X4(U8(1), acc[0], hi)
	op(hi, acc[0].AsY(), hi)
	h := XMM()
	VEXTRACTF32X4(U8(1), hi, h)
	op(h, hi.AsX(), h)
	t := XMM()
	VMOVHLPS(h, h, t)
	ret, err := ReturnIndex(i).Resolve()
	if err != nil {
		panic(err)
	}
	if f64 {
		op1(t, h, h)
		VMOVSD(h, ret.Addr)
		return
	}
	op(t, h, h)
	VMOVSHDUP(h, t)
	op1(t, h, h)
	VMOVSS(h, ret.Addr)
}

func zeroed(k int) []reg.VecVirtual {
	acc := make([]reg.VecVirtual, k)
	for i := range acc {
		acc[i] = ZMM()
		VPXORD(acc[i], acc[i], acc[i])
	}
	return acc
}

func genReluBwdSet() {
	const name = "reluBwdSetAVX512"
	TEXT(name, NOSPLIT, "func(dx, y, dy *float32, n int)")
	Doc(name + " computes dx[i] = dy[i] where y[i] > 0, else 0, for i < n (AVX-512F).")
	dx, y, dy, n := gp("dx"), gp("y"), gp("dy"), gp("n")
	zero := ZMM()
	VPXORD(zero, zero, zero)
	stream(name, n, []reg.GPVirtual{dx, y, dy}, func(off int, mask reg.Register) {
		zy, zd := ZMM(), ZMM()
		// Masked-off tail lanes load y = 0, so the compare excludes them.
		load(Mem{Base: y, Disp: off}, mask, zy)
		kp := K()
		VCMPPS(U8(0x1e), zero, zy, kp) // y > 0 (GT_OQ)
		VMOVUPS_Z(Mem{Base: dy, Disp: off}, kp, zd)
		store(zd, mask, Mem{Base: dx, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genSGD emits sgdMom<suffix> or sgdNesterov<suffix>.
func genSGD(s *simd, nesterov bool) {
	name := "sgdMom" + s.suffix
	doc := "w -= lr*buf"
	if nesterov {
		name, doc = "sgdNesterov"+s.suffix, "w -= lr*(d + mom*buf)"
	}
	TEXT(name, NOSPLIT, "func(w, grad, buf *float32, n int, lr, wd, mom, damp float32)")
	Doc(name + " applies d = grad + wd*w; buf = mom*buf + damp*d; " + doc + " for i < n (" + s.doc + ").")
	w, g, b, n := gp("w"), gp("grad"), gp("buf"), gp("n")
	zlr, zwd, zmom, zdamp := s.param("lr"), s.param("wd"), s.param("mom"), s.param("damp")
	s.stream(name, n, []reg.GPVirtual{w, g, b}, func(off int, mask reg.Register) {
		zw, d, zb, t := s.vec(), s.vec(), s.vec(), s.vec()
		s.load(Mem{Base: w, Disp: off}, mask, zw)
		s.load(Mem{Base: g, Disp: off}, mask, d)
		s.load(Mem{Base: b, Disp: off}, mask, zb)
		VFMADD231PS(zw, zwd, d)  // d = g + wd*w
		VMULPS(zdamp, d, t)      // t = damp*d
		VFMADD231PS(zb, zmom, t) // t = mom*buf + damp*d
		s.store(t, mask, Mem{Base: b, Disp: off})
		if nesterov {
			VFMADD231PS(t, zmom, d) // d = d + mom*buf
			VFNMADD231PS(d, zlr, zw)
		} else {
			VFNMADD231PS(t, zlr, zw) // w -= lr*buf
		}
		s.store(zw, mask, Mem{Base: w, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genSGDPlain emits sgdPlain<suffix>.
func genSGDPlain(s *simd) {
	name := "sgdPlain" + s.suffix
	TEXT(name, NOSPLIT, "func(w, grad *float32, n int, lr, wd float32)")
	Doc(name + " applies w -= lr*(grad + wd*w) for i < n (" + s.doc + ").")
	w, g, n := gp("w"), gp("grad"), gp("n")
	zlr, zwd := s.param("lr"), s.param("wd")
	s.stream(name, n, []reg.GPVirtual{w, g}, func(off int, mask reg.Register) {
		zw, d := s.vec(), s.vec()
		s.load(Mem{Base: w, Disp: off}, mask, zw)
		s.load(Mem{Base: g, Disp: off}, mask, d)
		VFMADD231PS(zw, zwd, d)
		VFNMADD231PS(d, zlr, zw)
		s.store(zw, mask, Mem{Base: w, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genMaxPool2x2 emits the 2×2 stride-2 max-pool of one pair of input rows:
// y[j] = max of r0[2j], r0[2j+1], r1[2j], r1[2j+1] (first maximum wins, a NaN
// always replaces the choice), arg[j] = base + 2j + {0, 1, w, w+1}.
func genMaxPool2x2() {
	const name = "maxPool2x2RowAVX512"
	evens := GLOBL("maxpool_evens", RODATA|NOPTR)
	for i := range 16 {
		DATA(4*i, U32(2*i))
	}
	odds := GLOBL("maxpool_odds", RODATA|NOPTR)
	for i := range 16 {
		DATA(4*i, U32(2*i+1))
	}
	TEXT(name, NOSPLIT, "func(y *float32, arg *int32, r0, r1 *float32, n int, base, w int32)")
	Doc(name+" max-pools two input rows r0, r1 (2n elements each) into y[0:n] with",
		"argmax indices arg[j] = base + 2j + {0, 1, w, w+1} (AVX-512F).")
	y, arg, r0, r1, n := gp("y"), gp("arg"), gp("r0"), gp("r1"), gp("n")
	ie, io := ZMM(), ZMM()
	VMOVDQU32(evens, ie)
	VMOVDQU32(odds, io)
	zbase, zw, zw1, zone, z32 := ZMM(), ZMM(), ZMM(), ZMM(), ZMM()
	t := GP32()
	// (vet's asmdecl wants 4-byte loads of int32 arguments, so go through t.)
	MOVL(paramAddr("base"), t)
	VPBROADCASTD(t, zbase)
	VPADDD(ie, zbase, zbase) // base + 2j for j = 0..15
	MOVL(paramAddr("w"), t)
	VPBROADCASTD(t, zw)
	MOVL(U32(1), t)
	VPBROADCASTD(t, zone)
	VPADDD(zone, zw, zw1)
	MOVL(U32(32), t)
	VPBROADCASTD(t, z32)

	// body pools 16 outputs from four zmm tables (a0, a1) = r0, (b0, b1) = r1.
	body := func(a0, b0 reg.VecVirtual, a1m, b1m Op, mask reg.Register) {
		best, ao, be, bo := ZMM(), ZMM(), ZMM(), ZMM()
		VMOVAPS(a0, best)
		VMOVAPS(a0, ao)
		VMOVAPS(b0, be)
		VMOVAPS(b0, bo)
		VPERMT2PS(a1m, ie, best)
		VPERMT2PS(a1m, io, ao)
		VPERMT2PS(b1m, ie, be)
		VPERMT2PS(b1m, io, bo)
		idx := ZMM()
		VMOVDQA32(zbase, idx)
		for _, c := range []struct {
			v   reg.VecVirtual
			off reg.VecVirtual
		}{{ao, zone}, {be, zw}, {bo, zw1}} {
			k1, k2 := K(), K()
			VCMPPS(U8(0x1e), best, c.v, k1) // v > best (GT_OQ)
			VCMPPS(U8(0x03), c.v, c.v, k2)  // v is NaN (UNORD_Q)
			KORW(k2, k1, k1)
			VMOVAPS(c.v, k1, best)
			VPADDD(c.off, zbase, k1, idx)
		}
		if mask == nil {
			VMOVUPS(best, Mem{Base: y})
			VMOVDQU32(idx, Mem{Base: arg})
		} else {
			VMOVUPS(best, mask, Mem{Base: y})
			VMOVDQU32(idx, mask, Mem{Base: arg})
		}
	}

	Label(name + "_loop16")
	CMPQ(n, U8(16))
	JL(LabelRef(name + "_tail"))
	{
		a0, b0 := ZMM(), ZMM()
		VMOVUPS(Mem{Base: r0}, a0)
		VMOVUPS(Mem{Base: r1}, b0)
		body(a0, b0, Mem{Base: r0, Disp: 64}, Mem{Base: r1, Disp: 64}, nil)
	}
	VPADDD(z32, zbase, zbase)
	ADDQ(U32(128), r0)
	ADDQ(U32(128), r1)
	ADDQ(U8(64), y)
	ADDQ(U8(64), arg)
	SUBQ(U8(16), n)
	JMP(LabelRef(name + "_loop16"))

	Label(name + "_tail")
	TESTQ(n, n)
	JE(LabelRef(name + "_done"))
	{
		// 1 <= n < 16 outputs: 2n inputs per row, split over two 16-lane masks.
		m, lo, hi, c := GP32(), GP32(), GP32(), GP32()
		MOVL(U32(0xffff), m)
		BZHIL(n.As32(), m, m) // output mask: n lanes
		km := K()
		KMOVW(m, km)
		MOVL(n.As32(), c)
		SHLL(U8(1), c) // 2n
		MOVL(U32(0xffff), lo)
		BZHIL(c, lo, lo) // min(2n, 16) lanes (BZHI saturates at 32 bits)
		SUBL(U8(16), c)  // 2n-16, negative when n < 8
		MOVL(U32(0), hi)
		CMPL(c, U8(0))
		JLE(LabelRef(name + "_hiz"))
		MOVL(U32(0xffff), hi)
		BZHIL(c, hi, hi)
		Label(name + "_hiz")
		klo, khi := K(), K()
		KMOVW(lo, klo)
		KMOVW(hi, khi)
		a0, a1, b0, b1 := ZMM(), ZMM(), ZMM(), ZMM()
		VMOVUPS_Z(Mem{Base: r0}, klo, a0)
		VMOVUPS_Z(Mem{Base: r0, Disp: 64}, khi, a1)
		VMOVUPS_Z(Mem{Base: r1}, klo, b0)
		VMOVUPS_Z(Mem{Base: r1, Disp: 64}, khi, b1)
		body(a0, b0, a1, b1, km)
	}
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// genMaxPoolWindowAVX2 emits the channels-last max-pool of one output pixel: for
// each block of 8 channels, the maximum over a rows×cols window of taps (tap
// (r, s) at x + r·rs + s·cs bytes, pixel index base + r·w + s) visited in
// row-major order, a later tap replacing the choice when it is greater or NaN
// (the NCHW kernels' rule), and the pixel index of the tap chosen.
func genMaxPoolWindowAVX2() {
	const name = "maxPoolWindowAVX2"
	TEXT(name, NOSPLIT, "func(y *float32, arg *int32, x *float32, rows, cols, rs, cs int, base, w int32, n int)")
	Doc(name+" writes y[ch] and arg[ch] for ch < n (a positive multiple of 8): the first maximum",
		"of the rows×cols taps x[r·rs/4 + s·cs/4 + ch] (rs, cs in bytes; rows, cols >= 1), a NaN",
		"always replacing the choice, and its pixel index base + r·w + s (AVX2).")
	y, arg, x, n := gp("y"), gp("arg"), gp("x"), gp("n")
	rowp, ridx, rcnt, p, ti, cnt := GP64(), GP64(), GP64(), GP64(), GP64(), GP64()
	best, idx := YMM(), YMM()
	Label(name + "_block")
	VMOVUPS(Mem{Base: x}, best)
	MOVL(paramAddr("base"), ridx.As32())
	VMOVD(ridx.As32(), idx.AsX())
	VPBROADCASTD(idx.AsX(), idx)
	MOVQ(x, rowp)
	Load(Param("rows"), rcnt)
	MOVQ(x, p)
	ADDQ(paramAddr("cs"), p)
	LEAL(Mem{Base: ridx, Disp: 1}, ti.As32())
	Load(Param("cols"), cnt)
	DECQ(cnt)
	Label(name + "_col")
	TESTQ(cnt, cnt)
	JZ(LabelRef(name + "_rowend"))
	v, m, u, tv := YMM(), YMM(), YMM(), YMM()
	VMOVUPS(Mem{Base: p}, v)
	VCMPPS(U8(0x1e), best, v, m) // v > best (GT_OQ)
	VCMPPS(U8(0x03), v, v, u)    // v is NaN (UNORD_Q)
	VORPS(u, m, m)
	VBLENDVPS(m, v, best, best) // m ? v : best
	VMOVD(ti.As32(), tv.AsX())
	VPBROADCASTD(tv.AsX(), tv)
	VBLENDVPS(m, tv, idx, idx)
	ADDQ(paramAddr("cs"), p)
	INCL(ti.As32())
	DECQ(cnt)
	JMP(LabelRef(name + "_col"))
	Label(name + "_rowend")
	DECQ(rcnt)
	JZ(LabelRef(name + "_store"))
	ADDQ(paramAddr("rs"), rowp)
	ADDL(paramAddr("w"), ridx.As32())
	MOVQ(rowp, p)
	MOVL(ridx.As32(), ti.As32())
	Load(Param("cols"), cnt)
	JMP(LabelRef(name + "_col"))
	Label(name + "_store")
	VMOVUPS(best, Mem{Base: y})
	VMOVDQU(idx, Mem{Base: arg})
	ADDQ(U8(32), y)
	ADDQ(U8(32), arg)
	ADDQ(U8(32), x)
	SUBQ(U8(8), n)
	JNZ(LabelRef(name + "_block"))
	VZEROUPPER()
	RET()
}
