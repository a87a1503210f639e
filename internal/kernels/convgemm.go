package kernels

import (
	"fmt"
	"unsafe"
)

// Implicit-im2col GEMM: the convolution's column matrix is never written to
// memory. The B operand's panels are packed straight from the NCHW image,
// which saves the column matrix's memory (75 MB for one VGG layer at batch
// 32) and one full write+read pass over it per GEMM.

// SgemmIm2col computes C = alpha*A*im2col(x) + beta*C, where im2col(x) is the
// g.ColRows()×g.ColCols() matrix that Im2col(g, x, col) would write. A is
// m×ColRows (row stride lda), C is m×ColCols (row stride ldc). For a
// convolution with weight W[Out, C·KH·KW] this is the forward pass:
// C[o, n·OH·OW + pixel]. Parallel and deterministic like Sgemm.
func SgemmIm2col(m int, alpha float32, a []float32, lda int, g ConvGeom, x []float32, beta float32, c []float32, ldc int) {
	g.checkImage("SgemmIm2col", len(x))
	implicitGemm(im2colB, m, g.ColCols(), g.ColRows(), alpha, a, lda, g, x, beta, c, ldc)
}

// SgemmIm2colT computes C = alpha*A*im2col(x)ᵀ + beta*C. A is m×ColCols (row
// stride lda), C is m×ColRows (row stride ldc). With A = dY[Out, N·OH·OW] this
// is a convolution's weight gradient.
func SgemmIm2colT(m int, alpha float32, a []float32, lda int, g ConvGeom, x []float32, beta float32, c []float32, ldc int) {
	g.checkImage("SgemmIm2colT", len(x))
	implicitGemm(im2colTB, m, g.ColRows(), g.ColCols(), alpha, a, lda, g, x, beta, c, ldc)
}

// SgemmFlippedKernelIm2col computes C = W'·im2col(dy) (beta 0) where W' is
// the convolution weight w [out, in, KH, KW] transposed to [in, out] with each
// kernel rotated by 180° — read from w directly, never stored — and g
// describes dy [N, out, OH, OW] with padding KH-1-P. C is in×ColCols (row
// stride ldc). This is the input gradient of a stride-1 convolution.
func SgemmFlippedKernelIm2col(w []float32, out, in int, g ConvGeom, dy []float32, c []float32, ldc int) {
	g.checkImage("SgemmFlippedKernelIm2col", len(dy))
	kk := g.KH * g.KW
	if g.C != out {
		panic(fmt.Sprintf("kernels.SgemmFlippedKernelIm2col: dy has %d channels, the kernel %d outputs", g.C, out))
	}
	if len(w) != out*in*kk {
		panic(fmt.Sprintf("kernels.SgemmFlippedKernelIm2col: w has %d elements, want %d×%d×%d", len(w), out, in, kk))
	}
	n, k := g.ColCols(), g.ColRows()
	checkMatrix("C", c, in, n, ldc)
	if trivialGemm(in, n, k, 1, 0, c, ldc) {
		return
	}
	j := jobPool.Get().(*gemmJob)
	*j = gemmJob{
		p: impl, m: in, n: n, k: k, alpha: 1, beta: 0,
		a: w, aFlip: true, kOut: out, kIn: in, kk: kk, c: c, ldc: ldc, bsrc: im2colB, geom: g, x: dy,
	}
	j.execute()
}

// packFlippedKernel packs rows [i0, i0+mc) and columns [p0, p0+kc) of the
// flipped, transposed kernel A[c, o·kk + q] = w[(o·in + c)·kk + kk-1-q] into
// mr-row slivers (the layout packA writes).
func packFlippedKernel(mr int, w []float32, out, in, kk, i0, mc, p0, kc int, dst []float32) {
	var tmp [8 * 64]float32 // one output channel's kernels for the sliver's rows
	for s := 0; s < mc; s += mr {
		rows := min(mr, mc-s)
		d := dst[s*kc : s*kc+mr*kc]
		if mr*kk > len(tmp) {
			packFlippedKernelPlain(mr, w, in, kk, i0+s, rows, p0, kc, d)
			continue
		}
		// Columns come in runs of kk per output channel o; each run reads
		// the rows' kk-element kernels (contiguous in w) once.
		for p := 0; p < kc; {
			o, q0 := (p0+p)/kk, (p0+p)%kk
			n := min(kk-q0, kc-p)
			copy(tmp[:rows*kk], w[(o*in+i0+s)*kk:(o*in+i0+s+rows)*kk])
			for q := q0; q < q0+n; q++ {
				dp := d[(p+q-q0)*mr : (p+q-q0+1)*mr]
				for r := range rows {
					dp[r] = tmp[r*kk+kk-1-q]
				}
				for r := rows; r < mr; r++ {
					dp[r] = 0
				}
			}
			p += n
		}
	}
}

