package hooks

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// Hier runs Inner hierarchically over the nodes (hosts) of the group's topology
// (comm.TopologyOf), as Horovod's hierarchical all-reduce runs NCCL inside a host and MPI
// across hosts, but with any hook across hosts (spec "hier:SPEC", e.g.
// "hier:spardl:density=0.01"). With H nodes of L ranks each (P = H·L; every node must hold
// the same number of ranks), one call on a bucket of n elements:
//
//  1. Inside each node, a dense ring reduce-scatter: the bucket is cut into L shards (the first
//     n mod L hold ⌈n/L⌉ elements, the others ⌊n/L⌋), and the rank of local index i ends with
//     the node's sum of shard i.
//  2. Across nodes, Inner runs on that shard among the H ranks of local index i (one per node,
//     numbered by node): every local rank works at once, on its own shard. Each rank's Inner
//     is its own hook instance, so its state (residuals, thresholds, call counters) is the
//     state of shard i among those H ranks, kept where Inner keeps it, in Inner's sum units.
//     Inner returns the average over H of the node sums; Hier divides it by L, which makes it
//     the average over the P ranks (DDP's contract: a hook returns the mean).
//  3. Inside each node, a ring all-gather of the shards: every rank gets every shard.
//
// The result is what Inner would return on H ranks given each node's summed gradient, divided
// by L: conservation holds when it holds for Inner (the output times P plus Inner's residuals
// equals the gradients plus the old residuals), and every rank gets the same bits (each shard
// is reduced on one rank, in a fixed order, and copied). With L = 1 Hier is Inner itself on
// the whole group (the same calls, messages and bits); with H = 1 it is a dense node-local
// all-reduce (reduce-scatter, divide by L, all-gather) and Inner never runs.
//
// Words received per call and rank (4 bytes): 2n − |shard i−1| − |shard i| inside the node
// (2n(L−1)/L when L divides n), and across nodes Inner's own volume for P = H on its shard
// (CostSplit). The intra-node part moves over shared memory or a host's loopback, the
// inter-node part over the network.
//
// Hier refuses to wrap hooks that need whole tensors (osp, which defers some of the model's
// parameters; lags, mgs and omgs, which plan buckets from per-tensor costs) and itself. Its
// Plan is Inner's (spardl's one bucket of the whole model stays one bucket). Its state is
// Inner's, with the topology it ran on: a checkpoint resumes only on the same number of nodes
// and ranks per node (and refuses another world size).
type Hier struct {
	Inner ddp.CommHook

	mu sync.Mutex
	// the group the sub-groups below were made for, and its layout
	g     comm.Group
	lay   hierLayout
	node  comm.Group // this rank's node
	cross comm.Group // the ranks of this rank's local index, one per node
	// restored: the layout a loaded state was saved on, checked on the first call
	restored *hierLayout
	// learnt: a layout is known (from a call or a loaded state), for the descriptions
	learnt bool
}

var (
	_ ddp.CommHook         = (*Hier)(nil)
	_ ddp.Stateful         = (*Hier)(nil)
	_ ddp.Planner          = (*Hier)(nil)
	_ ddp.WorldSizeChecker = (*Hier)(nil)
	_ CostDescriber        = (*Hier)(nil)
	_ SelectionDescriber   = (*Hier)(nil)
	_ ControlTagger        = (*Hier)(nil)
)

// hierLayout is the shape of a topology as Hier uses it: nodes × perNode ranks, and where
// this rank sits.
type hierLayout struct {
	nodes, perNode int
	node, local    int
}

// NewHier wraps inner (spec "hier:SPEC"). It refuses hooks that need whole tensors, Hier
// itself and nil. inner must be a fresh instance for this rank (Config.New).
func NewHier(inner ddp.CommHook) (*Hier, error) {
	for h := inner; ; {
		switch in := h.(type) {
		case nil:
			return nil, fmt.Errorf("hooks: hier: nil inner hook")
		case *Hier:
			return nil, fmt.Errorf("hooks: hier cannot wrap %s: the ranks of one local index are on different nodes already (write hier:SPEC once)", inner.Name())
		case *OSP:
			return nil, fmt.Errorf("hooks: hier cannot wrap %s: osp defers whole parameter tensors (ddp.LateFuture), and hier's inner hook sees shards of a bucket", inner.Name())
		case *Wrapped16:
			h = in.Inner
			continue
		}
		if Merged(h) != nil {
			return nil, fmt.Errorf("hooks: hier cannot wrap %s: it plans its buckets from per-tensor costs, and hier's inner hook sees shards of a bucket, not tensors", inner.Name())
		}
		return &Hier{Inner: inner}, nil
	}
}

// Name returns "hier:" and Inner's name.
func (h *Hier) Name() string { return "hier:" + h.Inner.Name() }

