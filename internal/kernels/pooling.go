package kernels

import (
	"fmt"
	"math"
)

// PoolGeom describes 2-D pooling over Planes independent H×W planes (N·C for
// NCHW input) with a K×K window, stride Stride and padding Pad on each side; the
// output planes are OutH()×OutW() (floor mode, as PyTorch).
type PoolGeom struct{ Planes, H, W, K, Stride, Pad int }

// OutH is (H + 2·Pad − K)/Stride + 1.
func (g PoolGeom) OutH() int { return (g.H+2*g.Pad-g.K)/g.Stride + 1 }

// OutW is (W + 2·Pad − K)/Stride + 1.
func (g PoolGeom) OutW() int { return (g.W+2*g.Pad-g.K)/g.Stride + 1 }

func (g PoolGeom) check(fn string, xLen, yLen int) {
	g.checkGeom(fn)
	mustLen(fn, "input", xLen, g.Planes*g.H*g.W)
	mustLen(fn, "output", yLen, g.Planes*g.OutH()*g.OutW())
}

func (g PoolGeom) checkGeom(fn string) {
	if g.Planes < 0 || g.H <= 0 || g.W <= 0 || g.K <= 0 || g.Stride <= 0 || g.Pad < 0 ||
		2*g.Pad > g.K || g.OutH() <= 0 || g.OutW() <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid geometry %+v", fn, g))
	}
}

// fast2x2 reports whether g is the 2×2, stride 2, unpadded window.
func (g PoolGeom) fast2x2() bool { return g.K == 2 && g.Stride == 2 && g.Pad == 0 }

// runPoolJob runs pool job j of the given kind over [0, n), n items of the given
// cost: on the calling goroutine when that is small, else on the worker pool.
func runPoolJob(kind int, j poolJob, n, cost int) {
	if runsSerial(n, cost) {
		j.run(kind, 0, n)
		return
	}
	t := newTask(kind)
	t.pool = j
	runTask(t, n)
}

// run processes items [lo, hi) of the job kind.
func (j *poolJob) run(kind, lo, hi int) {
	switch kind {
	case jobMaxForward:
		j.maxForward(lo, hi)
	case jobMaxBackward:
		j.maxBackward(lo, hi)
	case jobAvgForward:
		j.avgForward(lo, hi)
	case jobAvgBackward:
		j.avgBackward(lo, hi)
	case jobMaxForwardNHWC:
		j.maxForwardNHWC(lo, hi)
	case jobMaxBackwardNHWC:
		j.maxBackwardNHWC(lo, hi)
	case jobAvgForwardNHWC:
		j.avgForwardNHWC(lo, hi)
	case jobAvgBackwardNHWC:
		j.avgBackwardNHWC(lo, hi)
	default:
		panic("kernels: unknown pool job")
	}
}

// MaxPool2dForward writes y, the maximum of each window of x, and arg, the in-plane
// index (row·W + col) of the element chosen. Padding counts as −∞. Within a window
// the first maximum in row-major order wins, except that a NaN always replaces the
// current choice (PyTorch's rule: the result is NaN if any element is). Parallel over
// planes.
func MaxPool2dForward(g PoolGeom, y []float32, arg []int32, x []float32) {
	g.check("MaxPool2dForward", len(x), len(y))
	mustLen("MaxPool2dForward", "arg", len(arg), len(y))
	j := poolJob{g: g, oh: g.OutH(), ow: g.OutW(), v: impl.vec, x: x, y: y, arg: arg}
	runPoolJob(jobMaxForward, j, g.Planes, 2*g.H*g.W)
}

// poolJob holds the arguments of one pooling kernel call; its methods process the
// plane range [lo, hi).
type poolJob struct {
	g          PoolGeom
	c          int // channels of the NHWC kernels (pooling_nhwc.go)
	oh, ow     int
	v          *vecOps
	x, y       []float32 // input and output (gradients in backward)
	arg        []int32
	accumulate bool
}

func (j *poolJob) maxForward(lo, hi int) {
	h, w, oh, ow := j.g.H, j.g.W, j.oh, j.ow
	fast := j.g.fast2x2()
	for p := lo; p < hi; p++ {
		src := j.x[p*h*w : (p+1)*h*w]
		dst := j.y[p*oh*ow : (p+1)*oh*ow]
		ai := j.arg[p*oh*ow : (p+1)*oh*ow]
		if fast {
			maxPool2x2Plane(j.v, dst, ai, src, w, oh, ow)
		} else {
			maxPoolPlane(j.g, dst, ai, src, oh, ow)
		}
	}
}

func maxPool2x2Plane(v *vecOps, dst []float32, arg []int32, src []float32, w, oh, ow int) {
	for i := 0; i < oh; i++ {
		r0 := src[2*i*w : 2*i*w+2*ow]
		r1 := src[(2*i+1)*w : (2*i+1)*w+2*ow]
		yr := dst[i*ow : (i+1)*ow]
		ar := arg[i*ow : (i+1)*ow]
		v.maxPool2x2Row(yr, ar, r0, r1, int32(2*i*w), int32(w))
	}
}

// maxPool2x2RowGeneric pools two input rows r0, r1 (2·len(y) elements each) into y; base is
// the in-plane index of r0[0] and w the row stride.
func maxPool2x2RowGeneric(y []float32, arg []int32, r0, r1 []float32, base, w int32) {
	n := len(y)
	arg = arg[:n]
	r0 = r0[:2*n]
	r1 = r1[:2*n]
	for j := range y {
		a, b := r0[2*j], r0[2*j+1]
		c, d := r1[2*j], r1[2*j+1]
		best, bi := a, int32(0)
		if b > best || b != b {
			best, bi = b, 1
		}
		if c > best || c != c {
			best, bi = c, w
		}
		if d > best || d != d {
			best, bi = d, w+1
		}
		y[j] = best
		arg[j] = base + int32(2*j) + bi
	}
}

