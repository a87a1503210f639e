package kernels

import (
	"fmt"
	"math"
	"sync"
)

// Channels-last (NHWC) BatchNorm. Activations are rows × c, row-major: rows = N·H·W
// pixels, the c channels of a pixel contiguous. The kernels compute what the NCHW
// kernels of batchnorm.go compute (same statistics, formulas and argument rules).
//
// Layout of the work. A chunk is k rows (E = k·c elements, k chosen from c alone so
// that E is a multiple of 8 and at least bnhLanes): the per-channel values a pass
// needs (the shift, the mean, the scale and shift, the gradient coefficients) are
// expanded into arrays of E elements, element i holding channel i mod c's value, and
// every pass is a flat elementwise loop over the chunks of a block with those arrays
// as its per-element parameters (bnNHWCOps; AVX2 assembly, or portable loops). The
// reductions accumulate in E float32 lanes over a block, then fold the lanes into
// float64 per channel.
//
// Determinism. The rows are split into blocks of a fixed number of rows (a multiple
// of k, about bnhBlockElems elements; it depends on c only), the unit of parallel
// work. A block's sums are reduced in a fixed order and stored in float64 per block;
// the blocks' sums are combined in float64 in block order by the calling goroutine.
// So results do not depend on the goroutine count. The passes fuse each product with
// the addition after it (one rounding, as the NCHW kernels' AVX2 passes do); the
// portable loops compute those fused operations exactly (fma32), in the assembly's
// order, so every implementation gives the same bits.
//
// The results are not bit-identical to the NCHW kernels' on transposed data (the
// summation orders differ);
// they agree to rounding. (Given the same statistics, the AVX2 backward dx is the
// NCHW AVX2 kernel's, bit for bit.)

const (
	// bnhLanes is the smallest chunk length E (unless c is larger).
	bnhLanes = 256
	// bnhBlockElems is about the elements of a block (at least one chunk): a block's
	// float32 lanes each sum about bnhBlockElems/E ≤ 64 values.
	bnhBlockElems = 16384
)

// bnNHWCOps are the flat passes of the channels-last BatchNorm. e = len of the lane
// arrays (acc, k, mu, s, t, a, b, c); the stream arrays (x, y, r, dy, dst) hold whole
// rows of e elements, their element q·e+j paired with lane j. Every product is fused
// with the addition after it (one rounding); otherwise the order is as written.
type bnNHWCOps struct {
	sumDev      func(acc, k, x []float32)                            // acc += x − k
	sumSqDev    func(acc, mu, x []float32)                           // acc += (x − mu)²
	dyStats     func(s, t, mu, dy, x []float32)                      // s += dy, t += dy·(x − mu)
	dyStatsRelu func(s, t, mu, dy, y, x []float32)                   // dyStats of g = dy where y > 0, else 0
	affine      func(dst, x, mu, a, b []float32)                     // dst = (x − mu)·a + b
	affineRelu  func(dst, x, r, mu, a, b []float32)                  // dst = max(((x − mu)·a + b) + r, 0); r nil: no r
	bnBwd       func(dst, dy, x, mu, a, b, c []float32, acc bool)    // dst (+)= a·dy + (b·(x − mu) + c)
	bnBwdRelu   func(dst, dy, y, x, mu, a, b, c []float32, acc bool) // bnBwd of g = dy where y > 0, else 0
}

var bnNHWCGeneric = &bnNHWCOps{
	sumDev: bnhSumDevGeneric, sumSqDev: bnhSumSqDevGeneric,
	dyStats: bnhDyStatsGeneric, dyStatsRelu: bnhDyStatsReluGeneric,
	affine: bnhAffineGeneric, affineRelu: bnhAffineReluGeneric,
	bnBwd: bnhBwdGeneric, bnBwdRelu: bnhBwdReluGeneric,
}

// bnhOps returns the channels-last passes of the implementation in use.
func bnhOps() *bnNHWCOps {
	if o := impl.vec.bnNHWC; o != nil {
		return o
	}
	return bnNHWCGeneric
}

