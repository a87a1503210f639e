package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// IEEE binary16 conversion kernels (F16C on 256-bit vectors, VEX-encoded: AVX2 machines have
// them, AVX-512 ones too), emitted with -half into half_amd64.s / half_stub_amd64.go. Each
// processes n elements, n a multiple of 8 (the Go wrappers in half_amd64.go convert the
// remainder with the scalar code): 32 per iteration (4 ymm), then 8. VCVTPS2PH's immediate
// 0 rounds to nearest, ties to even, whatever MXCSR says; Go runs with every floating-point
// exception masked and without DAZ/FTZ, so subnormal float32 inputs and VADDPS/VDIVPS
// results are exact IEEE.

func genHalf() {
	genCPUID()

	// encode: dst[i] = half(src[i] / div)
	TEXT("halfEncodeF16C", NOSPLIT, "func(dst *uint16, src *float32, n int, div float32)")
	Doc("halfEncodeF16C sets dst[i] to the binary16 bits of src[i]/div (divided in float32, rounded",
		"to nearest even) for i < n, n a multiple of 8 (F16C, AVX).")
	{
		d, s, n := gp("dst"), gp("src"), gp("n")
		yd := YMM()
		VBROADCASTSS(paramAddr("div"), yd)
		stream8("halfEncodeF16C", n, []reg.GPVirtual{d, s}, []int{2, 4}, func(u int) {
			y := YMM()
			VMOVUPS(Mem{Base: s, Disp: 32 * u}, y)
			VDIVPS(yd, y, y)
			VCVTPS2PH(U8(0), y, Mem{Base: d, Disp: 16 * u})
		})
		VZEROUPPER()
		RET()
	}

	// decode: dst[i] = float32(src[i])
	TEXT("halfDecodeF16C", NOSPLIT, "func(dst *float32, src *uint16, n int)")
	Doc("halfDecodeF16C sets dst[i] to the float32 value of the binary16 bits src[i] for i < n, n a",
		"multiple of 8 (F16C, AVX).")
	{
		d, s, n := gp("dst"), gp("src"), gp("n")
		stream8("halfDecodeF16C", n, []reg.GPVirtual{d, s}, []int{4, 2}, func(u int) {
			y := YMM()
			VCVTPH2PS(Mem{Base: s, Disp: 16 * u}, y)
			VMOVUPS(y, Mem{Base: d, Disp: 32 * u})
		})
		VZEROUPPER()
		RET()
	}

	// add: dst[i] = half(float32(a[i]) + float32(b[i]))
	TEXT("halfAddF16C", NOSPLIT, "func(dst, a, b *uint16, n int)")
	Doc("halfAddF16C sets dst[i] to the binary16 bits of float32(a[i]) + float32(b[i]) (added in",
		"float32, rounded to nearest even) for i < n, n a multiple of 8 (F16C, AVX).")
	{
		d, a, b, n := gp("dst"), gp("a"), gp("b"), gp("n")
		stream8("halfAddF16C", n, []reg.GPVirtual{d, a, b}, []int{2, 2, 2}, func(u int) {
			ya, yb := YMM(), YMM()
			VCVTPH2PS(Mem{Base: a, Disp: 16 * u}, ya)
			VCVTPH2PS(Mem{Base: b, Disp: 16 * u}, yb)
			// yb + ya: when both are NaNs the first source's (b's) payload is kept, which is
			// what Go 1.26 compiles the scalar HalfToFloat32(a)+HalfToFloat32(b) to.
			VADDPS(ya, yb, ya)
			VCVTPS2PH(U8(0), ya, Mem{Base: d, Disp: 16 * u})
		})
		VZEROUPPER()
		RET()
	}
}

// stream8 emits a loop over n elements (n a multiple of 8): body(u) handles the 8 elements
// of vector u at byte offsets size·8·u from every pointer (size[i] bytes per element of
// ptrs[i]); 4 vectors per iteration, then single vectors, then it falls through.
func stream8(name string, n reg.GPVirtual, ptrs []reg.GPVirtual, size []int, body func(u int)) {
	advance := func(elems int) {
		for i, p := range ptrs {
			ADDQ(U32(elems*size[i]), p)
		}
		SUBQ(U8(elems), n)
	}
	Label(name + "_loop32")
	CMPQ(n, U8(32))
	JL(LabelRef(name + "_loop8"))
	for u := range 4 {
		body(u)
	}
	advance(32)
	JMP(LabelRef(name + "_loop32"))

	Label(name + "_loop8")
	TESTQ(n, n)
	JE(LabelRef(name + "_done"))
	body(0)
	advance(8)
	JMP(LabelRef(name + "_loop8"))
	Label(name + "_done")
}

// genCPUID emits cpuid1ECX, which returns ECX of CPUID leaf 1 (x/sys/cpu does not report
// F16C, bit 29).
func genCPUID() {
	TEXT("cpuid1ECX", NOSPLIT, "func() uint32")
	Doc("cpuid1ECX returns ECX of CPUID leaf 1 (feature flags; bit 29 is F16C).")
	MOVL(U32(1), reg.EAX)
	XORL(reg.ECX, reg.ECX)
	CPUID()
	Store(reg.ECX, ReturnIndex(0))
	RET()
}
