package kernels

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// Indirect convolution over channel-contiguous (NHWC) images.
//
// The implicit-im2col GEMM (convgemm.go) packs every B panel from the NCHW
// image: for maps narrower than a micro-tile that is a scalar gather of 9×
// the image per pass, and it costs as much time as the multiply. Here the
// image is copied once into a zero-padded NHWC layout (PadNHWC), where the
// K = KH·KW·C values a GEMM row needs are KH·KW contiguous runs of C
// channels. The micro-kernel reads those runs in place through a table of
// per-row offsets (an "indirect GEMM", as in XNNPACK), so the image is never
// packed at all; only the weights are packed, once per call. The result is
// [N·OH·OW, M] (NHWC); NHWCToNCHW brings it back to NCHW, adding a bias or
// accumulating in the same pass.

// PadNHWC writes x (NCHW, geometry g) into dst as [N, H+2·PadH, W+2·PadW, C]
// with a zero border: the image ConvNHWC and ConvWeightGradNHWC read.
// Rows of a multiple of 16 (8 on AVX2) pixels go through the in-register
// tile transpose (layoutTranspose), narrower maps eight channels at a time.
// Parallel.
func PadNHWC(g ConvGeom, x, dst []float32) {
	g.checkImage("PadNHWC", len(x))
	if need := PaddedLen(g); len(dst) != need {
		panic(fmt.Sprintf("kernels.PadNHWC: dst has %d elements, geometry %+v needs %d", len(dst), g, need))
	}
	tr, ts := layoutTranspose(g.C, g.W)
	h2, w2 := g.H+2*g.PadH, g.W+2*g.PadW
	c, hw := g.C, g.H*g.W
	parallelFor(g.N*h2, w2*c, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			n, y2 := u/h2, u%h2
			row := dst[u*w2*c : (u+1)*w2*c]
			y := y2 - g.PadH
			if y < 0 || y >= g.H {
				clear(row)
				continue
			}
			clear(row[:g.PadW*c])
			clear(row[(g.PadW+g.W)*c:])
			px, img := row[g.PadW*c:(g.PadW+g.W)*c], x[n*c*hw:(n+1)*c*hw]
			if tr != nil {
				ch := 0
				for ; ch+ts <= c; ch += ts {
					tr(px[ch:], c, img[ch*hw+y*g.W:], hw, g.W/ts)
				}
				padNHWCChannels(px, img, ch, c, hw, y, g.W)
			} else {
				padNHWCRow8(px, img, c, hw, y, g.W)
			}
		}
	})
}

// layoutTranspose returns PadNHWC's tile transpose for the implementation in
// use and its tile size, for c channels (at least a tile) and rows of w pixels
// (a multiple of the tile), or nil: transpose16 (AVX-512), else transpose8 (AVX2).
func layoutTranspose(c, w int) (func(dst []float32, ldd int, src []float32, lds, blocks int), int) {
	v := impl.vec
	switch {
	case v.transpose16 != nil && w%16 == 0 && c >= 16:
		return v.transpose16, 16
	case v.transpose8 != nil && w%8 == 0 && c >= 8:
		return v.transpose8, 8
	}
	return nil, 0
}

// padNHWCRow8 writes image row y of img (one sample's NCHW planes) into px eight channels
// at a time: eight sequential source rows, one 32-byte write per pixel.
func padNHWCRow8(px, img []float32, c, hw, y, w int) {
	ch := 0
	for ; ch+8 <= c; ch += 8 {
		s0 := img[ch*hw+y*w : ch*hw+y*w+w]
		s1 := img[(ch+1)*hw+y*w : (ch+1)*hw+y*w+w]
		s2 := img[(ch+2)*hw+y*w : (ch+2)*hw+y*w+w]
		s3 := img[(ch+3)*hw+y*w : (ch+3)*hw+y*w+w]
		s4 := img[(ch+4)*hw+y*w : (ch+4)*hw+y*w+w]
		s5 := img[(ch+5)*hw+y*w : (ch+5)*hw+y*w+w]
		s6 := img[(ch+6)*hw+y*w : (ch+6)*hw+y*w+w]
		s7 := img[(ch+7)*hw+y*w : (ch+7)*hw+y*w+w]
		for xx := range s0 {
			d := (*[8]float32)(px[xx*c+ch:])
			d[0], d[1], d[2], d[3] = s0[xx], s1[xx], s2[xx], s3[xx]
			d[4], d[5], d[6], d[7] = s4[xx], s5[xx], s6[xx], s7[xx]
		}
	}
	padNHWCChannels(px, img, ch, c, hw, y, w)
}

