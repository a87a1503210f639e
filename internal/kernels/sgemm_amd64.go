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
	kernel:   wrapKernel(sgemmKernelAVX512x8),
	indirect: indirectAVX512, indirectNarrow: indirectAVX512n,
	bIndirect: func(k int, a, x []float32, base, split int, offs []int, c []float32, ldc int, beta float32) {
		_, _ = a[8*k-1], offs[k-1]
		sgemmBIndirectAVX512x8(k, &a[0], &x[base], split, &offs[0], &c[0], ldc, beta)
	},
	vec:  avx512Vec,
	half: amd64Half,
}

// indirectAVX512 adapts sgemmIndirectAVX512x8 to indirectKernel. ConvNHWC
// guarantees that every row run lies inside x and that c covers the tile.
func indirectAVX512(_ *gemmImpl, taps, clen int, x []float32, base int, offs []int, b, c []float32, ldc int, beta float32) {
	_ = offs[taps*8-1]
	sgemmIndirectAVX512x8(taps, clen, &x[base], &offs[0], &b[0], &c[0], ldc, beta)
}

var avx2Impl = &gemmImpl{
	name: "avx2",
	mr:   6, nr: 16,
	mc: 192, kc: 256, nc: 4096,
	kernel:   wrapKernel(sgemmKernelAVX2),
	indirect: indirectAVX2, indirectNarrow: indirectAVX2n,
	bIndirect: func(k int, a, x []float32, base, split int, offs []int, c []float32, ldc int, beta float32) {
		_, _ = a[6*k-1], offs[k-1]
		sgemmBIndirectAVX2x6(k, &a[0], &x[base], split, &offs[0], &c[0], ldc, beta)
	},
	bIndirectRows: func(rows, k int, a, x []float32, base, split int, offs []int, c []float32, ldc int, beta float32) bool {
		f := sgemmBIndirectAVX2x6r4
		switch rows {
		case 4:
		case 2:
			f = sgemmBIndirectAVX2x6r2
		default:
			return false
		}
		_, _, _ = a[6*k-1], offs[k-1], c[(rows-1)*ldc+15]
		f(k, &a[0], &x[base], split, &offs[0], &c[0], ldc, beta)
		return true
	},
	vec:  avx2Vec,
	half: amd64Half,
}

// indirectAVX2 adapts sgemmIndirectAVX2x6 to indirectKernel (the same
// guarantees as indirectAVX512).
func indirectAVX2(_ *gemmImpl, taps, clen int, x []float32, base int, offs []int, b, c []float32, ldc int, beta float32) {
	_ = offs[taps*6-1]
	sgemmIndirectAVX2x6(taps, clen, &x[base], &offs[0], &b[0], &c[0], ldc, beta)
}

// indirectAVX512n and indirectAVX2n adapt the narrow kernels (the tile's first
// 16 and 8 columns) likewise.
func indirectAVX512n(_ *gemmImpl, taps, clen int, x []float32, base int, offs []int, b, c []float32, ldc int, beta float32) {
	_ = offs[taps*8-1]
	sgemmIndirectAVX512x8n(taps, clen, &x[base], &offs[0], &b[0], &c[0], ldc, beta)
}

func indirectAVX2n(_ *gemmImpl, taps, clen int, x []float32, base int, offs []int, b, c []float32, ldc int, beta float32) {
	_ = offs[taps*6-1]
	sgemmIndirectAVX2x6n(taps, clen, &x[base], &offs[0], &b[0], &c[0], ldc, beta)
}

func archImpls() []*gemmImpl { return []*gemmImpl{avx512Impl, avx2Impl, avx512ShapedImpl} }

// avx512Vec wraps the AVX-512 elementwise kernels (callers checked lengths).
var avx512Vec = func() *vecOps {
	v := avx512VecBase
	avx512Elem.install(&v)
	// Where the AVX-512 path has no kernel of its own, the AVX2 one (every AVX-512
	// CPU runs AVX2 and FMA): BatchNorm's passes, NCHW and channels-last, with their
	// fused ReLU and residual forms and the several-plane calls, the channels-last
	// max-pool window and the 8×8 transposes (maps whose width is a multiple of 8
	// but not of 16). The BatchNorm family comes whole from one instruction set, so
	// the fused and unfused passes give the same bits as on the avx2 path.
	a := avx2Vec
	v.sumSqDev, v.dyStats, v.affine, v.bnBwd = a.sumSqDev, a.dyStats, a.affine, a.bnBwd
	v.affineRelu, v.dyStatsRelu, v.bnBwdRelu = a.affineRelu, a.dyStatsRelu, a.bnBwdRelu
	v.bnPlanes, v.bnNHWC = a.bnPlanes, a.bnNHWC
	v.maxPoolWindow, v.transpose8 = a.maxPoolWindow, a.transpose8
	return &v
}()

var avx512VecBase = vecOps{
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
	// Layer kernels (layers_amd64.s).
	reluBwdSet: func(dx, y, dy []float32) {
		if len(dx) > 0 {
			reluBwdSetAVX512(&dx[0], &y[0], &dy[0], len(dx))
		}
	},
	gather32: func(dst, src []float32, rows, srcStep int, idx *[32]int32) {
		if rows > 0 {
			_, _ = dst[32*rows-1], src[(rows-1)*srcStep+int(idx[31])]
			gather32AVX512(&dst[0], &src[0], rows, srcStep, &idx[0])
		}
	},
	transpose16: func(dst []float32, ldd int, src []float32, lds, blocks int) {
		if blocks > 0 {
			_, _ = dst[(16*blocks-1)*ldd+15], src[15*lds+16*blocks-1]
			transpose16AVX512(&dst[0], ldd, &src[0], lds, blocks)
		}
	},
	lnParamGrad: func(sg, sb, dy, x, mean, rstd []float32, d int) {
		rows, n := len(mean), len(sg)
		if rows == 0 || n == 0 {
			return
		}
		_, _, _, _ = sb[n-1], rstd[rows-1], dy[(rows-1)*d+n-1], x[(rows-1)*d+n-1]
		for c := 0; c < n; c += 64 {
			lnParamGradAVX512(&sg[c], &sb[c], &dy[c], &x[c], &mean[0], &rstd[0], rows, d, min(64, n-c))
		}
	},
	pack8: func(dst, src []float32, lds, blocks int) {
		if blocks > 0 {
			_, _ = dst[128*blocks-1], src[7*lds+16*blocks-1]
			pack8AVX512(&dst[0], &src[0], lds, blocks)
		}
	},
	maxPool2x2Row: func(y []float32, arg []int32, r0, r1 []float32, base, w int32) {
		if n := len(y); n > 0 {
			_, _, _ = arg[n-1], r0[2*n-1], r1[2*n-1]
			maxPool2x2RowAVX512(&y[0], &arg[0], &r0[0], &r1[0], n, base, w)
		}
	},
}
