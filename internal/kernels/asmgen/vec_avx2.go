package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// AVX2 elementwise kernels: the ReLU passes, add, mul, scale and axpy. Each
// processes n float32 elements, n a multiple of 8 (the Go wrappers in
// sgemm_amd64.go run the last n mod 8 through the portable loops): 32 per
// iteration (4 ymm), then 8.

// loop8x32 emits the loop skeleton shared by the AVX2 streams: 32 elements per
// iteration (4 ymm, body(off, u) with u = 0..3), then 8 (u = 0), counting n down
// and advancing every pointer; it jumps to the label exit when fewer than 8 are left
// (the caller places it).
func loop8x32(name string, n reg.GPVirtual, ptrs []reg.GPVirtual, body func(off, u int), exit string) {
	Label(name + "_loop32")
	CMPQ(n, U8(32))
	JL(LabelRef(name + "_loop8"))
	for u := range 4 {
		body(u*32, u)
	}
	for _, p := range ptrs {
		ADDQ(U8(128), p)
	}
	SUBQ(U8(32), n)
	JMP(LabelRef(name + "_loop32"))

	Label(name + "_loop8")
	CMPQ(n, U8(8))
	JL(LabelRef(exit))
	body(0, 0)
	for _, p := range ptrs {
		ADDQ(U8(32), p)
	}
	SUBQ(U8(8), n)
	JMP(LabelRef(name + "_loop8"))
}