// padNHWCChannels writes channels from..c-1 of image row y one at a time (the remainder
// the vector loops leave).
func padNHWCChannels(px, img []float32, from, c, hw, y, w int) {
	for ch := from; ch < c; ch++ {
		s := img[ch*hw+y*w : ch*hw+y*w+w]
		for xx, v := range s {
			px[xx*c+ch] = v
		}
	}
}

// NHWCToNCHW writes src, an [n, plane, c] array, into dst as [n, c, plane],
// adding bias[ch] to channel ch when bias is non-nil and accumulating into
// dst instead of overwriting it when accumulate is set (dst + (src + bias),
// or dst + src without a bias). With at least a tile of pixels and a
// multiple of the tile in channels it transposes 16×16 (AVX-512) or 8×8
// (AVX2; on AVX-512 too where 16 does not fit) tiles in registers (through a
// scratch block when accumulating), otherwise eight channels at a time. Parallel.
func NHWCToNCHW(dst, src []float32, n, plane, c int, bias []float32, accumulate bool) {
	layoutCheck("NHWCToNCHW", dst, src, c, n, plane)
	if bias != nil && len(bias) != c {
		panic(fmt.Sprintf("kernels.NHWCToNCHW: bias has %d elements, want %d", len(bias), c))
	}
	v := impl.vec
	tr, ts := v.transpose16, 16
	if tr == nil || c%16 != 0 || plane < 16 {
		tr, ts = v.transpose8, 8
	}
	if tr == nil || c%ts != 0 || plane < ts {
		nhwcToNCHW8(dst, src, n, plane, c, bias, accumulate)
		return
	}
	if accumulate {
		nhwcAddToNCHW(dst, src, n, plane, c, bias, tr, ts)
		return
	}
	parallelFor(n, plane*c, func(lo, hi int) {
		for img := lo; img < hi; img++ {
			s := src[img*plane*c : (img+1)*plane*c]
			d := dst[img*c*plane : (img+1)*c*plane]
			p := 0
			for ; p+ts <= plane; p += ts {
				tr(d[p:], plane, s[p*c:], c, c/ts)
			}
			for ch := range c {
				var b float32
				if bias != nil {
					b = bias[ch]
				}
				row := d[ch*plane : (ch+1)*plane]
				if bias != nil {
					v.affine(row[:p], row[:p], 0, 1, b)
				}
				for q := p; q < plane; q++ {
					row[q] = s[q*c+ch]
					if bias != nil {
						row[q] += b
					}
				}
			}
		}
	})
}

// nhwcAddToNCHW is NHWCToNCHW with accumulate for c a multiple of the tile
// ts and plane ≥ ts: each image's pixels go in blocks through a scratch
// [c, block] array (transposed by tr, the bias added there), which one
// vector add per channel adds to dst; the pixels after the last whole tile
// go one at a time. The same additions as nhwcToNCHW8's, bit for bit.
func nhwcAddToNCHW(dst, src []float32, n, plane, c int, bias []float32, tr func(dst []float32, ldd int, src []float32, lds, blocks int), ts int) {
	v := impl.vec
	// Blocks of at most 64 KiB of scratch, whole tiles.
	blk := min(plane/ts*ts, max(ts, 16384/c/ts*ts))
	parallelFor(n, plane*c, func(lo, hi int) {
		tb := getShared(c * blk)
		defer putShared(tb)
		whole := plane / ts * ts
		for img := lo; img < hi; img++ {
			s := src[img*plane*c : (img+1)*plane*c]
			d := dst[img*c*plane : (img+1)*c*plane]
			for p := 0; p < whole; p += blk {
				w := min(blk, whole-p)
				t := (*tb)[:c*w]
				for q := 0; q < w; q += ts {
					tr(t[q:], w, s[(p+q)*c:], c, c/ts)
				}
				for ch := range c {
					row := t[ch*w : (ch+1)*w]
					if bias != nil {
						v.affine(row, row, 0, 1, bias[ch])
					}
					dr := d[ch*plane+p : ch*plane+p+w]
					v.add(dr, dr, row)
				}
			}
			for ch := range c {
				row := d[ch*plane : (ch+1)*plane]
				for q := whole; q < plane; q++ {
					x := s[q*c+ch]
					if bias != nil {
						x += bias[ch]
					}
					row[q] += x
				}
			}
		}
	})
}

