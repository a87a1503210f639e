package kernels

import (
	"fmt"
	"math"
	"sync"
)

// BatchNorm kernels. Activations are laid out as n blocks of c channel planes of
// plane elements each (NCHW with plane = H·W, or [N, C] with plane = 1). Work is
// split over channels; every channel's result depends only on its own data and is
// summed in a fixed order (large planes: each plane with the vector kernel's fixed
// order, planes accumulated in float64 in sample order; small planes: per element
// in float64 in sample order, then per channel in element order), so results do
// not depend on the goroutine count.
//
// The ReLU variants (BatchNormForwardTrainReLU, BatchNormApplyReLU,
// BatchNormBackwardReLU) fuse a following rectifier, and a residual sum before it, into
// the passes: the forward pass that writes y rectifies it, the backward passes mask dy
// with y > 0 as they read it. Every path (small planes, per-plane vecOps, the planes
// kernels) does the unfused kernels' arithmetic in their order, so the fused results
// are bit-identical to the composition's on every implementation.

// smallPlane is the plane size below which the per-plane vector kernels are
// not worth their call overhead; blocked portable loops are used instead.
const smallPlane = 16

func mustLen(fn, what string, got, want int) {
	if got != want {
		panic(fmt.Sprintf("kernels.%s: %s has %d elements, want %d", fn, what, got, want))
	}
}

// checkBNForward checks the slices of a training-mode forward BatchNorm call
// over elems activations of c channels (either layout); r may be nil.
func checkBNForward(fn string, y, x, r []float32, elems, c int, perChannel ...[]float32) {
	mustLen(fn, "x", len(x), elems)
	mustLen(fn, "y", len(y), elems)
	if r != nil {
		mustLen(fn, "r", len(r), elems)
	}
	for _, s := range perChannel {
		mustLen(fn, "per-channel slice", len(s), c)
	}
}

// checkBNApply checks the slices of an evaluation-mode BatchNorm call.
func checkBNApply(fn string, y, x, r []float32, elems, c int, mean, scale, shift []float32) {
	checkBNForward(fn, y, x, r, elems, c)
	mustLen(fn, "mean", len(mean), c)
	mustLen(fn, "scale", len(scale), c)
	mustLen(fn, "shift", len(shift), c)
}

// checkBNBackward checks the slices of a backward BatchNorm call; dx, dgamma
// and dbeta may be nil.
func checkBNBackward(fn string, dx, dy, x []float32, elems, c int, mean, invstd, gamma, dgamma, dbeta []float32) {
	mustLen(fn, "x", len(x), elems)
	mustLen(fn, "dy", len(dy), elems)
	if dx != nil {
		mustLen(fn, "dx", len(dx), elems)
	}
	for _, s := range [][]float32{mean, invstd, gamma} {
		mustLen(fn, "per-channel slice", len(s), c)
	}
	if dgamma != nil {
		mustLen(fn, "dgamma", len(dgamma), c)
	}
	if dbeta != nil {
		mustLen(fn, "dbeta", len(dbeta), c)
	}
}

// BatchNormForwardTrain normalises x with per-channel batch statistics:
//
//	mean[ch] = Σx/M, variance[ch] = Σ(x−mean)²/M (biased), invstd[ch] = 1/sqrt(variance+eps)
//	y = (x−mean)·(invstd·gamma[ch]) + beta[ch]
//
// where M = n·plane. Statistics are computed in two passes per channel (the sum of
// x−K, K the channel's first value, so that an offset the channel shares costs no
// precision; then the centred sum of squares), each plane (on AVX2, each group of planes
// up to bnGroupElems elements) reduced in float32 and those sums combined in float64: the mean is the exact one rounded to float32, as PyTorch's; a channel (n planes) is processed by one goroutine so its data stays
// in cache across the passes. y and x have n·c·plane elements; gamma, beta, mean,
// variance and invstd have c. y may alias x.
func BatchNormForwardTrain(y, x []float32, n, c, plane int, gamma, beta []float32, eps float64, mean, variance, invstd []float32) {
	batchNormForwardTrain("BatchNormForwardTrain", y, x, nil, false, n, c, plane, gamma, beta, eps, mean, variance, invstd)
}

