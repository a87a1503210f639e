package kernels

// bnNHWCAVX2 are the channels-last BatchNorm passes in AVX2 assembly
// (layers_amd64.s), for the AVX2 and AVX-512 tables. The assembly takes lane arrays
// of a multiple of 8 elements; a pass over a shorter or odd rest of a block (fewer
// elements than a chunk) runs the portable loop, which gives the same bits.
var bnNHWCAVX2 = &bnNHWCOps{
	sumDev: func(acc, k, x []float32) {
		e, rows := bnhRows(len(acc), len(x))
		if e == 0 {
			bnhSumDevGeneric(acc, k, x)
			return
		}
		_, _ = k[e-1], x[rows*e-1]
		bnhSumDevAVX2(&acc[0], &k[0], &x[0], e, rows)
	},
	sumSqDev: func(acc, mu, x []float32) {
		e, rows := bnhRows(len(acc), len(x))
		if e == 0 {
			bnhSumSqDevGeneric(acc, mu, x)
			return
		}
		_, _ = mu[e-1], x[rows*e-1]
		bnhSumSqDevAVX2(&acc[0], &mu[0], &x[0], e, rows)
	},
	dyStats: func(s, t, mu, dy, x []float32) {
		e, rows := bnhRows(len(s), len(dy))
		if e == 0 {
			bnhDyStatsGeneric(s, t, mu, dy, x)
			return
		}
		_, _, _ = t[e-1], mu[e-1], x[rows*e-1]
		bnhDyStatsAVX2(&s[0], &t[0], &mu[0], &dy[0], &x[0], e, rows)
	},
	dyStatsRelu: func(s, t, mu, dy, y, x []float32) {
		e, rows := bnhRows(len(s), len(dy))
		if e == 0 {
			bnhDyStatsReluGeneric(s, t, mu, dy, y, x)
			return
		}
		_, _, _, _ = t[e-1], mu[e-1], y[rows*e-1], x[rows*e-1]
		bnhDyStatsReluAVX2(&s[0], &t[0], &mu[0], &dy[0], &y[0], &x[0], e, rows)
	},
	affine: func(dst, x, mu, a, b []float32) {
		e, rows := bnhRows(len(mu), len(dst))
		if e == 0 {
			bnhAffineGeneric(dst, x, mu, a, b)
			return
		}
		_, _, _ = a[e-1], b[e-1], x[rows*e-1]
		bnhAffineAVX2(&dst[0], &x[0], &mu[0], &a[0], &b[0], e, rows)
	},
	affineRelu: func(dst, x, r, mu, a, b []float32) {
		e, rows := bnhRows(len(mu), len(dst))
		if e == 0 {
			bnhAffineReluGeneric(dst, x, r, mu, a, b)
			return
		}
		_, _, _ = a[e-1], b[e-1], x[rows*e-1]
		if r == nil {
			bnhAffineReluAVX2(&dst[0], &x[0], &mu[0], &a[0], &b[0], e, rows)
			return
		}
		_ = r[rows*e-1]
		bnhAffineAddReluAVX2(&dst[0], &x[0], &r[0], &mu[0], &a[0], &b[0], e, rows)
	},
	bnBwd: func(dst, dy, x, mu, a, b, c []float32, acc bool) {
		e, rows := bnhRows(len(mu), len(dst))
		if e == 0 {
			bnhBwdGeneric(dst, dy, x, mu, a, b, c, acc)
			return
		}
		_, _, _, _, _ = a[e-1], b[e-1], c[e-1], dy[rows*e-1], x[rows*e-1]
		if acc {
			bnhBwdAccAVX2(&dst[0], &dy[0], &x[0], &mu[0], &a[0], &b[0], &c[0], e, rows)
		} else {
			bnhBwdSetAVX2(&dst[0], &dy[0], &x[0], &mu[0], &a[0], &b[0], &c[0], e, rows)
		}
	},
	bnBwdRelu: func(dst, dy, y, x, mu, a, b, c []float32, acc bool) {
		e, rows := bnhRows(len(mu), len(dst))
		if e == 0 {
			bnhBwdReluGeneric(dst, dy, y, x, mu, a, b, c, acc)
			return
		}
		_, _, _, _, _, _ = a[e-1], b[e-1], c[e-1], dy[rows*e-1], y[rows*e-1], x[rows*e-1]
		if acc {
			bnhBwdReluAccAVX2(&dst[0], &dy[0], &y[0], &x[0], &mu[0], &a[0], &b[0], &c[0], e, rows)
		} else {
			bnhBwdReluSetAVX2(&dst[0], &dy[0], &y[0], &x[0], &mu[0], &a[0], &b[0], &c[0], e, rows)
		}
	},
}

// bnhRows returns the lane count e and row count of a pass over n stream elements
// with lane arrays of e elements, or e = 0 when the assembly cannot run it (e not a
// positive multiple of 8, or no whole row).
func bnhRows(e, n int) (int, int) {
	if e <= 0 || e%8 != 0 || n < e {
		return 0, 0
	}
	return e, n / e
}
