package kernels

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// Sgemm computes C = alpha*op(A)*op(B) + beta*C on row-major matrices.
// op(A) is m×k: if transA, A is stored k×m with row stride lda (lda >= m), else m×k (lda >= k).
// op(B) is k×n: if transB, B is stored n×k (ldb >= k), else k×n (ldb >= n). C is m×n (ldc >= n).
// beta == 0 means C is overwritten (NaNs in C are not propagated). Parallel over GOMAXPROCS.
// Deterministic: the summation order for each C element never depends on scheduling or the
// goroutine count (parallelise over M/N blocks only, never split K across goroutines; only
// ConvWeightGradNHWC splits K, into chunks of a fixed length).
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels.Sgemm: negative dimension m=%d n=%d k=%d", m, n, k))
	}
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
	j.execute()
}

// execute plans the job, packs operands that several units would otherwise
// pack again, runs the units on the worker pool and returns j to the pool.
func (j *gemmJob) execute() {
	countGEMM(j.m, j.n, j.k)
	nw := runtime.GOMAXPROCS(0)
	if float64(j.m)*float64(j.n)*float64(j.k) < 1<<18 {
		nw = 1
	}
	j.plan(nw)
	var sa, sb *[]float32
	if j.nColChunks > 1 {
		sa = j.prepackA(nw)
	}
	if j.nRowChunks > 1 && j.bsrc != nhwcIndirectB && j.sharedB == nil { // (SgemmPackedB brings its own)
		sb = j.prepackB(nw)
	}
	var so *[]int
	if j.bsrc == nhwcIndirectB && j.units > 1 {
		// Every unit walks all of K: compute the pixel offsets once, not per unit
		// (with single-micro-tile units they cost as much as the micro-kernel).
		so = sharedInts.get(j.k)
		j.pixOffs = *so
		pixelOffsets(j.geom, 0, j.pixOffs)
	}
	var sp *[]float32
	if j.nKChunks > 1 {
		sp = getShared((j.nKChunks - 1) * j.m * j.n)
		j.partial = *sp
	}
	dispatch(j, &j.wg, min(nw, j.units))
	if sp != nil {
		j.addPartials()
		putShared(sp)
	}
	if so != nil {
		sharedInts.put(so)
	}
	if sa != nil {
		putShared(sa)
	}
	if sb != nil {
		putShared(sb)
	}
	j.a, j.b, j.c, j.x, j.sharedA, j.sharedB, j.pixOffs, j.partial = nil, nil, nil, nil, nil, nil, nil, nil
	jobPool.Put(j)
}

// addPartials adds the K chunks' partial products to C in chunk order, rows
// in parallel.
func (j *gemmJob) addPartials() {
	mn := j.m * j.n
	parallelFor(j.m, j.n*(j.nKChunks-1), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := j.c[i*j.ldc : i*j.ldc+j.n]
			for q := range j.nKChunks - 1 {
				j.p.vec.add(row, row, j.partial[q*mn+i*j.n:q*mn+(i+1)*j.n])
			}
		}
	})
}

// bufPool holds whole-operand buffers between calls. Unlike a sync.Pool it
// survives garbage collections, so training steps do not reallocate megabytes
// of packing space after every GC.
type bufPool[T any] struct {
	mu    sync.Mutex
	free  []*[]T
	alloc func(n int) []T
}

// sharedBufs holds packing buffers and padded images; sharedInts the pixel
// offsets of a weight gradient.
var (
	sharedBufs = bufPool[float32]{alloc: alignedFloats}
	sharedInts = bufPool[int]{alloc: func(n int) []int { return make([]int, n) }}
)