// BatchNormForwardTrainReLU is BatchNormForwardTrain with the rectifier in the pass
// that writes y: y = max(bn(x) + r, 0), or max(bn(x), 0) when r is nil, where bn(x) is
// BatchNormForwardTrain's y. The result is bit-identical to BatchNormForwardTrain,
// then Add(y, y, r) and ReluForward(y, y); no pre-rectifier tensor is stored. r (when
// non-nil) has n·c·plane elements; y may alias x, not r.
func BatchNormForwardTrainReLU(y, x, r []float32, n, c, plane int, gamma, beta []float32, eps float64, mean, variance, invstd []float32) {
	batchNormForwardTrain("BatchNormForwardTrainReLU", y, x, r, true, n, c, plane, gamma, beta, eps, mean, variance, invstd)
}

func batchNormForwardTrain(fn string, y, x, r []float32, relu bool, n, c, plane int, gamma, beta []float32, eps float64, mean, variance, invstd []float32) {
	if n <= 0 || c < 0 || plane <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape n=%d c=%d plane=%d", fn, n, c, plane))
	}
	checkBNForward(fn, y, x, r, n*c*plane, c, gamma, beta, mean, variance, invstd)
	j := bnJob{v: impl.vec, n: n, plane: plane, stride: c * plane, x: x, y: y,
		gamma: gamma, beta: beta, eps: eps, mean: mean, variance: variance, invstd: invstd,
		relu: relu, res: r}
	if cost := 4 * n * plane; runsSerial(c, cost) {
		j.forwardTrain(0, c)
	} else {
		t := newTask(jobBNForwardTrain)
		t.bn = j
		runTask(t, c)
	}
}

// bnJob holds the arguments of one BatchNorm kernel call; its methods process the
// channel range [lo, hi).
type bnJob struct {
	v                      *vecOps
	n, plane, stride       int
	x, y, dx, dy           []float32
	gamma, beta            []float32
	eps                    float64
	mean, variance, invstd []float32
	scale, shift           []float32
	dgamma, dbeta          []float32
	training, accumulate   bool
	// The fused ReLU kernels: relu rectifies the output after adding res (nil: no
	// residual) in the forward passes, and masks dy with ry > 0 (the rectifier's
	// output) in the backward ones.
	relu    bool
	res, ry []float32
}

// bnPlanesOps are BatchNorm's per-plane passes over n planes of plane elements
// (a multiple of 8), stride apart, in one call; every slice starts at the first
// plane and holds (n−1)·stride + plane elements.
type bnPlanesOps struct {
	sumDev   func(x []float32, n, plane, stride int, k float32) float32             // Σ(x−k)
	sumSqDev func(x []float32, n, plane, stride int, mu float32) float32            // Σ(x−mu)²
	dyStats  func(dy, x []float32, n, plane, stride int, mu float32) (s, t float32) // Σdy, Σdy·(x−mu)
	affine   func(dst, x []float32, n, plane, stride int, mu, a, b float32)
	bnBwd    func(dst, dy, x []float32, n, plane, stride int, mu, a, b, c float32, acc bool)

	// The fused ReLU passes (vecOps.affineRelu, dyStatsRelu, bnBwdRelu over planes).
	affineRelu  func(dst, x, r []float32, n, plane, stride int, mu, a, b float32)
	dyStatsRelu func(dy, y, x []float32, n, plane, stride int, mu float32) (s, t float32)
	bnBwdRelu   func(dst, dy, y, x []float32, n, plane, stride int, mu, a, b, c float32, acc bool)
}

// bnGroupElems bounds the elements one bnPlanesOps reduction sums in float32
// lanes; the groups' sums are added in float64, as the planes' are otherwise.
const bnGroupElems = 4096

// planeGroups calls f(i0, k) for the groups of k ≤ bnGroupElems/plane planes that
// cover n planes, in order.
func planeGroups(n, plane int, f func(i0, k int)) {
	g := max(1, bnGroupElems/plane)
	for i0 := 0; i0 < n; i0 += g {
		f(i0, min(g, n-i0))
	}
}

// planesLen is the length of a bnPlanesOps slice for n planes.
func planesLen(n, plane, stride int) int { return (n-1)*stride + plane }

