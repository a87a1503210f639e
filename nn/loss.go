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