// BatchNormForwardTrainNHWC is BatchNormForwardTrain on channels-last activations:
// x and y are rows × c (c channels contiguous per row), and every channel is
// normalised with its batch statistics over the rows:
//
//	mean[ch] = Σx/M, variance[ch] = Σ(x−mean)²/M (biased), invstd[ch] = 1/sqrt(variance+eps)
//	y = (x−mean)·(invstd·gamma[ch]) + beta[ch]
//
// with M = rows. The mean is Σ(x−K)/M + K, K the channel's value in row 0 (a shared
// offset costs no precision), rounded to float32 from its exact float64 value; each
// block of rows sums its part in float32 lanes, then in float64, and the block sums
// are added in float64 in block order. The variance is each block's sum of squares
// about its own mean (a second pass over the block while it is in cache) combined
// with the blocks' mean offsets in float64 (Chan et al.): the same value as
// BatchNormForwardTrain's to rounding. The results do not depend on the goroutine
// count. gamma, beta, mean, variance and invstd have c elements. y may alias x.
func BatchNormForwardTrainNHWC(y, x []float32, rows, c int, gamma, beta []float32, eps float64, mean, variance, invstd []float32) {
	batchNormForwardTrainNHWC("BatchNormForwardTrainNHWC", y, x, nil, false, rows, c, gamma, beta, eps, mean, variance, invstd)
}

// BatchNormForwardTrainReLUNHWC is BatchNormForwardTrainNHWC with the rectifier in
// the pass that writes y: y = max(bn(x) + r, 0), or max(bn(x), 0) when r is nil. The
// result is bit-identical to BatchNormForwardTrainNHWC, then Add(y, y, r) and
// ReluForward(y, y). r (when non-nil) has rows·c elements; y may alias x, not r.
func BatchNormForwardTrainReLUNHWC(y, x, r []float32, rows, c int, gamma, beta []float32, eps float64, mean, variance, invstd []float32) {
	batchNormForwardTrainNHWC("BatchNormForwardTrainReLUNHWC", y, x, r, true, rows, c, gamma, beta, eps, mean, variance, invstd)
}

func batchNormForwardTrainNHWC(fn string, y, x, r []float32, relu bool, rows, c int, gamma, beta []float32, eps float64, mean, variance, invstd []float32) {
	if rows <= 0 || c < 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape rows=%d c=%d", fn, rows, c))
	}
	checkBNForward(fn, y, x, r, rows*c, c, gamma, beta, mean, variance, invstd)
	if c == 0 {
		return
	}
	j := newBNHJob(rows, c)
	defer j.release()
	j.x, j.y, j.r, j.relu = x, y, r, relu
	// Pass 1 (per block): Σ(x−K) and the sum of squares about the block's mean.
	j.expand(j.eK, x[:c])
	j.run(bnhFwdStats)
	// The blocks' sums in block order.
	m := float64(rows)
	nb, part := j.blocks, j.part
	for ch := range c {
		var s float64
		for b := range nb {
			s += part[2*c*b+ch]
		}
		d := s / m // mean − K
		var m2 float64
		for b := range nb {
			nbr := float64(j.blockRows(b))
			db := part[2*c*b+ch]/nbr - d
			m2 += part[2*c*b+c+ch] + nbr*db*db
		}
		mu := float32(float64(x[ch]) + d)
		vr := max(m2/m, 0)
		is := float32(1 / math.Sqrt(vr+eps))
		mean[ch], variance[ch], invstd[ch] = mu, float32(vr), is
		j.chA[ch] = is * gamma[ch]
	}
	// Pass 2: y = (x−mean)·scale + beta (rectified).
	j.expand(j.eMu, mean)
	j.expand(j.eA, j.chA)
	j.expand(j.eB, beta)
	j.run(bnhAffine)
}

// BatchNormApplyNHWC is BatchNormApply on channels-last activations (rows × c):
// y = (x−mean[ch])·scale[ch] + shift[ch]. y may alias x.
func BatchNormApplyNHWC(y, x []float32, rows, c int, mean, scale, shift []float32) {
	batchNormApplyNHWC("BatchNormApplyNHWC", y, x, nil, false, rows, c, mean, scale, shift)
}

