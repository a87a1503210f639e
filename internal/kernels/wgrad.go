package kernels

import "fmt"

// ConvWeightGrad adds a convolution's weight gradient to dw [M, C, KH, KW]:
// dw += dY · im2col(x)ᵀ, where dY is the [M, N·OH·OW] output gradient with
// row stride ldd and x is the NCHW input of geometry g.
//
// The reduction runs over output pixels, so the GEMM's B panels need, for
// every pixel, a run of (channel, kernel offset) values — a transposing gather
// from NCHW. With at least minNHWCChannels channels it instead copies x once
// into a zero-padded NHWC image and orders the gradient's columns
// (kh, kw, c): every packed row is then a contiguous run of channels, copied
// rather than gathered, and the [M, KH·KW·C] result is permuted into dw.
// Smaller channel counts use SgemmIm2colT directly. Parallel; deterministic.
func ConvWeightGrad(g ConvGeom, x, dy []float32, m, ldd int, dw []float32) {
	g.checkImage("ConvWeightGrad", len(x))
	n := g.ColRows()
	if len(dw) != m*n {
		panic(fmt.Sprintf("kernels.ConvWeightGrad: dw has %d elements, want %d×%d", len(dw), m, n))
	}
	if g.C < minNHWCChannels {
		SgemmIm2colT(m, 1, dy, ldd, g, x, 1, dw, n)
		return
	}
	xb := getShared(g.N * g.C * (g.H + 2*g.PadH) * (g.W + 2*g.PadW))
	PadNHWC(g, x, *xb)
	ConvWeightGradNHWC(g, *xb, dy, m, ldd, dw)
	putShared(xb)
}

// ConvWeightGradNHWC is ConvWeightGrad for an input already copied by
// PadNHWC(g, x, xp) (the forward pass of ConvNHWC keeps that copy): it adds
// dY · im2col(x)ᵀ to dw [M, C, KH, KW] for any channel count. When dw is
// small (at most 64 Ki elements) and the batch has more than wgradKChunk
// output pixels, the reduction runs in chunks of wgradKChunk pixels whose
// sums are added in chunk order: deterministic, and the same for every
// goroutine count, but not the bits of one unbroken reduction.
func ConvWeightGradNHWC(g ConvGeom, xp, dy []float32, m, ldd int, dw []float32) {
	convWeightGradNHWC("ConvWeightGradNHWC", g, xp, dy, m, ldd, 0, false, dw)
}

// ConvWeightGradNHWCPlanes is ConvWeightGradNHWC for dY as the layer's NCHW
// output gradient [N, M, OH, OW] rather than [M, N·OH·OW]: the GEMM packs
// each image's rows of dY where they lie, so dY needs no transposed copy.
// The same bits as ConvWeightGradNHWC of that copy.
func ConvWeightGradNHWCPlanes(g ConvGeom, xp, dy []float32, m int, dw []float32) {
	plane := g.OutH() * g.OutW()
	if len(dy) != g.N*m*plane {
		panic(fmt.Sprintf("kernels.ConvWeightGradNHWCPlanes: dy has %d elements, want %d×%d×%d", len(dy), g.N, m, plane))
	}
	convWeightGradNHWC("ConvWeightGradNHWCPlanes", g, xp, dy, m, 0, plane, false, dw)
}

// convWeightGradNHWC is ConvWeightGradNHWC with dY as [M, ldd] (plane 0),
// as [N, M, plane] (gemmJob.aPlane), or with transA as [N·OH·OW, ldd]
// (channels last).
func convWeightGradNHWC(name string, g ConvGeom, xp, dy []float32, m, ldd, plane int, transA bool, dw []float32) {
	g.checkImage(name, g.N*g.C*g.H*g.W)
	gp := g
	gp.H, gp.W, gp.PadH, gp.PadW = g.H+2*g.PadH, g.W+2*g.PadW, 0, 0
	if need := g.N * gp.H * gp.W * g.C; len(xp) != need {
		panic(fmt.Sprintf("kernels.%s: padded image has %d elements, geometry %+v needs %d", name, len(xp), g, need))
	}
	k, n := g.ColCols(), g.ColRows()
	if len(dw) != m*n {
		panic(fmt.Sprintf("kernels.%s: dw has %d elements, want %d×%d", name, len(dw), m, n))
	}
	switch {
	case transA:
		checkMatrix("A", dy, k, m, ldd)
	case plane == 0:
		checkMatrix("A", dy, m, k, ldd)
	}
	if m == 0 || n == 0 || k == 0 {
		return
	}
	pb := getShared(m * n)
	perm := *pb
	j := jobPool.Get().(*gemmJob)
	src := nhwcTB
	if impl.bIndirect != nil && g.C%(impl.nr/2) == 0 {
		// Every half of an NR-column sliver is NR/2 channels of one tap: read in
		// place (packed panels took 2.3× as long for ResNet's 16-channel layers,
		// -bench ConvWeightGrad).
		src = nhwcIndirectB
	}
	*j = gemmJob{
		p: impl, transA: transA, m: m, n: n, k: k, alpha: 1, beta: 0,
		a: dy, lda: ldd, aPlane: plane, c: perm, ldc: n, bsrc: src, geom: gp, x: xp, kChunk: wgradKChunk,
	}
	j.execute()
	// perm[o][(i·KW + jj)·C + c] → dw[o][(c·KH + i)·KW + jj]
	kk := g.KH * g.KW
	parallelFor(m, n, func(lo, hi int) {
		tb := getShared(n)
		for o := lo; o < hi; o++ {
			addTapsToChannels(dw[o*n:(o+1)*n], perm[o*n:(o+1)*n], *tb, g.C, kk)
		}
		putShared(tb)
	})
	putShared(pb)
}

