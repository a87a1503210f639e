package gorgonia

import (
	"math"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/spargo-dl/spargo/nn"
)

// The gorgonia v0.9.18 bugs that the package documentation lists and that Block refuses the
// ops for, reproduced on gorgonia itself. If a later gorgonia fixes one, its subtest fails:
// update doc.go and unsupported() then.
func TestGorgoniaKnownBugs(t *testing.T) {
	t.Run("InverseSqrt gradient", func(t *testing.T) {
		g := G.NewGraph()
		x := G.NewVector(g, tensor.Float32, G.WithShape(1), G.WithName("x"), G.WithValue(tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{4}))))
		cost := G.Must(G.Sum(G.Must(G.InverseSqrt(x))))
		grads, err := G.Grad(cost, x)
		if err != nil {
			t.Fatal(err)
		}
		runAll(t, g)
		got := grads[0].Value().Data().([]float32)[0]
		right := -0.5 * math.Pow(4, -1.5) // d/dx x^(-1/2) = -1/16
		if math.Abs(float64(got)-right) < 1e-3 {
			t.Fatalf("gorgonia's InverseSqrt gradient is now right (%v): allow the op in Block and update the docs", got)
		}
		if math.Abs(float64(got)-(-4)) > 1e-3 { // -1/(2y³) with y = 1/2
			t.Fatalf("gorgonia's InverseSqrt gradient is %v, neither right (%v) nor the known wrong -4", got, right)
		}
	})
	t.Run("Dropout gradient", func(t *testing.T) {
		const p = 0.25
		ones := make([]float32, 400)
		for i := range ones {
			ones[i] = 1
		}
		g := G.NewGraph()
		x := G.NewVector(g, tensor.Float32, G.WithShape(len(ones)), G.WithName("x"), G.WithValue(tensor.New(tensor.WithShape(len(ones)), tensor.WithBacking(ones))))
		y := G.Must(G.Dropout(x, p))
		grads, err := G.Grad(G.Must(G.Sum(y)), x)
		if err != nil {
			t.Fatal(err)
		}
		runAll(t, g)
		ys, dx := y.Value().Data().([]float32), grads[0].Value().Data().([]float32)
		kept := 0
		for i := range ys {
			if ys[i] == 0 {
				continue
			}
			kept++
			// Kept elements are scaled by 1/(1-p) in the forward; the gradient should be the
			// same factor, gorgonia's is 1/p.
			if math.Abs(float64(ys[i])-1/(1-p)) > 1e-5 {
				t.Fatalf("forward: kept element %d is %v, want 1/(1-p)", i, ys[i])
			}
			if math.Abs(float64(dx[i])-1/(1-p)) < 1e-5 {
				t.Fatalf("gorgonia's Dropout gradient is now right: allow the op? (still random per run) and update the docs")
			}
			if math.Abs(float64(dx[i])-1/p) > 1e-5 {
				t.Fatalf("gorgonia's Dropout gradient at %d is %v, neither 1/(1-p) nor the known wrong 1/p", i, dx[i])
			}
		}
		if kept == 0 {
			t.Fatal("dropout kept nothing")
		}
	})
	t.Run("BatchNorm running variance", func(t *testing.T) {
		g := G.NewGraph()
		x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 3, 2, 2), G.WithName("x"))
		_, _, _, op, err := G.BatchNorm(x, nil, nil, 0.9, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		_, variance := op.Stats()
		for i, v := range variance.Data().([]float32) {
			if v != 0 {
				t.Fatalf("running variance[%d] starts at %v now (PyTorch: 1, gorgonia v0.9.18: 0): update the docs", i, v)
			}
		}
		_, err = NewBlock(func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			y, _, _, _, err := G.BatchNorm(xs[0], nil, nil, 0.9, 1e-5)
			return y, err
		}, nn.NewRand(1), []int{2, 3, 2, 2})
		if err == nil || !strings.Contains(err.Error(), "nn.BatchNorm2d") {
			t.Fatalf("a block with gorgonia's BatchNorm: %v", err)
		}
	})
}

func runAll(t *testing.T, g *G.ExprGraph) {
	t.Helper()
	vm := G.NewTapeMachine(g)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
}

// What the refusal of InverseSqrt recommends instead has the right gradient in a Block:
// d/dx x^(-1/2) = -x^(-3/2)/2.
func TestInverseSqrtReplacements(t *testing.T) {
	for name, f := range map[string]func(*G.Node) (*G.Node, error){
		"Inverse(Sqrt(x))": func(x *G.Node) (*G.Node, error) { return G.Inverse(G.Must(G.Sqrt(x))) },
		"Pow(x, -0.5)":     func(x *G.Node) (*G.Node, error) { return G.Pow(x, G.NewConstant(float32(-0.5))) },
	} {
		blk := mustBlock(t, func(b *Builder, xs ...*G.Node) (*G.Node, error) { return f(xs[0]) }, 1, []int{3})
		tape := nn.NewTape()
		x, _ := nn.FromSlice([]float32{4, 9, 0.25}, 3)
		xv := tape.Input(x)
		if err := tape.BackwardFrom(blk.Forward(xv), []float32{1, 2, 3}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := make([]float32, 3)
		for i, v := range x.Data {
			want[i] = float32(float64(i+1) * -0.5 * math.Pow(float64(v), -1.5))
		}
		closeTo(t, name+" gradient", xv.Grad.Data, want, 1e-6)
	}
}
