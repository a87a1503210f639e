package kernels

import (
	"fmt"
	"math"
)

// SoftmaxCrossEntropy computes, for logits laid out as n rows of k classes, the
// row-wise softmax into prob and returns Σ_i −log softmax(row i)[labels[i]] (the
// summed, not averaged, loss). Exponentials are float32 (exp32), the normaliser is summed in
// float64. Rows are processed in parallel when the problem is large; the per-row
// losses are summed in row order, so the result does not depend on the split.
// rowLoss (n elements) receives each row's loss. Labels must lie in [0, k).
func SoftmaxCrossEntropy(prob, rowLoss, logits []float32, labels []int, n, k int) float64 {
	const fn = "SoftmaxCrossEntropy"
	if n < 0 || k <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape n=%d k=%d", fn, n, k))
	}
	mustLen(fn, "logits", len(logits), n*k)
	mustLen(fn, "prob", len(prob), n*k)
	mustLen(fn, "labels", len(labels), n)
	mustLen(fn, "rowLoss", len(rowLoss), n)
	j := ceJob{k: k, prob: prob, rowLoss: rowLoss, logits: logits, labels: labels}
	if cost := 8 * k; runsSerial(n, cost) {
		j.forward(0, n)
	} else {
		t := newTask(jobCEForward)
		t.ce = j
		runTask(t, n)
	}
	var total float64
	for _, l := range rowLoss {
		total += float64(l)
	}
	return total
}

// SoftmaxCrossEntropyBackward writes (or, with accumulate, adds) the gradient of
// scale·Σ_i −log softmax(row i)[labels[i]] with respect to the logits:
// dx = scale·(prob − onehot(labels)).
func SoftmaxCrossEntropyBackward(dx, prob []float32, labels []int, n, k int, scale float32, accumulate bool) {
	const fn = "SoftmaxCrossEntropyBackward"
	if n < 0 || k <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape n=%d k=%d", fn, n, k))
	}
	mustLen(fn, "prob", len(prob), n*k)
	mustLen(fn, "dx", len(dx), n*k)
	mustLen(fn, "labels", len(labels), n)
	j := ceJob{k: k, prob: prob, dx: dx, labels: labels, scale: scale, accumulate: accumulate}
	if cost := 3 * k; runsSerial(n, cost) {
		j.backward(0, n)
	} else {
		t := newTask(jobCEBackward)
		t.ce = j
		runTask(t, n)
	}
}

// ceJob holds the arguments of one softmax cross-entropy call; its methods process
// the row range [lo, hi).
type ceJob struct {
	k                         int
	prob, rowLoss, logits, dx []float32
	labels                    []int
	scale                     float32
	accumulate                bool
}

func (j *ceJob) forward(lo, hi int) {
	k, v := j.k, impl.vec
	for i := lo; i < hi; i++ {
		row := j.logits[i*k : (i+1)*k]
		p := j.prob[i*k : (i+1)*k]
		// float32 exponentials (exp32's formula, relative error ~1e-7) instead of
		// math.Exp: this loop is most of a language model's loss (10,000 classes per
		// word); the normaliser is summed in float64.
		mx := v.maxOf(row)
		z := v.expSum(p, row, mx)
		v.scale(float32(1/z), p)
		j.rowLoss[i] = float32(math.Log(z) + float64(mx) - float64(row[j.labels[i]]))
	}
}

func (j *ceJob) backward(lo, hi int) {
	k, v := j.k, impl.vec
	for i := lo; i < hi; i++ {
		p := j.prob[i*k : (i+1)*k]
		d := j.dx[i*k : (i+1)*k]
		// scale·prob for every class, then the label's entry again with its −1
		// (read before the scaling, which may overwrite prob when dx is prob).
		l := j.labels[i]
		pl, dl := p[l], d[l]
		if j.accumulate {
			v.axpy(j.scale, p, d)
			d[l] = dl + j.scale*(pl-1)
		} else {
			if &d[0] != &p[0] {
				v.affine(d, p, 0, j.scale, 0) // d = scale·p in one pass (not a copy, then a scaling)
			} else {
				v.scale(j.scale, d)
			}
			d[l] = j.scale * (pl - 1)
		}
	}
}