func nhwcToNCHW8(dst, src []float32, n, plane, c int, bias []float32, accumulate bool) {
	// Units are (image, block of eight channels).
	cb := ceilDiv(c, 8)
	parallelFor(n*cb, 8*plane, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			img, ch0 := u/cb, (u%cb)*8
			s := src[img*plane*c : (img+1)*plane*c]
			d := dst[img*c*plane : (img+1)*c*plane]
			if ch0+8 > c {
				for ch := ch0; ch < c; ch++ {
					var b float32
					if bias != nil {
						b = bias[ch]
					}
					row := d[ch*plane : (ch+1)*plane]
					for p := range row {
						v := s[p*c+ch]
						if bias != nil {
							v += b
						}
						if accumulate {
							v += row[p]
						}
						row[p] = v
					}
				}
				continue
			}
			var b [8]float32
			if bias != nil {
				b = *(*[8]float32)(bias[ch0:])
			}
			r0, r1 := d[ch0*plane:(ch0+1)*plane], d[(ch0+1)*plane:(ch0+2)*plane]
			r2, r3 := d[(ch0+2)*plane:(ch0+3)*plane], d[(ch0+3)*plane:(ch0+4)*plane]
			r4, r5 := d[(ch0+4)*plane:(ch0+5)*plane], d[(ch0+5)*plane:(ch0+6)*plane]
			r6, r7 := d[(ch0+6)*plane:(ch0+7)*plane], d[(ch0+7)*plane:(ch0+8)*plane]
			for p := range r0 {
				v := *(*[8]float32)(s[p*c+ch0:])
				if bias != nil {
					for k := range v {
						v[k] += b[k]
					}
				}
				if accumulate {
					r0[p] += v[0]
					r1[p] += v[1]
					r2[p] += v[2]
					r3[p] += v[3]
					r4[p] += v[4]
					r5[p] += v[5]
					r6[p] += v[6]
					r7[p] += v[7]
					continue
				}
				r0[p], r1[p], r2[p], r3[p] = v[0], v[1], v[2], v[3]
				r4[p], r5[p], r6[p], r7[p] = v[4], v[5], v[6], v[7]
			}
		}
	})
}

// UseConvNHWC reports whether a convolution of geometry g runs through
// PadNHWC + ConvNHWC + NHWCToNCHW rather than the implicit-im2col GEMM: when
// the implementation in use has an indirect micro-kernel (all of them: on
// AVX2 the im2col packing took a third of a ResNet-20 training step and the
// indirect 6×16 kernel made the step 2.4× faster), g has at
// least minNHWCChannels channels (with fewer, the per-tap runs are too short;
// the 3-channel first VGG layer is 2× faster through im2col), and neither
// SPARGO_CONV=im2col nor SPARGO_CONV=winograd (for g) asks for another path.
func UseConvNHWC(g ConvGeom) bool {
	return impl.indirect != nil && g.C >= minNHWCChannels && convAlgo != "im2col" && !UseWinograd(g)
}

// PaddedLen is the length of PadNHWC's output for geometry g.
func PaddedLen(g ConvGeom) int { return g.N * (g.H + 2*g.PadH) * (g.W + 2*g.PadW) * g.C }

// ConvNHWC computes the convolution y = x ⊛ w over a padded NHWC image.
// g is the convolution's NCHW geometry (with its padding) and xp is
// PadNHWC(g, x). y is [N·OH·OW, m] row-major (NHWC) and is overwritten.
// Without flip, w is a convolution weight [m, C, KH, KW]; with flip, w is
// stored as [C, m, KH, KW] and the kernel used is its transpose with every
// kernel rotated by 180° — the input gradient of a stride-1 convolution
// whose weight is w is ConvNHWC(flip) of its output gradient, padded by
// KH-1-PadH. Parallel; deterministic (the summation order of an element
// does not depend on the split).
func ConvNHWC(g ConvGeom, xp, w []float32, m int, flip bool, y []float32) {
	convNHWC("ConvNHWC", g, xp, w, m, flip, y, false)
}

// ConvNHWCAdd is ConvNHWC adding the convolution to y instead of
// overwriting it (a channels-last input gradient that another branch has
// written already): each K block's partial sum is added to y in block
// order by the micro-kernel's stores.
func ConvNHWCAdd(g ConvGeom, xp, w []float32, m int, flip bool, y []float32) {
	convNHWC("ConvNHWCAdd", g, xp, w, m, flip, y, true)
}