func (bp *bufPool[T]) get(n int) *[]T {
	bp.mu.Lock()
	// Best fit: the smallest free buffer that holds n; otherwise the largest,
	// which is then grown (so buffers only ever grow and stop churning).
	best := -1
	for i, f := range bp.free {
		if best < 0 {
			best = i
			continue
		}
		c, b := cap(*f), cap(*bp.free[best])
		if (c >= n && (b < n || c < b)) || (b < n && c > b) {
			best = i
		}
	}
	var s *[]T
	if best >= 0 {
		s = bp.free[best]
		last := len(bp.free) - 1
		bp.free[best] = bp.free[last]
		bp.free = bp.free[:last]
	}
	bp.mu.Unlock()
	if s == nil {
		s = new([]T)
	}
	if cap(*s) < n {
		*s = bp.alloc(n)
	}
	*s = (*s)[:n]
	return s
}

// maxSharedFree bounds the idle shared buffers kept per pool. Each in-process
// worker holds up to four at once (prepacked A and B, an NHWC or padded image, a
// permuted result), so this covers 16 concurrent GEMM callers without
// dropping and reallocating buffers every step.
const maxSharedFree = 64

func (bp *bufPool[T]) put(s *[]T) {
	bp.mu.Lock()
	if len(bp.free) < maxSharedFree {
		bp.free = append(bp.free, s)
	}
	bp.mu.Unlock()
}

func getShared(n int) *[]float32 { return sharedBufs.get(n) }
func putShared(s *[]float32)     { sharedBufs.put(s) }

// prepackA packs all of op(A) once, in parallel, into the layout the units
// read: for each KC block starting at pc (depth kcl), the MR-row slivers of
// the full M at offset pc*mPad + i*kcl.
func (j *gemmJob) prepackA(nw int) *[]float32 {
	j.mPad = roundUp(j.m, j.p.mr)
	s := getShared(j.mPad * j.k)
	j.sharedA = *s
	j.prepack(nw, packingA, ceilDiv(j.m, j.p.mc))
	return s
}

// prepackB packs all of op(B) once, in parallel: for each KC block at pc
// (depth kcl), the NR-column slivers of the full N at offset pc*nPad + jj*kcl.
func (j *gemmJob) prepackB(nw int) *[]float32 {
	j.nPad = roundUp(j.n, j.p.nr)
	s := getShared(j.nPad * j.k)
	j.sharedB = *s
	j.prepack(nw, packingB, ceilDiv(j.n, prepackCols))
	return s
}

// prepackCols is the number of B columns one prepack unit packs (a multiple of every NR).
const prepackCols = 256

type packWhich uint8

const (
	packingA packWhich = iota
	packingB
)

// packJob is one parallel prepack pass: units are (KC block, group of rows
// or columns) pairs claimed dynamically.
type packJob struct {
	j      *gemmJob
	which  packWhich
	groups int
	units  int
	next   atomic.Int64
	wg     joiner
}

var packJobPool = sync.Pool{New: func() any { return new(packJob) }}

func (j *gemmJob) prepack(nw int, which packWhich, groups int) {
	pj := packJobPool.Get().(*packJob)
	pj.j, pj.which, pj.groups = j, which, groups
	pj.units = ceilDiv(j.k, j.p.kc) * groups
	pj.next.Store(0)
	dispatch(pj, &pj.wg, min(nw, pj.units))
	pj.j = nil
	packJobPool.Put(pj)
}

func (pj *packJob) done() { pj.wg.Done() }

func (pj *packJob) run() {
	j, p := pj.j, pj.j.p
	for {
		u := int(pj.next.Add(1)) - 1
		if u >= pj.units {
			return
		}
		pc := (u / pj.groups) * p.kc
		kcl := min(p.kc, j.k-pc)
		g := u % pj.groups
		if pj.which == packingA {
			i0 := g * p.mc
			j.packA(i0, min(p.mc, j.m-i0), pc, kcl, j.sharedA[pc*j.mPad+i0*kcl:])
		} else {
			j0 := g * prepackCols
			j.packB(pc, kcl, j0, min(prepackCols, j.n-j0), j.sharedB[pc*j.nPad+j0*kcl:])
		}
	}
}

