package kernels

import (
	"fmt"
	"math"
)

// Pooling over channels-last (NHWC) images. The semantics per channel are those
// of the NCHW kernels in pooling.go (window, padding, NaN rule and tie-breaking of
// the max and its argmax, the average's divisor, the summation order): on
// transposed data the results are bit for bit the same. Here PoolGeom.Planes is
// the number of images N, and every window tap is a contiguous run of c channels,
// so the inner loops run over channels.

func (g PoolGeom) checkNHWC(fn string, c, xLen, yLen int) {
	if c <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid channel count %d", fn, c))
	}
	g.checkGeom(fn)
	mustLen(fn, "input", xLen, g.Planes*g.H*g.W*c)
	mustLen(fn, "output", yLen, g.Planes*g.OutH()*g.OutW()*c)
}

// MaxPool2dForwardNHWC is MaxPool2dForward over channels-last images: x is
// [g.Planes, H, W, c] (g.Planes counts images, not image·channel planes) and y
// is [g.Planes, OH, OW, c]. arg[(n·OH·OW + p)·c + ch] is the in-image pixel index
// (row·W + col) of the element chosen for channel ch of output pixel p of image n.
// Padding, NaN and tie rules are MaxPool2dForward's. Parallel over output rows.
func MaxPool2dForwardNHWC(g PoolGeom, c int, y []float32, arg []int32, x []float32) {
	g.checkNHWC("MaxPool2dForwardNHWC", c, len(x), len(y))
	mustLen("MaxPool2dForwardNHWC", "arg", len(arg), len(y))
	j := poolJob{g: g, c: c, oh: g.OutH(), ow: g.OutW(), v: impl.vec, x: x, y: y, arg: arg}
	n := g.Planes * j.oh
	runPoolJob(jobMaxForwardNHWC, j, n, j.ow*g.K*g.K*c)
}

// maxForwardNHWC pools output rows [lo, hi) of all images (row u is image u/OH,
// output row u%OH).
func (j *poolJob) maxForwardNHWC(lo, hi int) {
	g, c := j.g, j.c
	h, w, oh, ow := g.H, g.W, j.oh, j.ow
	for u := lo; u < hi; u++ {
		n, i := u/oh, u%oh
		img := j.x[n*h*w*c : (n+1)*h*w*c]
		dst := j.y[u*ow*c : (u+1)*ow*c]
		ai := j.arg[u*ow*c : (u+1)*ow*c]
		// The window clipped to the image: its taps in row-major order are the
		// NCHW kernel's valid ones (never none, as 2·Pad ≤ K).
		r0, r1 := max(i*g.Stride-g.Pad, 0), min(i*g.Stride-g.Pad+g.K, h)
		for q := 0; q < ow; q++ {
			s0, s1 := max(q*g.Stride-g.Pad, 0), min(q*g.Stride-g.Pad+g.K, w)
			o := r0*w + s0
			j.v.maxPoolWindow(dst[q*c:(q+1)*c], ai[q*c:(q+1)*c], img[o*c:], r1-r0, s1-s0, w*c, c, int32(o), int32(w))
		}
	}
}

// maxPoolWindowGeneric pools the c = len(y) channels of a rows×cols window: tap
// (r, s) is x[r·rs + s·cc:][:c] with pixel index base + r·w + s, visited in
// row-major order. A full 2×2 window goes in one pass over the channels, others
// one tap at a time.
func maxPoolWindowGeneric(y []float32, arg []int32, x []float32, rows, cols, rs, cc int, base, w int32) {
	c := len(y)
	arg = arg[:c]
	if rows == 2 && cols == 2 {
		a, b := x[:c], x[cc:][:c]
		e, f := x[rs:][:c], x[rs+cc:][:c]
		for ch := range y {
			best, bi := math.Float32bits(a[ch]), base
			best, bi = maxSel(best, bi, b[ch], base+1)
			best, bi = maxSel(best, bi, e[ch], base+w)
			best, bi = maxSel(best, bi, f[ch], base+w+1)
			y[ch] = math.Float32frombits(best)
			arg[ch] = bi
		}
		return
	}
	copy(y, x[:c])
	for ch := range arg {
		arg[ch] = base
	}
	for r := range rows {
		for s := range cols {
			if r > 0 || s > 0 {
				maxTapNHWCGeneric(y, arg, x[r*rs+s*cc:][:c], base+int32(r)*w+int32(s))
			}
		}
	}
}