func convNHWC(name string, g ConvGeom, xp, w []float32, m int, flip bool, y []float32, accumulate bool) {
	g.checkImage(name, g.N*g.C*g.H*g.W)
	hp, wp := g.H+2*g.PadH, g.W+2*g.PadW
	if need := g.N * hp * wp * g.C; len(xp) != need {
		panic(fmt.Sprintf("kernels.%s: padded image has %d elements, geometry %+v needs %d", name, len(xp), g, need))
	}
	taps := g.KH * g.KW
	if m < 0 || len(w) != m*g.C*taps {
		panic(fmt.Sprintf("kernels.%s: weight has %d elements, want %d×%d×%d", name, len(w), m, g.C, taps))
	}
	pix := g.N * g.OutH() * g.OutW()
	if len(y) != pix*m {
		panic(fmt.Sprintf("kernels.%s: y has %d elements, want %d×%d", name, len(y), pix, m))
	}
	if pix == 0 || m == 0 {
		return
	}
	if g.C == 0 {
		if !accumulate {
			clear(y)
		}
		return
	}
	p := impl
	j := convJobPool.Get().(*convJob)
	*j = convJob{p: p, g: g, hp: hp, wp: wp, x: xp, w: w, flip: flip, m: m, y: y,
		taps: taps, pix: pix, oh: g.OutH(), ow: g.OutW(), accumulate: accumulate}
	j.kernel, j.narrow = p.indirect, p.indirectNarrow
	if j.kernel == nil {
		j.kernel, j.narrow = indirectGeneric, indirectGenericNarrow
	}
	j.execute()
}

// indirectKernel computes an mr×nr tile C = A·B + beta·C, where row r of A
// is taps runs of clen floats at x[base+offs[t·mr+r]:] and B is packed as
// taps·clen groups of nr floats (see sgemmIndirectAVX512x8).
type indirectKernel func(p *gemmImpl, taps, clen int, x []float32, base int, offs []int, b, c []float32, ldc int, beta float32)

// indirectGeneric is the portable indirect micro-kernel for any tile size.
func indirectGeneric(p *gemmImpl, taps, clen int, x []float32, base int, offs []int, b, c []float32, ldc int, beta float32) {
	indirectGenericCols(p.mr, p.nr, p.nr, taps, clen, x, base, offs, b, c, ldc, beta)
}

// indirectGenericNarrow is indirectGeneric for the tile's first nr/2 columns
// (gemmImpl.indirectNarrow).
func indirectGenericNarrow(p *gemmImpl, taps, clen int, x []float32, base int, offs []int, b, c []float32, ldc int, beta float32) {
	indirectGenericCols(p.mr, p.nr, p.nr/2, taps, clen, x, base, offs, b, c, ldc, beta)
}

// indirectGenericCols computes the first cols columns of an mr×nr indirect tile
// (B packed nr wide; mr ≤ 8, nr ≤ 32).
func indirectGenericCols(mr, nr, cols, taps, clen int, x []float32, base int, offs []int, b, c []float32, ldc int, beta float32) {
	var acc [8 * 32]float32
	for r := range mr {
		a := acc[r*cols : (r+1)*cols]
		clear(a)
		for t := range taps {
			o := base + offs[t*mr+r]
			row := x[o : o+clen]
			bt := b[t*clen*nr:]
			for q, v := range row {
				bq := bt[q*nr : q*nr+cols]
				for jj := range a {
					a[jj] += v * bq[jj]
				}
			}
		}
	}
	for r := range mr {
		row := c[r*ldc : r*ldc+cols]
		a := acc[r*cols : (r+1)*cols]
		if beta == 0 {
			copy(row, a)
		} else {
			for jj := range row {
				row[jj] = a[jj] + beta*row[jj]
			}
		}
	}
}

// convJob is one ConvNHWC call: first the weights are packed (in parallel),
// then C is split into units of pixel rows × output-channel slivers.
type convJob struct {
	p              *gemmImpl
	kernel         indirectKernel
	narrow         indirectKernel // kernel for the first nr/2 columns only (nil: kernel)
	g              ConvGeom
	hp, wp         int // padded image height and width
	x, w, y        []float32
	flip           bool
	accumulate     bool // add to y (ConvNHWCAdd)
	m, taps, pix   int
	oh, ow         int
	tpb            int // taps per K block (C < KC), else 1
	cchunks, cl    int // channel chunks per tap and their length
	nblocks        int
	nPad, slivers  int
	bp             []float32
	gatherIdx      [32]int32 // packSliver's gather offsets: q·stride
	packGroup      int       // channels per transposed group (packSliver16), 0 when unused
	mChunk, nChunk int       // pixel rows and slivers per unit
	mUnits, units  int
	packing        bool
	next           atomic.Int64
	wg             joiner
}

