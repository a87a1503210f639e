package kernels

import (
	"fmt"
	"math"
	"runtime"
)

// The kernels of transformer layers: batched GEMMs over attention heads, a row
// softmax with an additive bias (the attention mask), layer normalisation over the
// last dimension and the exact (erf) GELU. Like the rest of the package, results do
// not depend on the number of goroutines: rows are split, never reductions.

// SgemmBatched computes C_i = alpha*op(A_i)*op(B_i) + beta*C_i for every i in
// [0, len(aOff)), where A_i is the matrix of a starting at aOff[i] (and B_i, C_i
// likewise); all products share the shapes, transpositions and leading dimensions
// of Sgemm. The offsets let one call address the heads of a [N, T, heads·d]
// activation in place (offset n·T·H + h·d, leading dimension H) without a
// transpose. The C_i must not overlap. When there are enough products each one
// runs on one goroutine and the products run in parallel; otherwise they run one
// after another, each parallelised by Sgemm. Every C element is summed in the same
// order either way.
func SgemmBatched(transA, transB bool, m, n, k int, alpha float32, a []float32, aOff []int, lda int, b []float32, bOff []int, ldb int, beta float32, c []float32, cOff []int, ldc int) {
	batch := len(aOff)
	if len(bOff) != batch || len(cOff) != batch {
		panic(fmt.Sprintf("kernels.SgemmBatched: %d A offsets, %d B offsets, %d C offsets", batch, len(bOff), len(cOff)))
	}
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels.SgemmBatched: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	for i := range batch {
		if aOff[i] < 0 || bOff[i] < 0 || cOff[i] < 0 || aOff[i] > len(a) || bOff[i] > len(b) || cOff[i] > len(c) {
			panic(fmt.Sprintf("kernels.SgemmBatched: product %d: offsets A %d, B %d, C %d outside lengths %d, %d, %d",
				i, aOff[i], bOff[i], cOff[i], len(a), len(b), len(c)))
		}
	}
	nw := runtime.GOMAXPROCS(0)
	if batch < 2*nw || nw == 1 {
		for i := range batch {
			Sgemm(transA, transB, m, n, k, alpha, a[aOff[i]:], lda, b[bOff[i]:], ldb, beta, c[cOff[i]:], ldc)
		}
		return
	}
	parallelFor(batch, 2*m*n*k, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			sgemmSerial(transA, transB, m, n, k, alpha, a[aOff[i]:], lda, b[bOff[i]:], ldb, beta, c[cOff[i]:], ldc)
		}
	})
}

// sgemmSerial is Sgemm on the calling goroutine only (no worker pool), for use
// inside a parallel loop. Its results equal Sgemm's bit for bit: units always
// cover all of K, so splitting C does not change any element's summation order.
func sgemmSerial(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	aRows, aCols := m, k
	if transA {
		aRows, aCols = k, m
	}
	bRows, bCols := k, n
	if transB {
		bRows, bCols = n, k
	}
	checkMatrix("A", a, aRows, aCols, lda)
	checkMatrix("B", b, bRows, bCols, ldb)
	checkMatrix("C", c, m, n, ldc)
	if trivialGemm(m, n, k, alpha, beta, c, ldc) {
		return
	}
	j := jobPool.Get().(*gemmJob)
	*j = gemmJob{
		p: impl, transA: transA, transB: transB, m: m, n: n, k: k,
		alpha: alpha, beta: beta, a: a, b: b, c: c, lda: lda, ldb: ldb, ldc: ldc,
	}
	countGEMM(m, n, k)
	j.plan(1)
	j.run()
	j.a, j.b, j.c = nil, nil, nil
	jobPool.Put(j)
}

// SoftmaxRows writes the softmax of each of the rows of k elements of x into y
// (y may be x). With a non-nil bias, bias[(r/rowsPerBias)·k : …+k] is added to row r
// before the softmax — the additive attention mask, one row of k per sample shared by
// the rowsPerBias = heads·T query rows of that sample. The maximum is subtracted
// first, so large logits do not overflow; a row whose every entry is −Inf gives NaN,
// as in PyTorch.
func SoftmaxRows(y, x, bias []float32, rows, k, rowsPerBias int) {
	const fn = "SoftmaxRows"
	if rows < 0 || k <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape rows=%d k=%d", fn, rows, k))
	}
	mustLen(fn, "x", len(x), rows*k)
	mustLen(fn, "y", len(y), rows*k)
	if bias != nil {
		if rowsPerBias <= 0 || rows%rowsPerBias != 0 {
			panic(fmt.Sprintf("kernels.%s: %d rows are not a multiple of rowsPerBias=%d", fn, rows, rowsPerBias))
		}
		mustLen(fn, "bias", len(bias), rows/rowsPerBias*k)
	}
	parallelFor(rows, 12*k, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			src, dst := x[r*k:(r+1)*k], y[r*k:(r+1)*k]
			if bias != nil {
				b := r / rowsPerBias
				impl.vec.add(dst, src, bias[b*k:(b+1)*k])
				src = dst
			}
			softmaxRow(dst, src)
		}
	})
}