// maxSel returns (v, vi) when v > best or v is NaN, else (best, bi); best is held
// as its bits so that the select compiles to conditional moves.
func maxSel(best uint32, bi int32, v float32, vi int32) (uint32, int32) {
	var m uint32
	if v > math.Float32frombits(best) {
		m = ^uint32(0)
	}
	if v != v {
		m = ^uint32(0)
	}
	return best ^ (best^math.Float32bits(v))&m, bi ^ (bi^vi)&int32(m)
}

// maxTapNHWCGeneric folds one window tap (pixel index idx) into the running
// maxima y and their indices arg: a larger value or a NaN replaces the choice.
func maxTapNHWCGeneric(y []float32, arg []int32, tap []float32, idx int32) {
	tap = tap[:len(y)]
	arg = arg[:len(y)]
	for ch, v := range tap {
		b, i := maxSel(math.Float32bits(y[ch]), arg[ch], v, idx)
		y[ch], arg[ch] = math.Float32frombits(b), i
	}
}

// MaxPool2dBackwardNHWC is MaxPool2dBackward over channels-last images (shapes as
// MaxPool2dForwardNHWC; g.Planes counts images): dx[(n·H·W + arg)·c + ch] += dy for
// every output element, in output order within each image, so overlapping windows
// sum in the same order as the NCHW kernel. With accumulate false dx is
// overwritten (elements no window chose get 0). Parallel over images.
func MaxPool2dBackwardNHWC(g PoolGeom, c int, dx, dy []float32, arg []int32, accumulate bool) {
	g.checkNHWC("MaxPool2dBackwardNHWC", c, len(dx), len(dy))
	mustLen("MaxPool2dBackwardNHWC", "arg", len(arg), len(dy))
	j := poolJob{g: g, c: c, oh: g.OutH(), ow: g.OutW(), x: dx, y: dy, arg: arg, accumulate: accumulate}
	runPoolJob(jobMaxBackwardNHWC, j, g.Planes, (g.H*g.W+2*j.oh*j.ow)*c)
}

func (j *poolJob) maxBackwardNHWC(lo, hi int) {
	c := j.c
	hwc, ohwc := j.g.H*j.g.W*c, j.oh*j.ow*c
	for n := lo; n < hi; n++ {
		d := j.x[n*hwc : (n+1)*hwc]
		if !j.accumulate {
			clear(d)
		}
		a := j.arg[n*ohwc : (n+1)*ohwc]
		dy := j.y[n*ohwc : (n+1)*ohwc]
		for p := 0; p < ohwc; p += c {
			pa, pd := a[p:p+c], dy[p:p+c]
			for ch, v := range pd {
				d[int(pa[ch])*c+ch] += v
			}
		}
	}
}

// AvgPool2dForwardNHWC is AvgPool2dForward over channels-last images (x is
// [g.Planes, H, W, c], y is [g.Planes, OH, OW, c]; g.Planes counts images). The
// window is summed in the NCHW kernel's order and divided the same way, so the
// results equal AvgPool2dForward's on transposed data. Parallel over output rows.
func AvgPool2dForwardNHWC(g PoolGeom, c int, y, x []float32) {
	g.checkNHWC("AvgPool2dForwardNHWC", c, len(x), len(y))
	j := poolJob{g: g, c: c, oh: g.OutH(), ow: g.OutW(), x: x, y: y}
	n := g.Planes * j.oh
	runPoolJob(jobAvgForwardNHWC, j, n, j.ow*g.K*g.K*c)
}

