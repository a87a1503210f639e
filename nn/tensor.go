package nn

import (
	"fmt"
	"strings"
)

// Tensor is a dense, contiguous, row-major float32 array with a shape.
// A Tensor owns no autograd state; see Var for values recorded on a Tape.
type Tensor struct {
	Data  []float32
	Shape []int
}

// NewTensor returns a zero-filled tensor of the given shape.
func NewTensor(shape ...int) *Tensor {
	return &Tensor{Data: make([]float32, numel(shape)), Shape: append([]int(nil), shape...)}
}

// FromSlice wraps data (without copying) as a tensor of the given shape.
// It returns an error when len(data) does not equal the product of shape.
func FromSlice(data []float32, shape ...int) (*Tensor, error) {
	if n := numel(shape); n != len(data) {
		return nil, fmt.Errorf("nn.FromSlice: shape %v needs %d elements, got %d", shape, n, len(data))
	}
	return &Tensor{Data: data, Shape: append([]int(nil), shape...)}, nil
}

// Len returns the number of elements.
func (t *Tensor) Len() int { return len(t.Data) }

// Dims returns the number of dimensions.
func (t *Tensor) Dims() int { return len(t.Shape) }

// Clone returns a deep copy.
func (t *Tensor) Clone() *Tensor {
	return &Tensor{Data: append([]float32(nil), t.Data...), Shape: append([]int(nil), t.Shape...)}
}

// CopyFrom copies src's values into t; the shapes must hold the same number of elements.
func (t *Tensor) CopyFrom(src *Tensor) error {
	if len(src.Data) != len(t.Data) {
		return fmt.Errorf("nn.Tensor.CopyFrom: shape %v into %v", src.Shape, t.Shape)
	}
	copy(t.Data, src.Data)
	return nil
}

// Zero sets every element to 0.
func (t *Tensor) Zero() { clear(t.Data) }

func (t *Tensor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Tensor%v", t.Shape)
	if len(t.Data) <= 8 {
		fmt.Fprintf(&b, "%v", t.Data)
	}
	return b.String()
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