// softmaxRow writes the softmax of src into dst (which may be src); the normaliser
// is summed in float64.
func softmaxRow(dst, src []float32) {
	v := impl.vec
	z := v.expSum(dst, src, v.maxOf(src))
	v.scale(float32(1/z), dst)
}

// SoftmaxRowsBackward writes (or, with accumulate, adds) the gradient of a row
// softmax: dx = y ⊙ (dy − Σ_j dy_j·y_j) row by row, where y is the softmax output.
// dx may be dy when accumulate is false.
func SoftmaxRowsBackward(dx, y, dy []float32, rows, k int, accumulate bool) {
	const fn = "SoftmaxRowsBackward"
	if rows < 0 || k <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape rows=%d k=%d", fn, rows, k))
	}
	mustLen(fn, "y", len(y), rows*k)
	mustLen(fn, "dy", len(dy), rows*k)
	mustLen(fn, "dx", len(dx), rows*k)
	parallelFor(rows, 4*k, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			yr, gr, dr := y[r*k:(r+1)*k], dy[r*k:(r+1)*k], dx[r*k:(r+1)*k]
			s := impl.vec.dot(yr, gr)
			if accumulate {
				for i, v := range yr {
					dr[i] += v * (gr[i] - s)
				}
			} else {
				for i, v := range yr {
					dr[i] = v * (gr[i] - s)
				}
			}
		}
	})
}

// LayerNormForward normalises each of the rows of d elements of x to zero mean and
// unit variance (biased variance, eps added before the square root, as PyTorch's
// layer_norm) and applies y = x̂·gamma + beta. It stores each row's mean and
// 1/sqrt(var+eps) in mean and rstd for the backward pass. Statistics are computed in
// float64.
func LayerNormForward(y, x, gamma, beta, mean, rstd []float32, rows, d int, eps float64) {
	const fn = "LayerNormForward"
	if rows < 0 || d <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape rows=%d d=%d", fn, rows, d))
	}
	mustLen(fn, "x", len(x), rows*d)
	mustLen(fn, "y", len(y), rows*d)
	mustLen(fn, "gamma", len(gamma), d)
	mustLen(fn, "beta", len(beta), d)
	mustLen(fn, "mean", len(mean), rows)
	mustLen(fn, "rstd", len(rstd), rows)
	v := impl.vec
	parallelFor(rows, 8*d, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, yr := x[r*d:(r+1)*d], y[r*d:(r+1)*d]
			mu, ss := v.lnStats(xr)
			inv := 1 / math.Sqrt(ss/float64(d)+eps)
			m32, i32 := float32(mu), float32(inv)
			mean[r], rstd[r] = m32, i32
			v.lnApply(yr, xr, gamma, beta, m32, i32)
		}
	})
}

// LayerNormBackward computes the gradients of LayerNormForward from dy, x and the
// saved mean and rstd: dx (written, or added with accumulate; nil to skip) and, when
// dgamma and dbeta are non-nil, dgamma += Σ_rows dy·x̂ and dbeta += Σ_rows dy.
// The column sums are split over columns, so their order is fixed.
func LayerNormBackward(dx, dy, x, gamma, mean, rstd []float32, rows, d int, accumulate bool, dgamma, dbeta []float32) {
	const fn = "LayerNormBackward"
	if rows < 0 || d <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape rows=%d d=%d", fn, rows, d))
	}
	mustLen(fn, "x", len(x), rows*d)
	mustLen(fn, "dy", len(dy), rows*d)
	mustLen(fn, "gamma", len(gamma), d)
	mustLen(fn, "mean", len(mean), rows)
	mustLen(fn, "rstd", len(rstd), rows)
	v := impl.vec
	if dgamma != nil {
		mustLen(fn, "dgamma", len(dgamma), d)
		mustLen(fn, "dbeta", len(dbeta), d)
		// Blocks of 64 columns, each summed over all rows in row order.
		const blk = 64
		parallelFor((d+blk-1)/blk, 4*rows*blk, func(lo, hi int) {
			for b := lo; b < hi; b++ {
				c0, c1 := b*blk, min((b+1)*blk, d)
				var sg, sb [blk]float32
				if rows > 0 {
					v.lnParamGrad(sg[:c1-c0], sb[:c1-c0], dy[c0:], x[c0:], mean, rstd, d)
				}
				for i := c0; i < c1; i++ {
					dgamma[i] += sg[i-c0]
					dbeta[i] += sb[i-c0]
				}
			}
		})
	}
	if dx == nil {
		return
	}
	mustLen(fn, "dx", len(dx), rows*d)
	// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·gamma.
	parallelFor(rows, 10*d, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, gr, dr := x[r*d:(r+1)*d], dy[r*d:(r+1)*d], dx[r*d:(r+1)*d]
			mu, inv := mean[r], rstd[r]
			s1, s2 := v.lnBwdStats(gr, xr, gamma, mu, inv)
			v.lnBwdDx(dr, gr, xr, gamma, mu, inv, s1/float32(d), s2/float32(d), accumulate)
		}
	})
}

