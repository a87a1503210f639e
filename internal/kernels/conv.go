package kernels

import "fmt"

// ConvGeom describes a 2-D convolution / im2col over a batch in NCHW layout.
type ConvGeom struct{ N, C, H, W, KH, KW, PadH, PadW, StrideH, StrideW int }

// OutH is the output height (H + 2*PadH - KH)/StrideH + 1.
func (g ConvGeom) OutH() int { return (g.H+2*g.PadH-g.KH)/g.StrideH + 1 }

// OutW is the output width (W + 2*PadW - KW)/StrideW + 1.
func (g ConvGeom) OutW() int { return (g.W+2*g.PadW-g.KW)/g.StrideW + 1 }

// ColRows is C*KH*KW, the number of rows of the im2col matrix.
func (g ConvGeom) ColRows() int { return g.C * g.KH * g.KW }

// ColCols is N*OutH*OutW, the number of columns of the im2col matrix.
func (g ConvGeom) ColCols() int { return g.N * g.OutH() * g.OutW() }

func (g ConvGeom) check(fn string, xLen, colLen int) {
	g.checkImage(fn, xLen)
	if need := g.ColRows() * g.ColCols(); colLen != need {
		panic(fmt.Sprintf("kernels.%s: col has %d elements, geometry %+v needs %d", fn, colLen, g, need))
	}
}

// validRange returns the range [lo,hi) of output positions o in [0,out) for
// which o*stride - pad + k lies inside [0,size).
func validRange(out, stride, pad, k, size int) (lo, hi int) {
	// need o*stride >= pad-k  and  o*stride <= size-1+pad-k
	a := pad - k
	if a > 0 {
		lo = (a + stride - 1) / stride
	}
	b := size - 1 + pad - k
	if b < 0 {
		return 0, 0
	}
	hi = min(out, b/stride+1)
	lo = min(lo, hi)
	return lo, hi
}

// Im2col writes col, a ColRows()×ColCols() row-major matrix: row (c*KH+i)*KW+j, column n*OutH*OutW + oh*OutW + ow
// holds x[n,c,oh*StrideH-PadH+i, ow*StrideW-PadW+j] (0 outside the image). Parallel.
func Im2col(g ConvGeom, x, col []float32) {
	g.check("Im2col", len(x), len(col))
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	rows := g.ColRows()
	ncols := g.N * plane
	if rows == 0 || ncols == 0 {
		return
	}
	// unit = (row, n): writes a contiguous OutH*OutW segment of col.
	parallelFor(rows*g.N, plane, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			r, n := u/g.N, u%g.N
			c := r / (g.KH * g.KW)
			i := (r / g.KW) % g.KH
			j := r % g.KW
			dst := col[r*ncols+n*plane : r*ncols+(n+1)*plane]
			src := x[(n*g.C+c)*g.H*g.W : (n*g.C+c+1)*g.H*g.W]
			owLo, owHi := validRange(ow, g.StrideW, g.PadW, j, g.W)
			ohLo, ohHi := validRange(oh, g.StrideH, g.PadH, i, g.H)
			clear(dst[:ohLo*ow])
			clear(dst[ohHi*ow:])
			for y := ohLo; y < ohHi; y++ {
				d := dst[y*ow : (y+1)*ow]
				ih := y*g.StrideH - g.PadH + i
				srow := src[ih*g.W : (ih+1)*g.W]
				clear(d[:owLo])
				clear(d[owHi:])
				if owLo >= owHi {
					continue
				}
				iw0 := owLo*g.StrideW - g.PadW + j
				if g.StrideW == 1 {
					copy(d[owLo:owHi], srow[iw0:])
				} else {
					iw := iw0
					for q := owLo; q < owHi; q++ {
						d[q] = srow[iw]
						iw += g.StrideW
					}
				}
			}
		}
	})
}

// Col2im is the adjoint: dx[n,c,h,w] += sum of the col entries that Im2col read from that pixel. Accumulates into dx. Parallel, deterministic.
func Col2im(g ConvGeom, col, dx []float32) {
	g.check("Col2im", len(dx), len(col))
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	ncols := g.N * plane
	if g.ColRows() == 0 || ncols == 0 {
		return
	}
	kk := g.KH * g.KW
	// unit = (n, c) image plane; contributions added in fixed (i, j, oh, ow) order.
	parallelFor(g.N*g.C, plane*kk, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			n, c := u/g.C, u%g.C
			dst := dx[u*g.H*g.W : (u+1)*g.H*g.W]
			for i := range g.KH {
				ohLo, ohHi := validRange(oh, g.StrideH, g.PadH, i, g.H)
				for j := range g.KW {
					owLo, owHi := validRange(ow, g.StrideW, g.PadW, j, g.W)
					if owLo >= owHi {
						continue
					}
					r := (c*g.KH+i)*g.KW + j
					src := col[r*ncols+n*plane : r*ncols+(n+1)*plane]
					for y := ohLo; y < ohHi; y++ {
						ih := y*g.StrideH - g.PadH + i
						drow := dst[ih*g.W : (ih+1)*g.W]
						s := src[y*ow+owLo : y*ow+owHi]
						iw := owLo*g.StrideW - g.PadW + j
						if g.StrideW == 1 {
							d := drow[iw : iw+len(s)]
							for q, v := range s {
								d[q] += v
							}
						} else {
							for _, v := range s {
								drow[iw] += v
								iw += g.StrideW
							}
						}
					}
				}
			}
		}
	})
}