func (j *bnJob) forwardTrain(lo, hi int) {
	if j.plane < smallPlane {
		j.forwardTrainSmall(lo, hi)
		return
	}
	if pl := j.v.bnPlanes; pl != nil && j.plane%8 == 0 {
		j.forwardTrainPlanes(pl, lo, hi)
		return
	}
	// One channel at a time: its n planes stay in cache across the three passes.
	n, plane, stride, x, v := j.n, j.plane, j.stride, j.x, j.v
	m := float64(n * plane)
	for ch := lo; ch < hi; ch++ {
		// The mean from Σ(x−K), K the channel's first value: the subtraction comes before
		// the float32 sum, so an offset shared by the channel (inputs near 1000, say) costs
		// no precision; Σx itself in float32 lanes would lose the low bits of every value.
		shift := x[ch*plane]
		var s, ss float64
		for i, off := 0, ch*plane; i < n; i, off = i+1, off+stride {
			s += sumDev(v, x[off:off+plane], shift)
		}
		mean := float64(shift) + s/m
		mu := float32(mean)
		for i, off := 0, ch*plane; i < n; i, off = i+1, off+stride {
			ss += float64(v.sumSqDev(x[off:off+plane], mu))
		}
		is := j.setStats(ch, mean, ss, mu)
		scale := is * j.gamma[ch]
		for i, off := 0, ch*plane; i < n; i, off = i+1, off+stride {
			j.affinePlane(off, mu, scale, j.beta[ch])
		}
	}
}

// affinePlane writes the plane at off of y: (x−mu)·a + b, rectified (after adding res)
// when j.relu.
func (j *bnJob) affinePlane(off int, mu, a, b float32) {
	v, end := j.v, off+j.plane
	dst, x := j.y[off:end], j.x[off:end]
	if !j.relu {
		v.affine(dst, x, mu, a, b)
		return
	}
	var r []float32
	if j.res != nil {
		r = j.res[off:end]
	}
	v.affineRelu(dst, x, r, mu, a, b)
}

// forwardTrainPlanes is forwardTrain with each pass over a channel's planes in a
// few bnPlanesOps calls.
func (j *bnJob) forwardTrainPlanes(pl *bnPlanesOps, lo, hi int) {
	n, plane, stride, x := j.n, j.plane, j.stride, j.x
	m := float64(n * plane)
	for ch := lo; ch < hi; ch++ {
		base := ch * plane
		shift := x[base]
		var s, ss float64
		planeGroups(n, plane, func(i0, k int) {
			off := base + i0*stride
			s += float64(pl.sumDev(x[off:off+planesLen(k, plane, stride)], k, plane, stride, shift))
		})
		mean := float64(shift) + s/m
		mu := float32(mean)
		planeGroups(n, plane, func(i0, k int) {
			off := base + i0*stride
			ss += float64(pl.sumSqDev(x[off:off+planesLen(k, plane, stride)], k, plane, stride, mu))
		})
		is := j.setStats(ch, mean, ss, mu)
		l := planesLen(n, plane, stride)
		switch {
		case !j.relu:
			pl.affine(j.y[base:base+l], x[base:base+l], n, plane, stride, mu, is*j.gamma[ch], j.beta[ch])
		case j.res != nil:
			pl.affineRelu(j.y[base:base+l], x[base:base+l], j.res[base:base+l], n, plane, stride, mu, is*j.gamma[ch], j.beta[ch])
		default:
			pl.affineRelu(j.y[base:base+l], x[base:base+l], nil, n, plane, stride, mu, is*j.gamma[ch], j.beta[ch])
		}
	}
}

// bnOnes is a read-only run of ones: dyStats(bnOnes[:l], x, k) is Σ(x−k), subtracted
// before it is summed, in the vector kernel's fixed order.
var bnOnes = func() []float32 {
	o := make([]float32, 1024)
	for i := range o {
		o[i] = 1
	}
	return o
}()

// sumDev returns Σ(x−k), each chunk of len(bnOnes) summed by the vector kernel in float32
// (a fixed order that depends only on len(x)) and the chunks added in float64.
func sumDev(v *vecOps, x []float32, k float32) float64 {
	var s float64
	for len(x) > 0 {
		l := min(len(x), len(bnOnes))
		_, d := v.dyStats(bnOnes[:l], x[:l], k)
		s += float64(d)
		x = x[l:]
	}
	return s
}

// setStats stores channel ch's statistics from its mean (float64) and Σ(x−mu)² = ss,
// where mu is the float32 mean that was subtracted, and returns invstd.
func (j *bnJob) setStats(ch int, mean, ss float64, mu float32) float32 {
	m := float64(j.n * j.plane)
	// Σ(x−mu32)² = Σ(x−mean)² + M·(mean−mu32)²: remove the rounding of the shift.
	sd := mean - float64(mu)
	vr := max(ss/m-sd*sd, 0)
	is := float32(1 / math.Sqrt(vr+j.eps))
	j.mean[ch], j.variance[ch], j.invstd[ch] = mu, float32(vr), is
	return is
}