// addTapsToChannels adds src, one output channel's weight gradient in tap-major
// order [kk][c], to dst in the weight's channel-major order [c][kk]:
// dst[ch·kk+ij] += src[ij·c+ch]. src is reordered into tmp (len(dst)
// elements of scratch), eight channels at a time (eight contiguous reads
// per tap, 8·kk contiguous writes), and added with one vector add: the same
// additions as the element loop, without its strided read-modify-writes.
func addTapsToChannels(dst, src, tmp []float32, c, kk int) {
	if kk > 1 {
		ch := 0
		for ; ch+8 <= c; ch += 8 {
			t := tmp[ch*kk : (ch+8)*kk]
			for ij := range kk {
				s := (*[8]float32)(src[ij*c+ch:])
				t[ij], t[kk+ij], t[2*kk+ij], t[3*kk+ij] = s[0], s[1], s[2], s[3]
				t[4*kk+ij], t[5*kk+ij], t[6*kk+ij], t[7*kk+ij] = s[4], s[5], s[6], s[7]
			}
		}
		for ij := range kk {
			for i, x := range src[ij*c+ch : (ij+1)*c] {
				tmp[(ch+i)*kk+ij] = x
			}
		}
		src = tmp[:len(dst)]
	}
	impl.vec.add(dst, dst, src)
}

// wgradKChunk is the reduction length (pixels) into which ConvWeightGradNHWC
// splits K when C is small (gemmJob.kChunk): fixed, so that the summation
// order does not depend on the goroutine count.
const wgradKChunk = 2048

// minNHWCChannels is the channel count from which ConvWeightGrad's NHWC path
// pays: below it the contiguous channel runs are too short to beat the gather.
const minNHWCChannels = 16

// pixelOffsets writes offs[p] = the offset in the padded NHWC image x (geometry
// g, no padding left) of output pixel p0+p's receptive field (tap 0,
// channel 0), for p < len(offs).
func pixelOffsets(g ConvGeom, p0 int, offs []int) {
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	n, rem := p0/plane, p0%plane
	y, xo := rem/ow, rem%ow
	for p := range offs {
		offs[p] = ((n*g.H+y*g.StrideH)*g.W + xo*g.StrideW) * g.C
		if xo++; xo == ow {
			xo = 0
			if y++; y == oh {
				y = 0
				n++
			}
		}
	}
}

// bIndirectGeneric is the portable B-indirect micro-kernel (see
// gemmImpl.bIndirect) for an mr×nr tile.
func bIndirectGeneric(mr, nr, k int, a, x []float32, base, split int, offs []int, c []float32, ldc int, beta float32) {
	var acc [8 * 32]float32
	h := nr / 2
	for p := range k {
		o := base + offs[p]
		b0, b1 := x[o:o+h], x[o+split:o+split+h]
		ap := a[p*mr : p*mr+mr]
		for r, av := range ap {
			row := acc[r*nr : r*nr+nr]
			for q, bv := range b0 {
				row[q] += av * bv
			}
			for q, bv := range b1 {
				row[h+q] += av * bv
			}
		}
	}
	for r := range mr {
		row := c[r*ldc : r*ldc+nr]
		if beta == 0 {
			copy(row, acc[r*nr:r*nr+nr])
		} else {
			for q := range row {
				row[q] = acc[r*nr+q] + beta*row[q]
			}
		}
	}
}

// packNHWCT packs B[p0:p0+kc, j0:j0+nc] of B = im2col(x)ᵀ with columns in
// (kh, kw, c) order, where x is a padded NHWC image described by g (no
// padding left): row p is output pixel p, and the columns of one kernel
// offset are a contiguous run of channels at that pixel's shifted position.
func packNHWCT(nr int, g ConvGeom, x []float32, p0, kc, j0, nc int, dst []float32) {
	oh, ow := g.OutH(), g.OutW()
	plane, c := oh*ow, g.C
	type run struct{ q, l, off int } // columns [q, q+l) read x[base+off : base+off+l]
	var runs [64]run
	for s := 0; s < nc; s += nr {
		cols := min(nr, nc-s)
		d := dst[s*kc : s*kc+nr*kc]
		nrun := 0
		for q := 0; q < cols; {
			col := j0 + s + q
			ij, ch := col/c, col%c
			i, jj := ij/g.KW, ij%g.KW
			l := min(c-ch, cols-q)
			runs[nrun] = run{q: q, l: l, off: (i*g.W+jj)*c + ch}
			nrun++
			q += l
		}
		n, rem := p0/plane, p0%plane
		y, xo := rem/ow, rem%ow
		for pp := range kc {
			dp := d[pp*nr : pp*nr+nr]
			base := ((n*g.H+y*g.StrideH)*g.W + xo*g.StrideW) * c
			if nrun == 1 && cols == 32 {
				*(*[32]float32)(dp) = *(*[32]float32)(x[base+runs[0].off:])
			} else {
				for _, r := range runs[:nrun] {
					copy(dp[r.q:r.q+r.l], x[base+r.off:base+r.off+r.l])
				}
				if cols < nr {
					clear(dp[cols:])
				}
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
