package gorgonia

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/spargo-dl/spargo/nn"
)

// BuildFunc constructs a block's expression graph: from the input nodes (float32 tensors of
// the shapes being run, created by the Block on b.Graph()) and the learnables it declares
// with b.Param, it returns the output node. It is called once per distinct set of input
// shapes (a smaller last batch, an evaluation batch) and must declare the same parameters,
// in the same order and with the same shapes, every time. Gorgonia's Must-style panics are
// recovered and reported as errors.
type BuildFunc func(b *Builder, inputs ...*G.Node) (*G.Node, error)

// Init fills a new parameter's values (row-major, len(data) = product of shape) when a
// block is created. Draw only from rng, so that the same seed gives the same model.
type Init func(data []float32, shape []int, rng *rand.Rand)

// Zeros leaves a parameter at 0 (biases).
func Zeros(data []float32, _ []int, _ *rand.Rand) { clear(data) }

// Uniform draws from U(-bound, bound), with nn.Uniform.
func Uniform(bound float64) Init {
	return func(data []float32, _ []int, rng *rand.Rand) { nn.Uniform(data, bound, rng) }
}

// KaimingUniform draws from U(-1/sqrt(fanIn), 1/sqrt(fanIn)): PyTorch's default for the
// weight and bias of a Linear layer with fanIn inputs (nn.NewLinear's). Gorgonia's own
// initialisers (GlorotU, …) draw from a global, unseeded generator; use these instead.
func KaimingUniform(fanIn int) Init { return Uniform(1 / math.Sqrt(float64(fanIn))) }

// Values copies src (len = product of shape) into the parameter.
func Values(src []float32) Init {
	return func(data []float32, _ []int, _ *rand.Rand) { copy(data, src) }
}

// Builder is what a BuildFunc builds with: the graph, and the declaration of the block's
// learnables.
type Builder struct {
	g      *G.ExprGraph
	blk    *Block
	first  bool // building for NewBlock: Param creates the nn.Params
	inputs G.Nodes
	nodes  G.Nodes // declared parameters, in order
	err    error   // the first misuse of Param
}

// Graph returns the expression graph to build on.
func (b *Builder) Graph() *G.ExprGraph { return b.g }

// Param declares a learnable of the given shape (at least one dimension) and returns its
// node. The first build creates an nn.Param with local name name — its full name is the
// block's path in the model plus name, e.g. "head.fc1.weight", so names may contain dots —
// filled by init from the block's generator; later builds (other input shapes) return a node
// of the new graph bound to the same memory. A misuse (empty or repeated name, a shape that
// differs from the first build's) is reported by NewBlock or Forward; Param still returns a
// usable node so that the build can go on.
func (b *Builder) Param(name string, init Init, shape ...int) *G.Node {
	j := len(b.nodes)
	fail := func(format string, args ...any) {
		if b.err == nil {
			b.err = fmt.Errorf(format, args...)
		}
	}
	switch {
	case name == "":
		fail("parameter %d has an empty name", j)
	case len(shape) == 0:
		fail("parameter %q has no dimensions (declare a scalar as shape 1)", name)
	case slices.ContainsFunc(shape, func(d int) bool { return d <= 0 }):
		fail("parameter %q has shape %v: every dimension must be positive", name, shape)
		shape = []int{1}
	}
	for _, n := range b.nodes {
		if n.Name() == name {
			fail("parameter %q declared twice", name)
		}
	}
	for _, n := range b.inputs {
		if n.Name() == name {
			fail("parameter name %q is the name of an input node", name)
		}
	}
	if name == upstreamGradName {
		fail("parameter name %q is reserved for the upstream gradient's node", name)
	}
	if b.first {
		p := nn.NewParam(name, shape...)
		if init != nil && b.err == nil {
			init(p.Value.Data, p.Value.Shape, b.blk.rng)
		}
		b.blk.params = append(b.blk.params, p)
		b.blk.local = append(b.blk.local, name)
		b.blk.shapes = append(b.blk.shapes, slices.Clone(shape))
		b.blk.views = append(b.blk.views, nil)
	} else if j >= len(b.blk.params) {
		fail("parameter %q: the first build declared %d parameters, this one declares more", name, len(b.blk.params))
	} else if b.blk.local[j] != name || !slices.Equal(b.blk.shapes[j], shape) {
		fail("parameter %d is %q %v, the first build declared %q %v", j, name, shape, b.blk.local[j], b.blk.shapes[j])
	}
	n := G.NewTensor(b.g, tensor.Float32, len(shape), G.WithShape(shape...), G.WithName(name))
	b.nodes = append(b.nodes, n)
	return n
}

