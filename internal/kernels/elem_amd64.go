package kernels

// elemAsm is one instruction set's elementwise kernels whose bodies the generator
// writes once for AVX-512 and AVX2 (asmgen/simd.go; layers_amd64.s): the exponential,
// GELU, LSTM-cell and LayerNorm row kernels and the SGD steps. install puts their
// wrappers into a vector table. All handle any n, the tail included. (lnParamGrad,
// whose column blocks differ, is set by each table.)
type elemAsm struct {
	expSum                 func(dst, x *float32, n int, shift float32) float64
	max                    func(x *float32, n int) float32
	gelu                   func(y, x *float32, n int)
	geluCDF                func(y, cdf, x *float32, n int)
	geluBwdSet, geluBwdAcc func(dx, x, cdf, dy *float32, n int)
	lstmFwd                func(gates, c, tc, h *float32, n int)
	lstmFwdPrev            func(gates, cPrev, c, tc, h *float32, n int)
	lstmBwd                func(d, a, tc, dy, dc *float32, n int)
	lstmBwdRec             func(d, a, tc, dy, dhRec, dc *float32, n int)
	lstmBwdPrev            func(d, a, cPrev, tc, dy, dc *float32, n int)
	lstmBwdPrevRec         func(d, a, cPrev, tc, dy, dhRec, dc *float32, n int)
	lnStats                func(x *float32, n int) (mean, ss float64)
	lnApply                func(y, x, gamma, beta *float32, n int, mu, inv float32)
	lnBwdStats             func(dy, x, gamma *float32, n int, mu, inv float32) (s1, s2 float32)
	lnBwdDxSet, lnBwdDxAcc func(dx, dy, x, gamma *float32, n int, mu, inv, s1, s2 float32)
	sgdMom, sgdNesterov    func(w, grad, buf *float32, n int, lr, wd, mom, damp float32)
	sgdPlain               func(w, grad *float32, n int, lr, wd float32)
}

var avx512Elem = &elemAsm{
	expSum: expSumAVX512, max: maxAVX512, gelu: geluAVX512, geluCDF: geluCDFAVX512,
	geluBwdSet: geluBwdSetAVX512, geluBwdAcc: geluBwdAccAVX512,
	lstmFwd: lstmFwdAVX512, lstmFwdPrev: lstmFwdPrevAVX512,
	lstmBwd: lstmBwdAVX512, lstmBwdRec: lstmBwdRecAVX512,
	lstmBwdPrev: lstmBwdPrevAVX512, lstmBwdPrevRec: lstmBwdPrevRecAVX512,
	lnStats: lnStatsAVX512, lnApply: lnApplyAVX512, lnBwdStats: lnBwdStatsAVX512,
	lnBwdDxSet: lnBwdDxSetAVX512, lnBwdDxAcc: lnBwdDxAccAVX512,
	sgdMom: sgdMomAVX512, sgdNesterov: sgdNesterovAVX512, sgdPlain: sgdPlainAVX512,
}

var avx2Elem = &elemAsm{
	expSum: expSumAVX2, max: maxAVX2, gelu: geluAVX2, geluCDF: geluCDFAVX2,
	geluBwdSet: geluBwdSetAVX2, geluBwdAcc: geluBwdAccAVX2,
	lstmFwd: lstmFwdAVX2, lstmFwdPrev: lstmFwdPrevAVX2,
	lstmBwd: lstmBwdAVX2, lstmBwdRec: lstmBwdRecAVX2,
	lstmBwdPrev: lstmBwdPrevAVX2, lstmBwdPrevRec: lstmBwdPrevRecAVX2,
	lnStats: lnStatsAVX2, lnApply: lnApplyAVX2, lnBwdStats: lnBwdStatsAVX2,
	lnBwdDxSet: lnBwdDxSetAVX2, lnBwdDxAcc: lnBwdDxAccAVX2,
	sgdMom: sgdMomAVX2, sgdNesterov: sgdNesterovAVX2, sgdPlain: sgdPlainAVX2,
}

