// Command asmgen generates the amd64 assembly micro-kernels of package
// kernels with avo. Run from the kernels directory (see generate.go):
//
//	go run -C asmgen . -out ../sgemm_amd64.s -stubs ../sgemm_stub_amd64.go -pkg kernels
//	go run -C asmgen . -layers -out ../layers_amd64.s -stubs ../layers_stub_amd64.go -pkg kernels
//	go run -C asmgen . -half -out ../half_amd64.s -stubs ../half_stub_amd64.go -pkg kernels
package main

import (
	"flag"
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

const kernelSig = "func(k int, a, b, c *float32, ldc int, alpha, beta float32)"

// layers selects the second output set: the layer kernels (BatchNorm, ReLU
// backward, SGD, max-pool) for layers_amd64.s instead of the SGEMM and
// elementwise kernels of sgemm_amd64.s.
var layers = flag.Bool("layers", false, "emit the layer kernels (layers_amd64.s) instead of the SGEMM kernels")

// half selects the third output set: the binary16 conversion kernels (F16C) for
// half_amd64.s.
var half = flag.Bool("half", false, "emit the binary16 conversion kernels (half_amd64.s) instead of the SGEMM kernels")

func main() {
	flag.Parse()
	ConstraintExpr("amd64")
	if *layers {
		genLayers()
		Generate()
		return
	}
	if *half {
		genHalf()
		Generate()
		return
	}
	// 8×32 with explicit broadcasts measured fastest on the target
	// (Zen 5, two 512-bit FMA pipes); 4, 6, 12 and 14 rows and
	// embedded-broadcast FMAs were 5-15% slower. Other shapes can be
	// re-measured by emitting them here and using BenchmarkTune.
	genAVX512(8, false)
	genIndirect(isaAVX512, false)
	genIndirect(isaAVX512, true)
	genGather32AVX512()
	genTranspose16AVX512()
	genPack8AVX512()
	genBIndirect(isaAVX512, isaAVX512.mr)
	genAVX2()
	genIndirect(isaAVX2, false)
	genIndirect(isaAVX2, true)
	genBIndirect(isaAVX2, isaAVX2.mr)
	genBIndirect(isaAVX2, 4)
	genBIndirect(isaAVX2, 2)
	genVecAVX2()
	genTranspose8AVX2()
	genPack6AVX2()
	for _, rows := range []int{6, 4, 2} {
		genPackTAVX2(rows)
	}
	genBatchNormPlanesAVX2()
	genVec()
	genBatchNormReluPlanesAVX2()
	Generate()
}

// genAVX512 emits sgemmKernelAVX512x<mr>: an mr×32 tile, two zmm
// accumulators per row. Packed A sliver: k groups of mr floats; packed B
// sliver: k groups of 32 floats. C = alpha*A*B + beta*C (beta==0: overwrite).
// bcast selects FMAs with embedded-broadcast memory operands (vs explicit
// VBROADCASTSS into a register).
func genAVX512(mr int, bcast bool) {
	name := fmt.Sprintf("sgemmKernelAVX512x%d", mr)
	if bcast {
		name += "b"
	}
	TEXT(name, NOSPLIT, kernelSig)
	Doc(fmt.Sprintf("%s computes a %d×32 tile C = alpha*A*B + beta*C from packed panels (AVX-512F).", name, mr))
	const nr = 32
	k := Load(Param("k"), GP64())
	a := Load(Param("a"), GP64())
	b := Load(Param("b"), GP64())
	c := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	SHLQ(U8(2), ldc)

	acc := zeroAccumulators(mr, 2, ZMM, VPXORD)
	b0, b1 := ZMM(), ZMM()
	var abc reg.VecVirtual
	if !bcast {
		abc = ZMM()
	}
	step := func(u int) {
		VMOVUPS(Mem{Base: b, Disp: u * nr * 4}, b0)
		VMOVUPS(Mem{Base: b, Disp: u*nr*4 + 64}, b1)
		for r := range mr {
			am := Mem{Base: a, Disp: (u*mr + r) * 4}
			if bcast {
				VFMADD231PS_BCST(am, b0, acc[r][0])
				VFMADD231PS_BCST(am, b1, acc[r][1])
			} else {
				VBROADCASTSS(am, abc)
				VFMADD231PS(abc, b0, acc[r][0])
				VFMADD231PS(abc, b1, acc[r][1])
			}
		}
	}
	kLoop(name, k, "_store", step, func(count int) {
		ADDQ(U32(count*mr*4), a)
		ADDQ(U32(count*nr*4), b)
	})

	Label(name + "_store")
	VBROADCASTSS(paramAddr("alpha"), b0)
	for r := range mr {
		VMULPS(b0, acc[r][0], acc[r][0])
		VMULPS(b0, acc[r][1], acc[r][1])
	}
	storeTile(name, acc, c, ldc, b1, 64)
}

// genAVX2 emits sgemmKernelAVX2: a 6×16 tile with ymm registers (12
// accumulators, 2 B vectors, 1 broadcast register).
func genAVX2() {
	const mr, nr = 6, 16
	name := "sgemmKernelAVX2"
	TEXT(name, NOSPLIT, kernelSig)
	Doc(name + " computes a 6×16 tile C = alpha*A*B + beta*C from packed panels (AVX2+FMA).")
	k := Load(Param("k"), GP64())
	a := Load(Param("a"), GP64())
	b := Load(Param("b"), GP64())
	c := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	SHLQ(U8(2), ldc)
	acc := zeroAccumulators(mr, 2, YMM, VXORPS)
	b0, b1, ab := YMM(), YMM(), YMM()
	step := func(u int) {
		VMOVUPS(Mem{Base: b, Disp: u * nr * 4}, b0)
		VMOVUPS(Mem{Base: b, Disp: u*nr*4 + 32}, b1)
		for r := range mr {
			VBROADCASTSS(Mem{Base: a, Disp: (u*mr + r) * 4}, ab)
			VFMADD231PS(ab, b0, acc[r][0])
			VFMADD231PS(ab, b1, acc[r][1])
		}
	}
	kLoop(name, k, "_store", step, func(count int) {
		ADDQ(U32(count*mr*4), a)
		ADDQ(U32(count*nr*4), b)
	})

	Label(name + "_store")
	VBROADCASTSS(paramAddr("alpha"), b0)
	for r := range mr {
		VMULPS(b0, acc[r][0], acc[r][0])
		VMULPS(b0, acc[r][1], acc[r][1])
	}
	storeTile(name, acc, c, ldc, b1, 32)
}

// storeTile emits a kernel's epilogue: C = acc, or C = acc + beta·C when
// beta != 0, for the rows of acc (vectors of width bytes each, side by side) at c
// with row stride ldc bytes; bv is a free vector register. Then VZEROUPPER; RET.
func storeTile(name string, acc [][]reg.VecVirtual, c, ldc reg.Register, bv reg.VecVirtual, width int) {
	// beta == 0 (either sign) overwrites C without reading it.
	betaBits := GP32()
	MOVL(paramAddr("beta"), betaBits)
	ANDL(U32(0x7fffffff), betaBits)
	JNZ(LabelRef(name + "_beta"))
	p := GP64()
	MOVQ(c, p)
	for r := range acc {
		for v, a := range acc[r] {
			VMOVUPS(a, Mem{Base: p, Disp: v * width})
		}
		if r < len(acc)-1 {
			ADDQ(ldc, p)
		}
	}
	VZEROUPPER()
	RET()

	Label(name + "_beta")
	VBROADCASTSS(paramAddr("beta"), bv)
	for r := range acc {
		for v, a := range acc[r] {
			VFMADD231PS(Mem{Base: c, Disp: v * width}, bv, a)
		}
		for v, a := range acc[r] {
			VMOVUPS(a, Mem{Base: c, Disp: v * width})
		}
		if r < len(acc)-1 {
			ADDQ(ldc, c)
		}
	}
	VZEROUPPER()
	RET()
}

// paramAddr returns the frame address of a scalar parameter.
func paramAddr(name string) Mem {
	basic, err := Param(name).Resolve()
	if err != nil {
		panic(err)
	}
	return basic.Addr
}

// kLoop emits a k loop unrolled 4 times with a one-step tail: step(u) emits
// step u of a group, advance(count) the pointer updates after count steps;
// n counts down to zero, then it jumps to name+done.
func kLoop(name string, n reg.Register, done string, step func(u int), advance func(count int)) {
	const unroll = 4
	Label(name + "_loop4")
	CMPQ(n, U8(unroll))
	JL(LabelRef(name + "_tail"))
	for u := range unroll {
		step(u)
	}
	advance(unroll)
	SUBQ(U8(unroll), n)
	JMP(LabelRef(name + "_loop4"))

	Label(name + "_tail")
	TESTQ(n, n)
	JE(LabelRef(name + done))
	step(0)
	advance(1)
	DECQ(n)
	JMP(LabelRef(name + "_tail"))
}

// zeroAccumulators returns mr rows of nv zeroed accumulator registers (zero
// emits the zeroing instruction: VPXORD for zmm, VXORPS for ymm).
func zeroAccumulators(mr, nv int, alloc func() reg.VecVirtual, zero func(ops ...Op)) [][]reg.VecVirtual {
	acc := make([][]reg.VecVirtual, mr)
	for r := range acc {
		acc[r] = make([]reg.VecVirtual, nv)
		for v := range acc[r] {
			acc[r][v] = alloc()
			zero(acc[r][v], acc[r][v], acc[r][v])
		}
	}
	return acc
}