// BatchNormApplyReLUNHWC is BatchNormApplyNHWC with the rectifier in the same pass:
// y = max(apply(x) + r, 0), or max(apply(x), 0) when r is nil, bit-identical to
// BatchNormApplyNHWC, then Add(y, y, r) and ReluForward(y, y). r (when non-nil) has
// rows·c elements; y may alias x, not r.
func BatchNormApplyReLUNHWC(y, x, r []float32, rows, c int, mean, scale, shift []float32) {
	batchNormApplyNHWC("BatchNormApplyReLUNHWC", y, x, r, true, rows, c, mean, scale, shift)
}

func batchNormApplyNHWC(fn string, y, x, r []float32, relu bool, rows, c int, mean, scale, shift []float32) {
	if rows < 0 || c < 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape rows=%d c=%d", fn, rows, c))
	}
	checkBNApply(fn, y, x, r, rows*c, c, mean, scale, shift)
	if c == 0 || rows == 0 {
		return
	}
	j := newBNHJob(rows, c)
	defer j.release()
	j.x, j.y, j.r, j.relu = x, y, r, relu
	j.expand(j.eMu, mean)
	j.expand(j.eA, scale)
	j.expand(j.eB, shift)
	j.run(bnhAffine)
}

// BatchNormBackwardNHWC is BatchNormBackward on channels-last activations (rows × c):
// per channel it computes Σdy and Σdy·x̂ with x̂ = (x−mean)·invstd and adds them to
// dbeta[ch] and dgamma[ch] (either slice may be nil). When dx is non-nil it also
// computes the input gradient:
//
//	batch statistics (training): dx = gamma·invstd·(dy − Σdy/M − x̂·Σdy·x̂/M)
//	fixed statistics (eval):     dx = gamma·invstd·dy
//
// with M = rows, overwriting dx, or adding to it when accumulate is true. mean and
// invstd are the statistics the forward pass used. The sums are reduced per block of
// rows (float32 lanes, then float64) and the blocks' sums added in float64 in block
// order, so the results do not depend on the goroutine count.
func BatchNormBackwardNHWC(dx, dy, x []float32, rows, c int, mean, invstd, gamma []float32, training, accumulate bool, dgamma, dbeta []float32) {
	batchNormBackwardNHWC("BatchNormBackwardNHWC", dx, dy, nil, x, rows, c, mean, invstd, gamma, training, accumulate, dgamma, dbeta)
}

// BatchNormBackwardReLUNHWC is the backward pass of the fused y = max(bn(x) [+ r], 0)
// (BatchNormForwardTrainReLUNHWC, BatchNormApplyReLUNHWC) given its output y:
// BatchNormBackwardNHWC of g = dy where y > 0 and 0 elsewhere, the mask applied as
// each pass reads dy (no masked copy of dy is stored). The results are bit-identical
// to ReluBackwardSet(g, y, dy) followed by BatchNormBackwardNHWC(dx, g, x, …). r's
// gradient is g (see ReluBackwardSet, ReluBackwardAxpy).
func BatchNormBackwardReLUNHWC(dx, dy, y, x []float32, rows, c int, mean, invstd, gamma []float32, training, accumulate bool, dgamma, dbeta []float32) {
	const fn = "BatchNormBackwardReLUNHWC"
	mustLen(fn, "y", len(y), len(dy))
	batchNormBackwardNHWC(fn, dx, dy, y, x, rows, c, mean, invstd, gamma, training, accumulate, dgamma, dbeta)
}