func checkMatrix(name string, x []float32, rows, cols, ld int) {
	if ld < cols || ld < 0 {
		panic(fmt.Sprintf("kernels.Sgemm: ld%s=%d smaller than stored width %d", name, ld, cols))
	}
	if rows == 0 || cols == 0 {
		return
	}
	if need := (rows-1)*ld + cols; len(x) < need {
		panic(fmt.Sprintf("kernels.Sgemm: %s has %d elements, need %d for a %d×%d matrix with stride %d", name, len(x), need, rows, cols, ld))
	}
}

// trivialGemm finishes the calls that need no product: an empty C, or
// alpha == 0 or k == 0 (C = beta*C). It reports whether it did.
func trivialGemm(m, n, k int, alpha, beta float32, c []float32, ldc int) bool {
	if m == 0 || n == 0 {
		return true
	}
	if alpha == 0 || k == 0 {
		scaleMatrix(m, n, beta, c, ldc)
		return true
	}
	return false
}

// scaleMatrix sets C = beta*C (beta == 0 overwrites with zeros).
func scaleMatrix(m, n int, beta float32, c []float32, ldc int) {
	if beta == 1 {
		return
	}
	for i := range m {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
		} else {
			for j := range row {
				row[j] *= beta
			}
		}
	}
}

// gemmJob is one Sgemm call split into a grid of C blocks ("units").
type gemmJob struct {
	p                      *gemmImpl
	transA, transB         bool
	m, n, k                int
	alpha, beta            float32
	a, b, c                []float32
	lda, ldb, ldc          int
	rowChunk, colChunk     int
	nRowChunks, nColChunks int
	units                  int
	// Implicit B operand (bsrc != denseB): B is im2col(x) or its transpose
	// for geometry geom, packed straight from the image.
	bsrc srcKind
	geom ConvGeom
	x    []float32
	// Implicit A operand: flipped, transposed convolution kernel (see
	// SgemmFlippedKernelIm2col); kOut, kIn, kk describe the stored weight.
	aFlip         bool
	kOut, kIn, kk int
	// aPlane > 0: A (not transposed) is an NCHW gradient [k/aPlane, m,
	// aPlane]: column q of row i is a[(q/aPlane·m + i)·aPlane + q%aPlane].
	aPlane int
	// Whole-operand packed copies shared by every unit (nil: each unit packs).
	sharedA, sharedB []float32
	mPad, nPad       int
	pixOffs          []int // nhwcIndirectB: the pixel offsets of all of K, shared by the units (nil: per block)
	// kChunk > 0 (a convolution's weight gradient) lets plan split K into
	// chunks of kChunk, a length that does not depend on the goroutine count:
	// chunk 0 goes to C, chunk q ≥ 1 to partial[(q-1)·m·n:] (m×n, row stride
	// n), and execute adds the partials to C in chunk order.
	kChunk, nKChunks int
	partial          []float32
	next             atomic.Int64
	wg               joiner
}

var jobPool = sync.Pool{New: func() any { return new(gemmJob) }}

// longK is the reduction length from which plan may split C down to single
// micro-tiles.
const longK = 1024

// maxKChunkedC is the largest C (elements) whose K a gemmJob with kChunk
// splits: the partials then take at most 256 KiB each.
const maxKChunkedC = 1 << 16

// plan splits C into units. Each unit covers all of K, or (kChunk) one
// chunk of K, so the per-element summation order depends only on KC and
// kChunk, never on the split.
func (j *gemmJob) plan(nw int) {
	p := j.p
	j.nKChunks = 1
	if j.kChunk > 0 && j.k > j.kChunk && j.m*j.n <= maxKChunkedC {
		// A small C over a long K (ResNet-20's first weight gradients: 16 × 144
		// over 32,768 pixels): units that each walked all of K for a micro-tile
		// of C streamed the image and dy from L3 once per tile. Chunks of K
		// with all of C (or a few column chunks) keep both in L1/L2.
		j.kChunk = roundUp(j.kChunk, p.kc) // chunks start on KC blocks (sharedA's)
		j.nKChunks = ceilDiv(j.k, j.kChunk)
		j.rowChunk, j.nRowChunks = j.m, 1
		cols := min(ceilDiv(4*nw, j.nKChunks), ceilDiv(j.n, p.nr))
		j.colChunk = roundUp(ceilDiv(j.n, max(cols, 1)), p.nr)
		j.nColChunks = ceilDiv(j.n, j.colChunk)
		j.units = j.nKChunks * j.nColChunks
		return
	}
	// Prefer splitting N (keeps B packed once); columns chunks stay >= 128 wide
	// and row chunks >= 4·MR.
	j.split(nw, 4*nw, 128, 4*p.mr)
	if nw > 1 && j.units < 4*nw && j.k >= longK {
		// A small C with a long reduction (a convolution's weight gradient: C is
		// C_out × C_in·KH·KW, K the batch's pixels; 16 × 27 for ResNet-20's first
		// layer was one unit): every micro-tile is a lot of work and the
		// operands are packed once for all chunks, so chunks go down to one
		// micro-tile rather than leave a worker idle.
		j.split(nw, 8*nw, p.nr, p.mr)
	}
}

