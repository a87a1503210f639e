package kernels

import "fmt"

func checkLen(fn string, n int, others ...int) {
	for _, o := range others {
		if o != n {
			panic(fmt.Sprintf("kernels.%s: length mismatch %d vs %d", fn, n, o))
		}
	}
}

// Axpy computes y += alpha*x.
func Axpy(alpha float32, x, y []float32) {
	checkLen("Axpy", len(x), len(y))
	impl.vec.axpy(alpha, x, y)
}

// Scale computes x *= alpha.
func Scale(alpha float32, x []float32) { impl.vec.scale(alpha, x) }

// Add computes dst = a + b.
func Add(dst, a, b []float32) {
	checkLen("Add", len(dst), len(a), len(b))
	impl.vec.add(dst, a, b)
}

// Mul computes dst = a * b elementwise.
func Mul(dst, a, b []float32) {
	checkLen("Mul", len(dst), len(a), len(b))
	impl.vec.mul(dst, a, b)
}

// Dot returns the inner product of a and b. The summation order is fixed
// (it depends only on len(a) and the implementation in use).
func Dot(a, b []float32) float32 {
	checkLen("Dot", len(a), len(b))
	return impl.vec.dot(a, b)
}

// Sum returns the sum of x, with a fixed summation order.
func Sum(x []float32) float32 { return impl.vec.sum(x) }

// Fill sets every element of x to v.
func Fill(x []float32, v float32) {
	if v == 0 {
		clear(x)
		return
	}
	for i := range x {
		x[i] = v
	}
}

// ReluForward computes dst = max(x, 0). NaN inputs produce 0. Large slices are
// processed in parallel.
func ReluForward(dst, x []float32) {
	checkLen("ReluForward", len(dst), len(x))
	runElem(elemJob{op: elemReluFwd, n: len(dst), a: dst, b: x})
}

// ReluBackward accumulates dx += dy where y > 0. Large slices are processed in
// parallel.
func ReluBackward(dx, y, dy []float32) {
	checkLen("ReluBackward", len(dx), len(y), len(dy))
	runElem(elemJob{op: elemReluBwd, n: len(dx), a: dx, b: y, c: dy})
}

// ReluBackwardSet overwrites dx with dy where y > 0 and 0 elsewhere (the gradient of
// max(x, 0) given its output y, for a freshly allocated dx).
func ReluBackwardSet(dx, y, dy []float32) {
	checkLen("ReluBackwardSet", len(dx), len(y), len(dy))
	runElem(elemJob{op: elemReluBwdSet, n: len(dx), a: dx, b: y, c: dy})
}

// ReluBackwardAxpy adds the rectifier's gradient to an existing dx: dx += g with g = dy
// where y > 0 and +0 elsewhere, bit-identical to ReluBackwardSet(g, y, dy) followed by
// AxpyParallel(1, g, dx) without the buffer g. (ReluBackward leaves dx untouched where
// y ≤ 0, so a −0 there stays −0; here it becomes −0 + +0 = +0, as in that composition.)
// Large slices are processed in parallel.
func ReluBackwardAxpy(dx, y, dy []float32) {
	checkLen("ReluBackwardAxpy", len(dx), len(y), len(dy))
	runElem(elemJob{op: elemReluBwdAxpy, n: len(dx), a: dx, b: y, c: dy})
}

// Zero sets every element of x to 0, in parallel for large slices.
func Zero(x []float32) { runElem(elemJob{op: elemZero, n: len(x), a: x}) }

// Copy copies src into dst (equal lengths), in parallel for large slices.
func Copy(dst, src []float32) {
	checkLen("Copy", len(dst), len(src))
	runElem(elemJob{op: elemCopy, n: len(dst), a: dst, b: src})
}

// AxpyParallel computes y += alpha*x like Axpy, splitting large slices over the
// worker pool (elementwise, so the result does not depend on the split).
func AxpyParallel(alpha float32, x, y []float32) {
	checkLen("AxpyParallel", len(x), len(y))
	runElem(elemJob{op: elemAxpy, n: len(x), a: x, b: y, alpha: alpha})
}

// Portable implementations (all architectures; the avx512 path replaces them).

func axpyGeneric(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

func scaleGeneric(alpha float32, x []float32) {
	for i := range x {
		x[i] *= alpha
	}
}

func addGeneric(dst, a, b []float32) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

func mulGeneric(dst, a, b []float32) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] * b[i]
	}
}

// dotGeneric uses 8 interleaved partial sums (lane i%8) combined pairwise.
func dotGeneric(a, b []float32) float32 {
	b = b[:len(a)]
	var s [8]float32
	i := 0
	for ; i+8 <= len(a); i += 8 {
		x, y := a[i:i+8:i+8], b[i:i+8:i+8]
		s[0] += x[0] * y[0]
		s[1] += x[1] * y[1]
		s[2] += x[2] * y[2]
		s[3] += x[3] * y[3]
		s[4] += x[4] * y[4]
		s[5] += x[5] * y[5]
		s[6] += x[6] * y[6]
		s[7] += x[7] * y[7]
	}
	for ; i < len(a); i++ {
		s[i&7] += a[i] * b[i]
	}
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

func sumGeneric(x []float32) float32 {
	var s [8]float32
	i := 0
	for ; i+8 <= len(x); i += 8 {
		v := x[i : i+8 : i+8]
		s[0] += v[0]
		s[1] += v[1]
		s[2] += v[2]
		s[3] += v[3]
		s[4] += v[4]
		s[5] += v[5]
		s[6] += v[6]
		s[7] += v[7]
	}
	for ; i < len(x); i++ {
		s[i&7] += x[i]
	}
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

func reluFwdGeneric(dst, x []float32) {
	x = x[:len(dst)]
	for i, v := range x {
		if v > 0 {
			dst[i] = v
		} else {
			dst[i] = 0
		}
	}
}

func reluBwdGeneric(dx, y, dy []float32) {
	y = y[:len(dx)]
	dy = dy[:len(dx)]
	for i := range dx {
		if y[i] > 0 {
			dx[i] += dy[i]
		}
	}
}

func reluBwdAxpyGeneric(dx, y, dy []float32) {
	y = y[:len(dx)]
	dy = dy[:len(dx)]
	for i := range dx {
		dx[i] += reluMask(dy[i], y[i])
	}
}

func reluBwdSetGeneric(dx, y, dy []float32) {
	y = y[:len(dx)]
	dy = dy[:len(dx)]
	for i := range dx {
		g := float32(0)
		if y[i] > 0 {
			g = dy[i]
		}
		dx[i] = g
	}
}
