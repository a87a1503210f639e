package gorgonia

import (
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"

	"github.com/spargo-dl/spargo/nn"
)

// The gorgonia MLP head and the same head written with spargo layers, with identical weights,
// give the same output and the same input and parameter gradients (within 1e-5), with a
// spargo layer in front of the block so that its input gradient flows on through spargo's
// tape. The block's parameters' grad-ready hooks fire once each, right after the block's
// backward and before the first layer's.
func TestBlockMatchesSpargoLayers(t *testing.T) {
	const n, in, feat, hidden, out = 6, 5, 7, 9, 4
	rng := rand.New(rand.NewPCG(1, 2))
	front := nn.NewLinear(in, feat, true, nn.NewRand(3))
	ref, l1, l2 := spargoMLP(feat, hidden, out, 4)
	blk := mustBlock(t, mlpBuild(feat, hidden, out, nil), 5, []int{n, feat})
	copyLinearInto(blk.OwnParams(), 0, l1)
	copyLinearInto(blk.OwnParams(), 2, l2)
	mixed := nn.NewSequential(front, blk)
	params := nn.Parameters(mixed)
	if got := names(params); !slices.Equal(got, []string{"0.weight", "0.bias", "1.fc1.weight", "1.fc1.bias", "1.fc2.weight", "1.fc2.bias"}) {
		t.Fatalf("parameter names %v", got)
	}
	x := randTensor(rng, n, in)
	dy := randSlice(rng, n*out)

	// Reference: the same front layer followed by spargo's MLP.
	tape := nn.NewTape()
	xv := tape.Input(x)
	yRef := ref.Forward(front.Forward(xv))
	if err := tape.BackwardFrom(yRef, dy); err != nil {
		t.Fatal(err)
	}
	want := map[string][]float32{"y": slices.Clone(yRef.Value.Data), "x": slices.Clone(xv.Grad.Data),
		"front.w": slices.Clone(front.Weight.Grad.Data), "front.b": slices.Clone(front.Bias.Grad.Data),
		"fc1.w": slices.Clone(l1.Weight.Grad.Data), "fc1.b": slices.Clone(l1.Bias.Grad.Data),
		"fc2.w": slices.Clone(l2.Weight.Grad.Data), "fc2.b": slices.Clone(l2.Bias.Grad.Data)}
	nn.ZeroGrad(params)

	tape = nn.NewTape()
	var ready []string
	tape.OnGradReady(func(p *nn.Param) { ready = append(ready, p.Name) })
	xv = tape.Input(x)
	y := mixed.Forward(xv)
	if err := tape.Err(); err != nil {
		t.Fatal(err)
	}
	if err := tape.BackwardFrom(y, dy); err != nil {
		t.Fatal(err)
	}
	ps := blk.OwnParams()
	closeTo(t, "output", y.Value.Data, want["y"], 1e-5)
	closeTo(t, "input gradient", xv.Grad.Data, want["x"], 1e-5)
	closeTo(t, "front weight gradient", front.Weight.Grad.Data, want["front.w"], 1e-5)
	closeTo(t, "front bias gradient", front.Bias.Grad.Data, want["front.b"], 1e-5)
	closeTo(t, "fc1.weight gradient", transposeGrad(ps[0].Grad.Data, feat, hidden), want["fc1.w"], 1e-5)
	closeTo(t, "fc1.bias gradient", ps[1].Grad.Data, want["fc1.b"], 1e-5)
	closeTo(t, "fc2.weight gradient", transposeGrad(ps[2].Grad.Data, hidden, out), want["fc2.w"], 1e-5)
	closeTo(t, "fc2.bias gradient", ps[3].Grad.Data, want["fc2.b"], 1e-5)
	if len(ready) != 6 || !slices.Equal(sorted(ready[:4]), sorted(names(ps))) || !slices.Equal(sorted(ready[4:]), []string{"0.bias", "0.weight"}) {
		t.Fatalf("grad-ready order %v: want the block's four parameters, then the front layer's", ready)
	}
}