// Plan is Inner's plan when Inner is a ddp.Planner (spardl's one bucket), else DDP's own.
func (h *Hier) Plan(params []*nn.Param) ([][]int, error) {
	if p, ok := h.Inner.(ddp.Planner); ok {
		return p.Plan(params)
	}
	return nil, nil
}

// layout returns g's layout, building the node and cross-node sub-groups on the first call
// with g.
func (h *Hier) layout(g comm.Group) (hierLayout, comm.Group, comm.Group, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.g != nil && reflect.TypeOf(g).Comparable() && g == h.g {
		return h.lay, h.node, h.cross, nil
	}
	top := comm.TopologyOf(g)
	perNode, err := top.RanksPerNode()
	if err != nil {
		return hierLayout{}, nil, nil, err
	}
	r := g.Rank()
	lay := hierLayout{nodes: top.Nodes(), perNode: perNode, node: top.Node(r), local: top.LocalRank(r)}
	if s := h.restored; s != nil && (s.nodes != lay.nodes || s.perNode != lay.perNode || s.node != lay.node || s.local != lay.local) {
		return hierLayout{}, nil, nil, fmt.Errorf("restored state was saved on %d nodes × %d ranks as node %d's local rank %d; this run has %d nodes × %d ranks (topology %v) and this rank is node %d's local rank %d: "+
			"the inner hook's state lives on shards that depend on the topology, resume on the same one",
			s.nodes, s.perNode, s.node, s.local, lay.nodes, lay.perNode, top, lay.node, lay.local)
	}
	if lay.nodes > 1 {
		if err := ddp.CheckWorldSize(h.Inner, lay.nodes); err != nil {
			return hierLayout{}, nil, nil, fmt.Errorf("across the %d nodes: %w", lay.nodes, err)
		}
	}
	var node, cross comm.Group
	if lay.perNode > 1 {
		if node, err = comm.Sub(g, top.Members(lay.node)); err != nil {
			return hierLayout{}, nil, nil, err
		}
		peers := make([]int, lay.nodes)
		for j := range peers {
			peers[j] = top.Members(j)[lay.local]
		}
		if cross, err = comm.Sub(g, peers); err != nil {
			return hierLayout{}, nil, nil, err
		}
	}
	h.g, h.lay, h.node, h.cross, h.learnt = g, lay, node, cross, true
	return lay, node, cross, nil
}

// Run reduce-scatters the bucket inside the node, runs Inner on this rank's shard across the
// nodes and all-gathers the shards inside the node.
func (h *Hier) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	lay, node, cross, err := h.layout(g)
	if err != nil {
		return ddp.Ready(nil, fmt.Errorf("hooks: %s: bucket %d: %w", h.Name(), b.Index(), err))
	}
	if lay.perNode == 1 {
		return h.Inner.Run(ctx, g, b)
	}
	out, err := h.run(ctx, lay, node, cross, b)
	if err != nil {
		return ddp.Ready(nil, fmt.Errorf("hooks: %s: bucket %d: %w", h.Name(), b.Index(), err))
	}
	return ddp.Ready(out, nil)
}

func (h *Hier) run(ctx context.Context, lay hierLayout, node, cross comm.Group, b ddp.Bucket) ([]float32, error) {
	flat, tag := b.Flat(), b.Tag()
	offs := shardOffsets(len(flat), lay.perNode)
	if err := ringReduceScatter(ctx, node, tag, flat, offs); err != nil {
		return nil, fmt.Errorf("reduce-scatter inside node %d: %w", lay.node, err)
	}
	shard := flat[offs[lay.local]:offs[lay.local+1]]
	avg := shard // H = 1: the node's sum is the total
	if lay.nodes > 1 && len(shard) > 0 {
		var sb ddp.Bucket = &shardBucket{outer: b, flat: shard}
		if t, ok := b.(ddp.Timed); ok {
			sb = &timedShardBucket{shardBucket: sb.(*shardBucket), timed: t}
		}
		out, err := h.Inner.Run(ctx, cross, sb).Wait()
		if err != nil {
			return nil, fmt.Errorf("%s on shard %d across the %d nodes: %w", h.Inner.Name(), lay.local, lay.nodes, err)
		}
		if len(out) != len(shard) {
			return nil, fmt.Errorf("%s returned %d values for shard %d of %d elements", h.Inner.Name(), len(out), lay.local, len(shard))
		}
		avg = out
	}
	l := float32(lay.perNode)
	for j, x := range avg { // avg may be shard itself: element j is read before it is written
		shard[j] = x / l
	}
	if err := ringAllGather(ctx, node, tag, flat, offs); err != nil {
		return nil, fmt.Errorf("all-gather inside node %d: %w", lay.node, err)
	}
	return flat, nil
}

