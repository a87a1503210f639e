package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// 16-bit float conversion kernels, emitted with -half into half_amd64.s /
// half_stub_amd64.go: IEEE binary16 with F16C on 256-bit vectors (VEX-encoded; AVX2 machines
// have it, AVX-512 ones too), bfloat16 with AVX2 integer arithmetic (the scalar code's
// rounding, lane by lane). Each processes n elements, n a multiple of 8 (the Go wrappers in
// half_amd64.go convert the remainder with the scalar code): 32 per iteration (4 ymm), then
// 8. VCVTPS2PH's immediate 0 rounds to nearest, ties to even, whatever MXCSR says; Go runs
// with every floating-point exception masked and without DAZ/FTZ, so subnormal float32
// inputs and VADDPS/VDIVPS results are exact IEEE.

func genHalf() {
	genCPUID()
	genBF16()

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

// genBF16 emits the bfloat16 kernels: encode (b + 0x7fff + (b>>16 & 1)) >> 16, a NaN
// (|b| > 0x7f800000) to b>>16 | 0x40 instead; decode h << 16.
func genBF16() {
	type consts struct{ one, round, abs, inf, quiet reg.VecVirtual }
	load := func() consts {
		return consts{bcastU32(1), bcastU32(0x7fff), bcastU32(0x7fffffff), bcastU32(0x7f800000), bcastU32(0x40)}
	}
	// encode8 rounds the 8 float32 in y to bfloat16 and stores them at m (16 bytes).
	encode8 := func(c consts, y reg.VecVirtual, m Mem) {
		hi, r, nan := YMM(), YMM(), YMM()
		VPSRLD(U8(16), y, hi)
		VPAND(c.one, hi, r)
		VPADDD(y, r, r)
		VPADDD(c.round, r, r)
		VPSRLD(U8(16), r, r)
		VPAND(c.abs, y, nan)
		VPCMPGTD(c.inf, nan, nan) // |b| > 0x7f800000: NaN
		VPOR(c.quiet, hi, hi)
		VPBLENDVB(nan, hi, r, r)
		x := XMM()
		VEXTRACTI128(U8(1), r, x)
		VPACKUSDW(x, r.AsX(), x) // every lane is at most 0xffff: no saturation
		VMOVDQU(x, m)
	}

	TEXT("bf16EncodeAVX2", NOSPLIT, "func(dst *uint16, src *float32, n int, div float32)")
	Doc("bf16EncodeAVX2 sets dst[i] to the bfloat16 bits of src[i]/div (divided in float32, rounded",
		"to nearest even; a NaN quiet, top payload bits kept) for i < n, n a multiple of 8 (AVX2).")
	{
		d, s, n := gp("dst"), gp("src"), gp("n")
		yd := YMM()
		VBROADCASTSS(paramAddr("div"), yd)
		c := load()
		stream8("bf16EncodeAVX2", n, []reg.GPVirtual{d, s}, []int{2, 4}, func(u int) {
			y := YMM()
			VMOVUPS(Mem{Base: s, Disp: 32 * u}, y)
			VDIVPS(yd, y, y)
			encode8(c, y, Mem{Base: d, Disp: 16 * u})
		})
		VZEROUPPER()
		RET()
	}

	TEXT("bf16DecodeAVX2", NOSPLIT, "func(dst *float32, src *uint16, n int)")
	Doc("bf16DecodeAVX2 sets dst[i] to the float32 value of the bfloat16 bits src[i] for i < n, n a",
		"multiple of 8 (AVX2).")
	{
		d, s, n := gp("dst"), gp("src"), gp("n")
		stream8("bf16DecodeAVX2", n, []reg.GPVirtual{d, s}, []int{4, 2}, func(u int) {
			y := YMM()
			VPMOVZXWD(Mem{Base: s, Disp: 16 * u}, y)
			VPSLLD(U8(16), y, y)
			VMOVDQU(y, Mem{Base: d, Disp: 32 * u})
		})
		VZEROUPPER()
		RET()
	}

	TEXT("bf16AddAVX2", NOSPLIT, "func(dst, a, b *uint16, n int)")
	Doc("bf16AddAVX2 sets dst[i] to the bfloat16 bits of float32(a[i]) + float32(b[i]) (added in",
		"float32, rounded to nearest even) for i < n, n a multiple of 8 (AVX2).")
	{
		d, a, b, n := gp("dst"), gp("a"), gp("b"), gp("n")
		c := load()
		stream8("bf16AddAVX2", n, []reg.GPVirtual{d, a, b}, []int{2, 2, 2}, func(u int) {
			ya, yb := YMM(), YMM()
			VPMOVZXWD(Mem{Base: a, Disp: 16 * u}, ya)
			VPMOVZXWD(Mem{Base: b, Disp: 16 * u}, yb)
			VPSLLD(U8(16), ya, ya)
			VPSLLD(U8(16), yb, yb)
			VADDPS(ya, yb, ya) // yb + ya: both NaNs keep b's payload, as halfAddF16C
			encode8(c, ya, Mem{Base: d, Disp: 16 * u})
		})
		VZEROUPPER()
		RET()
	}
}

// bcastU32 returns a fresh ymm register with v in every 32-bit lane.
func bcastU32(v uint32) reg.VecVirtual {
	r, x, y := GP32(), XMM(), YMM()
	MOVL(U32(v), r)
	VMOVD(r, x)
	VPBROADCASTD(x, y)
	return y
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