// install sets v's expSum, maxOf, gelu, geluBwd, lstmFwd, lstmBwd, lnStats, lnApply,
// lnBwdStats, lnBwdDx, sgdMom and sgdPlain to m's kernels
// (callers checked lengths; the bounds checks below guard the assembly).
func (m *elemAsm) install(v *vecOps) {
	v.expSum = func(dst, x []float32, shift float32) float64 {
		if len(x) == 0 {
			return 0
		}
		_ = dst[len(x)-1]
		return m.expSum(&dst[0], &x[0], len(x), shift)
	}
	v.maxOf = func(x []float32) float32 { return m.max(&x[0], len(x)) }
	v.gelu = func(y, cdf, x []float32) {
		n := len(x)
		if n == 0 {
			return
		}
		_ = y[n-1]
		if cdf == nil {
			m.gelu(&y[0], &x[0], n)
			return
		}
		_ = cdf[n-1]
		m.geluCDF(&y[0], &cdf[0], &x[0], n)
	}
	v.geluBwd = func(dx, x, cdf, dy []float32, acc bool) {
		n := len(x)
		if n == 0 {
			return
		}
		_, _, _ = dx[n-1], cdf[n-1], dy[n-1]
		if acc {
			m.geluBwdAcc(&dx[0], &x[0], &cdf[0], &dy[0], n)
		} else {
			m.geluBwdSet(&dx[0], &x[0], &cdf[0], &dy[0], n)
		}
	}
	v.lstmFwd = func(g, cPrev, c, tc, h []float32) {
		n := len(c)
		if n == 0 {
			return
		}
		_, _, _ = g[4*n-1], tc[n-1], h[n-1]
		if cPrev == nil {
			m.lstmFwd(&g[0], &c[0], &tc[0], &h[0], n)
			return
		}
		_ = cPrev[n-1]
		m.lstmFwdPrev(&g[0], &cPrev[0], &c[0], &tc[0], &h[0], n)
	}
	v.lstmBwd = func(d, a, cPrev, tc, dy, dhRec, dc []float32) {
		n := len(dc)
		if n == 0 {
			return
		}
		if dy == nil { // not reached from nn.LSTM, which always has a gradient from above
			lstmBwdGeneric(d, a, cPrev, tc, dy, dhRec, dc)
			return
		}
		_, _, _, _ = d[4*n-1], a[4*n-1], tc[n-1], dy[n-1]
		switch {
		case cPrev != nil && dhRec != nil:
			_, _ = cPrev[n-1], dhRec[n-1]
			m.lstmBwdPrevRec(&d[0], &a[0], &cPrev[0], &tc[0], &dy[0], &dhRec[0], &dc[0], n)
		case cPrev != nil:
			_ = cPrev[n-1]
			m.lstmBwdPrev(&d[0], &a[0], &cPrev[0], &tc[0], &dy[0], &dc[0], n)
		case dhRec != nil:
			_ = dhRec[n-1]
			m.lstmBwdRec(&d[0], &a[0], &tc[0], &dy[0], &dhRec[0], &dc[0], n)
		default:
			m.lstmBwd(&d[0], &a[0], &tc[0], &dy[0], &dc[0], n)
		}
	}
	v.lnStats = func(x []float32) (mean, ss float64) { return m.lnStats(&x[0], len(x)) }
	v.lnApply = func(y, x, gamma, beta []float32, mu, inv float32) {
		n := len(x)
		_, _, _ = y[n-1], gamma[n-1], beta[n-1]
		m.lnApply(&y[0], &x[0], &gamma[0], &beta[0], n, mu, inv)
	}
	v.lnBwdStats = func(dy, x, gamma []float32, mu, inv float32) (s1, s2 float32) {
		n := len(dy)
		_, _ = x[n-1], gamma[n-1]
		return m.lnBwdStats(&dy[0], &x[0], &gamma[0], n, mu, inv)
	}
	v.lnBwdDx = func(dx, dy, x, gamma []float32, mu, inv, s1, s2 float32, acc bool) {
		n := len(dy)
		_, _, _ = dx[n-1], x[n-1], gamma[n-1]
		if acc {
			m.lnBwdDxAcc(&dx[0], &dy[0], &x[0], &gamma[0], n, mu, inv, s1, s2)
		} else {
			m.lnBwdDxSet(&dx[0], &dy[0], &x[0], &gamma[0], n, mu, inv, s1, s2)
		}
	}
	v.sgdMom = func(w, g, buf []float32, lr, wd, mom, damp float32, nesterov bool) {
		n := len(w)
		if n == 0 {
			return
		}
		_, _ = g[n-1], buf[n-1]
		if nesterov {
			m.sgdNesterov(&w[0], &g[0], &buf[0], n, lr, wd, mom, damp)
		} else {
			m.sgdMom(&w[0], &g[0], &buf[0], n, lr, wd, mom, damp)
		}
	}
	v.sgdPlain = func(w, g []float32, lr, wd float32) {
		n := len(w)
		if n == 0 {
			return
		}
		_ = g[n-1]
		m.sgdPlain(&w[0], &g[0], n, lr, wd)
	}
}
