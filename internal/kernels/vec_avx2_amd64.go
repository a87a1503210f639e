package kernels

// avx2Vec is the portable vector table with the AVX2 ReLU passes and the
// residual add, and the 8×8 transposes of the NHWC layout passes
// (sgemm_amd64.s) in place of the Go loops: on an AVX2 machine
// these ran as scalar loops and took 11% of a ResNet-20 training step. The
// assembly handles a multiple of 8 elements; the rest goes through the
// portable loop. The other entries are genericVec's.
var avx2Vec = func() *vecOps {
	v := *genericVec
	v.reluFwd = func(dst, x []float32) {
		n := len(dst) &^ 7
		if n > 0 {
			_ = x[n-1]
			reluFwdAVX2(&dst[0], &x[0], n)
		}
		reluFwdGeneric(dst[n:], x[n:])
	}
	v.reluBwd = func(dx, y, dy []float32) {
		n := len(dx) &^ 7
		if n > 0 {
			_, _ = y[n-1], dy[n-1]
			reluBwdAVX2(&dx[0], &y[0], &dy[0], n)
		}
		reluBwdGeneric(dx[n:], y[n:], dy[n:])
	}
	v.reluBwdSet = func(dx, y, dy []float32) {
		n := len(dx) &^ 7
		if n > 0 {
			_, _ = y[n-1], dy[n-1]
			reluBwdSetAVX2(&dx[0], &y[0], &dy[0], n)
		}
		reluBwdSetGeneric(dx[n:], y[n:], dy[n:])
	}
	v.add = func(dst, a, b []float32) {
		n := len(dst) &^ 7
		if n > 0 {
			_, _ = a[n-1], b[n-1]
			addAVX2(&dst[0], &a[0], &b[0], n)
		}
		addGeneric(dst[n:], a[n:], b[n:])
	}
	v.transpose8 = func(dst []float32, ldd int, src []float32, lds, blocks int) {
		if blocks > 0 {
			_, _ = dst[(8*blocks-1)*ldd+7], src[7*lds+8*blocks-1]
			transpose8AVX2(&dst[0], ldd, &src[0], lds, blocks)
		}
	}
	return &v
}()