var convJobPool = sync.Pool{New: func() any { return new(convJob) }}

// block returns K block bi: taps [t0, t0+nt), channels [c0, c0+cl), and its
// offset in K (blocks are ordered by tap, then channel chunk).
func (j *convJob) block(bi int) (t0, nt, c0, cl, koff int) {
	tg, ch := bi/j.cchunks, bi%j.cchunks
	t0 = tg * j.tpb
	nt = min(j.tpb, j.taps-t0)
	c0 = ch * j.cl
	cl = min(j.cl, j.g.C-c0)
	return t0, nt, c0, cl, t0*j.g.C + c0
}

// plan sets the K blocking (taps per block, channel chunks), the slivers
// and packSliver's gather offsets.
func (j *convJob) plan() {
	p, c := j.p, j.g.C
	if c >= p.kc {
		j.tpb, j.cchunks = 1, ceilDiv(c, p.kc)
		j.cl = ceilDiv(c, j.cchunks)
		j.cchunks = ceilDiv(c, j.cl)
	} else {
		j.tpb, j.cchunks, j.cl = min(j.taps, p.kc/c), 1, c
	}
	j.nblocks = ceilDiv(j.taps, j.tpb) * j.cchunks
	j.slivers = ceilDiv(j.m, p.nr)
	j.nPad = j.slivers * p.nr
	stride := c * j.taps // consecutive output channels in w: [m, C, taps]
	if j.flip {
		stride = j.taps // [C, m, taps]
	}
	for q := range j.gatherIdx {
		j.gatherIdx[q] = int32(q * stride)
	}
	j.packGroup = 0
	if p.nr == 16 && p.vec.transpose8 != nil {
		// At most 2304 columns: a 256-channel chunk of a 3×3 kernel, 147 KB
		// of scratch per goroutine.
		j.packGroup = min(j.cl, max(8, 2304/j.taps/8*8))
		if j.flip {
			j.packGroup = 1
		}
	}
}

func (j *convJob) execute() {
	p, c := j.p, j.g.C
	countGEMM(j.pix, j.m, j.taps*c)
	j.plan()
	nw := runtime.GOMAXPROCS(0)
	if float64(j.pix)*float64(j.m)*float64(j.taps*c) < 1<<18 {
		nw = 1
	}
	bs := getShared(j.nPad * j.taps * c)
	j.bp = *bs
	j.packing = true
	j.units = j.slivers
	dispatch(j, &j.wg, min(nw, j.units))

	j.mChunk = roundUp(min(j.pix, p.mc), p.mr)
	j.mUnits = ceilDiv(j.pix, j.mChunk)
	j.nChunk = j.slivers
	if target := 4 * nw; nw > 1 && j.mUnits < target {
		split := min(j.slivers, ceilDiv(target, j.mUnits))
		j.nChunk = ceilDiv(j.slivers, split)
	}
	j.units = j.mUnits * ceilDiv(j.slivers, j.nChunk)
	j.packing = false
	j.next.Store(0)
	dispatch(j, &j.wg, min(nw, j.units))
	runtime.KeepAlive(j.x)
	putShared(bs)
	*j = convJob{}
	convJobPool.Put(j)
}

func (j *convJob) done() { j.wg.Done() }

func (j *convJob) run() {
	if j.packing {
		var sb *[]float32
		var scratch []float32
		if j.packGroup > 0 {
			sb = packScratch.get(j.packGroup * j.taps * 16)
			scratch = *sb
		}
		for {
			u := int(j.next.Add(1)) - 1
			if u >= j.units {
				break
			}
			j.packSliver(u, scratch)
		}
		if sb != nil {
			packScratch.put(sb)
		}
		return
	}
	var ws *convWorkspace
	for {
		u := int(j.next.Add(1)) - 1
		if u >= j.units {
			break
		}
		if ws == nil {
			ws = getConvWorkspace(j.mChunk*j.taps, j.p.mr*j.p.nr)
		}
		nu := ceilDiv(j.slivers, j.nChunk)
		mi, ni := u/nu, u%nu
		j.compute(ws, mi*j.mChunk, min((mi+1)*j.mChunk, j.pix), ni*j.nChunk, min((ni+1)*j.nChunk, j.slivers))
	}
	if ws != nil {
		putConvWorkspace(ws)
	}
}