// split divides C into about target units, columns first, chunks at least minW
// columns and minH rows wide (or all of them).
func (j *gemmJob) split(nw, target, minW, minH int) {
	p := j.p
	j.rowChunk, j.colChunk = j.m, min(j.n, p.nc)
	j.nRowChunks, j.nColChunks = 1, ceilDiv(j.n, j.colChunk)
	if nw > 1 {
		if j.nColChunks < target {
			w := roundUp(ceilDiv(j.n, target), p.nr)
			w = max(w, min(roundUp(j.n, p.nr), minW))
			j.colChunk = min(w, p.nc)
			j.nColChunks = ceilDiv(j.n, j.colChunk)
		}
		if j.nColChunks < target {
			want := ceilDiv(target, j.nColChunks)
			h := roundUp(ceilDiv(j.m, want), p.mr)
			h = max(h, min(roundUp(j.m, p.mr), minH))
			j.rowChunk = h
			j.nRowChunks = ceilDiv(j.m, h)
		}
	}
	j.units = j.nRowChunks * j.nColChunks
}

func (j *gemmJob) done() { j.wg.Done() }

func (j *gemmJob) run() {
	var ws *workspace
	for {
		u := int(j.next.Add(1)) - 1
		if u >= j.units {
			break
		}
		if ws == nil {
			ws = getWorkspace(j.p)
		}
		kq, u := u/(j.nRowChunks*j.nColChunks), u%(j.nRowChunks*j.nColChunks)
		ri, ci := u/j.nColChunks, u%j.nColChunks
		i0, j0 := ri*j.rowChunk, ci*j.colChunk
		c, ldc, beta := j.c, j.ldc, j.beta
		k0, k1 := 0, j.k
		if j.nKChunks > 1 {
			k0, k1 = kq*j.kChunk, min((kq+1)*j.kChunk, j.k)
			if kq > 0 {
				c, ldc, beta = j.partial[(kq-1)*j.m*j.n:], j.n, 0
			}
		}
		j.block(ws, i0, min(i0+j.rowChunk, j.m), j0, min(j0+j.colChunk, j.n), k0, k1, c, ldc, beta)
	}
	if ws != nil {
		putWorkspace(ws)
	}
}

// block computes c[i0:i1, j0:j1] = beta·c + the product over K's [k0, k1)
// with the BLIS loop nest (k0 a multiple of KC).
func (j *gemmJob) block(ws *workspace, i0, i1, j0, j1, k0, k1 int, c []float32, ldc int, beta0 float32) {
	p := j.p
	for jc := j0; jc < j1; jc += p.nc {
		nc := min(p.nc, j1-jc)
		for pc := k0; pc < k1; pc += p.kc {
			kc := min(p.kc, k1-pc)
			beta := beta0
			if pc > k0 {
				beta = 1
			}
			bp := ws.b
			var offs []int // nhwcIndirectB: the block's pixel offsets
			switch {
			case j.bsrc == nhwcIndirectB && j.pixOffs != nil:
				offs = j.pixOffs[pc : pc+kc]
			case j.bsrc == nhwcIndirectB:
				pixelOffsets(j.geom, pc, ws.offs[:kc])
				offs = ws.offs[:kc]
			case j.sharedB != nil:
				bp = j.sharedB[pc*j.nPad+jc*kc:]
			default:
				j.packB(pc, kc, jc, nc, bp)
			}
			for ic := i0; ic < i1; ic += p.mc {
				mc := min(p.mc, i1-ic)
				ap := ws.a
				if j.sharedA != nil {
					ap = j.sharedA[pc*j.mPad+ic*kc:]
				} else {
					j.packA(ic, mc, pc, kc, ap)
				}
				j.macro(ws, ap, bp, offs, ic, mc, jc, nc, kc, c, ldc, beta)
			}
		}
	}
}

