package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// AVX-512 elementwise kernels. Each processes n float32 elements: 64 per
// iteration (4 zmm), then 16, then a masked tail (mask built with BZHI).

// stream emits the loop skeleton. body(off, mask) must process 16 elements
// at byte offset off from every pointer; mask is nil for full vectors, else
// the tail opmask (masked loads must zero, masked stores must merge).
func stream(name string, n reg.GPVirtual, ptrs []reg.GPVirtual, body func(off int, mask reg.Register)) {
	Label(name + "_loop64")
	CMPQ(n, U8(64))
	JL(LabelRef(name + "_loop16"))
	for u := range 4 {
		body(u*64, nil)
	}
	for _, p := range ptrs {
		ADDQ(U32(256), p)
	}
	SUBQ(U8(64), n)
	JMP(LabelRef(name + "_loop64"))

	Label(name + "_loop16")
	CMPQ(n, U8(16))
	JL(LabelRef(name + "_tail"))
	body(0, nil)
	for _, p := range ptrs {
		ADDQ(U8(64), p)
	}
	SUBQ(U8(16), n)
	JMP(LabelRef(name + "_loop16"))

	Label(name + "_tail")
	TESTQ(n, n)
	JE(LabelRef(name + "_done"))
	m := GP32()
	MOVL(U32(0xffff), m)
	BZHIL(n.As32(), m, m)
	k := K()
	KMOVW(m, k)
	body(0, k)
	Label(name + "_done")
}

// load loads 16 floats (zeroing masked-off lanes when mask != nil).
func load(m Mem, mask reg.Register, z reg.VecVirtual) {
	if mask == nil {
		VMOVUPS(m, z)
	} else {
		VMOVUPS_Z(m, mask, z)
	}
}

func store(z reg.VecVirtual, mask reg.Register, m Mem) {
	if mask == nil {
		VMOVUPS(z, m)
	} else {
		VMOVUPS(z, mask, m)
	}
}

