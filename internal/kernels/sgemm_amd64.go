package kernels

type asmKernel func(k int, a, b, c *float32, ldc int, alpha, beta float32)

// wrapKernel adapts an assembly micro-kernel to the slice-based contract.
// The driver guarantees len(a) >= k*mr, len(b) >= k*nr and that c covers
// the mr×nr tile with stride ldc.
func wrapKernel(f asmKernel) func(k int, a, b, c []float32, ldc int, alpha, beta float32) {
	return func(k int, a, b, c []float32, ldc int, alpha, beta float32) {
		f(k, &a[0], &b[0], &c[0], ldc, alpha, beta)
	}
}

var avx512Impl = &gemmImpl{
	name: "avx512",
	mr:   8, nr: 32,
	mc: 256, kc: 256, nc: 4096,
	kernel: wrapKernel(sgemmKernelAVX512x8),
}

var avx2Impl = &gemmImpl{
	name: "avx2",
	mr:   6, nr: 16,
	mc: 192, kc: 256, nc: 4096,
	kernel: wrapKernel(sgemmKernelAVX2),
}

func archImpls() []*gemmImpl { return []*gemmImpl{avx512Impl, avx2Impl} }