// macro runs the micro-kernel over an mc×nc block of C from packed panels.
func (j *gemmJob) macro(ws *workspace, pa, pb []float32, offs []int, ic, mc, jc, nc, kc int, c []float32, ldc int, beta float32) {
	p := j.p
	mr, nr := p.mr, p.nr
	kern := p.kernel
	alpha := j.alpha
	indirect := j.bsrc == nhwcIndirectB // alpha is 1; columns are (tap, channel)
	for jr := 0; jr < nc; jr += nr {
		nrr := min(nr, nc-jr)
		var bp []float32
		base, split := 0, 0
		if indirect {
			// The sliver's two halves, each a run of channels of one tap (C is a
			// multiple of nr/2); an edge of at most half a sliver reads its first
			// half twice (the copy keeps only its columns).
			base = j.nhwcColumn(jc + jr)
			if nrr > nr/2 {
				split = j.nhwcColumn(jc+jr+nr/2) - base
			}
		} else {
			bp = pb[jr*kc : jr*kc+nr*kc]
		}
		for ir := 0; ir < mc; ir += mr {
			mrr := min(mr, mc-ir)
			ap := pa[ir*kc : ir*kc+mr*kc]
			off := (ic+ir)*ldc + jc + jr
			if mrr == mr && nrr == nr {
				if indirect {
					p.bIndirect(kc, ap, j.x, base, split, offs, c[off:], ldc, beta)
				} else {
					kern(kc, ap, bp, c[off:], ldc, alpha, beta)
				}
				continue
			}
			if indirect && nrr == nr && p.bIndirectRows != nil && p.bIndirectRows(mrr, kc, ap, j.x, base, split, offs, c[off:], ldc, beta) {
				continue
			}
			// Edge tile: compute into the scratch tile, then merge.
			t := ws.tile
			if indirect {
				p.bIndirect(kc, ap, j.x, base, split, offs, t, nr, 0)
			} else {
				kern(kc, ap, bp, t, nr, alpha, 0)
			}
			for r := range mrr {
				row := c[off+r*ldc : off+r*ldc+nrr]
				tr := t[r*nr : r*nr+nrr]
				if beta == 0 {
					copy(row, tr)
				} else {
					for q := range row {
						row[q] = tr[q] + beta*row[q]
					}
				}
			}
		}
	}
}

// nhwcColumn is the element offset, from a pixel's corner in the padded NHWC
// image, of column col of B = im2col(x)ᵀ (nhwcIndirectB; columns in (kh, kw, c)
// order).
func (j *gemmJob) nhwcColumn(col int) int {
	g := j.geom
	t := col / g.C
	return ((t/g.KW)*g.W+t%g.KW)*g.C + col%g.C
}

// srcKind says where the B operand comes from.
type srcKind uint8

const (
	denseB        srcKind = iota // b, ldb, transB
	im2colB                      // B = im2col(x) for geom: ColRows × ColCols
	im2colTB                     // B = im2col(x)ᵀ: ColCols × ColRows
	nhwcTB                       // B = im2col(x)ᵀ with columns in (kh, kw, c) order, from padded NHWC x
	nhwcIndirectB                // nhwcTB read in place by the bIndirect micro-kernel (never packed)
)