func maxPoolPlane(g PoolGeom, dst []float32, arg []int32, src []float32, oh, ow int) {
	h, w, k, stride, pad := g.H, g.W, g.K, g.Stride, g.Pad
	for i := 0; i < oh; i++ {
		for j := 0; j < ow; j++ {
			best := float32(math.Inf(-1))
			bi := int32(-1)
			for a := 0; a < k; a++ {
				r := i*stride - pad + a
				if r < 0 || r >= h {
					continue
				}
				for b := 0; b < k; b++ {
					q := j*stride - pad + b
					if q < 0 || q >= w {
						continue
					}
					if v := src[r*w+q]; v > best || bi < 0 || v != v {
						best, bi = v, int32(r*w+q)
					}
				}
			}
			dst[i*ow+j] = best
			arg[i*ow+j] = bi
		}
	}
}

// MaxPool2dBackward routes each dy to the input element arg selected in the forward
// pass: dx[arg] += dy. With accumulate false dx is overwritten (elements no window
// chose get 0). Parallel over planes.
func MaxPool2dBackward(g PoolGeom, dx, dy []float32, arg []int32, accumulate bool) {
	g.check("MaxPool2dBackward", len(dx), len(dy))
	mustLen("MaxPool2dBackward", "arg", len(arg), len(dy))
	j := poolJob{g: g, oh: g.OutH(), ow: g.OutW(), x: dx, y: dy, arg: arg, accumulate: accumulate}
	runPoolJob(jobMaxBackward, j, g.Planes, g.H*g.W+2*j.oh*j.ow)
}

func (j *poolJob) maxBackward(lo, hi int) {
	hw, ohw := j.g.H*j.g.W, j.oh*j.ow
	for p := lo; p < hi; p++ {
		d := j.x[p*hw : (p+1)*hw]
		if !j.accumulate {
			clear(d)
		}
		a := j.arg[p*ohw : (p+1)*ohw]
		for k, v := range j.y[p*ohw : (p+1)*ohw] {
			d[a[k]] += v
		}
	}
}

// avgWindow returns the clipped window rows [r0,r1) and columns [q0,q1) of output
// (i, j) and its divisor (padded cells count, count_include_pad=True).
func (g PoolGeom) avgWindow(i, j int) (r0, r1, q0, q1 int, div float32) {
	r0, q0 = i*g.Stride-g.Pad, j*g.Stride-g.Pad
	r1, q1 = min(r0+g.K, g.H+g.Pad), min(q0+g.K, g.W+g.Pad)
	div = float32((r1 - r0) * (q1 - q0))
	return max(r0, 0), min(r1, g.H), max(q0, 0), min(q1, g.W), div
}

// AvgPool2dForward writes the mean of each window (padded cells count as zeros in
// the divisor, PyTorch's count_include_pad=True). Parallel over planes.
func AvgPool2dForward(g PoolGeom, y, x []float32) {
	g.check("AvgPool2dForward", len(x), len(y))
	j := poolJob{g: g, oh: g.OutH(), ow: g.OutW(), x: x, y: y}
	runPoolJob(jobAvgForward, j, g.Planes, 2*g.H*g.W+g.K*g.K*j.oh*j.ow)
}

func (job *poolJob) avgForward(lo, hi int) {
	g, x, y := job.g, job.x, job.y
	h, w, oh, ow := g.H, g.W, job.oh, job.ow
	for p := lo; p < hi; p++ {
		src := x[p*h*w : (p+1)*h*w]
		dst := y[p*oh*ow : (p+1)*oh*ow]
		if g.fast2x2() {
			for i := 0; i < oh; i++ {
				a := src[2*i*w : 2*i*w+2*ow]
				b := src[(2*i+1)*w : (2*i+1)*w+2*ow]
				yr := dst[i*ow : (i+1)*ow]
				for j := range yr {
					yr[j] = (a[2*j] + a[2*j+1] + b[2*j] + b[2*j+1]) / 4
				}
			}
			continue
		}
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				r0, r1, q0, q1, div := g.avgWindow(i, j)
				var sum float32
				for r := r0; r < r1; r++ {
					for _, v := range src[r*w+q0 : r*w+q1] {
						sum += v
					}
				}
				dst[i*ow+j] = sum / div
			}
		}
	}
}

// AvgPool2dBackward spreads each dy evenly over its window: dx += dy/div (dx
// overwritten first when accumulate is false). Parallel over planes.
func AvgPool2dBackward(g PoolGeom, dx, dy []float32, accumulate bool) {
	g.check("AvgPool2dBackward", len(dx), len(dy))
	j := poolJob{g: g, oh: g.OutH(), ow: g.OutW(), x: dx, y: dy, accumulate: accumulate}
	runPoolJob(jobAvgBackward, j, g.Planes, 2*g.H*g.W+g.K*g.K*j.oh*j.ow)
}

func (job *poolJob) avgBackward(lo, hi int) {
	g, dx, dy := job.g, job.x, job.y
	h, w, oh, ow := g.H, g.W, job.oh, job.ow
	for p := lo; p < hi; p++ {
		dst := dx[p*h*w : (p+1)*h*w]
		if !job.accumulate {
			clear(dst)
		}
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				r0, r1, q0, q1, div := g.avgWindow(i, j)
				v := dy[(p*oh+i)*ow+j] / div
				for r := r0; r < r1; r++ {
					row := dst[r*w+q0 : r*w+q1]
					for q := range row {
						row[q] += v
					}
				}
			}
		}
	}
}