// batchNormBackwardNHWC masks dy with ry > 0 when ry is non-nil.
func batchNormBackwardNHWC(fn string, dx, dy, ry, x []float32, rows, c int, mean, invstd, gamma []float32, training, accumulate bool, dgamma, dbeta []float32) {
	if rows < 0 || c < 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape rows=%d c=%d", fn, rows, c))
	}
	checkBNBackward(fn, dx, dy, x, rows*c, c, mean, invstd, gamma, dgamma, dbeta)
	if c == 0 {
		return
	}
	j := newBNHJob(rows, c)
	defer j.release()
	j.x, j.dx, j.dy, j.ry, j.relu, j.accumulate = x, dx, dy, ry, ry != nil, accumulate
	j.expand(j.eMu, mean)
	needStats := dgamma != nil || dbeta != nil || (dx != nil && training)
	if needStats && rows > 0 {
		j.run(bnhBwdStats)
	}
	// The coefficients of dx = a·dy + (b·(x−mean) + c), as the NCHW kernels compute them.
	cj := bnJob{n: rows, plane: 1, invstd: invstd, gamma: gamma, dgamma: dgamma, dbeta: dbeta, training: training}
	nb, part := j.blocks, j.part
	for ch := range c {
		var sdy, sdyc float64 // Σdy, Σdy·(x−mean)
		if needStats {
			for b := range nb {
				sdy += part[2*c*b+ch]
				sdyc += part[2*c*b+c+ch]
			}
		}
		j.chA[ch], j.chB[ch], j.chC[ch] = cj.coeffs(ch, sdy, sdyc)
	}
	if dx == nil || rows == 0 {
		return
	}
	j.expand(j.eA, j.chA)
	j.expand(j.eB, j.chB)
	j.expand(j.eC, j.chC)
	j.run(bnhBwdDx)
}

// The passes a bnhJob runs over its blocks.
const (
	bnhFwdStats = iota + 1 // part[b] = Σ(x−K), Σ(x−mean_b)²
	bnhAffine              // y = (x−mu)·a + b (rectified)
	bnhBwdStats            // part[b] = Σg, Σg·(x−mu)
	bnhBwdDx               // dx (+)= a·g + (b·(x−mu) + c)
)

// bnhJob is one channels-last BatchNorm call: its layout, the expanded per-channel
// arrays its passes share (read-only while they run), the per-block sums, and the
// arguments. Its method run processes blocks [lo, hi) of the current pass.
type bnhJob struct {
	v       *bnNHWCOps
	pass    int
	rows, c int
	k, e    int // rows and elements of a chunk
	br      int // rows of a block (a multiple of k)
	blocks  int

	x, y, r, dx, dy, ry []float32
	relu, accumulate    bool

	// Expanded per-channel values (E elements: element i is channel i mod c's).
	eK, eMu, eA, eB, eC []float32
	// Per-channel scratch (c elements each): the scale, or dx's coefficients.
	chA, chB, chC []float32
	// part holds each block's two per-channel sums: part[2·c·b + ch], part[2·c·b + c + ch].
	part []float64

	buf *bnhBuf
}

// bnhBuf is a call's pooled storage.
type bnhBuf struct {
	f32 []float32
	f64 []float64
}

var bnhBufs = sync.Pool{New: func() any { return new(bnhBuf) }}

// bnhLayout returns a chunk's rows k (E = k·c a multiple of 8 and at least
// bnhLanes, or k = 8/gcd(c, 8) when c is larger) and a block's rows.
func bnhLayout(c int) (k, br int) {
	g := 1 // gcd(c, 8)
	for g < 8 && c%(2*g) == 0 {
		g *= 2
	}
	q := 8 / g // the fewest rows whose elements are a multiple of 8
	k = q * max(1, bnhLanes/(q*c))
	return k, k * max(1, bnhBlockElems/(k*c))
}

func newBNHJob(rows, c int) bnhJob {
	k, br := bnhLayout(c)
	e := k * c
	nb := (rows + br - 1) / br
	buf := bnhBufs.Get().(*bnhBuf)
	need := 5*e + 3*c
	if cap(buf.f32) < need {
		buf.f32 = make([]float32, need)
	}
	if cap(buf.f64) < 2*c*nb {
		buf.f64 = make([]float64, 2*c*nb)
	}
	f := buf.f32[:need]
	return bnhJob{v: bnhOps(), rows: rows, c: c, k: k, e: e, br: br, blocks: nb, buf: buf,
		eK: f[0:e:e], eMu: f[e : 2*e : 2*e], eA: f[2*e : 3*e : 3*e], eB: f[3*e : 4*e : 4*e], eC: f[4*e : 5*e : 5*e],
		chA: f[5*e : 5*e+c : 5*e+c], chB: f[5*e+c : 5*e+2*c : 5*e+2*c], chC: f[5*e+2*c : 5*e+3*c : 5*e+3*c],
		part: buf.f64[:2*c*nb]}
}