func (j *gemmJob) packA(i0, mc, p0, kc int, dst []float32) {
	if j.aFlip {
		packFlippedKernel(j.p.mr, j.a, j.kOut, j.kIn, j.kk, i0, mc, p0, kc, dst)
		return
	}
	if j.aPlane > 0 {
		// Sliver by sliver, one packA per image the block's columns cross,
		// written at those columns (a single sliver's layout does not depend
		// on its column count).
		mr, pl := j.p.mr, j.aPlane
		for s := 0; s < mc; s += mr {
			d := dst[s*kc : s*kc+mr*kc]
			for q := p0; q < p0+kc; {
				img, p := q/pl, q%pl
				w := min(pl-p, p0+kc-q)
				packA(mr, false, j.a[img*j.m*pl+p:], pl, i0+s, min(mr, mc-s), 0, w, d[(q-p0)*mr:], j.p.vec)
				q += w
			}
		}
		return
	}
	packA(j.p.mr, j.transA, j.a, j.lda, i0, mc, p0, kc, dst, j.p.vec)
}

func (j *gemmJob) packB(p0, kc, j0, nc int, dst []float32) {
	switch j.bsrc {
	case im2colB:
		packIm2col(j.p.nr, j.geom, j.x, p0, kc, j0, nc, dst)
	case im2colTB:
		packIm2colT(j.p.nr, j.geom, j.x, p0, kc, j0, nc, dst)
	case nhwcTB:
		packNHWCT(j.p.nr, j.geom, j.x, p0, kc, j0, nc, dst)
	default:
		tr, ts := j.p.vec.packBTranspose()
		packB(j.p.nr, j.transB, j.b, j.ldb, p0, kc, j0, nc, dst, tr, ts)
	}
}

// packBTranspose returns the tile transpose packB uses for a transposed B and its
// tile size: transpose16 (AVX-512), else transpose8 (AVX2), else nil (generic).
func (v *vecOps) packBTranspose() (func(dst []float32, ldd int, src []float32, lds, blocks int), int) {
	if v.transpose16 != nil {
		return v.transpose16, 16
	}
	return v.transpose8, 8
}

// packA packs op(A)[i0:i0+mc, p0:p0+kc] into mr-row slivers: sliver s holds,
// for each p, the mr values op(A)[i0+s*mr+r, p0+p] (zero padded past mc).
// v, when not nil, supplies the implementation's register packers (vecOps.pack8,
// pack6), used for whole slivers of a non-transposed A.
// packT6Generic is vecOps.packT6 in Go.
func packT6Generic(dst, src []float32, lds, rows int) {
	for p := 0; p < len(dst)/6; p++ {
		d := dst[p*6 : p*6+6]
		for r := range 6 {
			if r < rows {
				d[r] = src[p*lds+r]
			} else {
				d[r] = 0
			}
		}
	}
}