// Central finite differences of L = Σ y·r (float64 sums, float32 parameters) against the
// block's gradients, on a tiny tanh MLP (smooth, so no kink sits between the probes).
func TestBlockFiniteDifferences(t *testing.T) {
	const n, in, hidden, out = 3, 4, 5, 2
	rng := rand.New(rand.NewPCG(9, 9))
	blk := mustBlock(t, mlpBuild(in, hidden, out, G.Tanh), 11, []int{n, in})
	x := randTensor(rng, n, in)
	r := randSlice(rng, n*out)
	tape := nn.NewTape()
	xv := tape.Input(x)
	y := blk.Forward(xv)
	if err := tape.BackwardFrom(y, r); err != nil {
		t.Fatal(err)
	}
	loss := func() float64 {
		tp := nn.NewTape()
		tp.SetGradEnabled(false)
		out := blk.Forward(tp.Const(x))
		if err := tp.Err(); err != nil {
			t.Fatal(err)
		}
		var s float64
		for i, v := range out.Value.Data {
			s += float64(v) * float64(r[i])
		}
		return s
	}
	const eps = 1e-2
	check := func(what string, val, grad []float32) {
		for i := range val {
			orig := val[i]
			val[i] = orig + eps
			lp := loss()
			val[i] = orig - eps
			lm := loss()
			val[i] = orig
			num := (lp - lm) / (2 * eps)
			if math.Abs(num-float64(grad[i])) > 2e-3*(1+math.Abs(num)) {
				t.Errorf("d/d%s[%d] = %.6g, finite difference %.6g", what, i, grad[i], num)
			}
		}
	}
	check("x", x.Data, xv.Grad.Data)
	for _, p := range blk.OwnParams() {
		check(p.Name, p.Value.Data, p.Grad.Data)
	}
}

// A batch of another size (the short last batch) builds a second graph and stays exact;
// going back reuses the first; MaxGraphs bounds the cache.
func TestBlockBatchSizeChanges(t *testing.T) {
	const in, hidden, out = 6, 8, 3
	ref, l1, l2 := spargoMLP(in, hidden, out, 21)
	blk := mustBlock(t, mlpBuild(in, hidden, out, nil), 22, []int{5, in})
	copyLinearInto(blk.OwnParams(), 0, l1)
	copyLinearInto(blk.OwnParams(), 2, l2)
	rng := rand.New(rand.NewPCG(3, 3))
	run := func(m nn.Module, x *nn.Tensor, dy []float32) (y, dx []float32) {
		tape := nn.NewTape()
		xv := tape.Input(x)
		yv := m.Forward(xv)
		if err := tape.BackwardFrom(yv, dy); err != nil {
			t.Fatalf("batch %d: %v", x.Shape[0], err)
		}
		return yv.Value.Data, xv.Grad.Data
	}
	for k, batch := range []int{5, 2, 5, 1, 2} {
		x, dy := randTensor(rng, batch, in), randSlice(rng, batch*out)
		nn.ZeroGrad(nn.Parameters(blk))
		y, dx := run(blk, x, dy)
		y, dx = slices.Clone(y), slices.Clone(dx)
		nn.ZeroGrad(nn.Parameters(ref))
		yRef, dxRef := run(ref, x, dy)
		closeTo(t, "output", y, yRef, 1e-5)
		closeTo(t, "input gradient", dx, dxRef, 1e-5)
		closeTo(t, "fc2.bias gradient", blk.OwnParams()[3].Grad.Data, l2.Bias.Grad.Data, 1e-5)
		if want := []int{1, 2, 2, 3, 3}[k]; blk.Graphs() != want {
			t.Fatalf("after batch %d: %d graphs cached, want %d", batch, blk.Graphs(), want)
		}
	}
	blk.MaxGraphs = 1
	x := randTensor(rng, 4, in)
	nn.ZeroGrad(nn.Parameters(ref))
	y, _ := run(blk, x, randSlice(rng, 4*out))
	if blk.Graphs() != 1 {
		t.Fatalf("MaxGraphs 1: %d graphs cached", blk.Graphs())
	}
	tape := nn.NewTape()
	closeTo(t, "output after eviction", y, ref.Forward(tape.Const(x)).Value.Data, 1e-5)
}

