package nn

import (
	"fmt"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// CrossEntropy returns the mean over the batch of −log softmax(logits)[label], PyTorch's
// F.cross_entropy with reduction "mean". logits has shape [N, classes]; labels has N
// entries in [0, classes).
func CrossEntropy(logits *Var, labels []int) *Var {
	t := logits.tape
	s := logits.Value.Shape
	if logits.broken {
		return t.fail([]int{}, nil)
	}
	if len(s) != 2 {
		return t.failf([]int{}, "nn.CrossEntropy: logits shape %v, want [N classes]", s)
	}
	n, k := s[0], s[1]
	if len(labels) != n {
		return t.failf([]int{}, "nn.CrossEntropy: %d labels for %d rows of logits", len(labels), n)
	}
	for i, l := range labels {
		if l < 0 || l >= k {
			return t.fail([]int{}, fmt.Errorf("nn.CrossEntropy: label %d of sample %d outside [0, %d)", l, i, k))
		}
	}
	prob := t.buf(n * k) // softmax, kept for backward
	total := kernels.SoftmaxCrossEntropy(prob, t.buf(n), logits.Value.Data, labels, n, k)
	y := t.newVar(t.tensor([]int{}), false)
	y.Value.Data[0] = float32(total / float64(n))
	t.record(y, func(dy []float32) {
		dx, fresh := logits.gradOverwrite()
		kernels.SoftmaxCrossEntropyBackward(dx, prob, labels, n, k, dy[0]/float32(n), !fresh)
	}, logits)
	return y
}

// Accuracy counts the rows of logits whose largest entry is at the label's index.
func Accuracy(logits *Tensor, labels []int) int {
	if len(logits.Shape) != 2 {
		return 0
	}
	k := logits.Shape[1]
	correct := 0
	for i, l := range labels {
		row := logits.Data[i*k : (i+1)*k]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		if best == l {
			correct++
		}
	}
	return correct
}

// IgnoreIndex is the label PyTorch's cross_entropy skips by default (ignore_index=-100):
// masked-LM labels mark every position that was not masked with it.
const IgnoreIndex = -100

// CrossEntropyIgnore is CrossEntropy with PyTorch's ignore_index: rows whose label equals
// ignoreIndex add nothing to the loss and get a zero gradient, and the mean is over the
// remaining rows, as F.cross_entropy(logits, labels, ignore_index=ignoreIndex). When
// every row is ignored the loss is NaN (0/0) and the gradient zero, as in PyTorch.
// Only the counted rows go through the softmax, so a masked-LM loss over a large
// vocabulary costs in proportion to the masked positions.
func CrossEntropyIgnore(logits *Var, labels []int, ignoreIndex int) *Var {
	t := logits.tape
	s := logits.Value.Shape
	if logits.broken {
		return t.fail([]int{}, nil)
	}
	if len(s) != 2 {
		return t.failf([]int{}, "nn.CrossEntropyIgnore: logits shape %v, want [N classes]", s)
	}
	n, k := s[0], s[1]
	if len(labels) != n {
		return t.failf([]int{}, "nn.CrossEntropyIgnore: %d labels for %d rows of logits (shape %v)", len(labels), n, s)
	}
	var rows, kept []int
	for i, l := range labels {
		if l == ignoreIndex {
			continue
		}
		if l < 0 || l >= k {
			return t.failf([]int{}, "nn.CrossEntropyIgnore: label %d of row %d outside [0, %d) and not the ignore index %d", l, i, k, ignoreIndex)
		}
		rows = append(rows, i)
		kept = append(kept, l)
	}
	m := len(rows)
	y := t.newVar(t.tensor([]int{}), false)
	var prob []float32
	if m > 0 {
		compact := t.buf(m * k)
		for j, r := range rows {
			copy(compact[j*k:(j+1)*k], logits.Value.Data[r*k:(r+1)*k])
		}
		prob = t.buf(m * k)
		total := kernels.SoftmaxCrossEntropy(prob, t.buf(m), compact, kept, m, k)
		y.Value.Data[0] = float32(total / float64(m))
	} else {
		y.Value.Data[0] = float32NaN()
	}
	t.record(y, func(dy []float32) {
		dx, fresh := logits.gradOverwrite()
		if fresh {
			clear(dx)
		}
		if m == 0 {
			return
		}
		// prob becomes the compact gradient in place; rows are then added to dx.
		kernels.SoftmaxCrossEntropyBackward(prob, prob, kept, m, k, dy[0]/float32(m), false)
		for j, r := range rows {
			kernels.Axpy(1, prob[j*k:(j+1)*k], dx[r*k:(r+1)*k])
		}
	}, logits)
	return y
}
