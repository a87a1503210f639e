package gorgonia

import (
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/spargo-dl/spargo/nn"
)

// ToDense and FromDense share memory: a write through either side is seen by the other, in
// both directions, and shapes carry over.
func TestConversionSharesMemory(t *testing.T) {
	x := nn.NewTensor(2, 3)
	for i := range x.Data {
		x.Data[i] = float32(i)
	}
	d := ToDense(x)
	if !slices.Equal([]int(d.Shape()), []int{2, 3}) || d.Dtype() != tensor.Float32 {
		t.Fatalf("Dense shape %v dtype %v", d.Shape(), d.Dtype())
	}
	x.Data[4] = 40 // spargo write, seen by gorgonia
	if v, _ := d.At(1, 1); v.(float32) != 40 {
		t.Fatalf("Dense[1,1] = %v after writing 40 through the spargo tensor", v)
	}
	if err := d.SetAt(float32(-7), 0, 2); err != nil { // gorgonia write, seen by spargo
		t.Fatal(err)
	}
	if x.Data[2] != -7 {
		t.Fatalf("spargo[2] = %v after writing -7 through the Dense", x.Data[2])
	}
	back, err := FromDense(d)
	if err != nil {
		t.Fatal(err)
	}
	if !sameMemory(back.Data, x.Data) || !slices.Equal(back.Shape, x.Shape) {
		t.Fatal("FromDense(ToDense(x)) is not a view of x")
	}

	// The other way round: a Dense made by gorgonia (here by the tensor package) viewed as
	// a spargo tensor.
	g := tensor.New(tensor.WithShape(3, 2), tensor.WithBacking([]float32{1, 2, 3, 4, 5, 6}))
	s, err := FromDense(g)
	if err != nil {
		t.Fatal(err)
	}
	s.Data[5] = 60
	if v, _ := g.At(2, 1); v.(float32) != 60 {
		t.Fatalf("Dense[2,1] = %v after writing 60 through the spargo view", v)
	}
	_ = g.SetAt(float32(10), 0, 0)
	if s.Data[0] != 10 || !slices.Equal(s.Shape, []int{3, 2}) {
		t.Fatalf("spargo view %v %v", s.Shape, s.Data)
	}

	// A gorgonia graph reads a ToDense view and its result converts back without a copy.
	graph := G.NewGraph()
	a := G.NewMatrix(graph, tensor.Float32, G.WithShape(2, 3), G.WithName("a"), G.WithValue(ToDense(x)))
	sum := G.Must(G.Add(a, a))
	vm := G.NewTapeMachine(graph)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	res, err := FromDense(sum.Value().(*tensor.Dense))
	if err != nil {
		t.Fatal(err)
	}
	for i := range x.Data {
		if res.Data[i] != 2*x.Data[i] {
			t.Fatalf("a+a [%d] = %v, want %v", i, res.Data[i], 2*x.Data[i])
		}
	}
	data, _ := valueFloat32s(sum.Value())
	if !sameMemory(res.Data, data) {
		t.Fatal("FromDense copied the graph's value")
	}
}

// What cannot be viewed as a spargo tensor is an error that says what to do.
func TestFromDenseRejects(t *testing.T) {
	m := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{1, 2, 3, 4, 5, 6}))
	tr := m.Clone().(*tensor.Dense)
	if err := tr.T(); err != nil {
		t.Fatal(err)
	}
	if _, err := FromDense(tr); err == nil || !strings.Contains(err.Error(), "Materialize") {
		t.Fatalf("transposed view: %v", err)
	}
	f64 := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, 2}))
	if _, err := FromDense(f64); err == nil || !strings.Contains(err.Error(), "float32") {
		t.Fatalf("float64: %v", err)
	}
	if _, err := FromDense(nil); err == nil {
		t.Fatal("nil Dense accepted")
	}
	// A contiguous slice (rows 1..2) is fine and shares memory; a column slice is not.
	rows, err := m.Slice(G.S(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := FromDense(rows.(*tensor.Dense)); err != nil || !slices.Equal(v.Data, []float32{4, 5, 6}) {
		t.Fatalf("row slice: %v %v", v, err)
	}
	col, err := m.Slice(nil, G.S(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FromDense(col.(*tensor.Dense)); err == nil {
		t.Fatal("a column slice (strided) was accepted")
	}
}