// Parameters share memory with the graph: an in-place update (what optimizers do) changes the
// next forward, and running forward and backward leaves the values untouched (gorgonia never
// writes into an input node's value).
func TestBlockParamsShareMemory(t *testing.T) {
	blk := mustBlock(t, mlpBuild(3, 4, 2, nil), 31, []int{2, 3})
	x := randTensor(rand.New(rand.NewPCG(1, 1)), 2, 3)
	forward := func() []float32 {
		tape := nn.NewTape()
		y := blk.Forward(tape.Input(x))
		if err := tape.BackwardFrom(y, []float32{1, 2, 3, 4}); err != nil {
			t.Fatal(err)
		}
		return slices.Clone(y.Value.Data)
	}
	before := paramHash(blk.OwnParams())
	y0 := forward()
	if paramHash(blk.OwnParams()) != before {
		t.Fatal("forward and backward changed the parameters")
	}
	gr := blk.graphs[shapeKey([][]int{{2, 3}})]
	for j, p := range blk.OwnParams() {
		got, err := valueFloat32s(gr.params[j].Value())
		if err != nil || !sameMemory(got, p.Value.Data) {
			t.Fatalf("%s: the graph's value does not share the parameter's memory (%v)", p.Name, err)
		}
	}
	orig := blk.OwnParams()[3].Value.Data[1]
	blk.OwnParams()[3].Value.Data[1] = orig + 1 // fc2.bias[1]
	y1 := forward()
	if y1[0] != y0[0] || y1[2] != y0[2] || y1[1] != y0[1]+1 || y1[3] != y0[3]+1 {
		t.Fatalf("after bias[1] += 1: %v, before %v", y1, y0)
	}
	// A replaced Value (not written in place) is picked up too.
	p := blk.OwnParams()[3]
	p.Value = p.Value.Clone()
	p.Value.Data[1] = orig
	closeTo(t, "after replacing the bias tensor", forward(), y0, 0)
}

// In evaluation (gradients off) the block computes its output and records nothing.
func TestBlockEvaluation(t *testing.T) {
	blk := mustBlock(t, mlpBuild(3, 4, 2, nil), 41, []int{2, 3})
	tape := nn.NewTape()
	tape.SetGradEnabled(false)
	y := blk.Forward(tape.Const(nn.NewTensor(7, 3)))
	if err := tape.Err(); err != nil || !slices.Equal(y.Shape(), []int{7, 2}) || y.NeedsGrad() {
		t.Fatalf("eval: err %v, shape %v, needsGrad %v", err, y.Shape(), y.NeedsGrad())
	}
}

// Two inputs: y = x0·W + x1 (a residual join), against spargo's Linear(no bias) + Add.
func TestBlockTwoInputs(t *testing.T) {
	const n, d = 3, 4
	lin := nn.NewLinear(d, d, false, nn.NewRand(51))
	blk := mustBlock(t, func(b *Builder, xs ...*G.Node) (*G.Node, error) {
		w := b.Param("weight", Zeros, d, d)
		return G.Add(G.Must(G.Mul(xs[0], w)), xs[1])
	}, 52, []int{n, d}, []int{n, d})
	w := blk.OwnParams()[0].Value.Data
	for o := 0; o < d; o++ {
		for i := 0; i < d; i++ {
			w[i*d+o] = lin.Weight.Value.Data[o*d+i]
		}
	}
	rng := rand.New(rand.NewPCG(5, 5))
	x0, x1, dy := randTensor(rng, n, d), randTensor(rng, n, d), randSlice(rng, n*d)
	tape := nn.NewTape()
	a, b := tape.Input(x0), tape.Input(x1)
	yRef := nn.Add(lin.Forward(a), b)
	if err := tape.BackwardFrom(yRef, dy); err != nil {
		t.Fatal(err)
	}
	tape2 := nn.NewTape()
	a2, b2 := tape2.Input(x0), tape2.Input(x1)
	y := blk.Apply(a2, b2)
	if err := tape2.BackwardFrom(y, dy); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "output", y.Value.Data, yRef.Value.Data, 1e-5)
	closeTo(t, "first input gradient", a2.Grad.Data, a.Grad.Data, 1e-5)
	closeTo(t, "second input gradient", b2.Grad.Data, b.Grad.Data, 1e-5)
	closeTo(t, "weight gradient", transposeGrad(blk.OwnParams()[0].Grad.Data, d, d), lin.Weight.Grad.Data, 1e-5)
	if tape3 := nn.NewTape(); blk.Forward(tape3.Input(x0)) != nil && (tape3.Err() == nil || !strings.Contains(tape3.Err().Error(), "1 inputs, built for 2")) {
		t.Fatalf("one input to a two-input block: %v", tape3.Err())
	}
}