// Block is an nn.Module whose computation is a gorgonia expression graph built by a user
// function. Its learnables are ordinary nn.Params that share memory with the graph's values,
// so optimizers, checkpoints, DDP's buckets and every comm hook treat them like any other.
//
// Forward (or Apply, for several inputs) runs the graph's forward program on gorgonia's
// TapeMachine and records one op on the spargo tape; when backward reaches it, a second
// program — the forward again plus the graph's symbolic vector-Jacobian product, built once
// with gorgonia.Backpropagate from the upstream gradient — computes the input and parameter
// gradients, which are added to the Vars' and Params' Grad; then the tape fires the
// grad-ready hooks of the block's parameters. The recomputation is the price of gorgonia's
// VM, which runs a compiled program from start to end and cannot stop between the forward
// and backward halves.
//
// Graphs are cached per input shapes (at most MaxGraphs, least recently used dropped). A
// Block is used by one goroutine at a time, like the Tape it records on.
type Block struct {
	// MaxGraphs bounds the graphs kept (default DefaultMaxGraphs).
	MaxGraphs int

	build     BuildFunc
	rng       *rand.Rand
	numInputs int
	params    []*nn.Param
	local     []string        // declared names, kept apart from Param.Name which Parameters rewrites
	shapes    [][]int         // declared shapes
	views     []*tensor.Dense // ToDense(params[j].Value), rebuilt if the Value's memory changes
	graphs    map[string]*graph
	tick      int64
}

// DefaultMaxGraphs is how many input-shape graphs a Block keeps: training, a short last
// batch and evaluation batches fit with room to spare.
const DefaultMaxGraphs = 8

var (
	_ nn.Module     = (*Block)(nil)
	_ nn.ParamOwner = (*Block)(nil)
)

// NewBlock builds the graph for the given input shapes (one per input; the first dimension
// is usually the batch), declares the block's parameters and initialises them from rng.
// Errors — from build, from gorgonia's graph construction, differentiation or compilation,
// or a gorgonia op a Block does not accept (see the package documentation) — are returned.
func NewBlock(build BuildFunc, rng *rand.Rand, inputShapes ...[]int) (*Block, error) {
	if build == nil {
		return nil, fmt.Errorf("nn/gorgonia: NewBlock: nil build function")
	}
	if rng == nil {
		return nil, fmt.Errorf("nn/gorgonia: NewBlock: nil random generator (pass nn.NewRand(seed))")
	}
	if len(inputShapes) == 0 {
		return nil, fmt.Errorf("nn/gorgonia: NewBlock: no input shapes (give one per input, e.g. []int{batch, features})")
	}
	b := &Block{MaxGraphs: DefaultMaxGraphs, build: build, rng: rng, numInputs: len(inputShapes), graphs: map[string]*graph{}}
	shapes := make([][]int, len(inputShapes))
	for i, s := range inputShapes {
		shapes[i] = slices.Clone(s)
	}
	gr, err := b.newGraph(shapes, true)
	if err != nil {
		return nil, fmt.Errorf("nn/gorgonia: NewBlock: %w", err)
	}
	b.graphs[gr.key] = gr
	b.rng = nil // initialisation only
	return b, nil
}

// OwnParams returns the declared parameters in declaration order.
func (b *Block) OwnParams() []*nn.Param { return b.params }

// NumInputs returns how many inputs the block takes.
func (b *Block) NumInputs() int { return b.numInputs }

// Graphs returns how many input-shape graphs are cached.
func (b *Block) Graphs() int { return len(b.graphs) }

// Forward runs a one-input block on x.
func (b *Block) Forward(x *nn.Var) *nn.Var { return b.Apply(x) }