func (j *bnhJob) release() {
	bnhBufs.Put(j.buf)
	j.buf = nil
}

// expand fills dst (E elements) with the c per-channel values of src, repeated.
func (j *bnhJob) expand(dst, src []float32) {
	for i := 0; i < len(dst); i += j.c {
		copy(dst[i:i+j.c], src)
	}
}

// blockRows is the number of rows of block b.
func (j *bnhJob) blockRows(b int) int { return min(j.br, j.rows-b*j.br) }

// run runs pass p over every block, in parallel when the work is worth it.
func (j *bnhJob) run(p int) {
	j.pass = p
	if runsSerial(j.blocks, 4*j.br*j.c) {
		j.runBlocks(0, j.blocks)
		return
	}
	t := newTask(jobBNNHWC)
	t.bnh = *j
	runTask(t, j.blocks)
}

// bnhBlockBuf is a worker's scratch for the reductions: two arrays of E float32
// lanes, the block's expanded mean, and c float64 sums.
type bnhBlockBuf struct {
	acc []float32
	sum []float64
}

var bnhBlockBufs = sync.Pool{New: func() any { return new(bnhBlockBuf) }}

func (j *bnhJob) runBlocks(lo, hi int) {
	e, c := j.e, j.c
	var bb *bnhBlockBuf
	if j.pass == bnhFwdStats || j.pass == bnhBwdStats {
		bb = bnhBlockBufs.Get().(*bnhBlockBuf)
		defer bnhBlockBufs.Put(bb)
		if cap(bb.acc) < 3*e {
			bb.acc = make([]float32, 3*e)
		}
		if cap(bb.sum) < c {
			bb.sum = make([]float64, c)
		}
	}
	for i := lo; i < hi; i++ {
		// The output passes walk the blocks from the last: those the statistics pass
		// read last are still in cache.
		b := i
		if j.pass == bnhAffine || j.pass == bnhBwdDx {
			b = j.blocks - 1 - i
		}
		r0 := b * j.br
		nr := j.blockRows(b)
		lo, hi := r0*c, (r0+nr)*c
		switch j.pass {
		case bnhFwdStats:
			j.fwdStats(b, nr, j.x[lo:hi], bb)
		case bnhAffine:
			j.affine(lo, hi)
		case bnhBwdStats:
			j.bwdStats(b, lo, hi, bb)
		case bnhBwdDx:
			j.bwdDx(lo, hi)
		}
	}
}

// chunks calls f(lo, hi, l) for the elements [lo, hi) of a block, in order: the
// whole chunks together (l = E), then the rest (l = its length, fewer than k rows).
func (j *bnhJob) chunks(lo, hi int, f func(lo, hi, l int)) {
	whole := lo + (hi-lo)/j.e*j.e
	if whole > lo {
		f(lo, whole, j.e)
	}
	if hi > whole {
		f(whole, hi, hi-whole)
	}
}

// fold adds the E lanes of acc into sum per channel, in lane order.
func (j *bnhJob) fold(sum []float64, acc []float32) {
	c := j.c
	sum = sum[:c]
	clear(sum)
	for i := 0; i < len(acc); i += c {
		for ch, v := range acc[i : i+c] {
			sum[ch] += float64(v)
		}
	}
}