func (j *poolJob) avgForwardNHWC(lo, hi int) {
	g, c := j.g, j.c
	h, w, oh, ow := g.H, g.W, j.oh, j.ow
	fast := g.fast2x2()
	for u := lo; u < hi; u++ {
		n, i := u/oh, u%oh
		img := j.x[n*h*w*c : (n+1)*h*w*c]
		dst := j.y[u*ow*c : (u+1)*ow*c]
		if fast {
			r0 := img[2*i*w*c : (2*i*w+2*ow)*c]
			r1 := img[(2*i+1)*w*c : ((2*i+1)*w+2*ow)*c]
			for q := 0; q < ow; q++ {
				d := dst[q*c : (q+1)*c]
				a, b := r0[2*q*c:(2*q+1)*c], r0[(2*q+1)*c:(2*q+2)*c]
				e, f := r1[2*q*c:(2*q+1)*c], r1[(2*q+1)*c:(2*q+2)*c]
				a, b, e, f = a[:len(d)], b[:len(d)], e[:len(d)], f[:len(d)]
				for ch := range d {
					d[ch] = (a[ch] + b[ch] + e[ch] + f[ch]) / 4
				}
			}
			continue
		}
		for q := 0; q < ow; q++ {
			d := dst[q*c : (q+1)*c]
			r0, r1, q0, q1, div := g.avgWindow(i, q)
			clear(d) // +0, as the NCHW kernel's sum starts
			for r := r0; r < r1; r++ {
				for s := q0; s < q1; s++ {
					tap := img[(r*w+s)*c : (r*w+s+1)*c]
					for ch, v := range tap {
						d[ch] += v
					}
				}
			}
			for ch := range d {
				d[ch] /= div
			}
		}
	}
}

// AvgPool2dBackwardNHWC is AvgPool2dBackward over channels-last images (shapes as
// AvgPool2dForwardNHWC; g.Planes counts images): dx += dy/div over each window, in
// the NCHW kernel's order (dx overwritten first when accumulate is false).
// Parallel over images.
func AvgPool2dBackwardNHWC(g PoolGeom, c int, dx, dy []float32, accumulate bool) {
	g.checkNHWC("AvgPool2dBackwardNHWC", c, len(dx), len(dy))
	j := poolJob{g: g, c: c, oh: g.OutH(), ow: g.OutW(), x: dx, y: dy, accumulate: accumulate}
	runPoolJob(jobAvgBackwardNHWC, j, g.Planes, (2*g.H*g.W+g.K*g.K*j.oh*j.ow)*c)
}

// avgGradChunk is how many channels avgBackwardNHWC divides at a time.
const avgGradChunk = 64

func (job *poolJob) avgBackwardNHWC(lo, hi int) {
	g, c := job.g, job.c
	h, w, oh, ow := g.H, g.W, job.oh, job.ow
	var v [avgGradChunk]float32
	for n := lo; n < hi; n++ {
		dst := job.x[n*h*w*c : (n+1)*h*w*c]
		if !job.accumulate {
			clear(dst)
		}
		for i := 0; i < oh; i++ {
			for q := 0; q < ow; q++ {
				r0, r1, q0, q1, div := g.avgWindow(i, q)
				src := job.dy(n, i, q)
				for c0 := 0; c0 < c; c0 += avgGradChunk {
					cl := min(avgGradChunk, c-c0)
					vs := v[:cl]
					for ch, d := range src[c0 : c0+cl] {
						vs[ch] = d / div
					}
					for r := r0; r < r1; r++ {
						for s := q0; s < q1; s++ {
							row := dst[(r*w+s)*c+c0 : (r*w+s)*c+c0+cl]
							row = row[:len(vs)]
							for ch, x := range vs {
								row[ch] += x
							}
						}
					}
				}
			}
		}
	}
}

// dy returns the c output gradients of pixel (i, q) of image n.
func (j *poolJob) dy(n, i, q int) []float32 {
	o := ((n*j.oh+i)*j.ow + q) * j.c
	return j.y[o : o+j.c]
}