func genVec() {
	// axpy: y += alpha*x
	TEXT("axpyAVX512", NOSPLIT, "func(alpha float32, x, y *float32, n int)")
	Doc("axpyAVX512 computes y[i] += alpha*x[i] for i < n (AVX-512F, fused multiply-add).")
	{
		x, y, n := gp("x"), gp("y"), gp("n")
		za := ZMM()
		VBROADCASTSS(paramAddr("alpha"), za)
		stream("axpyAVX512", n, []reg.GPVirtual{x, y}, func(off int, mask reg.Register) {
			zx, zy := ZMM(), ZMM()
			load(Mem{Base: x, Disp: off}, mask, zx)
			load(Mem{Base: y, Disp: off}, mask, zy)
			VFMADD231PS(zx, za, zy)
			store(zy, mask, Mem{Base: y, Disp: off})
		})
		VZEROUPPER()
		RET()
	}

	// scale: x *= alpha
	TEXT("scaleAVX512", NOSPLIT, "func(alpha float32, x *float32, n int)")
	Doc("scaleAVX512 computes x[i] *= alpha for i < n (AVX-512F).")
	{
		x, n := gp("x"), gp("n")
		za := ZMM()
		VBROADCASTSS(paramAddr("alpha"), za)
		stream("scaleAVX512", n, []reg.GPVirtual{x}, func(off int, mask reg.Register) {
			zx := ZMM()
			load(Mem{Base: x, Disp: off}, mask, zx)
			VMULPS(za, zx, zx)
			store(zx, mask, Mem{Base: x, Disp: off})
		})
		VZEROUPPER()
		RET()
	}

	// binary ops: dst = a op b
	for _, op := range []struct {
		name string
		doc  string
		f    func(ops ...Op)
	}{{"addAVX512", "a[i]+b[i]", VADDPS}, {"mulAVX512", "a[i]*b[i]", VMULPS}} {
		TEXT(op.name, NOSPLIT, "func(dst, a, b *float32, n int)")
		Doc(op.name + " computes dst[i] = " + op.doc + " for i < n (AVX-512F).")
		d, a, b, n := gp("dst"), gp("a"), gp("b"), gp("n")
		stream(op.name, n, []reg.GPVirtual{d, a, b}, func(off int, mask reg.Register) {
			za, zb := ZMM(), ZMM()
			load(Mem{Base: a, Disp: off}, mask, za)
			load(Mem{Base: b, Disp: off}, mask, zb)
			op.f(zb, za, za)
			store(za, mask, Mem{Base: d, Disp: off})
		})
		VZEROUPPER()
		RET()
	}

	// dot and sum: four zmm accumulators (lane j of accumulator u sums
	// elements i with i%64 == 16u+j in the unrolled loop), fixed reduction.
	for _, isDot := range []bool{true, false} {
		name := "sumAVX512"
		sig := "func(x *float32, n int) float32"
		if isDot {
			name, sig = "dotAVX512", "func(x, y *float32, n int) float32"
		}
		TEXT(name, NOSPLIT, sig)
		if isDot {
			Doc("dotAVX512 returns sum x[i]*y[i] for i < n (AVX-512F); fixed summation order.")
		} else {
			Doc("sumAVX512 returns sum x[i] for i < n (AVX-512F); fixed summation order.")
		}
		x := gp("x")
		ptrs := []reg.GPVirtual{x}
		var y reg.GPVirtual
		if isDot {
			y = gp("y")
			ptrs = append(ptrs, y)
		}
		n := gp("n")
		acc := []reg.VecVirtual{ZMM(), ZMM(), ZMM(), ZMM()}
		for _, z := range acc {
			VPXORD(z, z, z)
		}
		stream(name, n, ptrs, func(off int, mask reg.Register) {
			z := acc[off/64]
			zx := ZMM()
			load(Mem{Base: x, Disp: off}, mask, zx)
			if isDot {
				if mask == nil {
					VFMADD231PS(Mem{Base: y, Disp: off}, zx, z)
				} else {
					zy := ZMM()
					load(Mem{Base: y, Disp: off}, mask, zy)
					VFMADD231PS(zy, zx, z)
				}
			} else {
				VADDPS(zx, z, z)
			}
		})
		reduce4(acc, 0)
		VZEROUPPER()
		RET()
	}

	// relu forward: dst = max(x, 0), NaN -> 0
	TEXT("reluFwdAVX512", NOSPLIT, "func(dst, x *float32, n int)")
	Doc("reluFwdAVX512 computes dst[i] = max(x[i], 0) for i < n, NaN giving 0 (AVX-512F).")
	{
		d, x, n := gp("dst"), gp("x"), gp("n")
		zero := ZMM()
		VPXORD(zero, zero, zero)
		stream("reluFwdAVX512", n, []reg.GPVirtual{d, x}, func(off int, mask reg.Register) {
			zx := ZMM()
			load(Mem{Base: x, Disp: off}, mask, zx)
			// Intel order: max(src1=x, src2=0) returns src2 when x is NaN.
			VMAXPS(zero, zx, zx)
			store(zx, mask, Mem{Base: d, Disp: off})
		})
		VZEROUPPER()
		RET()
	}

	// relu backward: dx += dy where y > 0
	TEXT("reluBwdAVX512", NOSPLIT, "func(dx, y, dy *float32, n int)")
	Doc("reluBwdAVX512 computes dx[i] += dy[i] where y[i] > 0, for i < n (AVX-512F).")
	{
		dx, y, dy, n := gp("dx"), gp("y"), gp("dy"), gp("n")
		zero := ZMM()
		VPXORD(zero, zero, zero)
		stream("reluBwdAVX512", n, []reg.GPVirtual{dx, y, dy}, func(off int, mask reg.Register) {
			zy, zdx, zdy := ZMM(), ZMM(), ZMM()
			load(Mem{Base: y, Disp: off}, mask, zy)
			load(Mem{Base: dx, Disp: off}, mask, zdx)
			load(Mem{Base: dy, Disp: off}, mask, zdy)
			kp := K()
			VCMPPS(U8(0x1e), zero, zy, kp) // y > 0 (GT_OQ)
			VADDPS(zdy, zdx, kp, zdx)
			store(zdx, mask, Mem{Base: dx, Disp: off})
		})
		VZEROUPPER()
		RET()
	}
}

// gp loads a pointer or int parameter into a fresh 64-bit register.
func gp(name string) reg.GPVirtual {
	r := GP64()
	Load(Param(name), r)
	return r
}