func packA(mr int, trans bool, a []float32, lda, i0, mc, p0, kc int, dst []float32, v *vecOps) {
	s0 := 0
	if trans && mr == 8 {
		// The AVX-512 slivers of a transposed A, all whole ones together: op(A)[i,p] =
		// a[p*lda+i], so for each p the block's rows are one contiguous run of a, read in
		// order (a sliver at a time would touch a new line of a at every p, the pattern of
		// the decoder's weight gradient dYᵀ·X, whose dY rows are 40 KB apart), and each
		// sliver gets a fixed-size copy, not a memmove call.
		s0 = mc / 8 * 8
		for p := range kc {
			row := a[(p0+p)*lda+i0 : (p0+p)*lda+i0+s0]
			for s := 0; s < s0; s += 8 {
				v := *(*[8]float32)(row[s : s+8]) // through a register: no memmove call
				*(*[8]float32)(dst[s*kc+p*8 : s*kc+p*8+8]) = v
			}
		}
	}
	if trans && mr == 6 {
		// The AVX2 slivers likewise: a copy call per 6 floats was runtime.memmove
		// at 11 % of a BERT-tiny training step (the weight gradients' dYᵀ).
		// The edge sliver too, zero-padded. Go's fixed-size copies were a
		// memmove call (or stack round trips) per column, a fifth of the speed.
		pack := packT6Generic
		if v != nil && v.packT6 != nil {
			pack = v.packT6
		}
		for s := 0; s < mc; s += 6 {
			pack(dst[s*kc:s*kc+6*kc], a[p0*lda+i0+s:], lda, min(6, mc-s))
		}
		s0 = mc
	}
	for s := s0; s < mc; s += mr {
		rows := min(mr, mc-s)
		d := dst[s*kc : s*kc+mr*kc]
		if trans {
			// op(A)[i,p] = a[p*lda+i]: each p is a contiguous run of rows,
			// copied element by element (a copy call per run of a few floats
			// was 5 % of a channels-last ResNet-20 step: its weight gradients'
			// dY with 16, 32 or 64 output channels ends in an edge sliver).
			for p := range kc {
				src := a[(p0+p)*lda+i0+s:][:rows]
				dp := d[p*mr : p*mr+mr]
				copy(dp, src)
				clear(dp[rows:])
			}
			continue
		}
		if rows == 8 && mr == 8 {
			// The AVX-512 sliver: read eight rows together so the packed
			// output is written sequentially.
			base, kr := (i0+s)*lda+p0, kc
			if pt := kc / 16 * 16; v != nil && v.pack8 != nil && pt > 0 {
				// Whole blocks of 16 columns in registers, the rest below.
				v.pack8(d, a[base:], lda, kc/16)
				d, base, kr = d[pt*8:], base+pt, kc-pt
			}
			r0, r1 := a[base:base+kr], a[base+lda:base+lda+kr]
			r2, r3 := a[base+2*lda:base+2*lda+kr], a[base+3*lda:base+3*lda+kr]
			r4, r5 := a[base+4*lda:base+4*lda+kr], a[base+5*lda:base+5*lda+kr]
			r6, r7 := a[base+6*lda:base+6*lda+kr], a[base+7*lda:base+7*lda+kr]
			for p := range r0 {
				dp := (*[8]float32)(d[p*8 : p*8+8])
				dp[0], dp[1], dp[2], dp[3] = r0[p], r1[p], r2[p], r3[p]
				dp[4], dp[5], dp[6], dp[7] = r4[p], r5[p], r6[p], r7[p]
			}
			continue
		}
		if rows == 6 && mr == 6 {
			// The AVX2 sliver, likewise six rows together (the weight gradient's
			// dY, packed a row at a time, was 7 % of a ResNet-20 step on AVX2).
			base, kr := (i0+s)*lda+p0, kc
			if pt := kc / 8 * 8; v != nil && v.pack6 != nil && pt > 0 {
				// Whole blocks of 8 columns transposed in registers, the rest below.
				v.pack6(d, a[base:], lda, kc/8)
				d, base, kr = d[pt*6:], base+pt, kc-pt
			}
			r0, r1 := a[base:base+kr], a[base+lda:base+lda+kr]
			r2, r3 := a[base+2*lda:base+2*lda+kr], a[base+3*lda:base+3*lda+kr]
			r4, r5 := a[base+4*lda:base+4*lda+kr], a[base+5*lda:base+5*lda+kr]
			for p := range r0 {
				dp := (*[6]float32)(d[p*6 : p*6+6])
				dp[0], dp[1], dp[2], dp[3], dp[4], dp[5] = r0[p], r1[p], r2[p], r3[p], r4[p], r5[p]
			}
			continue
		}
		if mr == 6 {
			// An AVX2 edge sliver (ResNet's 16 and 32 output channels leave 4 and
			// 2 rows): whole zero-padded groups of six, written in order.
			base := (i0+s)*lda + p0
			var rs [6][]float32
			for r := range rows {
				rs[r] = a[base+r*lda : base+r*lda+kc]
			}
			for p := range kc {
				var g [6]float32
				for r, row := range rs[:rows] {
					g[r] = row[p]
				}
				*(*[6]float32)(d[p*6 : p*6+6]) = g
			}
			continue
		}
		for r := range rows {
			src := a[(i0+s+r)*lda+p0 : (i0+s+r)*lda+p0+kc]
			for p, v := range src {
				d[p*mr+r] = v
			}
		}
		for r := rows; r < mr; r++ {
			for p := range kc {
				d[p*mr+r] = 0
			}
		}
	}
}