// Mistakes in the build function, gorgonia panics and refused ops are errors, at NewBlock or
// on the tape, never panics.
func TestBlockErrors(t *testing.T) {
	rng := nn.NewRand(1)
	for _, tc := range []struct {
		name  string
		build BuildFunc
		want  string
	}{
		{"build error", func(*Builder, ...*G.Node) (*G.Node, error) { return nil, errors.New("no can do") }, "no can do"},
		{"panic", func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			w := b.Param("w", Zeros, 5, 5) // [2 3]·[5 5]: gorgonia's Must panics
			return G.Must(G.Mul(xs[0], w)), nil
		}, "gorgonia panicked"},
		{"unused parameter", func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			b.Param("w", Zeros, 3, 3)
			return G.Tanh(xs[0])
		}, `parameter "w" is declared but not used`},
		{"duplicate name", func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			w := b.Param("w", Zeros, 3)
			w2 := b.Param("w", Zeros, 3)
			return G.BroadcastAdd(xs[0], G.Must(G.Add(w, w2)), nil, []byte{0})
		}, `"w" declared twice`},
		{"dropout", func(b *Builder, xs ...*G.Node) (*G.Node, error) { return G.Dropout(xs[0], 0.5) }, "nn.Dropout"},
		{"inverse sqrt", func(b *Builder, xs ...*G.Node) (*G.Node, error) { return G.InverseSqrt(xs[0]) }, "InverseSqrt"},
		{"nil output", func(*Builder, ...*G.Node) (*G.Node, error) { return nil, nil }, "no output node"},
		{"float64 output", func(b *Builder, xs ...*G.Node) (*G.Node, error) {
			return G.NewMatrix(b.Graph(), G.Float64, G.WithShape(2, 3), G.WithName("f64")), nil
		}, "float32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewBlock(tc.build, rng, []int{2, 3})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to mention %q", err, tc.want)
			}
		})
	}

	// A shape the graph cannot take, met at Forward: the tape's error, then Backward's.
	blk := mustBlock(t, mlpBuild(3, 4, 2, nil), 61, []int{2, 3})
	tape := nn.NewTape()
	y := blk.Forward(tape.Input(nn.NewTensor(2, 5)))
	if err := tape.Err(); err == nil || !strings.Contains(err.Error(), "[[2 5]]") {
		t.Fatalf("wrong width: %v", err)
	}
	if err := tape.Backward(nn.CrossEntropy(y, []int{0})); err == nil {
		t.Fatal("Backward after a failed forward returned nil")
	}
	if blk.Graphs() != 1 {
		t.Fatalf("a failed build was cached: %d graphs", blk.Graphs())
	}
	if _, err := NewBlock(nil, rng, []int{1}); err == nil {
		t.Fatal("nil build accepted")
	}
	if _, err := NewBlock(mlpBuild(3, 4, 2, nil), nil, []int{2, 3}); err == nil {
		t.Fatal("nil rng accepted")
	}
	if _, err := NewBlock(mlpBuild(3, 4, 2, nil), rng); err == nil {
		t.Fatal("no input shapes accepted")
	}
	// A build function that declares other parameters for another shape.
	calls := 0
	fickle := mustBlock(t, func(b *Builder, xs ...*G.Node) (*G.Node, error) {
		calls++
		w := b.Param("w", Zeros, 3, 1+calls)
		return G.Mul(xs[0], w)
	}, 1, []int{2, 3})
	tape = nn.NewTape()
	fickle.Forward(tape.Input(nn.NewTensor(4, 3)))
	if err := tape.Err(); err == nil || !strings.Contains(err.Error(), "the first build declared") {
		t.Fatalf("changed parameters: %v", err)
	}
}

