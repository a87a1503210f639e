package hooks

import (
	"slices"
	"testing"
)

// TestResidualVerbs checks the error-feedback verbs on a small bucket: what each leaves in the
// gradient and in ξ, and that the two-step update (Keep, then MarkSent or MarkApplied) is the
// one-step Update.
func TestResidualVerbs(t *testing.T) {
	g := []float32{1, -2, 3, 0.5, -4}
	cases := []struct {
		name   string
		update func(xi Residual, acc []float32)
		want   []float32 // ξ after compensating g with ξ0 and updating
	}{
		{"update", func(xi Residual, acc []float32) { xi.Update(acc, []int32{1, 4}) },
			[]float32{1.5, 0, 4, 0.5, 0}},
		{"keep+marksent", func(xi Residual, acc []float32) { xi.Keep(acc); xi.MarkSent([]int32{1, 4}) },
			[]float32{1.5, 0, 4, 0.5, 0}},
		// Contributed 0, 2, 4; the result applied 1, 2, 3, 4: only 2 and 4 left the rank.
		{"markapplied", func(xi Residual, acc []float32) { xi.Keep(acc); xi.MarkApplied([]int32{0, 2, 4}, []int32{1, 2, 3, 4}) },
			[]float32{1.5, -2.5, 0, 0.5, 0}},
		{"markallsent", func(xi Residual, acc []float32) { xi.Keep(acc); xi.MarkAllSent() },
			[]float32{0, 0, 0, 0, 0}},
		{"updatedense", func(xi Residual, acc []float32) { xi.UpdateDense(acc, []float32{1, 1, 1, 1, 1}) },
			[]float32{0.5, -3.5, 3, -0.5, -5}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			xi := Residual{0.5, -0.5, 1, 0, 0}
			acc := slices.Clone(g)
			xi.Compensate(acc)
			if want := []float32{1.5, -2.5, 4, 0.5, -4}; !slices.Equal(acc, want) {
				t.Fatalf("Compensate: G = %v, want g + ξ = %v", acc, want)
			}
			c.update(xi, acc)
			if !slices.Equal(xi, c.want) {
				t.Errorf("ξ = %v, want %v", xi, c.want)
			}
		})
	}
}

// TestResidualRange checks that the verbs act on a sliced range only (OMGS's dense segments,
// SparDL's blocks).
func TestResidualRange(t *testing.T) {
	xi := Residual{1, 2, 3, 4, 5, 6}
	g := []float32{10, 20, 30, 40, 50, 60}
	xi[2:4].Compensate(g[2:4])
	xi[2:4].MarkAllSent()
	xi[4:].MarkSent([]int32{1})
	if want := []float32{10, 20, 33, 44, 50, 60}; !slices.Equal(g, want) {
		t.Errorf("g = %v, want %v", g, want)
	}
	if want := []float32{1, 2, 0, 0, 5, 0}; !slices.Equal(xi, want) {
		t.Errorf("ξ = %v, want %v", xi, want)
	}
}