// packSliver packs output-channel sliver s of the weights into every K
// block: for each (tap, channel) row, nr consecutive output channels (zero
// past m). On AVX-512 the rows of one tap and channel chunk are one strided
// gather (gather32 when the sliver is full): measured against transposing 16
// rows of w at a time in registers, the gathers were faster there (VGG's
// 512-channel layers, 2×2 and 4×4 maps). On AVX2 (Zen 3) the register
// transposes win: full slivers go through packSliver16, 2.2-3× faster than
// the strided loop for 3×3 kernels and 5-16× for 1×1 ones with the weights
// in cache, 1.3-3× with them in memory (BenchmarkConvPackWeights), where an
// AVX2 gather per row (VGATHERDPS, as gather32) gained 1.2-2× and a Go loop
// reading w in order lost. A partial sliver, or the generic path, takes the
// strided loop. scratch holds packSliver16's transposed group.
func (j *convJob) packSliver(s int, scratch []float32) {
	nr, c, taps := j.p.nr, j.g.C, j.taps
	n0 := s * nr
	cols := min(nr, j.m-n0)
	if cols == 16 && j.packGroup > 0 {
		j.packSliver16(s, scratch)
		return
	}
	// Output channel n0+q of row (t, ch) is at w[src(t, ch) + q·stride],
	// and consecutive channels are rowStep apart.
	stride, rowStep := c*taps, taps // w[n, ch, t]
	if j.flip {
		stride, rowStep = taps, j.m*taps // w[ch, n, rot(t)]
	}
	gather := nr == 32 && cols == nr && j.p.vec.gather32 != nil && 31*stride <= math.MaxInt32
	for t := range taps {
		tg := t / j.tpb
		tt := t - tg*j.tpb
		for chunk := range j.cchunks {
			_, nt, c0, cl, koff := j.block(tg*j.cchunks + chunk)
			at := koff*j.nPad + s*nr*nt*cl + tt*cl*nr
			d := j.bp[at : at+cl*nr]
			src0 := (n0*c+c0)*taps + t
			if j.flip {
				src0 = (c0*j.m+n0)*taps + taps - 1 - t
			}
			if gather {
				j.p.vec.gather32(d, j.w[src0:], cl, rowStep, &j.gatherIdx)
				continue
			}
			for cc := range cl {
				dd := d[cc*nr : (cc+1)*nr]
				src := j.w[src0+cc*rowStep:]
				for q := range cols {
					dd[q] = src[q*stride]
				}
				clear(dd[cols:])
			}
		}
	}
}

// packSliver16 is packSliver for a full 16-channel sliver on AVX2, with 8×8
// register transposes (transpose8) instead of a strided loop. In w the
// sliver is 16 rows (its output channels) at a fixed stride, and within one
// input channel, or a run of them without flip, the columns channel·taps +
// tap are contiguous: such a group is transposed into scratch, whose row k
// then holds the 16 output channels of column k, and the rows are copied to
// their panels in scratch order.
func (j *convJob) packSliver16(s int, scratch []float32) {
	taps := j.taps
	var atBuf [64]int
	at := atBuf[:0]
	if taps > len(atBuf) {
		at = make([]int, 0, taps)
	}
	at = at[:taps]
	for chunk := range j.cchunks {
		// at[tp]: the panel row of (tap, channel c0) for column tp of a group
		// (the taps in w's order: reversed with flip).
		var c0, cl int
		for t := range taps {
			tg := t / j.tpb
			tt := t - tg*j.tpb
			_, nt, bc0, bcl, koff := j.block(tg*j.cchunks + chunk)
			tp := t
			if j.flip {
				tp = taps - 1 - t
			}
			at[tp] = koff*j.nPad + s*16*nt*bcl + tt*bcl*16
			c0, cl = bc0, bcl
		}
		if j.flip {
			j.packFlipped16(s*16, c0, cl, at, scratch)
		} else {
			j.packForward16(s*16, c0, cl, at, scratch)
		}
	}
}