// shardOffsets cuts n elements into l shards, the first n mod l one element longer: shard i
// is [offs[i], offs[i+1]).
func shardOffsets(n, l int) []int {
	offs := make([]int, l+1)
	for i := range l {
		c := n / l
		if i < n%l {
			c++
		}
		offs[i+1] = offs[i] + c
	}
	return offs
}

// ringReduceScatter sums buf over g's ranks shard by shard (offs, as shardOffsets): rank i
// ends with the sum of shard i in place; the other shards hold partial sums. In step s rank r
// passes its partial of shard r−s−1 to the right and adds the left neighbour's partial of
// shard r−s−2 to its own (received + own, in that order): shard i is summed along the ring
// from rank i+1 to rank i, the same order on every run. P−1 rounds; rank r receives every
// shard but shard r−1.
func ringReduceScatter(ctx context.Context, g comm.Group, tag uint32, buf []float32, offs []int) error {
	p, r := g.Size(), g.Rank()
	shard := func(i int) []float32 {
		i = ((i % p) + p) % p
		return buf[offs[i]:offs[i+1]]
	}
	in := make([]float32, offs[1]-offs[0]) // shard 0 is the longest
	for s := range p - 1 {
		dst := shard(r - s - 2)
		recv := in[:len(dst)]
		if err := exchangeFloats(ctx, g, tag, (r+1)%p, shard(r-s-1), (r+p-1)%p, recv); err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		for j := range dst {
			dst[j] = recv[j] + dst[j]
		}
	}
	return nil
}

// ringAllGather completes buf on every rank of g from each rank i's shard i (offs, as
// shardOffsets): in step s rank r passes shard r−s to the right and receives shard r−s−1 in
// place. P−1 rounds; rank r receives every shard but its own.
func ringAllGather(ctx context.Context, g comm.Group, tag uint32, buf []float32, offs []int) error {
	p, r := g.Size(), g.Rank()
	shard := func(i int) []float32 {
		i = ((i % p) + p) % p
		return buf[offs[i]:offs[i+1]]
	}
	for s := range p - 1 {
		if err := exchangeFloats(ctx, g, tag, (r+1)%p, shard(r-s), (r+p-1)%p, shard(r-s-1)); err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
	}
	return nil
}

// exchangeFloats sends send to rank to and receives exactly len(recv) floats from rank from,
// as one round.
func exchangeFloats(ctx context.Context, g comm.Group, tag uint32, to int, send []float32, from int, recv []float32) error {
	n, err := comm.SendRecv(ctx, g, tag, to, comm.F32Bytes(send), from, comm.F32Bytes(recv))
	if err != nil {
		return err
	}
	if n != 4*len(recv) {
		return fmt.Errorf("rank %d: %d bytes from rank %d, want %d (do the ranks pass buckets of the same size?)", g.Rank(), n, from, 4*len(recv))
	}
	return nil
}

// shardBucket is the bucket Inner sees: one shard of DDP's bucket, under the bucket's index,
// iteration and tags, without parameters (a shard is not made of whole tensors).
type shardBucket struct {
	outer ddp.Bucket
	flat  []float32
}

func (s *shardBucket) Index() int          { return s.outer.Index() }
func (s *shardBucket) Iteration() int64    { return s.outer.Iteration() }
func (s *shardBucket) IsLast() bool        { return s.outer.IsLast() }
func (s *shardBucket) Flat() []float32     { return s.flat }
func (s *shardBucket) Params() []*nn.Param { return nil }
func (s *shardBucket) Offsets() []int      { return nil }
func (s *shardBucket) Tag() uint32         { return s.outer.Tag() }

// timedShardBucket passes DDP's bucket timestamps on (ddp.Timed: covap's interval=auto).
type timedShardBucket struct {
	*shardBucket
	timed ddp.Timed
}

func (s *timedShardBucket) ReadyAfter() time.Duration { return s.timed.ReadyAfter() }

func init() {
	Register(Spec{
		Name: "hier",
		Summary: "hierarchical: written hier:SPEC, any hook across nodes. Inside each node a dense reduce-scatter gives local rank i the node's sum of shard i " +
			"(of n/L); SPEC runs on it among the ranks of local index i, one per node (every local rank works); inside the node an all-gather. " +
			"Needs the same number of ranks L on every node (the group's topology); L=1 is SPEC itself, one node a dense all-reduce. " +
			"Words: 2n(L-1)/L inside a node, SPEC's formula at P = nodes on n/L across",
		New: func(Values) (ddp.CommHook, error) {
			return nil, fmt.Errorf("hooks: hier wraps a hook: write hier:SPEC (e.g. hier:spardl:density=0.01)")
		},
		Nest: func(inner ddp.CommHook) (ddp.CommHook, error) { return NewHier(inner) },
	})
}