// Small planes (fewer than smallPlane elements) are processed in blocks of
// bnSmallElems/plane channels walked sample by sample, in memory order (one small
// channel at a time would stride through memory and thrash the L1 sets, and a call
// per plane would cost more than the plane). Per-channel values are expanded to
// per-element arrays so every pass is a flat loop, and sums are accumulated per
// element in float64 across samples, then per channel in element order.
const bnSmallElems = 512

func (j *bnJob) forwardTrainSmall(lo, hi int) {
	n, plane, stride, x := j.n, j.plane, j.stride, j.x
	m := float64(n * plane)
	var acc [bnSmallElems]float64
	var eMu, eScale, eBeta [bnSmallElems]float32
	var sums [bnSmallElems]float64
	cb := bnSmallElems / plane
	for c0 := lo; c0 < hi; c0 += cb {
		c1 := min(c0+cb, hi)
		l := (c1 - c0) * plane
		a := acc[:l]
		clear(a)
		for i := 0; i < n; i++ {
			for q, e := range x[i*stride+c0*plane:][:l] {
				a[q] += float64(e)
			}
		}
		for k := range c1 - c0 {
			var t float64
			for _, e := range a[k*plane : (k+1)*plane] {
				t += e
			}
			sums[k] = t
			mu := float32(t / m)
			for q := k * plane; q < (k+1)*plane; q++ {
				eMu[q] = mu
			}
		}
		clear(a)
		mu := eMu[:l]
		for i := 0; i < n; i++ {
			for q, e := range x[i*stride+c0*plane:][:l] {
				d := e - mu[q]
				a[q] += float64(d * d)
			}
		}
		for k := range c1 - c0 {
			ch := c0 + k
			var ss float64
			for _, e := range a[k*plane : (k+1)*plane] {
				ss += e
			}
			scale := j.setStats(ch, sums[k]/m, ss, eMu[k*plane]) * j.gamma[ch]
			for q := k * plane; q < (k+1)*plane; q++ {
				eScale[q], eBeta[q] = scale, j.beta[ch]
			}
		}
		j.affineSmall(c0, l, mu, eScale[:l], eBeta[:l])
	}
}

// affineSmall writes the block of l elements from channel c0 of every sample of y:
// (x−mu)·sc + sh elementwise, rectified (after adding res) when j.relu. The rectifier
// runs as the vector add and reluFwd passes over each block row (at most
// bnSmallElems elements, still in L1): the composition's arithmetic, without a
// branch per element.
func (j *bnJob) affineSmall(c0, l int, mu, sc, sh []float32) {
	n, plane, stride, x, y := j.n, j.plane, j.stride, j.x, j.y
	for i := 0; i < n; i++ {
		off := i*stride + c0*plane
		yr := y[off : off+l]
		for q, e := range x[off : off+l] {
			yr[q] = (e-mu[q])*sc[q] + sh[q]
		}
		if j.relu {
			if j.res != nil {
				j.v.add(yr, yr, j.res[off:off+l])
			}
			j.v.reluFwd(yr, yr)
		}
	}
}

// relu32 is max(v, 0) with reluFwdGeneric's semantics (NaN and −0 give +0),
// without a branch (see positiveMask).
func relu32(v float32) float32 {
	b := math.Float32bits(v)
	return math.Float32frombits(b & positiveMask(b))
}

// positiveMask returns all ones when the float32 with bits b is > 0 (+Inf included,
// NaN excluded) and 0 otherwise, without a branch: those are the bit patterns 1 …
// 0x7f800000, and b−1 < 0x7f800000 (unsigned) makes the 64-bit difference below
// wrap. The small-plane loops and the portable kernels rectify and mask with it: a
// branch on the sign of each activation would be mispredicted half the time.
func positiveMask(b uint32) uint32 {
	return uint32((uint64(b-1) - 0x7f800000) >> 32)
}

// BatchNormApply computes y = (x−mean[ch])·scale[ch] + shift[ch] for every channel
// (evaluation mode: scale = gamma/sqrt(running_var+eps), shift = beta). y may alias x.
func BatchNormApply(y, x []float32, n, c, plane int, mean, scale, shift []float32) {
	batchNormApply("BatchNormApply", y, x, nil, false, n, c, plane, mean, scale, shift)
}

