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
	vec:    avx512Vec,
}

var avx2Impl = &gemmImpl{
	name: "avx2",
	mr:   6, nr: 16,
	mc: 192, kc: 256, nc: 4096,
	kernel: wrapKernel(sgemmKernelAVX2),
	vec:    genericVec,
}

func archImpls() []*gemmImpl { return []*gemmImpl{avx512Impl, avx2Impl} }

// avx512Vec wraps the AVX-512 elementwise kernels (callers checked lengths).
var avx512Vec = &vecOps{
	axpy: func(alpha float32, x, y []float32) {
		if len(x) > 0 {
			axpyAVX512(alpha, &x[0], &y[0], len(x))
		}
	},
	scale: func(alpha float32, x []float32) {
		if len(x) > 0 {
			scaleAVX512(alpha, &x[0], len(x))
		}
	},
	add: func(dst, a, b []float32) {
		if len(dst) > 0 {
			addAVX512(&dst[0], &a[0], &b[0], len(dst))
		}
	},
	mul: func(dst, a, b []float32) {
		if len(dst) > 0 {
			mulAVX512(&dst[0], &a[0], &b[0], len(dst))
		}
	},
	dot: func(a, b []float32) float32 {
		if len(a) == 0 {
			return 0
		}
		return dotAVX512(&a[0], &b[0], len(a))
	},
	sum: func(x []float32) float32 {
		if len(x) == 0 {
			return 0
		}
		return sumAVX512(&x[0], len(x))
	},
	reluFwd: func(dst, x []float32) {
		if len(dst) > 0 {
			reluFwdAVX512(&dst[0], &x[0], len(dst))
		}
	},
	reluBwd: func(dx, y, dy []float32) {
		if len(dx) > 0 {
			reluBwdAVX512(&dx[0], &y[0], &dy[0], len(dx))
		}
	},
}
