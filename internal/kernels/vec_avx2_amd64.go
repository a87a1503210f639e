package kernels

// avx2Vec is the portable vector table with the AVX2 ReLU passes, add, mul,
// scale and axpy (multiply then add, not fused: bit-identical to the Go loop),
// BatchNorm's per-plane passes, the six-row A packing and the
// 8×8 transposes of the NHWC layout passes (sgemm_amd64.s) in place of the
// Go loops: on an AVX2 machine the ReLU passes ran as scalar loops and took
// 11% of a ResNet-20 training step, the BatchNorm passes 16%. The assembly
// handles a multiple of 8 elements; the rest goes through the portable loop (a
// reduction adds the rest's sum last, so its order still depends only on the
// length). BatchNorm's per-plane passes (the fused ReLU ones too) are its plane
// kernels with one plane.
// The exponential, GELU, LSTM-cell and LayerNorm kernels and the SGD steps
// (avx2Elem, layers_amd64.s) take any length: their tails are masked, so every
// element goes through the same formula; on AVX2 the scalar exp32 and erfc32 were
// 40% of a BERT-tiny step and 22% of an LSTM one. LayerNorm's column sums run 32 columns at
// a time, the rest in Go. The other entries are genericVec's.
var avx2Vec = func() *vecOps {
	v := *genericVec
	v.maxPoolWindow = func(y []float32, arg []int32, x []float32, rows, cols, rs, c int, base, w int32) {
		n := len(y) &^ 7
		if n > 0 {
			_, _ = arg[n-1], x[(rows-1)*rs+(cols-1)*c+n-1]
			maxPoolWindowAVX2(&y[0], &arg[0], &x[0], rows, cols, 4*rs, 4*c, base, w, n)
		}
		if n < len(y) {
			maxPoolWindowGeneric(y[n:], arg[n:], x[n:], rows, cols, rs, c, base, w)
		}
	}
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
	v.mul = func(dst, a, b []float32) {
		n := len(dst) &^ 7
		if n > 0 {
			_, _ = a[n-1], b[n-1]
			mulAVX2(&dst[0], &a[0], &b[0], n)
		}
		mulGeneric(dst[n:], a[n:], b[n:])
	}
	v.scale = func(alpha float32, x []float32) {
		n := len(x) &^ 7
		if n > 0 {
			scaleAVX2(alpha, &x[0], n)
		}
		scaleGeneric(alpha, x[n:])
	}
	v.axpy = func(alpha float32, x, y []float32) {
		n := len(x) &^ 7
		if n > 0 {
			_ = y[n-1]
			axpyAVX2(alpha, &x[0], &y[0], n)
		}
		axpyGeneric(alpha, x[n:], y[n:])
	}
	v.sumSqDev = func(x []float32, mu float32) float32 {
		n := len(x) &^ 7
		var s float32
		if n > 0 {
			s = sumSqDevPlanesAVX2(&x[0], 1, n, n, mu)
		}
		if n < len(x) {
			s += sumSqDevGeneric(x[n:], mu)
		}
		return s
	}
	v.dyStats = func(dy, x []float32, mu float32) (float32, float32) {
		n := len(dy) &^ 7
		var s, t float32
		if n > 0 {
			_ = x[n-1]
			s, t = dyStatsPlanesAVX2(&dy[0], &x[0], 1, n, n, mu)
		}
		if n < len(dy) {
			s2, t2 := dyStatsGeneric(dy[n:], x[n:len(dy)], mu)
			s, t = s+s2, t+t2
		}
		return s, t
	}
	v.affine = func(dst, x []float32, mu, a, b float32) {
		n := len(dst) &^ 7
		if n > 0 {
			_ = x[n-1]
			affinePlanesAVX2(&dst[0], &x[0], 1, n, n, mu, a, b)
		}
		affineGeneric(dst[n:], x[n:len(dst)], mu, a, b)
	}
	v.bnBwd = func(dst, dy, x []float32, mu, a, b, c float32, acc bool) {
		n := len(dst) &^ 7
		if n > 0 {
			_, _ = dy[n-1], x[n-1]
			if acc {
				bnBwdAccPlanesAVX2(&dst[0], &dy[0], &x[0], 1, n, n, mu, a, b, c)
			} else {
				bnBwdSetPlanesAVX2(&dst[0], &dy[0], &x[0], 1, n, n, mu, a, b, c)
			}
		}
		bnBwdGeneric(dst[n:], dy[n:len(dst)], x[n:len(dst)], mu, a, b, c, acc)
	}
	v.affineRelu = func(dst, x, r []float32, mu, a, b float32) {
		n := len(dst) &^ 7
		if n > 0 {
			_ = x[n-1]
			if r == nil {
				affineReluPlanesAVX2(&dst[0], &x[0], 1, n, n, mu, a, b)
			} else {
				_ = r[n-1]
				affineAddReluPlanesAVX2(&dst[0], &x[0], &r[0], 1, n, n, mu, a, b)
			}
		}
		if r != nil {
			r = r[n:len(dst)]
		}
		affineReluGeneric(dst[n:], x[n:len(dst)], r, mu, a, b)
	}
	v.dyStatsRelu = func(dy, y, x []float32, mu float32) (float32, float32) {
		n := len(dy) &^ 7
		var s, t float32
		if n > 0 {
			_, _ = y[n-1], x[n-1]
			s, t = dyStatsReluPlanesAVX2(&dy[0], &y[0], &x[0], 1, n, n, mu)
		}
		if n < len(dy) {
			s2, t2 := dyStatsReluGeneric(dy[n:], y[n:len(dy)], x[n:len(dy)], mu)
			s, t = s+s2, t+t2
		}
		return s, t
	}
	v.bnBwdRelu = func(dst, dy, y, x []float32, mu, a, b, c float32, acc bool) {
		n := len(dst) &^ 7
		if n > 0 {
			_, _, _ = dy[n-1], y[n-1], x[n-1]
			if acc {
				bnBwdReluAccPlanesAVX2(&dst[0], &dy[0], &y[0], &x[0], 1, n, n, mu, a, b, c)
			} else {
				bnBwdReluSetPlanesAVX2(&dst[0], &dy[0], &y[0], &x[0], 1, n, n, mu, a, b, c)
			}
		}
		bnBwdReluGeneric(dst[n:], dy[n:len(dst)], y[n:len(dst)], x[n:len(dst)], mu, a, b, c, acc)
	}
	v.bnPlanes = &bnPlanesOps{
		sumDev: func(x []float32, n, plane, stride int, k float32) float32 {
			_ = x[planesLen(n, plane, stride)-1]
			return sumDevPlanesAVX2(&x[0], n, plane, stride, k)
		},
		sumSqDev: func(x []float32, n, plane, stride int, mu float32) float32 {
			_ = x[planesLen(n, plane, stride)-1]
			return sumSqDevPlanesAVX2(&x[0], n, plane, stride, mu)
		},
		dyStats: func(dy, x []float32, n, plane, stride int, mu float32) (float32, float32) {
			l := planesLen(n, plane, stride)
			_, _ = dy[l-1], x[l-1]
			return dyStatsPlanesAVX2(&dy[0], &x[0], n, plane, stride, mu)
		},
		affine: func(dst, x []float32, n, plane, stride int, mu, a, b float32) {
			l := planesLen(n, plane, stride)
			_, _ = dst[l-1], x[l-1]
			affinePlanesAVX2(&dst[0], &x[0], n, plane, stride, mu, a, b)
		},
		bnBwd: func(dst, dy, x []float32, n, plane, stride int, mu, a, b, c float32, acc bool) {
			l := planesLen(n, plane, stride)
			_, _, _ = dst[l-1], dy[l-1], x[l-1]
			if acc {
				bnBwdAccPlanesAVX2(&dst[0], &dy[0], &x[0], n, plane, stride, mu, a, b, c)
			} else {
				bnBwdSetPlanesAVX2(&dst[0], &dy[0], &x[0], n, plane, stride, mu, a, b, c)
			}
		},
		affineRelu: func(dst, x, r []float32, n, plane, stride int, mu, a, b float32) {
			l := planesLen(n, plane, stride)
			_, _ = dst[l-1], x[l-1]
			if r == nil {
				affineReluPlanesAVX2(&dst[0], &x[0], n, plane, stride, mu, a, b)
				return
			}
			_ = r[l-1]
			affineAddReluPlanesAVX2(&dst[0], &x[0], &r[0], n, plane, stride, mu, a, b)
		},
		dyStatsRelu: func(dy, y, x []float32, n, plane, stride int, mu float32) (float32, float32) {
			l := planesLen(n, plane, stride)
			_, _, _ = dy[l-1], y[l-1], x[l-1]
			return dyStatsReluPlanesAVX2(&dy[0], &y[0], &x[0], n, plane, stride, mu)
		},
		bnBwdRelu: func(dst, dy, y, x []float32, n, plane, stride int, mu, a, b, c float32, acc bool) {
			l := planesLen(n, plane, stride)
			_, _, _, _ = dst[l-1], dy[l-1], y[l-1], x[l-1]
			if acc {
				bnBwdReluAccPlanesAVX2(&dst[0], &dy[0], &y[0], &x[0], n, plane, stride, mu, a, b, c)
			} else {
				bnBwdReluSetPlanesAVX2(&dst[0], &dy[0], &y[0], &x[0], n, plane, stride, mu, a, b, c)
			}
		},
	}
	v.bnNHWC = bnNHWCAVX2
	avx2Elem.install(&v)
	v.lnParamGrad = func(sg, sb, dy, x, mean, rstd []float32, d int) {
		rows, n := len(mean), len(sg)
		if rows == 0 || n == 0 {
			return
		}
		_, _, _, _ = sb[n-1], rstd[rows-1], dy[(rows-1)*d+n-1], x[(rows-1)*d+n-1]
		c := 0
		for ; c+32 <= n; c += 32 {
			lnParamGradAVX2(&sg[c], &sb[c], &dy[c], &x[c], &mean[0], &rstd[0], rows, d)
		}
		lnParamGradGeneric(sg[c:], sb[c:], dy[c:], x[c:], mean, rstd, d)
	}
	v.pack6 = func(dst, src []float32, lds, blocks int) {
		if blocks > 0 {
			_, _ = dst[48*blocks-1], src[5*lds+8*blocks-1]
			pack6AVX2(&dst[0], &src[0], lds, blocks)
		}
	}
	v.packT6 = func(dst, src []float32, lds, rows int) {
		n := len(dst) / 6
		if n == 0 {
			return
		}
		_ = src[(n-1)*lds+rows-1]
		switch rows {
		case 6:
			packT6AVX2(&dst[0], &src[0], lds, n)
		case 4:
			packT4AVX2(&dst[0], &src[0], lds, n)
		case 2:
			packT2AVX2(&dst[0], &src[0], lds, n)
		default:
			packT6Generic(dst, src, lds, rows)
		}
	}
	v.transpose8 = func(dst []float32, ldd int, src []float32, lds, blocks int) {
		if blocks > 0 {
			_, _ = dst[(8*blocks-1)*ldd+7], src[7*lds+8*blocks-1]
			transpose8AVX2(&dst[0], ldd, &src[0], lds, blocks)
		}
	}
	return &v
}()