// BatchNormApplyReLU is BatchNormApply with the rectifier in the same pass:
// y = max(apply(x) + r, 0), or max(apply(x), 0) when r is nil, bit-identical to
// BatchNormApply, then Add(y, y, r) and ReluForward(y, y). r (when non-nil) has
// n·c·plane elements; y may alias x, not r.
func BatchNormApplyReLU(y, x, r []float32, n, c, plane int, mean, scale, shift []float32) {
	batchNormApply("BatchNormApplyReLU", y, x, r, true, n, c, plane, mean, scale, shift)
}

func batchNormApply(fn string, y, x, r []float32, relu bool, n, c, plane int, mean, scale, shift []float32) {
	if n < 0 || c < 0 || plane < 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape n=%d c=%d plane=%d", fn, n, c, plane))
	}
	checkBNApply(fn, y, x, r, n*c*plane, c, mean, scale, shift)
	if c == 0 || plane == 0 {
		return
	}
	j := bnJob{v: impl.vec, n: n, plane: plane, stride: c * plane, x: x, y: y,
		mean: mean, scale: scale, shift: shift, relu: relu, res: r}
	if cost := 2 * n * plane; runsSerial(c, cost) {
		j.apply(0, c)
	} else {
		t := newTask(jobBNApply)
		t.bn = j
		runTask(t, c)
	}
}

func (j *bnJob) apply(lo, hi int) {
	n, plane, stride := j.n, j.plane, j.stride
	if plane >= smallPlane {
		for ch := lo; ch < hi; ch++ {
			for i, off := 0, ch*plane; i < n; i, off = i+1, off+stride {
				j.affinePlane(off, j.mean[ch], j.scale[ch], j.shift[ch])
			}
		}
		return
	}
	var eMu, eScale, eShift [bnSmallElems]float32
	cb := bnSmallElems / plane
	for c0 := lo; c0 < hi; c0 += cb {
		c1 := min(c0+cb, hi)
		l := (c1 - c0) * plane
		for k := range c1 - c0 {
			for q := k * plane; q < (k+1)*plane; q++ {
				eMu[q], eScale[q], eShift[q] = j.mean[c0+k], j.scale[c0+k], j.shift[c0+k]
			}
		}
		j.affineSmall(c0, l, eMu[:l], eScale[:l], eShift[:l])
	}
}

// BatchNormBackward is the backward pass of y = (x−mean)·invstd·gamma + beta.
// Per channel it computes Σdy and Σdy·x̂ with x̂ = (x−mean)·invstd and adds them to
// dbeta[ch] and dgamma[ch] (either slice may be nil). When dx is non-nil it also
// computes the input gradient:
//
//	batch statistics (training): dx = gamma·invstd·(dy − Σdy/M − x̂·Σdy·x̂/M)
//	fixed statistics (eval):     dx = gamma·invstd·dy
//
// overwriting dx, or adding to it when accumulate is true. mean and invstd are the
// statistics the forward pass used.
func BatchNormBackward(dx, dy, x []float32, n, c, plane int, mean, invstd, gamma []float32, training, accumulate bool, dgamma, dbeta []float32) {
	batchNormBackward("BatchNormBackward", dx, dy, nil, x, n, c, plane, mean, invstd, gamma, training, accumulate, dgamma, dbeta)
}

// BatchNormBackwardReLU is the backward pass of the fused y = max(bn(x) [+ r], 0)
// (BatchNormForwardTrainReLU, BatchNormApplyReLU) given its output y: BatchNormBackward
// of g = dy where y > 0 and 0 elsewhere, the mask applied as each pass reads dy (no
// masked copy of dy is stored). The results are bit-identical to ReluBackwardSet(g, y,
// dy) followed by BatchNormBackward(dx, g, x, …). r's gradient is g (see
// ReluBackwardSet, ReluBackwardAxpy).
func BatchNormBackwardReLU(dx, dy, y, x []float32, n, c, plane int, mean, invstd, gamma []float32, training, accumulate bool, dgamma, dbeta []float32) {
	const fn = "BatchNormBackwardReLU"
	mustLen(fn, "y", len(y), len(dy))
	batchNormBackward(fn, dx, dy, y, x, n, c, plane, mean, invstd, gamma, training, accumulate, dgamma, dbeta)
}