// packB packs op(B)[p0:p0+kc, j0:j0+nc] into nr-column slivers: sliver s
// holds, for each p, the nr values op(B)[p0+p, j0+s*nr+q] (zero padded).
// tr, when not nil, is the implementation's ts×ts tile transpose (vecOps.transpose16
// or transpose8), used for whole slivers of a transposed B.
func packB(nr int, trans bool, b []float32, ldb, p0, kc, j0, nc int, dst []float32, tr func(dst []float32, ldd int, src []float32, lds, blocks int), ts int) {
	for s := 0; s < nc; s += nr {
		cols := min(nr, nc-s)
		d := dst[s*kc : s*kc+nr*kc]
		if !trans {
			if cols == 32 && nr == 32 {
				// The AVX-512 sliver: a fixed-size copy, not a memmove call per p.
				for p := range kc {
					o := (p0+p)*ldb + j0 + s
					v := *(*[32]float32)(b[o : o+32])
					*(*[32]float32)(d[p*32 : p*32+32]) = v
				}
				continue
			}
			if cols == 16 && nr == 16 {
				// The AVX2 sliver, likewise.
				for p := range kc {
					o := (p0+p)*ldb + j0 + s
					v := *(*[16]float32)(b[o : o+16])
					*(*[16]float32)(d[p*16 : p*16+16]) = v
				}
				continue
			}
			for p := range kc {
				src := b[(p0+p)*ldb+j0+s:]
				dp := d[p*nr : p*nr+nr]
				copy(dp, src[:cols])
				if cols < nr {
					clear(dp[cols:])
				}
			}
			continue
		}
		// op(B)[p,j] = b[j*ldb+p]
		pt := 0 // the columns p < pt are packed by ts×ts transposes
		if tr != nil && cols == nr && nr%ts == 0 && kc >= ts {
			pt = kc / ts * ts
			for q := 0; q < nr; q += ts {
				tr(d[q:], nr, b[(j0+s+q)*ldb+p0:], ldb, kc/ts)
			}
		}
		for q := range cols {
			src := b[(j0+s+q)*ldb+p0+pt : (j0+s+q)*ldb+p0+kc]
			for p, v := range src {
				d[(pt+p)*nr+q] = v
			}
		}
		for q := cols; q < nr; q++ {
			for p := range kc {
				d[p*nr+q] = 0
			}
		}
	}
}

// workspace holds one goroutine's packing buffers for one implementation.
type workspace struct {
	p    *gemmImpl
	a, b []float32
	tile []float32
	offs []int // pixel offsets of a KC block (nhwcIndirectB)
}

// wsFree keeps idle workspaces per implementation. It survives garbage
// collections (a sync.Pool would drop them and reallocate after every GC).
var wsFree struct {
	sync.Mutex
	m map[*gemmImpl][]*workspace
}

func getWorkspace(p *gemmImpl) *workspace {
	wsFree.Lock()
	if l := wsFree.m[p]; len(l) > 0 {
		ws := l[len(l)-1]
		wsFree.m[p] = l[:len(l)-1]
		wsFree.Unlock()
		return ws
	}
	wsFree.Unlock()
	return &workspace{
		p:    p,
		a:    alignedFloats(roundUp(p.mc, p.mr) * p.kc),
		b:    alignedFloats(roundUp(p.nc, p.nr) * p.kc),
		tile: alignedFloats(p.mr * p.nr),
		offs: make([]int, p.kc),
	}
}

func putWorkspace(ws *workspace) {
	wsFree.Lock()
	if wsFree.m == nil {
		wsFree.m = map[*gemmImpl][]*workspace{}
	}
	if len(wsFree.m[ws.p]) < 64 {
		wsFree.m[ws.p] = append(wsFree.m[ws.p], ws)
	}
	wsFree.Unlock()
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
func roundUp(a, b int) int { return ceilDiv(a, b) * b }