// fwdStats stores block b's Σ(x−K) and Σ(x−m_b)², m_b the block's mean, per channel.
func (j *bnhJob) fwdStats(b, nr int, x []float32, bb *bnhBlockBuf) {
	e, c, v := j.e, j.c, j.v
	acc, eMuB := bb.acc[:e], bb.acc[e:2*e]
	clear(acc)
	j.chunks(0, len(x), func(lo, hi, l int) { v.sumDev(acc[:l], j.eK[:l], x[lo:hi]) })
	s := j.part[2*c*b : 2*c*b+c]
	j.fold(s, acc)
	// The block's mean, rounded to float32, is the centre of its sum of squares.
	n := float64(nr)
	for ch := range c {
		eMuB[ch] = float32(float64(j.eK[ch]) + s[ch]/n)
	}
	j.expand(eMuB, eMuB[:c])
	clear(acc)
	j.chunks(0, len(x), func(lo, hi, l int) { v.sumSqDev(acc[:l], eMuB[:l], x[lo:hi]) })
	q := j.part[2*c*b+c : 2*c*(b+1)]
	j.fold(q, acc)
	// Σ(x−m_b)² = Σ(x−mu_b)² − n·(m_b−mu_b)², mu_b the float32 centre.
	for ch := range c {
		sd := (float64(j.eK[ch]) - float64(eMuB[ch])) + s[ch]/n
		q[ch] -= n * sd * sd
	}
}

func (j *bnhJob) affine(lo, hi int) {
	v := j.v
	j.chunks(lo, hi, func(lo, hi, l int) {
		switch {
		case !j.relu:
			v.affine(j.y[lo:hi], j.x[lo:hi], j.eMu[:l], j.eA[:l], j.eB[:l])
		case j.r != nil:
			v.affineRelu(j.y[lo:hi], j.x[lo:hi], j.r[lo:hi], j.eMu[:l], j.eA[:l], j.eB[:l])
		default:
			v.affineRelu(j.y[lo:hi], j.x[lo:hi], nil, j.eMu[:l], j.eA[:l], j.eB[:l])
		}
	})
}

// bwdStats stores block b's Σg and Σg·(x−mu) per channel.
func (j *bnhJob) bwdStats(b, lo, hi int, bb *bnhBlockBuf) {
	e, c, v := j.e, j.c, j.v
	s, t := bb.acc[:e], bb.acc[e:2*e]
	clear(s)
	clear(t)
	j.chunks(lo, hi, func(lo, hi, l int) {
		if j.relu {
			v.dyStatsRelu(s[:l], t[:l], j.eMu[:l], j.dy[lo:hi], j.ry[lo:hi], j.x[lo:hi])
		} else {
			v.dyStats(s[:l], t[:l], j.eMu[:l], j.dy[lo:hi], j.x[lo:hi])
		}
	})
	j.fold(j.part[2*c*b:2*c*b+c], s)
	j.fold(j.part[2*c*b+c:2*c*(b+1)], t)
}

func (j *bnhJob) bwdDx(lo, hi int) {
	v := j.v
	j.chunks(lo, hi, func(lo, hi, l int) {
		mu, a, b, c := j.eMu[:l], j.eA[:l], j.eB[:l], j.eC[:l]
		if j.relu {
			v.bnBwdRelu(j.dx[lo:hi], j.dy[lo:hi], j.ry[lo:hi], j.x[lo:hi], mu, a, b, c, j.accumulate)
		} else {
			v.bnBwd(j.dx[lo:hi], j.dy[lo:hi], j.x[lo:hi], mu, a, b, c, j.accumulate)
		}
	})
}

// The portable passes (bnNHWCOps): the assembly's arithmetic, each product and the
// addition after it rounded once (fma32), in the same order.

// fma32 returns a·b + c rounded once to float32, as a fused multiply-add
// instruction computes it. The product is exact in float64; the sum is rounded to
// float64 to odd (its rounding error from TwoSum decides whether the last bit is
// moved), which makes the rounding to float32 that follows correct (Boldo and
// Melquiond, "When double rounding is odd").
func fma32(a, b, c float32) float32 {
	p := float64(float64(a) * float64(b)) // exact; the conversion keeps it unfused
	z := float64(c)
	s := p + z
	bv := s - p
	e := (p - (s - bv)) + (z - bv) // p + z − s, exactly
	if e != 0 && !math.IsInf(s, 0) && !math.IsNaN(e) {
		if bits := math.Float64bits(s); bits&1 == 0 {
			// The exact sum lies between s and its neighbour on e's side: take the odd one.
			if (e > 0) == (s > 0) {
				bits++
			} else {
				bits--
			}
			s = math.Float64frombits(bits)
		}
	}
	return float32(s)
}