// packFlippedKernelPlain is packFlippedKernel for kernels too large for its buffer.
func packFlippedKernelPlain(mr int, w []float32, in, kk, c0, rows, p0, kc int, d []float32) {
	o, q := p0/kk, p0%kk
	for p := range kc {
		dp := d[p*mr : p*mr+mr]
		src := w[(o*in+c0)*kk+kk-1-q:]
		for r := range rows {
			dp[r] = src[r*kk]
		}
		for r := rows; r < mr; r++ {
			dp[r] = 0
		}
		if q++; q == kk {
			q = 0
			o++
		}
	}
}

func implicitGemm(src srcKind, m, n, k int, alpha float32, a []float32, lda int, g ConvGeom, x []float32, beta float32, c []float32, ldc int) {
	if m < 0 {
		panic(fmt.Sprintf("kernels.Sgemm: negative dimension m=%d", m))
	}
	checkMatrix("A", a, m, k, lda)
	checkMatrix("C", c, m, n, ldc)
	if trivialGemm(m, n, k, alpha, beta, c, ldc) {
		return
	}
	j := jobPool.Get().(*gemmJob)
	*j = gemmJob{
		p: impl, m: m, n: n, k: k, alpha: alpha, beta: beta,
		a: a, lda: lda, c: c, ldc: ldc, bsrc: src, geom: g, x: x,
	}
	j.execute()
}

func (g ConvGeom) checkImage(fn string, xLen int) {
	if g.N < 0 || g.C < 0 || g.H < 0 || g.W < 0 || g.KH <= 0 || g.KW <= 0 ||
		g.PadH < 0 || g.PadW < 0 || g.StrideH <= 0 || g.StrideW <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid geometry %+v", fn, g))
	}
	if g.H+2*g.PadH < g.KH || g.W+2*g.PadW < g.KW {
		panic(fmt.Sprintf("kernels.%s: kernel %dx%d larger than padded input in %+v", fn, g.KH, g.KW, g))
	}
	if need := g.N * g.C * g.H * g.W; xLen != need {
		panic(fmt.Sprintf("kernels.%s: image has %d elements, geometry %+v needs %d", fn, xLen, g, need))
	}
}

// colRun is a run of consecutive im2col columns (output pixels) sharing one
// image n and output row y: columns [q, q+l) are pixels x0 … x0+l-1.
type colRun struct{ q, l, img, y, x0 int }

// maxGatherTable bounds KH·KW·NR for the table-driven packing of small maps.
const maxGatherTable = 2048

// packIm2col packs im2col(x)[p0:p0+kc, j0:j0+nc] into nr-column slivers
// (the layout packB writes). Wide output rows are copied as runs; maps
// narrower than a sliver (where runs are a few elements long) go through a
// per-sliver table of source offsets instead.
func packIm2col(nr int, g ConvGeom, x []float32, p0, kc, j0, nc int, dst []float32) {
	if g.OutW() <= nr/4 && g.KH*g.KW*nr <= maxGatherTable {
		packIm2colTable(nr, g, x, p0, kc, j0, nc, dst)
		return
	}
	oh, ow := g.OutH(), g.OutW()
	plane, hw, kk := oh*ow, g.H*g.W, g.KH*g.KW
	var runs [64]colRun
	for s := 0; s < nc; s += nr {
		cols := min(nr, nc-s)
		d := dst[s*kc : s*kc+nr*kc]
		nrun := 0
		for q := 0; q < cols; {
			col := j0 + s + q
			n, rem := col/plane, col%plane
			y, x0 := rem/ow, rem%ow
			l := min(ow-x0, cols-q)
			runs[nrun] = colRun{q: q, l: l, img: n * g.C * hw, y: y, x0: x0}
			nrun++
			q += l
		}
		c, i, jj := p0/kk, (p0/g.KW)%g.KH, p0%g.KW
		for p := 0; p < kc; p++ {
			dp := d[p*nr : p*nr+nr]
			chw := c * hw
			for _, r := range runs[:nrun] {
				out := dp[r.q : r.q+r.l]
				ih := r.y*g.StrideH - g.PadH + i
				if ih < 0 || ih >= g.H {
					clear(out)
					continue
				}
				row := x[r.img+chw+ih*g.W : r.img+chw+(ih+1)*g.W]
				if g.StrideW == 1 {
					iw0 := r.x0 - g.PadW + jj
					if iw0 >= 0 && iw0+r.l <= g.W {
						copy(out, row[iw0:iw0+r.l])
						continue
					}
					lo, hi := max(0, -iw0), max(0, min(r.l, g.W-iw0))
					for t := 0; t < min(lo, r.l); t++ {
						out[t] = 0
					}
					if hi > lo {
						copy(out[lo:hi], row[iw0+lo:iw0+hi])
					}
					for t := max(lo, hi); t < r.l; t++ {
						out[t] = 0
					}
					continue
				}
				iw := r.x0*g.StrideW - g.PadW + jj
				for t := range out {
					if iw >= 0 && iw < g.W {
						out[t] = row[iw]
					} else {
						out[t] = 0
					}
					iw += g.StrideW
				}
			}
			if cols < nr {
				clear(dp[cols:])
			}
			if jj++; jj == g.KW {
				jj = 0
				if i++; i == g.KH {
					i = 0
					c++
				}
			}
		}
	}
}

