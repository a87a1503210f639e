package kernels

import "fmt"

// Channels-last (NHWC) convolution passes: a network that keeps its
// activations as [N, H, W, C] feeds ConvNHWC without a layout pass. The
// forward output of ConvNHWC is already NHWC; these functions supply the
// rest — the zero-padded copy of an NHWC image, the weight gradient from an
// NHWC output gradient, the input gradient of strided convolutions
// (GEMM + an NHWC col2im), the bias and its gradient, and the layout
// conversions at the network's edges.

// PadNHWCFromNHWC writes x, an NHWC image [N, H, W, C] of geometry g, into
// dst as PadNHWC does ([N, H+2·PadH, W+2·PadW, C] with a zero border): one
// copy per image row. With no padding the copy is x itself; callers may
// then pass x to ConvNHWC directly. Parallel.
func PadNHWCFromNHWC(g ConvGeom, x, dst []float32) {
	g.checkImage("PadNHWCFromNHWC", len(x))
	if need := PaddedLen(g); len(dst) != need {
		panic(fmt.Sprintf("kernels.PadNHWCFromNHWC: dst has %d elements, geometry %+v needs %d", len(dst), g, need))
	}
	h2, w2, c := g.H+2*g.PadH, g.W+2*g.PadW, g.C
	parallelFor(g.N*h2, w2*c, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			n, y := u/h2, u%h2-g.PadH
			row := dst[u*w2*c : (u+1)*w2*c]
			if y < 0 || y >= g.H {
				clear(row)
				continue
			}
			clear(row[:g.PadW*c])
			clear(row[(g.PadW+g.W)*c:])
			src := x[(n*g.H+y)*g.W*c : (n*g.H+y+1)*g.W*c]
			copy(row[g.PadW*c:], src)
		}
	})
}

// NCHWToNHWC writes src [n, c, plane] into dst as [n, plane, c] (the tile
// transposes of PadNHWC). Parallel.
func NCHWToNHWC(dst, src []float32, n, c, plane int) {
	layoutCheck("NCHWToNHWC", dst, src, c, n, plane)
	if n == 0 || c == 0 || plane == 0 {
		return
	}
	PadNHWC(ConvGeom{N: n, C: c, H: 1, W: plane, KH: 1, KW: 1, StrideH: 1, StrideW: 1}, src, dst)
}

// ConvWeightGradNHWCRows is ConvWeightGradNHWC for dY as the layer's NHWC
// output gradient [N·OH·OW, M] (channels last): the GEMM reads dY as a
// transposed A operand, so it needs no copy. Chunked and deterministic as
// ConvWeightGradNHWC.
func ConvWeightGradNHWCRows(g ConvGeom, xp, dy []float32, m int, dw []float32) {
	pix := g.N * g.OutH() * g.OutW()
	if len(dy) != pix*m {
		panic(fmt.Sprintf("kernels.ConvWeightGradNHWCRows: dy has %d elements, want %d×%d", len(dy), pix, m))
	}
	convWeightGradNHWC("ConvWeightGradNHWCRows", g, xp, dy, m, m, 0, true, dw)
}

// ConvInputGradNHWC writes the input gradient dx [N, H, W, C] of a
// convolution of geometry g with weight w [m, C, KH, KW] from its output
// gradient dy [N·OH·OW, m] (both channels last), adding to dx when
// accumulate is set. Any stride and padding: the column gradient
// dy · W' (W' the weight with its columns in (kh, kw, c) order) is one GEMM,
// and Col2imNHWC adds its rows into dx. For stride-1 convolutions ConvNHWC
// of the padded dy with the flipped kernel is faster. Parallel;
// deterministic.
func ConvInputGradNHWC(g ConvGeom, dy, w []float32, m int, dx []float32, accumulate bool) {
	g.checkImage("ConvInputGradNHWC", len(dx))
	kk, kdim := g.KH*g.KW, g.ColRows()
	pix := g.N * g.OutH() * g.OutW()
	if len(w) != m*kdim {
		panic(fmt.Sprintf("kernels.ConvInputGradNHWC: weight has %d elements, want %d×%d×%d", len(w), m, g.C, kk))
	}
	if len(dy) != pix*m {
		panic(fmt.Sprintf("kernels.ConvInputGradNHWC: dy has %d elements, want %d×%d", len(dy), pix, m))
	}
	if !accumulate {
		clear(dx)
	}
	if pix == 0 || kdim == 0 || m == 0 {
		return
	}
	wb := getShared(m * kdim)
	wp := *wb
	for o := range m {
		for ch := range g.C {
			for ij := range kk {
				wp[o*kdim+ij*g.C+ch] = w[o*kdim+ch*kk+ij]
			}
		}
	}
	cb := getShared(pix * kdim)
	Sgemm(false, false, pix, kdim, m, 1, dy, m, wp, kdim, 0, *cb, kdim)
	putShared(wb)
	Col2imNHWC(g, *cb, dx)
	putShared(cb)
}