// batchNormBackward masks dy with ry > 0 when ry is non-nil.
func batchNormBackward(fn string, dx, dy, ry, x []float32, n, c, plane int, mean, invstd, gamma []float32, training, accumulate bool, dgamma, dbeta []float32) {
	if n < 0 || c < 0 || plane < 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape n=%d c=%d plane=%d", fn, n, c, plane))
	}
	checkBNBackward(fn, dx, dy, x, n*c*plane, c, mean, invstd, gamma, dgamma, dbeta)
	j := bnJob{v: impl.vec, n: n, plane: plane, stride: c * plane, x: x, dx: dx, dy: dy,
		mean: mean, invstd: invstd, gamma: gamma, dgamma: dgamma, dbeta: dbeta,
		training: training, accumulate: accumulate, relu: ry != nil, ry: ry}
	if cost := 6 * n * plane; runsSerial(c, cost) {
		j.backward(0, c)
	} else {
		t := newTask(jobBNBackward)
		t.bn = j
		runTask(t, c)
	}
}

// coeffs turns channel ch's Σdy and Σdy·(x−mean) into the parameter gradients
// (added to dgamma, dbeta) and the coefficients of dx = a·dy + b·(x−mean) + c.
func (j *bnJob) coeffs(ch int, sdy, sdyc float64) (a, b, c float32) {
	m := float64(j.n * j.plane)
	is := float64(j.invstd[ch])
	sdyx := sdyc * is // Σdy·x̂
	if j.dgamma != nil {
		j.dgamma[ch] += float32(sdyx)
	}
	if j.dbeta != nil {
		j.dbeta[ch] += float32(sdy)
	}
	gi := float64(j.gamma[ch]) * is
	if !j.training {
		return float32(gi), 0, 0
	}
	// dx = gi·dy − gi·is·(Σdy·x̂/M)·(x−mean) − gi·Σdy/M
	return float32(gi), float32(-gi * is * sdyx / m), float32(-gi * sdy / m)
}

func (j *bnJob) backward(lo, hi int) {
	if j.plane < smallPlane {
		j.backwardSmall(lo, hi)
		return
	}
	if pl := j.v.bnPlanes; pl != nil && j.plane%8 == 0 {
		j.backwardPlanes(pl, lo, hi)
		return
	}
	n, plane, stride, x, dx, dy, v := j.n, j.plane, j.stride, j.x, j.dx, j.dy, j.v
	needStats := j.dgamma != nil || j.dbeta != nil || (dx != nil && j.training)
	for ch := lo; ch < hi; ch++ {
		mu := j.mean[ch]
		var sdy, sdyc float64 // Σdy, Σdy·(x−mu)
		if needStats {
			for i, off := 0, ch*plane; i < n; i, off = i+1, off+stride {
				var a, b float32
				if end := off + plane; j.relu {
					a, b = v.dyStatsRelu(dy[off:end], j.ry[off:end], x[off:end], mu)
				} else {
					a, b = v.dyStats(dy[off:end], x[off:end], mu)
				}
				sdy += float64(a)
				sdyc += float64(b)
			}
		}
		a, b, c := j.coeffs(ch, sdy, sdyc)
		if dx == nil {
			continue
		}
		for i, off := 0, ch*plane; i < n; i, off = i+1, off+stride {
			if end := off + plane; j.relu {
				v.bnBwdRelu(dx[off:end], dy[off:end], j.ry[off:end], x[off:end], mu, a, b, c, j.accumulate)
			} else {
				v.bnBwd(dx[off:end], dy[off:end], x[off:end], mu, a, b, c, j.accumulate)
			}
		}
	}
}

// backwardPlanes is backward with each pass over a channel's planes in a few
// bnPlanesOps calls.
func (j *bnJob) backwardPlanes(pl *bnPlanesOps, lo, hi int) {
	n, plane, stride, x, dx, dy := j.n, j.plane, j.stride, j.x, j.dx, j.dy
	needStats := j.dgamma != nil || j.dbeta != nil || (dx != nil && j.training)
	l := planesLen(n, plane, stride)
	for ch := lo; ch < hi; ch++ {
		base := ch * plane
		mu := j.mean[ch]
		var sdy, sdyc float64 // Σdy, Σdy·(x−mu)
		if needStats {
			planeGroups(n, plane, func(i0, k int) {
				off, lk := base+i0*stride, planesLen(k, plane, stride)
				var a, b float32
				if j.relu {
					a, b = pl.dyStatsRelu(dy[off:off+lk], j.ry[off:off+lk], x[off:off+lk], k, plane, stride, mu)
				} else {
					a, b = pl.dyStats(dy[off:off+lk], x[off:off+lk], k, plane, stride, mu)
				}
				sdy += float64(a)
				sdyc += float64(b)
			})
		}
		a, b, c := j.coeffs(ch, sdy, sdyc)
		switch {
		case dx == nil:
		case j.relu:
			pl.bnBwdRelu(dx[base:base+l], dy[base:base+l], j.ry[base:base+l], x[base:base+l], n, plane, stride, mu, a, b, c, j.accumulate)
		default:
			pl.bnBwd(dx[base:base+l], dy[base:base+l], x[base:base+l], n, plane, stride, mu, a, b, c, j.accumulate)
		}
	}
}