// packIm2colTable is packIm2col for narrow maps: for each sliver it tabulates,
// per kernel offset (i, jj) and column, the source offset relative to the
// channel plane (-1 for padding), then packs every row with one gather loop.
func packIm2colTable(nr int, g ConvGeom, x []float32, p0, kc, j0, nc int, dst []float32) {
	oh, ow := g.OutH(), g.OutW()
	plane, hw, kk := oh*ow, g.H*g.W, g.KH*g.KW
	var offs [maxGatherTable]int
	for s := 0; s < nc; s += nr {
		cols := min(nr, nc-s)
		d := dst[s*kc : s*kc+nr*kc]
		for q := range cols {
			col := j0 + s + q
			n, rem := col/plane, col%plane
			y, xo := rem/ow, rem%ow
			for i := range g.KH {
				ih := y*g.StrideH - g.PadH + i
				for jj := range g.KW {
					iw := xo*g.StrideW - g.PadW + jj
					o := -1
					if ih >= 0 && ih < g.H && iw >= 0 && iw < g.W {
						o = n*g.C*hw + ih*g.W + iw
					}
					offs[(i*g.KW+jj)*nr+q] = o
				}
			}
		}
		c, ij := p0/kk, p0%kk
		for p := 0; p < kc; p++ {
			dp := d[p*nr : p*nr+cols]
			tab := offs[ij*nr : ij*nr+cols]
			chw := c * hw
			for q, o := range tab {
				var v float32
				if o >= 0 {
					v = x[chw+o]
				}
				dp[q] = v
			}
			if cols < nr {
				clear(d[p*nr+cols : p*nr+nr])
			}
			if ij++; ij == kk {
				ij = 0
				c++
			}
		}
	}
}

// packIm2colT packs im2col(x)ᵀ[p0:p0+kc, j0:j0+nc] into nr-column slivers:
// rows are output pixels, columns are (channel, kernel row, kernel column).
// Each packed row gathers nr values around one pixel; pixels whose whole
// receptive field lies inside the image take a branch-free loop.
func packIm2colT(nr int, g ConvGeom, x []float32, p0, kc, j0, nc int, dst []float32) {
	oh, ow := g.OutH(), g.OutW()
	plane, hw, kk := oh*ow, g.H*g.W, g.KH*g.KW
	var qoff [64]int
	var qi, qj [64]int
	for s := 0; s < nc; s += nr {
		cols := min(nr, nc-s)
		d := dst[s*kc : s*kc+nr*kc]
		for q := range cols {
			r := j0 + s + q
			c, i, jj := r/kk, (r/g.KW)%g.KH, r%g.KW
			qoff[q] = c*hw + (i-g.PadH)*g.W + (jj - g.PadW)
			qi[q], qj[q] = i, jj
		}
		offs := qoff[:cols]
		n, rem := p0/plane, p0%plane
		y, xo := rem/ow, rem%ow
		for pp := range kc {
			dp := d[pp*nr : pp*nr+cols]
			iy, ix := y*g.StrideH, xo*g.StrideW
			base := n*g.C*hw + iy*g.W + ix
			if iy >= g.PadH && iy-g.PadH+g.KH <= g.H && ix >= g.PadW && ix-g.PadW+g.KW <= g.W {
				// Every offset lies inside image n (checked by construction:
				// the receptive field is inside the image), so skip bounds checks.
				// base alone is in padded coordinates and may lie past the end of
				// x (padding wider than the kernel): only base+o is an index.
				x0 := unsafe.Pointer(unsafe.SliceData(x))
				for q, o := range offs {
					dp[q] = *(*float32)(unsafe.Add(x0, (base+o)*4))
				}
			} else {
				for q, o := range offs {
					var v float32
					if uint(iy-g.PadH+qi[q]) < uint(g.H) && uint(ix-g.PadW+qj[q]) < uint(g.W) {
						v = x[base+o]
					}
					dp[q] = v
				}
			}
			if cols < nr {
				clear(d[pp*nr+cols : pp*nr+nr])
			}
			if xo++; xo == ow {
				xo = 0
				if y++; y == oh {
					y = 0
					n++
				}
			}
		}
	}
}
