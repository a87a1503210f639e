package gorgonia

import (
	"fmt"
	"unsafe"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/spargo-dl/spargo/nn"
)

// ToDense returns a *tensor.Dense that views t's memory: same backing array, same shape, no
// copy. Writes through either are visible through the other.
//
// Aliasing and lifetime: the Dense is valid for as long as t.Data is t's storage — for a
// parameter's Value, the life of the model (optimizers and DDP update values in place); for
// a Var's Value or Grad on a Tape, until the tape's next Reset, after which the pool hands
// the memory to other tensors. Replacing t.Data (rather than writing into it) detaches the
// two. Gorgonia ops that allocate their result never write into their inputs, but "unsafe"
// tensor calls (tensor.UseUnsafe(), Apply with tensor.WithReuse of the view) do write into
// t. A tensor of shape [] (one element) becomes a Dense of shape (1).
func ToDense(t *nn.Tensor) *tensor.Dense {
	shape := t.Shape
	if len(shape) == 0 {
		shape = []int{1}
	}
	return tensor.New(tensor.WithShape(append([]int(nil), shape...)...), tensor.WithBacking(t.Data))
}

// FromDense returns an *nn.Tensor that views d's memory: same backing array, same shape, no
// copy. d must hold float32 values in one contiguous row-major block: a transposed or
// strided view (tensor.T, a non-contiguous Slice) or a masked Dense is an error; call
// Materialize (which copies) first. The aliasing and lifetime rules of ToDense apply: the
// view is valid while d's memory is — for the value of a node that a gorgonia VM computed,
// until the VM runs again (Block copies what it keeps).
func FromDense(d *tensor.Dense) (*nn.Tensor, error) {
	if d == nil {
		return nil, fmt.Errorf("nn/gorgonia: FromDense: nil Dense")
	}
	data, err := denseFloat32s(d)
	if err != nil {
		return nil, fmt.Errorf("nn/gorgonia: FromDense: %w", err)
	}
	return &nn.Tensor{Data: data, Shape: append([]int(nil), d.Shape()...)}, nil
}

// denseFloat32s returns d's elements in row-major order, sharing d's memory.
func denseFloat32s(d *tensor.Dense) ([]float32, error) {
	if d.Dtype() != tensor.Float32 {
		return nil, fmt.Errorf("dtype %v, spargo tensors hold float32", d.Dtype())
	}
	if d.IsMasked() {
		return nil, fmt.Errorf("masked Dense of shape %v: use Materialize or a copy without the mask", d.Shape())
	}
	n := d.Shape().TotalSize()
	if d.RequiresIterator() || !rowMajor(d.Shape(), d.Strides()) || d.DataSize() < n {
		return nil, fmt.Errorf("Dense of shape %v with strides %v is not one contiguous row-major block (a transposed or sliced view): call Materialize first", d.Shape(), d.Strides())
	}
	if n == 0 {
		return []float32{}, nil
	}
	// Header.Float32s reinterprets the raw bytes; cap the slice at the view's own elements.
	all := d.Float32s()
	return all[:n:n], nil
}

// rowMajor reports whether strides are the packed row-major strides of shape (size-1
// dimensions may carry any stride).
func rowMajor(shape tensor.Shape, strides []int) bool {
	if len(shape) == 0 || shape.IsScalar() {
		return true
	}
	if len(strides) != len(shape) {
		return false
	}
	want := 1
	for i := len(shape) - 1; i >= 0; i-- {
		if shape[i] != 1 && strides[i] != want {
			return false
		}
		want *= shape[i]
	}
	return true
}

// valueFloat32s returns the float32 elements of a gorgonia Value (a Dense or a scalar),
// sharing the Dense's memory.
func valueFloat32s(v G.Value) ([]float32, error) {
	switch v := v.(type) {
	case nil:
		return nil, fmt.Errorf("no value (the node was not computed)")
	case *tensor.Dense:
		return denseFloat32s(v)
	case *G.F32:
		return []float32{float32(*v)}, nil
	case G.Scalar:
		return nil, fmt.Errorf("scalar of dtype %v, spargo tensors hold float32", v.Dtype())
	default:
		return nil, fmt.Errorf("value of type %T, want a float32 *tensor.Dense", v)
	}
}

// sameMemory reports whether a and b are the same slice of memory.
func sameMemory(a, b []float32) bool {
	return len(a) == len(b) && (len(a) == 0 || unsafe.SliceData(a) == unsafe.SliceData(b))
}
