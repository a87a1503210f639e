package gorgonia

import (
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/spargo-dl/spargo/nn"
)

// buildMu serialises graph construction, differentiation and compilation across every
// Block of the process. Gorgonia does not say that building graphs from several goroutines
// is safe (construction goes through package-level node pools and shared constant nodes),
// and every in-process DDP worker builds its replica's blocks at the same moment. It is
// taken once per block and input shape; running compiled programs is not serialised (each
// graph has its own machines, as in gorgonia's concurrent-training example).
var buildMu sync.Mutex

// upstreamGradName names the node that takes the upstream gradient; Builder.Param refuses it
// (gorgonia merges input nodes of equal name, type and shape).
const upstreamGradName = "upstream_grad"

// graph is a Block's expression graph for one set of input shapes, with its two programs.
type graph struct {
	key      string
	g        *G.ExprGraph
	inputs   G.Nodes
	params   G.Nodes
	out      *G.Node
	outShape []int
	dy       *G.Node // upstream gradient, shaped like out
	grads    G.Nodes // d⟨out, dy⟩ with respect to inputs..., params...
	fwd      G.VM    // computes out
	bwd      G.VM    // computes out again and grads
	lastUse  int64
}

// newGraph builds the graph for the input shapes: the user's forward, the symbolic
// vector-Jacobian product from an upstream-gradient input node, and the two programs.
func (b *Block) newGraph(shapes [][]int, first bool) (*graph, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	gr, err := b.buildGraph(shapes, first)
	if err != nil {
		return nil, fmt.Errorf("building the graph for input shapes %v: %w", shapes, err)
	}
	return gr, nil
}

func (b *Block) buildGraph(shapes [][]int, first bool) (gr *graph, err error) {
	defer recoverInto(&err)
	g := G.NewGraph()
	inputs := make(G.Nodes, len(shapes))
	for i, s := range shapes {
		if len(s) == 0 || slices.ContainsFunc(s, func(d int) bool { return d <= 0 }) {
			return nil, fmt.Errorf("input %d has shape %v: want at least one dimension, all positive", i, s)
		}
		inputs[i] = G.NewTensor(g, tensor.Float32, len(s), G.WithShape(s...), G.WithName(fmt.Sprintf("input%d", i)))
	}
	bld := &Builder{g: g, blk: b, first: first, inputs: inputs}
	out, buildErr := b.build(bld, inputs...)
	switch {
	case bld.err != nil:
		return nil, fmt.Errorf("declaring parameters: %v", bld.err)
	case buildErr != nil:
		return nil, fmt.Errorf("build function: %w", buildErr)
	case out == nil:
		return nil, fmt.Errorf("build function returned no output node")
	case !first && len(bld.nodes) != len(b.params):
		return nil, fmt.Errorf("the build declared %d parameters, the first build %d", len(bld.nodes), len(b.params))
	case out.Graph() != g:
		return nil, fmt.Errorf("the output node is not on the Builder's graph")
	case out.Dtype() != tensor.Float32:
		return nil, fmt.Errorf("output dtype %v, spargo tensors hold float32", out.Dtype())
	}
	for _, n := range g.AllNodes() {
		if why := unsupported(n); why != "" {
			return nil, fmt.Errorf("node %v: %s", n, why)
		}
	}
	for i, n := range inputs {
		if g.To(n.ID()).Len() == 0 && n != out {
			return nil, fmt.Errorf("input %d is not used by the graph", i)
		}
	}
	for _, n := range bld.nodes {
		if g.To(n.ID()).Len() == 0 && n != out {
			return nil, fmt.Errorf("parameter %q is declared but not used by the graph", n.Name())
		}
	}
	gr = &graph{key: shapeKey(shapes), g: g, inputs: inputs, params: bld.nodes, out: out}
	gr.outShape = append([]int{}, out.Shape()...)
	if len(gr.outShape) == 0 {
		gr.dy = G.NewScalar(g, tensor.Float32, G.WithName(upstreamGradName))
	} else {
		gr.dy = G.NewTensor(g, tensor.Float32, len(gr.outShape), G.WithShape(gr.outShape...), G.WithName(upstreamGradName))
	}
	wrt := append(slices.Clone(inputs), bld.nodes...)
	if gr.grads, err = G.Backpropagate(G.Nodes{out}, G.Nodes{gr.dy}, wrt); err != nil {
		return nil, fmt.Errorf("differentiating: %v", err)
	}
	prog, locMap, err := G.CompileFunction(g, wrt, G.Nodes{out})
	if err != nil {
		return nil, fmt.Errorf("compiling the forward program: %v", err)
	}
	gr.fwd = G.NewTapeMachine(g, G.WithPrecompiled(prog, locMap))
	gr.bwd = G.NewTapeMachine(g) // the whole graph: forward and gradients
	return gr, nil
}

