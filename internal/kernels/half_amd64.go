package kernels

// amd64Half holds the vector slice conversions of the avx2 and avx512 paths (both need AVX2):
// bfloat16 with AVX2, binary16 with F16C when the CPU has it (CPUID leaf 1, ECX bit 29;
// x/sys/cpu does not report it), else the scalar loops. 256-bit VEX forms are all they need:
// a conversion is a few instructions per 8 elements, far from memory bandwidth's limit.
var amd64Half = func() *halfOps {
	ops := &halfOps{
		encode: encodeHalfGeneric, decode: decodeHalfGeneric, add: addHalfGeneric,
		encodeBF16: encodeBF16AVX2, decodeBF16: decodeBF16AVX2, addBF16: addBF16AVX2,
	}
	if cpuid1ECX()&(1<<29) != 0 {
		ops.encode, ops.decode, ops.add = encodeHalfF16C, decodeHalfF16C, addHalfF16C
	}
	return ops
}()

// The kernels take multiples of 8 elements; the last len%8 go through the scalar code.

func encodeHalfF16C(dst []uint16, src []float32, div float32) {
	n := len(src) &^ 7
	if n > 0 {
		_ = dst[n-1]
		halfEncodeF16C(&dst[0], &src[0], n, div)
	}
	encodeHalfGeneric(dst[n:], src[n:], div)
}

func decodeHalfF16C(dst []float32, src []uint16) {
	n := len(src) &^ 7
	if n > 0 {
		_ = dst[n-1]
		halfDecodeF16C(&dst[0], &src[0], n)
	}
	decodeHalfGeneric(dst[n:], src[n:])
}

func addHalfF16C(dst, a, b []uint16) {
	n := len(a) &^ 7
	if n > 0 {
		_, _ = dst[n-1], b[n-1]
		halfAddF16C(&dst[0], &a[0], &b[0], n)
	}
	addHalfGeneric(dst[n:], a[n:], b[n:])
}

func encodeBF16AVX2(dst []uint16, src []float32, div float32) {
	n := len(src) &^ 7
	if n > 0 {
		_ = dst[n-1]
		bf16EncodeAVX2(&dst[0], &src[0], n, div)
	}
	encodeBF16Generic(dst[n:], src[n:], div)
}

func decodeBF16AVX2(dst []float32, src []uint16) {
	n := len(src) &^ 7
	if n > 0 {
		_ = dst[n-1]
		bf16DecodeAVX2(&dst[0], &src[0], n)
	}
	decodeBF16Generic(dst[n:], src[n:])
}

func addBF16AVX2(dst, a, b []uint16) {
	n := len(a) &^ 7
	if n > 0 {
		_, _ = dst[n-1], b[n-1]
		bf16AddAVX2(&dst[0], &a[0], &b[0], n)
	}
	addBF16Generic(dst[n:], a[n:], b[n:])
}