func (j *bnJob) backwardSmall(lo, hi int) {
	n, plane, stride, x, dx, dy := j.n, j.plane, j.stride, j.x, j.dx, j.dy
	needStats := j.dgamma != nil || j.dbeta != nil || (dx != nil && j.training)
	var accG, accH [bnSmallElems]float64
	var eMu, eA, eB, eC [bnSmallElems]float32
	var masked []float32 // a block row of dy masked by the rectifier (j.relu)
	if j.relu {
		sp := bnScratchBuf(bnSmallElems)
		defer bnScratch.Put(sp)
		masked = *sp
	}
	cb := bnSmallElems / plane
	for c0 := lo; c0 < hi; c0 += cb {
		c1 := min(c0+cb, hi)
		l := (c1 - c0) * plane
		for k := range c1 - c0 {
			for q := k * plane; q < (k+1)*plane; q++ {
				eMu[q] = j.mean[c0+k]
			}
		}
		mu := eMu[:l]
		g, h := accG[:l], accH[:l]
		clear(g)
		clear(h)
		if needStats {
			for i := 0; i < n; i++ {
				off := i*stride + c0*plane
				xr, gr := x[off:off+l], dy[off:off+l]
				if j.relu {
					gr = masked[:l]
					j.v.reluBwdSet(gr, j.ry[off:off+l], dy[off:off+l])
				}
				for q, e := range gr {
					g[q] += float64(e)
					h[q] += float64(e * (xr[q] - mu[q]))
				}
			}
		}
		for k := range c1 - c0 {
			var sdy, sdyc float64
			for q := k * plane; q < (k+1)*plane; q++ {
				sdy += g[q]
				sdyc += h[q]
			}
			a, b, c := j.coeffs(c0+k, sdy, sdyc)
			for q := k * plane; q < (k+1)*plane; q++ {
				eA[q], eB[q], eC[q] = a, b, c
			}
		}
		if dx == nil {
			continue
		}
		ea, eb, ec := eA[:l], eB[:l], eC[:l]
		for i := 0; i < n; i++ {
			off := i*stride + c0*plane
			xr, gr := x[off:off+l], dy[off:off+l]
			dr := dx[off : off+l]
			if j.relu {
				gr = masked[:l]
				j.v.reluBwdSet(gr, j.ry[off:off+l], dy[off:off+l])
			}
			if j.accumulate {
				for q, e := range gr {
					dr[q] += ea[q]*e + (eb[q]*(xr[q]-mu[q]) + ec[q])
				}
			} else {
				for q, e := range gr {
					dr[q] = ea[q]*e + (eb[q]*(xr[q]-mu[q]) + ec[q])
				}
			}
		}
	}
}

// bnScratch holds the buffers the fused ReLU backward passes mask dy into (a block
// row of small planes), pooled so that the
// kernels allocate nothing in the steady state.
var bnScratch = sync.Pool{New: func() any { return new([]float32) }}

// bnScratchBuf returns a pooled buffer of n elements (contents undefined); the caller
// puts it back into bnScratch.
func bnScratchBuf(n int) *[]float32 {
	p := bnScratch.Get().(*[]float32)
	if cap(*p) < n {
		*p = make([]float32, n)
	}
	*p = (*p)[:n]
	return p
}

// reluMask is the rectifier's gradient g where its output y > 0, else +0, as
// reluBwdSetGeneric writes it (without a branch).
func reluMask(g, y float32) float32 {
	return math.Float32frombits(math.Float32bits(g) & positiveMask(math.Float32bits(y)))
}

// Portable per-plane primitives. Reductions use 8 interleaved float32 partial sums
// combined pairwise (a fixed order that depends only on the length).