// Col2imNHWC adds col, the column gradient [N·OH·OW, KH·KW·C] with each row
// in (kh, kw, c) order, into dx [N, H, W, C]: output pixel p's tap (i, j)
// adds its C values to the input pixel it read. Work is split over images,
// and each image's contributions are added in pixel, then tap order:
// deterministic for every goroutine count.
func Col2imNHWC(g ConvGeom, col, dx []float32) {
	g.checkImage("Col2imNHWC", len(dx))
	oh, ow := g.OutH(), g.OutW()
	kdim := g.ColRows()
	if need := g.N * oh * ow * kdim; len(col) != need {
		panic(fmt.Sprintf("kernels.Col2imNHWC: col has %d elements, geometry %+v needs %d", len(col), g, need))
	}
	c, add := g.C, impl.vec.add
	parallelFor(g.N, oh*ow*kdim, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			img := dx[n*g.H*g.W*c : (n+1)*g.H*g.W*c]
			for y := range oh {
				for xo := range ow {
					row := col[((n*oh+y)*ow+xo)*kdim:][:kdim]
					for i := range g.KH {
						ih := y*g.StrideH - g.PadH + i
						if ih < 0 || ih >= g.H {
							continue
						}
						for j := range g.KW {
							iw := xo*g.StrideW - g.PadW + j
							if iw < 0 || iw >= g.W {
								continue
							}
							d := img[(ih*g.W+iw)*c:][:c]
							add(d, d, row[(i*g.KW+j)*c:][:c])
						}
					}
				}
			}
		}
	})
}

// AddBiasNHWC adds bias[ch] to channel ch of every row of y, an array of
// rows of len(bias) channels. Parallel.
func AddBiasNHWC(y, bias []float32) {
	c := len(bias)
	if c == 0 || len(y)%c != 0 {
		panic(fmt.Sprintf("kernels.AddBiasNHWC: %d elements are not rows of %d channels", len(y), c))
	}
	add := impl.vec.add
	parallelFor(len(y)/c, c, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := y[r*c : (r+1)*c]
			add(row, row, bias)
		}
	})
}

// biasGradBlock is the number of rows BiasGradNHWC sums in float32 before
// it adds the block's sums in float64.
const biasGradBlock = 256

// BiasGradNHWC adds the column sums of dy, rows of len(db) channels, to db:
// the bias gradient of a channels-last layer. Each block of biasGradBlock
// rows is summed in float32 in row order (the blocks in parallel) and the
// blocks' sums are added in float64 in block order: deterministic, the same
// for every goroutine count.
func BiasGradNHWC(db, dy []float32) {
	c := len(db)
	if c == 0 || len(dy)%c != 0 {
		panic(fmt.Sprintf("kernels.BiasGradNHWC: %d elements are not rows of %d channels", len(dy), c))
	}
	rows := len(dy) / c
	blocks := (rows + biasGradBlock - 1) / biasGradBlock
	pb := getShared(blocks * c)
	defer putShared(pb)
	part := (*pb)[:blocks*c]
	add := impl.vec.add
	parallelFor(blocks, biasGradBlock*c, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			blk := part[b*c : (b+1)*c]
			clear(blk)
			for r := b * biasGradBlock; r < min((b+1)*biasGradBlock, rows); r++ {
				add(blk, blk, dy[r*c:(r+1)*c])
			}
		}
	})
	for ch := range c {
		var acc float64
		for b := range blocks {
			acc += float64(part[b*c+ch])
		}
		db[ch] += float32(acc)
	}
}