// The generic LayerNorm row kernels (vecOps.lnStats, lnApply, lnBwdStats, lnBwdDx,
// lnParamGrad); asmgen/layernorm.go evaluates the same formulas 16 lanes at a time.

func lnStatsGeneric(x []float32) (mean, ss float64) {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	mean = s / float64(len(x))
	for _, v := range x {
		dv := float64(v) - mean
		ss += dv * dv
	}
	return mean, ss
}

func lnApplyGeneric(y, x, gamma, beta []float32, mu, inv float32) {
	y, gamma, beta = y[:len(x)], gamma[:len(x)], beta[:len(x)]
	for i, v := range x {
		y[i] = (v-mu)*inv*gamma[i] + beta[i]
	}
}

func lnBwdStatsGeneric(dy, x, gamma []float32, mu, inv float32) (s1, s2 float32) {
	x, gamma = x[:len(dy)], gamma[:len(dy)]
	for i, g := range dy {
		gg := g * gamma[i]
		s1 += gg
		s2 += gg * (x[i] - mu) * inv
	}
	return s1, s2
}

func lnBwdDxGeneric(dx, dy, x, gamma []float32, mu, inv, s1, s2 float32, acc bool) {
	dx, x, gamma = dx[:len(dy)], x[:len(dy)], gamma[:len(dy)]
	if acc {
		for i, g := range dy {
			xh := (x[i] - mu) * inv
			dx[i] += inv * (g*gamma[i] - s1 - xh*s2)
		}
		return
	}
	for i, g := range dy {
		xh := (x[i] - mu) * inv
		dx[i] = inv * (g*gamma[i] - s1 - xh*s2)
	}
}

func lnParamGradGeneric(sg, sb, dy, x, mean, rstd []float32, d int) {
	n := len(sg)
	sb = sb[:n]
	for r, mu := range mean {
		xr, gr := x[r*d:r*d+n], dy[r*d:r*d+n]
		inv := rstd[r]
		for i, g := range gr {
			sg[i] += g * (xr[i] - mu) * inv
			sb[i] += g
		}
	}
}

// The GELU kernels split x into chunks of whole elements (no reduction), so the
// results do not depend on the number of goroutines. The per-element costs passed to
// parallelFor are those of the vectorised path (asmgen/mathvec.go).

// GeluForward computes the exact GELU, y = x·Φ(x) = x/2·(1 + erfc(−x/√2)), PyTorch's
// default (approximate="none"). Φ is evaluated through erfc32's Chebyshev fit
// (relative error below 1e-5 on Φ; TestGeluAccuracy bounds the result against
// math.Erf).
func GeluForward(y, x []float32) {
	checkLen("GeluForward", len(y), len(x))
	v := impl.vec
	parallelFor(len(x), 8, func(lo, hi int) { v.gelu(y[lo:hi], nil, x[lo:hi]) })
}

// GeluForwardCDF is GeluForward that also writes Φ(x) into cdf, for GeluBackwardCDF: the
// backward pass then needs one exponential per element (φ) instead of two. y equals
// GeluForward's bit for bit.
func GeluForwardCDF(y, cdf, x []float32) {
	checkLen("GeluForwardCDF", len(y), len(x), len(cdf))
	v := impl.vec
	parallelFor(len(x), 8, func(lo, hi int) { v.gelu(y[lo:hi], cdf[lo:hi], x[lo:hi]) })
}

// GeluBackwardCDF writes (or, with accumulate, adds) dx = dy·(Φ(x) + x·φ(x)), the
// derivative of the exact GELU at x, with Φ(x) given (GeluForwardCDF's cdf).
func GeluBackwardCDF(dx, x, cdf, dy []float32, accumulate bool) {
	checkLen("GeluBackwardCDF", len(dx), len(x), len(cdf), len(dy))
	v := impl.vec
	parallelFor(len(x), 6, func(lo, hi int) { v.geluBwd(dx[lo:hi], x[lo:hi], cdf[lo:hi], dy[lo:hi], accumulate) })
}

// GeluBackward writes (or, with accumulate, adds) dx = dy·(Φ(x) + x·φ(x)), the
// derivative of the exact GELU at x, for callers that did not keep Φ(x): it evaluates
// Φ as GeluForwardCDF does (into a temporary) and applies GeluBackwardCDF, so the two
// give the same dx bit for bit.
func GeluBackward(dx, x, dy []float32, accumulate bool) {
	checkLen("GeluBackward", len(dx), len(x), len(dy))
	y, cdf := make([]float32, len(x)), make([]float32, len(x))
	GeluForwardCDF(y, cdf, x)
	GeluBackwardCDF(dx, x, cdf, dy, accumulate)
}