// packForward16 packs channels [c0, c0+cl) of the sliver of output channels
// n0..n0+15 from w[n, ch, t] in groups of packGroup channels, a whole chunk
// for 3×3 kernels: long runs of each row of w (groups of 8 to 64 of VGG's
// 512 channels were up to 1.6× slower). With one tap the transpose writes
// the panel directly.
func (j *convJob) packForward16(n0, c0, cl int, at []int, scratch []float32) {
	taps, tr, w, bp := j.taps, j.p.vec.transpose8, j.w, j.bp
	qs := j.g.C * taps // output channels are C·taps apart
	for g0 := 0; g0 < cl; g0 += j.packGroup {
		gl := min(j.packGroup, cl-g0)
		k := gl * taps // columns in the group
		o := n0*qs + (c0+g0)*taps
		src := w[o : o+15*qs+k]
		dst := scratch[:k*16]
		if taps == 1 {
			dst = bp[at[0]+g0*16 : at[0]+g0*16+k*16]
		}
		transpose16Rows(tr, dst, src, qs, k)
		if taps == 1 {
			continue
		}
		for cc := range gl {
			rows, o := dst[cc*taps*16:(cc+1)*taps*16], (g0+cc)*16
			for tp, a := range at {
				v := *(*[16]float32)(rows[tp*16 : tp*16+16]) // through a register: no memmove call
				*(*[16]float32)(bp[a+o : a+o+16]) = v
			}
		}
	}
}

// packFlipped16 is packForward16 from w[ch, n, rot(t)], one channel (16
// rows of taps floats, contiguous) at a time; with one tap each panel row
// is 16 contiguous floats of w.
func (j *convJob) packFlipped16(n0, c0, cl int, at []int, scratch []float32) {
	taps, m, tr, w, bp := j.taps, j.m, j.p.vec.transpose8, j.w, j.bp
	if taps == 1 {
		for cc := range cl {
			o := (c0+cc)*m + n0
			v := *(*[16]float32)(w[o : o+16])
			*(*[16]float32)(bp[at[0]+cc*16 : at[0]+cc*16+16]) = v
		}
		return
	}
	rows := scratch[:taps*16]
	for cc := range cl {
		o := ((c0+cc)*m + n0) * taps
		transpose16Rows(tr, rows, w[o:o+16*taps], taps, taps)
		for tp, a := range at {
			v := *(*[16]float32)(rows[tp*16 : tp*16+16])
			*(*[16]float32)(bp[a+cc*16 : a+cc*16+16]) = v
		}
	}
}

// transpose16Rows writes dst[kk·16+q] = src[q·lds+kk] for q < 16, kk < k: the k columns
// of 16 rows as rows of 16, whole 8-column blocks through tr (two 8×8 transposes per
// block), the rest by a loop.
func transpose16Rows(tr func(dst []float32, ldd int, src []float32, lds, blocks int), dst, src []float32, lds, k int) {
	if kb := k / 8; kb > 0 {
		tr(dst, 16, src, lds, kb)
		tr(dst[8:], 16, src[8*lds:], lds, kb)
	}
	for kk := k / 8 * 8; kk < k; kk++ {
		d := (*[16]float32)(dst[kk*16 : kk*16+16])
		for q := range d {
			d[q] = src[q*lds+kk]
		}
	}
}

// packScratch holds packSliver16's per-goroutine transpose buffers.
var packScratch = bufPool[float32]{alloc: alignedFloats}

