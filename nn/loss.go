package nn

import (
	"fmt"
	"math"
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
	x := logits.Value.Data
	prob := t.buf(n * k) // softmax, kept for backward
	var total float64
	for i := 0; i < n; i++ {
		row := x[i*k : (i+1)*k]
		mx := row[0]
		for _, v := range row[1:] {
			mx = max(mx, v)
		}
		var z float64
		for j, v := range row {
			e := math.Exp(float64(v - mx))
			prob[i*k+j] = float32(e)
			z += e
		}
		for j := range row {
			prob[i*k+j] = float32(float64(prob[i*k+j]) / z)
		}
		total += math.Log(z) + float64(mx) - float64(row[labels[i]])
	}
	y := t.newVar(t.tensor([]int{}), false)
	y.Value.Data[0] = float32(total / float64(n))
	t.record(y, func(dy []float32) {
		dx := logits.grad()
		g := dy[0] / float32(n)
		for i := 0; i < n; i++ {
			for j := 0; j < k; j++ {
				p := prob[i*k+j]
				if j == labels[i] {
					p--
				}
				dx[i*k+j] += g * p
			}
		}
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