// streamAVX2 emits an elementwise kernel's loop and return; body(off) processes 8
// elements at byte offset off from every pointer.
func streamAVX2(name string, n reg.GPVirtual, ptrs []reg.GPVirtual, body func(off int)) {
	loop8x32(name, n, ptrs, func(off, _ int) { body(off) }, name+"_done")
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

func genVecAVX2() {
	TEXT("reluFwdAVX2", NOSPLIT, "func(dst, x *float32, n int)")
	Doc("reluFwdAVX2 computes dst[i] = max(x[i], 0) for i < n (a multiple of 8), NaN giving 0 (AVX2).")
	{
		d, x, n := gp("dst"), gp("x"), gp("n")
		zero := YMM()
		VXORPS(zero, zero, zero)
		streamAVX2("reluFwdAVX2", n, []reg.GPVirtual{d, x}, func(off int) {
			v := YMM()
			// Intel order: max(src1=x, src2=0) returns src2 when x is NaN.
			VMOVUPS(Mem{Base: x, Disp: off}, v)
			VMAXPS(zero, v, v)
			VMOVUPS(v, Mem{Base: d, Disp: off})
		})
	}

	TEXT("reluBwdAVX2", NOSPLIT, "func(dx, y, dy *float32, n int)")
	Doc("reluBwdAVX2 computes dx[i] += dy[i] where y[i] > 0 (dx unchanged elsewhere), for i < n (a multiple of 8) (AVX2).")
	{
		dx, y, dy, n := gp("dx"), gp("y"), gp("dy"), gp("n")
		zero := YMM()
		VXORPS(zero, zero, zero)
		streamAVX2("reluBwdAVX2", n, []reg.GPVirtual{dx, y, dy}, func(off int) {
			m, vd, s := YMM(), YMM(), YMM()
			VMOVUPS(Mem{Base: y, Disp: off}, m)
			VCMPPS(U8(0x1e), zero, m, m) // y > 0 (GT_OQ)
			VMOVUPS(Mem{Base: dx, Disp: off}, vd)
			VADDPS(Mem{Base: dy, Disp: off}, vd, s)
			VBLENDVPS(m, s, vd, vd) // m ? dx+dy : dx
			VMOVUPS(vd, Mem{Base: dx, Disp: off})
		})
	}

	TEXT("reluBwdSetAVX2", NOSPLIT, "func(dx, y, dy *float32, n int)")
	Doc("reluBwdSetAVX2 computes dx[i] = dy[i] where y[i] > 0, else 0, for i < n (a multiple of 8) (AVX2).")
	{
		dx, y, dy, n := gp("dx"), gp("y"), gp("dy"), gp("n")
		zero := YMM()
		VXORPS(zero, zero, zero)
		streamAVX2("reluBwdSetAVX2", n, []reg.GPVirtual{dx, y, dy}, func(off int) {
			m := YMM()
			VMOVUPS(Mem{Base: y, Disp: off}, m)
			VCMPPS(U8(0x1e), zero, m, m) // y > 0 (GT_OQ)
			VANDPS(Mem{Base: dy, Disp: off}, m, m)
			VMOVUPS(m, Mem{Base: dx, Disp: off})
		})
	}

	TEXT("addAVX2", NOSPLIT, "func(dst, a, b *float32, n int)")
	Doc("addAVX2 computes dst[i] = a[i] + b[i] for i < n (a multiple of 8) (AVX2).")
	{
		d, a, b, n := gp("dst"), gp("a"), gp("b"), gp("n")
		streamAVX2("addAVX2", n, []reg.GPVirtual{d, a, b}, func(off int) {
			v := YMM()
			VMOVUPS(Mem{Base: a, Disp: off}, v)
			VADDPS(Mem{Base: b, Disp: off}, v, v)
			VMOVUPS(v, Mem{Base: d, Disp: off})
		})
	}

	TEXT("mulAVX2", NOSPLIT, "func(dst, a, b *float32, n int)")
	Doc("mulAVX2 computes dst[i] = a[i] * b[i] for i < n (a multiple of 8) (AVX2).")
	{
		d, a, b, n := gp("dst"), gp("a"), gp("b"), gp("n")
		streamAVX2("mulAVX2", n, []reg.GPVirtual{d, a, b}, func(off int) {
			v := YMM()
			VMOVUPS(Mem{Base: a, Disp: off}, v)
			VMULPS(Mem{Base: b, Disp: off}, v, v)
			VMOVUPS(v, Mem{Base: d, Disp: off})
		})
	}

	TEXT("scaleAVX2", NOSPLIT, "func(alpha float32, x *float32, n int)")
	Doc("scaleAVX2 computes x[i] *= alpha for i < n (a multiple of 8) (AVX2).")
	{
		x, n := gp("x"), gp("n")
		ya := bcastY("alpha")
		streamAVX2("scaleAVX2", n, []reg.GPVirtual{x}, func(off int) {
			v := YMM()
			VMULPS(Mem{Base: x, Disp: off}, ya, v)
			VMOVUPS(v, Mem{Base: x, Disp: off})
		})
	}

	// axpy multiplies, then adds, rounding twice like the Go loop (which does not
	// fuse): the assembly and the loop that finishes its last n mod 8 elements agree
	// bit for bit, so an element's result does not depend on its position.
	TEXT("axpyAVX2", NOSPLIT, "func(alpha float32, x, y *float32, n int)")
	Doc("axpyAVX2 computes y[i] += alpha*x[i] for i < n (a multiple of 8) (AVX2; multiply, then add: not fused).")
	{
		x, y, n := gp("x"), gp("y"), gp("n")
		ya := bcastY("alpha")
		streamAVX2("axpyAVX2", n, []reg.GPVirtual{x, y}, func(off int) {
			v := YMM()
			VMULPS(Mem{Base: x, Disp: off}, ya, v)
			VADDPS(Mem{Base: y, Disp: off}, v, v)
			VMOVUPS(v, Mem{Base: y, Disp: off})
		})
	}
}

// transpose8Regs transposes the 8×8 tile in rows r (register i holds row i) and
// returns its columns (register j holds column j): unpack 32-bit, 64-bit shuffles,
// then 128-bit lane permutes.
func transpose8Regs(r [8]reg.VecVirtual) [8]reg.VecVirtual {
	var t, u, o [8]reg.VecVirtual
	for i := 0; i < 8; i += 2 {
		t[i], t[i+1] = YMM(), YMM()
		VUNPCKLPS(r[i+1], r[i], t[i])   // r[i]0 r[i+1]0 r[i]1 r[i+1]1 (per 128-bit lane)
		VUNPCKHPS(r[i+1], r[i], t[i+1]) // r[i]2 r[i+1]2 r[i]3 r[i+1]3
	}
	for h := 0; h < 8; h += 4 {
		for q := range 2 {
			u[h+2*q], u[h+2*q+1] = YMM(), YMM()
			VSHUFPS(U8(0x44), t[h+2+q], t[h+q], u[h+2*q])   // columns 2q (lanes 0, 4)
			VSHUFPS(U8(0xee), t[h+2+q], t[h+q], u[h+2*q+1]) // columns 2q+1
		}
	}
	for j := range 8 {
		o[j] = YMM()
		imm := U8(0x20) // low lanes: columns 0-3
		if j >= 4 {
			imm = U8(0x31) // high lanes: columns 4-7
		}
		VPERM2F128(imm, u[4+j%4], u[j%4], o[j])
	}
	return o
}

// genTranspose8AVX2 emits transpose8AVX2: blocks 8×8 transposes,
// dst[(8b+j)·ldd + i] = src[i·lds + 8b + j] for i, j < 8 and b < blocks
// (strides in floats): unpack 32-bit, 64-bit shuffles, then 128-bit lane
// permutes. The layout passes of the NHWC convolution (PadNHWC,
// NHWCToNCHW) use it on the AVX2 path.
func genTranspose8AVX2() {
	name := "transpose8AVX2"
	TEXT(name, NOSPLIT, "func(dst *float32, ldd int, src *float32, lds, blocks int)")
	Doc(name + " transposes blocks 8×8 tiles: dst[(8b+j)·ldd+i] = src[i·lds+8b+j] (AVX2).")
	dst := Load(Param("dst"), GP64())
	ldd := Load(Param("ldd"), GP64())
	src := Load(Param("src"), GP64())
	lds := Load(Param("lds"), GP64())
	blocks := Load(Param("blocks"), GP64())
	SHLQ(U8(2), ldd)
	SHLQ(U8(2), lds)
	TESTQ(blocks, blocks)
	JE(LabelRef(name + "_done"))
	Label(name + "_loop")
	p := GP64()
	MOVQ(src, p)
	var r [8]reg.VecVirtual
	for i := range r {
		r[i] = YMM()
		VMOVUPS(Mem{Base: p}, r[i])
		if i < 7 {
			ADDQ(lds, p)
		}
	}
	o := transpose8Regs(r)
	p2 := GP64()
	MOVQ(dst, p2)
	for j := range 8 {
		VMOVUPS(o[j], Mem{Base: p2})
		if j < 7 {
			ADDQ(ldd, p2)
		}
	}
	ADDQ(U8(32), src)
	LEAQ(Mem{Base: dst, Index: ldd, Scale: 8}, dst)
	DECQ(blocks)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// AVX2 BatchNorm (batchnorm.go). The reductions keep four ymm accumulators,
// element i of a plane going to accumulator (i/8) mod 4 in the 32-element loop and
// to accumulator 0 in the 8-element tail, then add them (a0+a1)+(a2+a3) and halve
// 256 → 128 → 64 → 32 bits: a fixed order that depends only on the lengths.

// bcastY broadcasts a float32 parameter into a fresh ymm register.
func bcastY(name string) reg.VecVirtual {
	y := YMM()
	VBROADCASTSS(paramAddr(name), y)
	return y
}

func zeroedY(k int) []reg.VecVirtual {
	acc := make([]reg.VecVirtual, k)
	for i := range acc {
		acc[i] = YMM()
		VXORPS(acc[i], acc[i], acc[i])
	}
	return acc
}

// reduceY sums four ymm accumulators in the fixed order above and returns the
// scalar in the low lane of an xmm register.
func reduceY(acc []reg.VecVirtual) reg.VecVirtual { return reduceYWith(acc, VADDPS, VADDSS) }

// reduceYWith is reduceY with the packed operation op and the scalar op1 (the
// last step) in place of the additions.
func reduceYWith(acc []reg.VecVirtual, op, op1 func(...Op)) reg.VecVirtual {
	op(acc[1], acc[0], acc[0])
	op(acc[3], acc[2], acc[2])
	op(acc[2], acc[0], acc[0])
	h := XMM()
	VEXTRACTF128(U8(1), acc[0], h)
	op(h, acc[0].AsX(), h)
	t := XMM()
	VMOVHLPS(h, h, t)
	op(t, h, h)
	VMOVSHDUP(h, t)
	op1(t, h, h)
	return h
}

// genPack6AVX2 emits pack6AVX2, the AVX2 packer of six-row A slivers: for each
// block b of 8 columns, the 6×8 tile src[r·lds + 8b + p] (r < 6, p < 8) is
// transposed in registers (transpose8AVX2's network with two zero rows) and
// written column by column, dst[(8b+p)·6 + r]. Columns 0–6 are stored as whole
// ymm registers in increasing order, each overwriting the previous one's two
// spare lanes; column 7 as four plus two floats, so nothing is written past
// the block's 48 floats.
func genPack6AVX2() {
	name := "pack6AVX2"
	TEXT(name, NOSPLIT, "func(dst, src *float32, lds, blocks int)")
	Doc(name + " writes dst[(8b+p)·6+r] = src[r·lds+8b+p] for r < 6, p < 8, b < blocks (AVX2).")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	lds := Load(Param("lds"), GP64())
	blocks := Load(Param("blocks"), GP64())
	SHLQ(U8(2), lds)
	TESTQ(blocks, blocks)
	JE(LabelRef(name + "_done"))
	Label(name + "_loop")
	p := GP64()
	MOVQ(src, p)
	var r [8]reg.VecVirtual
	for i := range 6 {
		r[i] = YMM()
		VMOVUPS(Mem{Base: p}, r[i])
		if i < 5 {
			ADDQ(lds, p)
		}
	}
	r[6] = YMM()
	VXORPS(r[6], r[6], r[6])
	r[7] = r[6]
	o := transpose8Regs(r)
	for j := range 7 {
		VMOVUPS(o[j], Mem{Base: dst, Disp: j * 24})
	}
	VMOVUPS(o[7].AsX(), Mem{Base: dst, Disp: 7 * 24})
	hi := XMM()
	VEXTRACTF128(U8(1), o[7], hi)
	VMOVLPS(hi, Mem{Base: dst, Disp: 7*24 + 16})
	ADDQ(U8(32), src)
	ADDQ(U8(192), dst)
	DECQ(blocks)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// genPackTAVX2 emits packT<rows>AVX2 (rows 6, 4 or 2), the AVX2 packer of a
// six-row sliver of a transposed A: column p of the sliver is the run
// src[p·lds : p·lds+rows], copied to dst[6p:] and followed by 6−rows zeros
// (the padding of an edge sliver).
func genPackTAVX2(rows int) {
	name := fmt.Sprintf("packT%dAVX2", rows)
	TEXT(name, NOSPLIT, "func(dst, src *float32, lds, n int)")
	Doc(fmt.Sprintf("%s writes dst[6p+r] = src[p·lds+r] for r < %d and 0 for %d ≤ r < 6, p < n (AVX2).", name, rows, rows))
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	lds := Load(Param("lds"), GP64())
	n := Load(Param("n"), GP64())
	SHLQ(U8(2), lds)
	TESTQ(n, n)
	JE(LabelRef(name + "_done"))
	lo, hi := XMM(), XMM()
	if rows < 6 {
		VXORPS(hi, hi, hi)
	}
	if rows < 4 {
		VXORPS(lo, lo, lo)
	}
	Label(name + "_loop")
	switch rows {
	case 6:
		VMOVUPS(Mem{Base: src}, lo)
		VMOVSD(Mem{Base: src, Disp: 16}, hi)
	case 4:
		VMOVUPS(Mem{Base: src}, lo)
	case 2:
		VMOVSD(Mem{Base: src}, lo)
	}
	VMOVUPS(lo, Mem{Base: dst})
	VMOVSD(hi, Mem{Base: dst, Disp: 16})
	ADDQ(lds, src)
	ADDQ(U8(24), dst)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	RET()
}

// BatchNorm over a channel's planes in one call (the "Planes" kernels): n planes
// of plane floats (a multiple of 8), plane i starting stride floats after plane
// i−1, in every array. A call per plane cost more than the plane on ResNet's
// 8×8 and 16×16 maps (the wrapper and the horizontal sum, for 64 elements).
// The reductions accumulate over all the planes, then reduce once: a fixed order
// that depends only on (n, plane). The per-plane passes of vec_avx2_amd64.go are
// these kernels with n = 1.

// planesAVX2 emits the loop over planes around loop8x32;
// body(cur, off, u) processes 8 elements at byte offset off from the cursors.
func planesAVX2(name string, ptrs []reg.GPVirtual, body func(cur []reg.GPVirtual, off, u int)) {
	plane, n, stride := gp("plane"), gp("n"), gp("stride")
	SHLQ(U8(2), stride)
	cur := make([]reg.GPVirtual, len(ptrs))
	for i := range cur {
		cur[i] = GP64()
	}
	cnt := GP64()
	TESTQ(n, n)
	JE(LabelRef(name + "_done"))
	Label(name + "_plane")
	for i, p := range ptrs {
		MOVQ(p, cur[i])
	}
	MOVQ(plane, cnt)
	loop8x32(name, cnt, cur, func(off, u int) { body(cur, off, u) }, name+"_next")
	Label(name + "_next")
	for _, p := range ptrs {
		ADDQ(stride, p)
	}
	DECQ(n)
	JNZ(LabelRef(name + "_plane"))
	Label(name + "_done")
}

func genBatchNormPlanesAVX2() {
	TEXT("sumDevPlanesAVX2", NOSPLIT, "func(x *float32, n, plane, stride int, mu float32) float32")
	Doc("sumDevPlanesAVX2 returns the sum of x[i·stride+j]-mu over i < n, j < plane (a multiple of 8) (AVX2); fixed summation order.")
	{
		x := gp("x")
		ymu := bcastY("mu")
		acc := zeroedY(4)
		planesAVX2("sumDevPlanesAVX2", []reg.GPVirtual{x}, func(cur []reg.GPVirtual, off, u int) {
			d := YMM()
			VMOVUPS(Mem{Base: cur[0], Disp: off}, d)
			VSUBPS(ymu, d, d)
			VADDPS(d, acc[u], acc[u])
		})
		VMOVSS(reduceY(acc), retAddr(0))
		VZEROUPPER()
		RET()
	}

	TEXT("sumSqDevPlanesAVX2", NOSPLIT, "func(x *float32, n, plane, stride int, mu float32) float32")
	Doc("sumSqDevPlanesAVX2 returns the sum of (x[i·stride+j]-mu)² over i < n, j < plane (a multiple of 8) (AVX2, FMA); fixed summation order.")
	{
		x := gp("x")
		ymu := bcastY("mu")
		acc := zeroedY(4)
		planesAVX2("sumSqDevPlanesAVX2", []reg.GPVirtual{x}, func(cur []reg.GPVirtual, off, u int) {
			d := YMM()
			VMOVUPS(Mem{Base: cur[0], Disp: off}, d)
			VSUBPS(ymu, d, d)
			VFMADD231PS(d, d, acc[u])
		})
		VMOVSS(reduceY(acc), retAddr(0))
		VZEROUPPER()
		RET()
	}

	genDyStatsPlanesAVX2(false)

	genAffinePlanesAVX2(false, false)

	for _, acc := range []bool{false, true} {
		genBnBwdPlanesAVX2(acc, false)
	}
}

// The BatchNorm+ReLU planes kernels (batchnorm.go's fused ops): the passes above
// with the rectifier applied in the same pass. Each does exactly the arithmetic of
// the unfused kernels it replaces, in the same order (affinePlanesAVX2, addAVX2 and
// reluFwdAVX2 forward; reluBwdSetAVX2's masking, then dyStatsPlanesAVX2 or
// bnBwd*PlanesAVX2 backward), so the results are bit-identical to theirs.
func genBatchNormReluPlanesAVX2() {
	genAffinePlanesAVX2(true, false)
	genAffinePlanesAVX2(true, true)
	genDyStatsPlanesAVX2(true)
	for _, acc := range []bool{false, true} {
		genBnBwdPlanesAVX2(acc, true)
	}
}

// zeroY returns a register holding 0 (the rectifier's and the mask's).
func zeroY() reg.VecVirtual {
	zero := YMM()
	VXORPS(zero, zero, zero)
	return zero
}

// maskedY loads dy where y > 0 and 0 elsewhere into g (reluBwdSetAVX2's masking).
func maskedY(g reg.VecVirtual, zero reg.VecVirtual, dy, y Mem) {
	VMOVUPS(y, g)
	VCMPPS(U8(0x1e), zero, g, g) // y > 0 (GT_OQ)
	VANDPS(dy, g, g)
}

// genAffinePlanesAVX2 is affinePlanesAVX2, dst = (x-mu)*a + b, or with relu its fused
// forms affineReluPlanesAVX2 (max(…, 0)) and, with add, affineAddReluPlanesAVX2
// (max(… + r, 0)).
func genAffinePlanesAVX2(relu, add bool) {
	name, sig := "affinePlanesAVX2", "func(dst, x *float32, n, plane, stride int, mu, a, b float32)"
	doc := "affinePlanesAVX2 computes dst = (x-mu)*a + b at the elements i·stride+j, i < n, j < plane (a multiple of 8) (AVX2, fused multiply-add)."
	switch {
	case add:
		name, sig = "affineAddReluPlanesAVX2", "func(dst, x, r *float32, n, plane, stride int, mu, a, b float32)"
		doc = name + " computes dst = max(((x-mu)*a + b) + r, 0) at the elements i·stride+j, i < n, j < plane (a multiple of 8), NaN giving 0 (AVX2, fused multiply-add for the affine part)."
	case relu:
		name = "affineReluPlanesAVX2"
		doc = name + " computes dst = max((x-mu)*a + b, 0) at the elements i·stride+j, i < n, j < plane (a multiple of 8), NaN giving 0 (AVX2, fused multiply-add for the affine part)."
	}
	TEXT(name, NOSPLIT, sig)
	Doc(doc)
	ptrs := []reg.GPVirtual{gp("dst"), gp("x")}
	if add {
		ptrs = append(ptrs, gp("r"))
	}
	ymu, ya, yb := bcastY("mu"), bcastY("a"), bcastY("b")
	var zero reg.VecVirtual
	if relu {
		zero = zeroY()
	}
	planesAVX2(name, ptrs, func(cur []reg.GPVirtual, off, _ int) {
		v := YMM()
		VMOVUPS(Mem{Base: cur[1], Disp: off}, v)
		VSUBPS(ymu, v, v)
		VFMADD213PS(yb, ya, v)
		if add {
			VADDPS(Mem{Base: cur[2], Disp: off}, v, v)
		}
		if relu {
			// Intel order: max(src1=v, src2=0) returns src2 when v is NaN.
			VMAXPS(zero, v, v)
		}
		VMOVUPS(v, Mem{Base: cur[0], Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genDyStatsPlanesAVX2 is dyStatsPlanesAVX2, the sums of dy and dy·(x-mu), or with relu
// dyStatsReluPlanesAVX2, those of the masked dy.
func genDyStatsPlanesAVX2(relu bool) {
	name := "dyStatsPlanesAVX2"
	sig := "func(dy, x *float32, n, plane, stride int, mu float32) (sdy, sdyc float32)"
	doc := "dyStatsPlanesAVX2 returns the sums of dy and dy·(x-mu) over the elements i·stride+j, i < n, j < plane (a multiple of 8) (AVX2, FMA); fixed summation order."
	if relu {
		name = "dyStatsReluPlanesAVX2"
		sig = "func(dy, y, x *float32, n, plane, stride int, mu float32) (sdy, sdyc float32)"
		doc = "dyStatsReluPlanesAVX2 returns the sums of g and g·(x-mu), g = dy where y > 0 and 0 elsewhere, over the elements i·stride+j, i < n, j < plane (a multiple of 8) (AVX2, FMA); dyStatsPlanesAVX2's summation order."
	}
	TEXT(name, NOSPLIT, sig)
	Doc(doc)
	ptrs := []reg.GPVirtual{gp("dy")}
	if relu {
		ptrs = append(ptrs, gp("y"))
	}
	ptrs = append(ptrs, gp("x"))
	ymu := bcastY("mu")
	var zero reg.VecVirtual
	if relu {
		zero = zeroY()
	}
	s, t := zeroedY(4), zeroedY(4)
	xi := len(ptrs) - 1
	planesAVX2(name, ptrs, func(cur []reg.GPVirtual, off, u int) {
		g, d := YMM(), YMM()
		if relu {
			maskedY(g, zero, Mem{Base: cur[0], Disp: off}, Mem{Base: cur[1], Disp: off})
		} else {
			VMOVUPS(Mem{Base: cur[0], Disp: off}, g)
		}
		VMOVUPS(Mem{Base: cur[xi], Disp: off}, d)
		VSUBPS(ymu, d, d)
		VADDPS(g, s[u], s[u])
		VFMADD231PS(d, g, t[u])
	})
	VMOVSS(reduceY(s), retAddr(0))
	VMOVSS(reduceY(t), retAddr(1))
	VZEROUPPER()
	RET()
}

// genBnBwdPlanesAVX2 is bnBwdSetPlanesAVX2 (bnBwdAccPlanesAVX2 with acc), dst = (or +=)
// a*dy + (b*(x-mu) + c), or with relu bnBwdRelu{Set,Acc}PlanesAVX2 of the masked dy.
func genBnBwdPlanesAVX2(acc, relu bool) {
	kind, op := "Set", "="
	if acc {
		kind, op = "Acc", "+="
	}
	name := "bnBwd" + kind + "PlanesAVX2"
	sig := "func(dst, dy, x *float32, n, plane, stride int, mu, a, b, c float32)"
	doc := name + " computes dst " + op + " a*dy + (b*(x-mu) + c) at the elements i·stride+j, i < n, j < plane (a multiple of 8) (AVX2, FMA)."
	if relu {
		name = "bnBwdRelu" + kind + "PlanesAVX2"
		sig = "func(dst, dy, y, x *float32, n, plane, stride int, mu, a, b, c float32)"
		doc = name + " computes dst " + op + " a*g + (b*(x-mu) + c), g = dy where y > 0 and 0 elsewhere, at the elements i·stride+j, i < n, j < plane (a multiple of 8) (AVX2, FMA)."
	}
	TEXT(name, NOSPLIT, sig)
	Doc(doc)
	ptrs := []reg.GPVirtual{gp("dst"), gp("dy")}
	if relu {
		ptrs = append(ptrs, gp("y"))
	}
	ptrs = append(ptrs, gp("x"))
	ymu, ya, yb, yc := bcastY("mu"), bcastY("a"), bcastY("b"), bcastY("c")
	var zero reg.VecVirtual
	if relu {
		zero = zeroY()
	}
	xi := len(ptrs) - 1
	planesAVX2(name, ptrs, func(cur []reg.GPVirtual, off, _ int) {
		v, g := YMM(), YMM()
		VMOVUPS(Mem{Base: cur[xi], Disp: off}, v)
		if relu {
			maskedY(g, zero, Mem{Base: cur[1], Disp: off}, Mem{Base: cur[2], Disp: off})
		} else {
			VMOVUPS(Mem{Base: cur[1], Disp: off}, g)
		}
		VSUBPS(ymu, v, v)
		VFMADD213PS(yc, yb, v)
		VFMADD231PS(g, ya, v)
		if acc {
			VADDPS(Mem{Base: cur[0], Disp: off}, v, v)
		}
		VMOVUPS(v, Mem{Base: cur[0], Disp: off})
	})
	VZEROUPPER()
	RET()
}
