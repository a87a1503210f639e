package kernels

// f16cHalf is the F16C implementation of the binary16 slice conversions, or genericHalf on a
// CPU without F16C (CPUID leaf 1, ECX bit 29; x/sys/cpu does not report it). The avx2 and
// avx512 paths both use it: the 256-bit VEX forms are all they need (a conversion is a
// few instructions per 8 elements, far from the memory bandwidth's limit).
var f16cHalf = func() *halfOps {
	if cpuid1ECX()&(1<<29) == 0 {
		return genericHalf
	}
	return &halfOps{encode: encodeHalfF16C, decode: decodeHalfF16C, add: addHalfF16C}
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