func sumSqDevGeneric(x []float32, mu float32) float32 {
	var s [8]float32
	i := 0
	for ; i+8 <= len(x); i += 8 {
		v := x[i : i+8 : i+8]
		d0, d1, d2, d3 := v[0]-mu, v[1]-mu, v[2]-mu, v[3]-mu
		d4, d5, d6, d7 := v[4]-mu, v[5]-mu, v[6]-mu, v[7]-mu
		s[0] += d0 * d0
		s[1] += d1 * d1
		s[2] += d2 * d2
		s[3] += d3 * d3
		s[4] += d4 * d4
		s[5] += d5 * d5
		s[6] += d6 * d6
		s[7] += d7 * d7
	}
	for ; i < len(x); i++ {
		d := x[i] - mu
		s[i&7] += d * d
	}
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

func dyStatsGeneric(dy, x []float32, mu float32) (float32, float32) {
	x = x[:len(dy)]
	var s, t [4]float32
	i := 0
	for ; i+4 <= len(dy); i += 4 {
		g := dy[i : i+4 : i+4]
		v := x[i : i+4 : i+4]
		s[0] += g[0]
		s[1] += g[1]
		s[2] += g[2]
		s[3] += g[3]
		t[0] += g[0] * (v[0] - mu)
		t[1] += g[1] * (v[1] - mu)
		t[2] += g[2] * (v[2] - mu)
		t[3] += g[3] * (v[3] - mu)
	}
	for ; i < len(dy); i++ {
		s[i&3] += dy[i]
		t[i&3] += dy[i] * (x[i] - mu)
	}
	return (s[0] + s[2]) + (s[1] + s[3]), (t[0] + t[2]) + (t[1] + t[3])
}

func affineGeneric(dst, x []float32, mu, a, b float32) {
	x = x[:len(dst)]
	for i, v := range x {
		dst[i] = (v-mu)*a + b
	}
}

func bnBwdGeneric(dst, dy, x []float32, mu, a, b, c float32, acc bool) {
	dy = dy[:len(dst)]
	x = x[:len(dst)]
	if acc {
		for i := range dst {
			dst[i] += a*dy[i] + (b*(x[i]-mu) + c)
		}
		return
	}
	for i := range dst {
		dst[i] = a*dy[i] + (b*(x[i]-mu) + c)
	}
}

// The portable fused ReLU primitives: the arithmetic of affineGeneric (then add and
// the rectifier), dyStatsGeneric and bnBwdGeneric on the masked gradient, in the same
// order, so their results are bit-identical to the unfused passes'.

func affineReluGeneric(dst, x, r []float32, mu, a, b float32) {
	x = x[:len(dst)]
	if r == nil {
		for i, v := range x {
			t := (v-mu)*a + b
			dst[i] = relu32(t)
		}
		return
	}
	r = r[:len(dst)]
	for i, v := range x {
		t := (v-mu)*a + b
		dst[i] = relu32(t + r[i])
	}
}

func dyStatsReluGeneric(dy, y, x []float32, mu float32) (float32, float32) {
	y = y[:len(dy)]
	x = x[:len(dy)]
	var s, t [4]float32
	i := 0
	for ; i+4 <= len(dy); i += 4 {
		m := y[i : i+4 : i+4]
		v := x[i : i+4 : i+4]
		g0, g1 := reluMask(dy[i], m[0]), reluMask(dy[i+1], m[1])
		g2, g3 := reluMask(dy[i+2], m[2]), reluMask(dy[i+3], m[3])
		s[0] += g0
		s[1] += g1
		s[2] += g2
		s[3] += g3
		t[0] += g0 * (v[0] - mu)
		t[1] += g1 * (v[1] - mu)
		t[2] += g2 * (v[2] - mu)
		t[3] += g3 * (v[3] - mu)
	}
	for ; i < len(dy); i++ {
		g := reluMask(dy[i], y[i])
		s[i&3] += g
		t[i&3] += g * (x[i] - mu)
	}
	return (s[0] + s[2]) + (s[1] + s[3]), (t[0] + t[2]) + (t[1] + t[3])
}

func bnBwdReluGeneric(dst, dy, y, x []float32, mu, a, b, c float32, acc bool) {
	dy = dy[:len(dst)]
	y = y[:len(dst)]
	x = x[:len(dst)]
	if acc {
		for i := range dst {
			dst[i] += a*reluMask(dy[i], y[i]) + (b*(x[i]-mu) + c)
		}
		return
	}
	for i := range dst {
		dst[i] = a*reluMask(dy[i], y[i]) + (b*(x[i]-mu) + c)
	}
}