// compute runs pixel rows [m0, m1) × slivers [s0, s1) through every K block.
func (j *convJob) compute(ws *convWorkspace, m0, m1, s0, s1 int) {
	p := j.p
	mr, nr, c := p.mr, p.nr, j.g.C
	g := j.g
	plane := j.oh * j.ow
	// With one K block of every tap and channel (16 channels of a 3×3
	// kernel), a kernel row's KW taps are one contiguous run of KW·C floats
	// of the padded image, and the packed weights are in that order too: the
	// micro-kernel reads KH runs of KW·C instead of KH·KW runs of C (the
	// same products in the same order), from a third of the offsets.
	runs, runLen, runStep := j.taps, c, 1 // runs per pixel, their length, taps per run
	if j.nblocks == 1 && g.KW > 1 {
		runs, runLen, runStep = g.KH, g.KW*c, g.KW
	}
	// Offsets of each row's runs (channel 0), group by group; rows past m1
	// repeat the group's first row (computed, then dropped). A run starts at
	// its pixel's corner offset plus a per-run constant; the pixel's (image,
	// row, column) advance without divisions (with 16 output channels the
	// divisions took a fifth of this function's time).
	var tapBuf [64]int
	tapOff := tapBuf[:0]
	if runs > len(tapBuf) {
		tapOff = make([]int, 0, runs)
	}
	for r := range runs {
		t := r * runStep
		tapOff = append(tapOff, ((t/g.KW)*j.wp+t%g.KW)*c)
	}
	offs := ws.offs
	n, rem := m0/plane, m0%plane
	oy, ox := rem/j.ow, rem%j.ow
	var corners [8]int // mr ≤ 8
	for r0 := m0; r0 < m1; r0 += mr {
		grp := offs[(r0-m0)/mr*runs*mr : ((r0-m0)/mr+1)*runs*mr]
		cs := corners[:mr]
		for r := range cs {
			if r0+r >= m1 {
				cs[r] = cs[0]
				continue
			}
			cs[r] = ((n*j.hp+oy*g.StrideH)*j.wp + ox*g.StrideW) * c
			if ox++; ox == j.ow {
				ox = 0
				if oy++; oy == j.oh {
					oy = 0
					n++
				}
			}
		}
		if mr == 6 { // the AVX2 micro-kernel's rows, unrolled: a 6-trip inner loop cost as much as the stores
			c0, c1, c2, c3, c4, c5 := cs[0], cs[1], cs[2], cs[3], cs[4], cs[5]
			for t, to := range tapOff {
				row := grp[t*6 : t*6+6 : t*6+6]
				row[0], row[1], row[2], row[3], row[4], row[5] = c0+to, c1+to, c2+to, c3+to, c4+to, c5+to
			}
			continue
		}
		for t, to := range tapOff {
			row := grp[t*mr : t*mr+mr]
			for r, corner := range cs {
				row[r] = corner + to
			}
		}
	}
	for bi := range j.nblocks {
		t0, nt, c0, cl, koff := j.block(bi)
		kcl := nt * cl
		if runs != j.taps { // the merged runs of the single block
			nt, cl = runs, runLen
		}
		var beta float32
		if bi > 0 || j.accumulate {
			beta = 1
		}
		for s := s0; s < s1; s++ {
			bsl := j.bp[koff*j.nPad+s*nr*kcl : koff*j.nPad+(s+1)*nr*kcl]
			cols := min(nr, j.m-s*nr)
			// A sliver of at most half a tile's columns (16 output channels on
			// AVX-512) through the narrow kernel: half the FMAs, the same bits.
			kern, width := j.kernel, nr
			if cols <= nr/2 && j.narrow != nil {
				kern, width = j.narrow, nr/2
			}
			for r0 := m0; r0 < m1; r0 += mr {
				grp := (r0 - m0) / mr
				tab := offs[(grp*runs+t0)*mr : (grp*runs+t0+nt)*mr]
				rows := min(mr, m1-r0)
				off := r0*j.m + s*nr
				if rows == mr && cols == width {
					kern(p, nt, cl, j.x, c0, tab, bsl, j.y[off:], j.m, beta)
					continue
				}
				t := ws.tile
				kern(p, nt, cl, j.x, c0, tab, bsl, t, nr, 0)
				for r := range rows {
					row := j.y[off+r*j.m : off+r*j.m+cols]
					tr := t[r*nr : r*nr+cols]
					if beta == 0 {
						copy(row, tr)
					} else {
						for q := range row {
							row[q] += tr[q]
						}
					}
				}
			}
		}
	}
}

// convWorkspace is one goroutine's offset table and edge tile.
type convWorkspace struct {
	offs []int
	tile []float32
}

// convWS keeps idle workspaces across calls and garbage collections.
var convWS struct {
	sync.Mutex
	free []*convWorkspace
}

func getConvWorkspace(nOffs, nTile int) *convWorkspace {
	convWS.Lock()
	var ws *convWorkspace
	if k := len(convWS.free); k > 0 {
		ws = convWS.free[k-1]
		convWS.free = convWS.free[:k-1]
	}
	convWS.Unlock()
	if ws == nil {
		ws = new(convWorkspace)
	}
	if cap(ws.offs) < nOffs {
		ws.offs = make([]int, nOffs)
	}
	ws.offs = ws.offs[:nOffs]
	if cap(ws.tile) < nTile {
		ws.tile = alignedFloats(nTile)
	}
	ws.tile = ws.tile[:nTile]
	return ws
}

func putConvWorkspace(ws *convWorkspace) {
	convWS.Lock()
	if len(convWS.free) < 64 {
		convWS.free = append(convWS.free, ws)
	}
	convWS.Unlock()
}