func names(ps []*nn.Param) []string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.Name
	}
	return s
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func paramHash(ps []*nn.Param) uint64 {
	h := fnv.New64a()
	for _, p := range ps {
		for _, v := range p.Value.Data {
			b := math.Float32bits(v)
			h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
		}
	}
	return h.Sum64()
}

// A block applied twice in one forward (weight sharing, or one head on two inputs of the same
// shape) uses one cached graph for both calls: each backward rebinds its own input and
// upstream gradient, the parameter gradients add up, and each parameter's hook fires once,
// after the backward of the first application (which runs last).
func TestBlockAppliedTwice(t *testing.T) {
	const n, d = 3, 4
	ref, l1, l2 := spargoMLP(d, 5, d, 71)
	blk := mustBlock(t, mlpBuild(d, 5, d, nil), 72, []int{n, d})
	copyLinearInto(blk.OwnParams(), 0, l1)
	copyLinearInto(blk.OwnParams(), 2, l2)
	rng := rand.New(rand.NewPCG(7, 7))
	x, dy := randTensor(rng, n, d), randSlice(rng, n*d)
	run := func(m nn.Module) (dx []float32, fired map[string]int) {
		tape := nn.NewTape()
		fired = map[string]int{}
		tape.OnGradReady(func(p *nn.Param) { fired[p.Name]++ })
		xv := tape.Input(x)
		y := m.Forward(nn.Relu(m.Forward(xv)))
		if err := tape.BackwardFrom(y, dy); err != nil {
			t.Fatal(err)
		}
		return xv.Grad.Data, fired
	}
	dxRef, _ := run(ref)
	dx, fired := run(blk)
	closeTo(t, "input gradient", dx, dxRef, 1e-5)
	closeTo(t, "fc1.weight gradient", transposeGrad(blk.OwnParams()[0].Grad.Data, d, 5), l1.Weight.Grad.Data, 1e-5)
	closeTo(t, "fc2.bias gradient", blk.OwnParams()[3].Grad.Data, l2.Bias.Grad.Data, 1e-5)
	if blk.Graphs() != 1 || len(fired) != 4 {
		t.Fatalf("%d graphs, hooks fired %v", blk.Graphs(), fired)
	}
	for name, k := range fired {
		if k != 1 {
			t.Errorf("%s: grad-ready fired %d times", name, k)
		}
	}
}

// A parameter whose Value was replaced by a tensor of another shape is an error on the tape.
func TestBlockParamShapeChanged(t *testing.T) {
	blk := mustBlock(t, mlpBuild(3, 4, 2, nil), 81, []int{2, 3})
	blk.OwnParams()[1].Value = nn.NewTensor(5)
	tape := nn.NewTape()
	blk.Forward(tape.Input(nn.NewTensor(2, 3)))
	if err := tape.Err(); err == nil || !strings.Contains(err.Error(), "no longer has shape [4]") {
		t.Fatalf("err %v", err)
	}
}

// recoverInto turns a panic into an error that names the panicking function and place.
func TestRecoverInto(t *testing.T) {
	err := func() (err error) {
		defer recoverInto(&err)
		G.Must(nil, errors.New("inner failure"))
		return nil
	}()
	if err == nil || !strings.Contains(err.Error(), "inner failure") || !strings.Contains(err.Error(), "gorgonia.Must at ") {
		t.Fatalf("err %v", err)
	}
}