func bnhSumDevGeneric(acc, k, x []float32) {
	k = k[:len(acc)]
	for ; len(x) >= len(acc) && len(acc) > 0; x = x[len(acc):] {
		row := x[:len(acc)]
		for i, v := range row {
			acc[i] += v - k[i]
		}
	}
}

func bnhSumSqDevGeneric(acc, mu, x []float32) {
	mu = mu[:len(acc)]
	for ; len(x) >= len(acc) && len(acc) > 0; x = x[len(acc):] {
		row := x[:len(acc)]
		for i, v := range row {
			d := v - mu[i]
			acc[i] = fma32(d, d, acc[i])
		}
	}
}

func bnhDyStatsGeneric(s, t, mu, dy, x []float32) {
	e := len(s)
	t, mu = t[:e], mu[:e]
	for off := 0; off+e <= len(dy) && e > 0; off += e {
		g, xr := dy[off:off+e], x[off:off+e]
		for i, v := range g {
			s[i] += v
			t[i] = fma32(v, xr[i]-mu[i], t[i])
		}
	}
}

func bnhDyStatsReluGeneric(s, t, mu, dy, y, x []float32) {
	e := len(s)
	t, mu = t[:e], mu[:e]
	for off := 0; off+e <= len(dy) && e > 0; off += e {
		g, yr, xr := dy[off:off+e], y[off:off+e], x[off:off+e]
		for i, v := range g {
			v = reluMask(v, yr[i])
			s[i] += v
			t[i] = fma32(v, xr[i]-mu[i], t[i])
		}
	}
}

func bnhAffineGeneric(dst, x, mu, a, b []float32) {
	e := len(mu)
	a, b = a[:e], b[:e]
	for off := 0; off+e <= len(dst) && e > 0; off += e {
		d, xr := dst[off:off+e], x[off:off+e]
		for i, v := range xr {
			d[i] = fma32(v-mu[i], a[i], b[i])
		}
	}
}

func bnhAffineReluGeneric(dst, x, r, mu, a, b []float32) {
	e := len(mu)
	a, b = a[:e], b[:e]
	for off := 0; off+e <= len(dst) && e > 0; off += e {
		d, xr := dst[off:off+e], x[off:off+e]
		if r == nil {
			for i, v := range xr {
				d[i] = relu32(fma32(v-mu[i], a[i], b[i]))
			}
			continue
		}
		rr := r[off : off+e]
		for i, v := range xr {
			t := fma32(v-mu[i], a[i], b[i])
			d[i] = relu32(t + rr[i])
		}
	}
}

func bnhBwdGeneric(dst, dy, x, mu, a, b, c []float32, acc bool) {
	e := len(mu)
	a, b, c = a[:e], b[:e], c[:e]
	for off := 0; off+e <= len(dst) && e > 0; off += e {
		d, g, xr := dst[off:off+e], dy[off:off+e], x[off:off+e]
		if acc {
			for i, v := range g {
				d[i] += fma32(a[i], v, fma32(b[i], xr[i]-mu[i], c[i]))
			}
		} else {
			for i, v := range g {
				d[i] = fma32(a[i], v, fma32(b[i], xr[i]-mu[i], c[i]))
			}
		}
	}
}

func bnhBwdReluGeneric(dst, dy, y, x, mu, a, b, c []float32, acc bool) {
	e := len(mu)
	a, b, c = a[:e], b[:e], c[:e]
	for off := 0; off+e <= len(dst) && e > 0; off += e {
		d, g, yr, xr := dst[off:off+e], dy[off:off+e], y[off:off+e], x[off:off+e]
		if acc {
			for i, v := range g {
				v = reluMask(v, yr[i])
				d[i] += fma32(a[i], v, fma32(b[i], xr[i]-mu[i], c[i]))
			}
		} else {
			for i, v := range g {
				v = reluMask(v, yr[i])
				d[i] = fma32(a[i], v, fma32(b[i], xr[i]-mu[i], c[i]))
			}
		}
	}
}