// Apply runs the block on its inputs (all on one tape) and records it there. Errors
// (a wrong number of inputs, shapes the build function rejects, a failure inside gorgonia)
// are recorded on the tape and reported by its Err and Backward, as for built-in layers.
func (b *Block) Apply(xs ...*nn.Var) *nn.Var {
	if len(xs) == 0 || xs[0] == nil {
		// No tape to report on: the caller gets a Var on a fresh tape whose Err says why.
		return nn.NewTape().Fail(fmt.Errorf("nn/gorgonia: Block.Apply: no input Var"), 1)
	}
	t := xs[0].Tape()
	if t.Err() != nil {
		return t.Fail(nil, 1)
	}
	if len(xs) != b.numInputs {
		return t.Fail(fmt.Errorf("nn/gorgonia: block %s: %d inputs, built for %d", b.describe(), len(xs), b.numInputs), 1)
	}
	shapes := make([][]int, len(xs))
	for i, x := range xs {
		if x == nil || x.Tape() != t {
			return t.Fail(fmt.Errorf("nn/gorgonia: block %s: input %d is nil or on another tape", b.describe(), i), 1)
		}
		shapes[i] = x.Shape()
	}
	gr, err := b.graphFor(shapes)
	if err != nil {
		return t.Fail(fmt.Errorf("nn/gorgonia: block %s: %w", b.describe(), err), 1)
	}
	if err := b.refreshViews(); err != nil {
		return t.Fail(fmt.Errorf("nn/gorgonia: block %s: %w", b.describe(), err), gr.outShape...)
	}
	out, err := gr.forward(xs, b.views)
	if err != nil {
		return t.Fail(fmt.Errorf("nn/gorgonia: block %s: forward on input shapes %v: %w", b.describe(), shapes, err), gr.outShape...)
	}
	y := t.Alloc(gr.outShape...)
	copy(y.Data, out) // gorgonia's buffers are reused by its next run; the tape's live until Reset
	inputs := make([]*nn.Var, 0, len(xs)+len(b.params))
	inputs = append(inputs, xs...)
	pvs := make([]*nn.Var, len(b.params))
	for j, p := range b.params {
		pvs[j] = t.Param(p)
		inputs = append(inputs, pvs[j])
	}
	views := slices.Clone(b.views)
	return t.Custom(y, func(dy []float32) error {
		grads, err := gr.backward(xs, views, dy)
		if err != nil {
			return fmt.Errorf("nn/gorgonia: block %s: backward on input shapes %v: %w", b.describe(), shapes, err)
		}
		for i, x := range xs {
			if x.NeedsGrad() {
				if err := x.AccumulateGrad(grads[i]); err != nil {
					return fmt.Errorf("nn/gorgonia: block %s: input %d: %w", b.describe(), i, err)
				}
			}
		}
		for j, pv := range pvs {
			if err := pv.AccumulateGrad(grads[len(xs)+j]); err != nil {
				return fmt.Errorf("nn/gorgonia: block %s: parameter %s: %w", b.describe(), b.params[j].Name, err)
			}
		}
		return nil
	}, inputs...)
}

// describe names the block in errors by its parameters.
func (b *Block) describe() string {
	names := make([]string, len(b.params))
	for j, p := range b.params {
		names[j] = p.Name
	}
	return "[" + strings.Join(names, " ") + "]"
}

// refreshViews makes views[j] a Dense over params[j].Value.Data, rebuilding it when the
// Value's memory was replaced (a checkpoint loader that swaps tensors instead of copying).
func (b *Block) refreshViews() error {
	for j, p := range b.params {
		if p.Value == nil || !slices.Equal(p.Value.Shape, b.paramShape(j)) || p.Value.Len() != nnNumel(b.paramShape(j)) {
			return fmt.Errorf("parameter %s no longer has shape %v", p.Name, b.paramShape(j))
		}
		if v := b.views[j]; v != nil {
			if data, err := denseFloat32s(v); err == nil && sameMemory(data, p.Value.Data) {
				continue
			}
		}
		b.views[j] = tensor.New(tensor.WithShape(b.paramShape(j)...), tensor.WithBacking(p.Value.Data))
	}
	return nil
}

// paramShape is parameter j's declared shape.
func (b *Block) paramShape(j int) []int { return b.shapes[j] }

func nnNumel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// graphFor returns the graph for the input shapes, building (and caching) it on first use.
func (b *Block) graphFor(shapes [][]int) (*graph, error) {
	b.tick++
	key := shapeKey(shapes)
	if gr, ok := b.graphs[key]; ok {
		gr.lastUse = b.tick
		return gr, nil
	}
	gr, err := b.newGraph(shapes, false)
	if err != nil {
		return nil, err
	}
	gr.lastUse = b.tick
	b.graphs[key] = gr
	limit := b.MaxGraphs
	if limit < 1 {
		limit = 1
	}
	for len(b.graphs) > limit {
		var oldest *graph
		for _, g := range b.graphs {
			if g != gr && (oldest == nil || g.lastUse < oldest.lastUse) {
				oldest = g
			}
		}
		// A backward closure still recorded on a tape keeps its graph alive; it is only
		// dropped from the cache.
		delete(b.graphs, oldest.key)
	}
	return gr, nil
}

func shapeKey(shapes [][]int) string {
	var sb strings.Builder
	for i, s := range shapes {
		if i > 0 {
			sb.WriteByte(';')
		}
		for k, d := range s {
			if k > 0 {
				sb.WriteByte('x')
			}
			fmt.Fprint(&sb, d)
		}
	}
	return sb.String()
}