// unsupported explains why a Block refuses a node's op, or returns "". The backward program
// recomputes the forward, so an op must give the same result twice and keep no state; and
// ops whose gradients we measured to be wrong are refused rather than trained with.
func unsupported(n *G.Node) string {
	op := n.Op()
	if op == nil {
		return ""
	}
	typ := fmt.Sprintf("%T", op)
	switch {
	case strings.HasSuffix(typ, ".dropoutOp") || strings.HasSuffix(typ, ".dropoutDiffOp"):
		return "gorgonia's Dropout is not accepted: it is random (the backward program recomputes the forward, so the masks would differ) and its gradient divides by p instead of 1-p; apply nn.Dropout outside the block"
	case strings.HasSuffix(typ, ".randomOp"):
		return "random nodes are not accepted: the backward program recomputes the forward and would draw different numbers"
	case strings.HasSuffix(typ, ".BatchNormOp") || strings.HasSuffix(typ, ".batchnormDiffOp"):
		return "gorgonia's BatchNorm is not accepted: it keeps running statistics (updated twice per step by the recomputation, and its running variance starts at 0); use nn.BatchNorm2d outside the block"
	case op.String() == "invSqrt":
		return "gorgonia's InverseSqrt is not accepted: its gradient is wrong (-g/(2y³) instead of -g·y³/2); write it as Inverse(Sqrt(x)) or Pow(x, -0.5)"
	}
	return ""
}

// bind points the graph's input and parameter nodes at spargo memory (no copies).
func (gr *graph) bind(xs []*nn.Var, params []*tensor.Dense) error {
	for i, x := range xs {
		if err := G.Let(gr.inputs[i], ToDense(x.Value)); err != nil {
			return fmt.Errorf("binding input %d: %w", i, err)
		}
	}
	for j, v := range params {
		if err := G.Let(gr.params[j], v); err != nil {
			return fmt.Errorf("binding parameter %s: %w", gr.params[j].Name(), err)
		}
	}
	return nil
}

// forward runs the forward program and returns the output's values (gorgonia's memory,
// valid until this graph's next run).
func (gr *graph) forward(xs []*nn.Var, params []*tensor.Dense) (out []float32, err error) {
	defer recoverInto(&err)
	if err := gr.bind(xs, params); err != nil {
		return nil, err
	}
	defer gr.fwd.Reset()
	if err := gr.fwd.RunAll(); err != nil {
		return nil, err
	}
	if out, err = valueFloat32s(gr.out.Value()); err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	if len(out) != nnNumel(gr.outShape) {
		return nil, fmt.Errorf("output has %d values, its shape %v needs %d", len(out), gr.outShape, nnNumel(gr.outShape))
	}
	return out, nil
}

// backward runs the backward program with upstream gradient dy and returns the gradients
// of the inputs, then of the parameters (gorgonia's memory, valid until the next run).
func (gr *graph) backward(xs []*nn.Var, params []*tensor.Dense, dy []float32) (grads [][]float32, err error) {
	defer recoverInto(&err)
	if err := gr.bind(xs, params); err != nil {
		return nil, err
	}
	var dyVal G.Value
	if len(gr.outShape) == 0 {
		dyVal = G.NewF32(dy[0])
	} else {
		dyVal = tensor.New(tensor.WithShape(gr.outShape...), tensor.WithBacking(dy))
	}
	if err := G.Let(gr.dy, dyVal); err != nil {
		return nil, fmt.Errorf("binding the upstream gradient: %w", err)
	}
	defer gr.bwd.Reset()
	if err := gr.bwd.RunAll(); err != nil {
		return nil, err
	}
	grads = make([][]float32, len(gr.grads))
	for k, n := range gr.grads {
		if grads[k], err = valueFloat32s(n.Value()); err != nil {
			what := fmt.Sprintf("input %d", k)
			if k >= len(gr.inputs) {
				what = "parameter " + gr.params[k-len(gr.inputs)].Name()
			}
			return nil, fmt.Errorf("gradient of %s: %w", what, err)
		}
	}
	return grads, nil
}

// recoverInto turns a panic inside gorgonia into an error, so that no panic escapes a
// Block: an error reaches the tape and the training loop instead of killing every worker.
func recoverInto(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("gorgonia panicked: %v (in %s)", r, panicSite(debug.Stack()))
	}
}

// panicSite returns the function and file:line that panicked, from a stack trace taken in
// the deferred recover: the first frame after the runtime's panic frame.
func panicSite(stack []byte) string {
	lines := strings.Split(string(stack), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "panic(") && i+3 < len(lines) {
			fn := lines[i+2]
			if k := strings.LastIndexByte(fn, '('); k > 0 {
				fn = fn[:k]
			}
			loc := strings.TrimSpace(lines[i+3])
			if k := strings.LastIndex(loc, " +0x"); k > 0 {
				loc = loc[:k]
			}
			return fn + " at " + loc
		}
	}
	return "unknown location"
}
