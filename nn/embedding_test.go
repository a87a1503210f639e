package nn

import (
	"strings"
	"testing"
)

// The gradient of Σ y·r with respect to the table is r scattered into the looked-up rows,
// summed where an id repeats and skipped for the padding id.
func TestEmbeddingLookupAndGradient(t *testing.T) {
	rng := NewRand(3)
	e := NewEmbedding(7, 4, rng)
	e.PaddingIdx = 0
	ids := []int32{3, 1, 3, 0, 6, 1}
	tape := NewTape()
	y := e.Lookup(tape, ids, 2, 3)
	if err := tape.Err(); err != nil {
		t.Fatal(err)
	}
	if got := y.Shape(); len(got) != 3 || got[0] != 2 || got[1] != 3 || got[2] != 4 {
		t.Fatalf("shape %v, want [2 3 4]", got)
	}
	for i, id := range ids {
		for j := 0; j < 4; j++ {
			if y.Value.Data[i*4+j] != e.Weight.Value.Data[int(id)*4+j] {
				t.Fatalf("row %d differs from table row %d", i, id)
			}
		}
	}
	r := randTensor(rng, 2, 3, 4)
	if err := tape.BackwardFrom(y, r.Data); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, 7*4)
	for i, id := range ids {
		if id == 0 {
			continue
		}
		for j := 0; j < 4; j++ {
			want[int(id)*4+j] += r.Data[i*4+j]
		}
	}
	for i, g := range e.Weight.Grad.Data {
		if g != want[i] {
			t.Fatalf("grad[%d] = %v, want %v", i, g, want[i])
		}
	}
}

func TestEmbeddingErrors(t *testing.T) {
	e := NewEmbedding(5, 2, NewRand(1))
	for _, c := range []struct {
		name string
		run  func(*Tape) *Var
		want string
	}{
		{"id too large", func(tp *Tape) *Var { return e.Lookup(tp, []int32{1, 5}) }, "id 5 at position 1"},
		{"negative id", func(tp *Tape) *Var { return e.Lookup(tp, []int32{-1}) }, "id -1 at position 0"},
		{"shape", func(tp *Tape) *Var { return e.Lookup(tp, []int32{1, 2, 3}, 2, 2) }, "3 ids for shape [2 2]"},
		{"float id", func(tp *Tape) *Var {
			x := NewTensor(2)
			x.Data[1] = 1.5
			return e.Forward(tp.Const(x))
		}, "position 1 holds 1.5"},
	} {
		tp := NewTape()
		c.run(tp)
		if err := tp.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want it to mention %q", c.name, err, c.want)
		}
	}
}
