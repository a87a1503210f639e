package hooks

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/simnet"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// hierSpecs are the inner hooks the hier tests run: dense, SparDL and Ok-Topk (with a short
// threshold schedule, so that the calls below reach its re-evaluations).
var hierSpecs = []string{"allreduce", "spardl:density=0.01", "oktopk:density=0.01,tau=2,tau_prime=3"}

// hierTopologies are nodes × ranks per node.
var hierTopologies = [][2]int{{2, 2}, {2, 3}, {3, 2}}

// newHierWorld is a world of nodes×perNode in-process ranks seen as simulated hosts
// (comm.WithTopology of a grid), each rank with its own hook of spec.
func newHierWorld(t testing.TB, nodes, perNode int, spec string) (*world, comm.Topology) {
	t.Helper()
	top, err := comm.GridTopology(nodes, perNode)
	if err != nil {
		t.Fatal(err)
	}
	return newTopoWorld(t, top, spec), top
}

// newMessageWorld is newWorld on in-process ranks whatever SPARGO_TEST_TRANSPORT says: a
// reference whose collectives count bytes as the message-passing algorithms do, as hier's
// cross-node sub-groups do (on shared memory Auto's all-reduce is the shared one, which counts
// its own way).
func newMessageWorld(t testing.TB, p int, spec string) *world {
	t.Helper()
	groups, err := comm.NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	return newWorldOn(t, groups, spec)
}

func newTopoWorld(t testing.TB, top comm.Topology, spec string) *world {
	t.Helper()
	w := newWorld(t, top.Size(), spec)
	for r, g := range w.groups {
		v, err := comm.WithTopology(g, top)
		if err != nil {
			t.Fatal(err)
		}
		w.groups[r] = v
	}
	return w
}

// hierResiduals returns every rank's residual of bucket 0 (hierResidual).
func hierResiduals(w *world, top comm.Topology, n int) [][]float32 {
	rs := make([][]float32, len(w.hooks))
	for r, h := range w.hooks {
		rs[r] = hierResidual(h, top, r, 0, n)
	}
	return rs
}

// hierResidual returns rank r's residual of bucket idx as a vector of the bucket's n
// elements: the inner hook's residual of the rank's shard at the shard's place, zeros
// elsewhere (a dense inner hook keeps none).
func hierResidual(h ddp.CommHook, top comm.Topology, r, idx, n int) []float32 {
	perNode, _ := top.RanksPerNode()
	offs := shardOffsets(n, perNode)
	res := make([]float32, n)
	inner := h.(*Hier).Inner
	if _, ok := inner.(interface{ memory() *Memory }); !ok {
		return res
	}
	i := top.LocalRank(r)
	lo, hi := offs[i], offs[i+1]
	if perNode == 1 {
		lo, hi = 0, n
	}
	copy(res[lo:hi], (&world{hooks: []ddp.CommHook{inner}}).residual(0, idx, hi-lo))
	return res
}

// quantized returns gradients on a grid of 2^-12 below 2^8 in magnitude: a node's sum of up
// to 3 of them is exact in float32, whatever the order of the additions, so a flat run of the
// inner hook on the node sums sees the same bits as hier's.
func quantized(seed uint64, p, n int) [][]float32 {
	gs := grads(seed, p, n)
	for _, g := range gs {
		for i, x := range g {
			g[i] = float32(math.Round(math.Max(-255, math.Min(255, float64(x)))*4096) / 4096)
		}
	}
	return gs
}

// hier:SPEC on simulated hosts, for a dense, SparDL and Ok-Topk inner hook: every rank gets
// the same bits, the outputs times P plus the inner hooks' residuals equal the gradients plus
// the old residuals, and the result on shard i is, bit for bit, what SPEC run flat on H ranks
// with the node sums of shard i returns, divided by L; the words received across nodes are
// that flat run's, and inside a node 2n − |shard i−1| − |shard i|.
func TestHierConservationReplicasAndFlatEquivalence(t *testing.T) {
	for _, tp := range hierTopologies {
		nodes, perNode := tp[0], tp[1]
		for _, inner := range hierSpecs {
			name := fmt.Sprintf("%d×%d/hier:%s", nodes, perNode, inner)
			t.Run(name, func(t *testing.T) {
				w, top := newHierWorld(t, nodes, perNode, "hier:"+inner)
				n := 1500*nodes*perNode + 13 // uneven shards
				offs := shardOffsets(n, perNode)
				flats := make([]*world, perNode) // flats[i]: SPEC on the H ranks of shard i
				for i := range flats {
					flats[i] = newMessageWorld(t, nodes, inner)
				}
				for it := range 4 {
					what := fmt.Sprintf("%s/call %d", name, it)
					gs := quantized(uint64(1000*nodes+10*perNode+it), nodes*perNode, n)
					before := hierResiduals(w, top, n)
					outs, stats := w.call(t, 0, gs)
					after := hierResiduals(w, top, n)
					checkIdentical(t, what, outs)
					checkConservation(t, what, gs, before, after, outs[0])
					for i := range perNode {
						lo, hi := offs[i], offs[i+1]
						sums := make([][]float32, nodes)
						for j := range nodes {
							sums[j] = make([]float32, hi-lo)
							for _, r := range top.Members(j) {
								for k := range sums[j] {
									sums[j][k] += gs[r][lo+k]
								}
							}
						}
						fo, fs := flats[i].call(t, 0, sums)
						for k, x := range fo[0] {
							if want := x / float32(perNode); math.Float32bits(outs[0][lo+k]) != math.Float32bits(want) {
								t.Fatalf("%s: shard %d element %d = %v, the flat run on the node sums gives %v/L = %v", what, i, k, outs[0][lo+k], x, want)
							}
						}
						for j := range nodes {
							r := top.Members(j)[i]
							if got, want := stats[r].InterBytesRecv, fs[j].BytesRecv; got != want {
								t.Errorf("%s: rank %d (node %d, local %d) received %d bytes across nodes, the flat run's rank %d %d", what, r, j, i, got, j, want)
							}
							prev := (i + perNode - 1) % perNode
							wantIntra := 4 * int64(2*n-(offs[prev+1]-offs[prev])-(hi-lo))
							if got := stats[r].BytesRecv - stats[r].InterBytesRecv; got != wantIntra {
								t.Errorf("%s: rank %d received %d bytes inside its node, want 4(2n-|shard %d|-|shard %d|) = %d", what, r, got, prev, i, wantIntra)
							}
						}
					}
				}
			})
		}
	}
}

// The words crossing nodes are the inner hook's formula at P = H on the shard (CostSplit),
// for sizes at which SparDL's blocks make its Table I volume exact; the words inside a node
// are 2n(L-1)/L.
func TestHierInterWordsMatchFormula(t *testing.T) {
	for _, tp := range hierTopologies {
		nodes, perNode := tp[0], tp[1]
		for _, inner := range []string{"allreduce", "spardl:density=0.01"} {
			w, _ := newHierWorld(t, nodes, perNode, "hier:"+inner)
			n := 200 * nodes * perNode
			_, stats := w.call(t, 0, grads(7, nodes*perNode, n))
			c := w.hooks[0].(*Hier).CostSplit(n, nodes, perNode)
			if !c.InterKnown || c.Shard != n/perNode {
				t.Fatalf("%d×%d hier:%s: CostSplit %+v", nodes, perNode, inner, c)
			}
			var inter, intra float64
			for _, s := range stats {
				inter = max(inter, s.InterWordsRecv())
				intra = max(intra, s.WordsRecv()-s.InterWordsRecv())
			}
			if inter != c.Inter || intra != c.Intra {
				t.Errorf("%d×%d hier:%s: busiest rank received %v words across nodes and %v inside, the formulas say %v (%s) and %v (%s)",
					nodes, perNode, inner, inter, intra, c.Inter, c.InterExpr, c.Intra, c.IntraExpr)
			}
			if expr, words, ok := CostFormula(w.hooks[0], n, nodes*perNode); !ok || words != c.Inter+c.Intra || !strings.Contains(expr, "across") {
				t.Errorf("%d×%d hier:%s: CostFormula %q %v %v", nodes, perNode, inner, expr, words, ok)
			}
		}
	}
}

// With one rank per node hier is its inner hook (same bits, same messages); on one node it is
// a dense all-reduce that leaves no residual.
func TestHierDegenerateTopologies(t *testing.T) {
	const n = 4001
	gs := grads(3, 4, n)
	w, _ := newHierWorld(t, 4, 1, "hier:spardl:density=0.01")
	flat := newWorld(t, 4, "spardl:density=0.01")
	for it := range 2 {
		outs, stats := w.call(t, 0, gs)
		fo, fs := flat.call(t, 0, gs)
		for r := range outs {
			if !slices.Equal(outs[r], fo[r]) || stats[r].BytesRecv != fs[r].BytesRecv || stats[r].Rounds != fs[r].Rounds {
				t.Fatalf("4×1 call %d rank %d: hier:spardl differs from spardl (%v vs %v)", it, r, stats[r], fs[r])
			}
		}
	}
	w, top := newHierWorld(t, 1, 4, "hier:spardl:density=0.01")
	outs, stats := w.call(t, 0, gs)
	checkIdentical(t, "1×4", outs)
	zero := make([][]float32, 4)
	for r := range zero {
		zero[r] = make([]float32, n)
	}
	checkConservation(t, "1×4", gs, zero, hierResiduals(w, top, n), outs[0])
	for i := range n {
		var s float64
		for r := range gs {
			s += float64(gs[r][i])
		}
		if d := math.Abs(float64(outs[0][i]) - s/4); d > 1e-5*(1+math.Abs(s)) {
			t.Fatalf("1×4 element %d = %v, the average is %v", i, outs[0][i], s/4)
		}
	}
	for r, s := range stats {
		if s.InterBytesRecv != 0 {
			t.Errorf("1×4 rank %d received %d bytes across nodes", r, s.InterBytesRecv)
		}
	}
}

// The state of hier's inner hooks goes through State and LoadState: a world restored from it
// continues bit for bit as the one that saved it; another topology is refused when it runs,
// another world size when a checkpoint is resized.
func TestHierStateRoundTrip(t *testing.T) {
	const spec, n = "hier:spardl:density=0.01", 3001
	a, _ := newHierWorld(t, 2, 2, spec)
	for it := range 2 {
		a.call(t, 0, grads(uint64(it), 4, n))
	}
	b, states := restoredWorld(t, a, spec, []string{"hier.layout", "hier.spardl.bucket0.residual"})
	b.groups = a.groups
	next := grads(9, 4, n)
	oa, _ := a.call(t, 0, next)
	ob, _ := b.call(t, 0, next)
	for r := range oa {
		if !slices.Equal(oa[r], ob[r]) {
			t.Fatalf("rank %d: the restored hook's output differs from the uninterrupted one's", r)
		}
	}

	// the same state on 4 nodes of one rank: refused on the first call, naming both layouts
	c := newTopoWorld(t, comm.FlatTopology(4), spec)
	for r, h := range c.hooks {
		if err := h.(ddp.Stateful).LoadState(states[r]); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := c.try(0, next); err == nil || !strings.Contains(err.Error(), "saved on 2 nodes × 2 ranks") || !strings.Contains(err.Error(), "this run has 4 nodes × 1 ranks") {
		t.Errorf("state of 2×2 on 4×1: %v", err)
	}
	// another world size
	if _, err := a.hooks[0].(*Hier).Redistribute(states[:2], 4, 0, 2); err == nil || !strings.Contains(err.Error(), "cannot move its state from 4 ranks to 2") {
		t.Errorf("Redistribute: %v", err)
	}
	// a key of another hook
	if err := a.hooks[0].(ddp.Stateful).LoadState(map[string][]float32{"spardl.bucket0.residual": {1}}); err == nil || !strings.Contains(err.Error(), "not hier state") {
		t.Errorf("LoadState of a bare spardl key: %v", err)
	}
	// an inner hook without state saves none
	d, _ := newHierWorld(t, 2, 2, "hier:allreduce")
	d.call(t, 0, next)
	if st, err := d.hooks[0].(ddp.Stateful).State(); err != nil || len(st) != 0 {
		t.Errorf("hier:allreduce state %v, %v", st, err)
	}
}

// DDP training with hier:spardl on 2 simulated hosts × 2 ranks keeps the replicas identical
// and moves the parameters.
func TestHierDDPTraining(t *testing.T) {
	top, _ := comm.GridTopology(2, 2)
	groups, err := comm.NewLocal(4)
	if err != nil {
		t.Fatal(err)
	}
	for r, g := range groups {
		if groups[r], err = comm.WithTopology(g, top); err != nil {
			t.Fatal(err)
		}
	}
	res := trainDDP(t, "hier:spardl:density=0.05", 4, 4, ddpTraining{groups: groups})
	checkReplicasAgree(t, "hier:spardl 2×2: ", res.hashes)
	if res.hashes[0][0] == res.hashes[0][3] {
		t.Fatal("training did not move the parameters")
	}
}

// Exact resume through a checkpoint, on 2 simulated hosts × 2 ranks: 3 steps, a checkpoint,
// 3 steps of fresh DDPs and hooks that loaded it give the parameters of 6 steps without a stop
// (TestResumeIsExactForEveryHook runs hier on 2 ranks, where it is its inner hook).
func TestHierResumeIsExact(t *testing.T) {
	const spec, p, k, m = "hier:spardl:density=0.05,dense_warmup=1", 4, 3, 3
	top, _ := comm.GridTopology(2, 2)
	groups, err := comm.NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	for r, g := range groups {
		if groups[r], err = comm.WithTopology(g, top); err != nil {
			t.Fatal(err)
		}
	}
	o := ddpTraining{groups: groups}
	straight := trainDDP(t, spec, p, k+m, o)
	dir := t.TempDir()
	meta := checkpoint.Meta{Model: "tinyNet", Hook: spec}
	first := o
	first.end = func(ctx context.Context, r int, model nn.Module, dp *ddp.DDP, opt *optim.SGD) error {
		_, err := checkpoint.Saver{Dir: dir, Keep: 1}.Save(ctx, checkpoint.State{Model: model, DDP: dp, Optimizer: opt}, meta,
			checkpoint.Position{Step: k, Iteration: k})
		if st, serr := dp.Hook().(ddp.Stateful).State(); err == nil && (serr != nil || len(st[hierKeyLayout]) == 0) {
			return fmt.Errorf("hook state without its layout (%v)", serr)
		}
		return err
	}
	trainDDP(t, spec, p, k, first)
	second := o
	second.firstStep = k
	second.begin = func(ctx context.Context, r int, model nn.Module, dp *ddp.DDP, opt *optim.SGD) error {
		path, err := checkpoint.Latest(dir)
		if err != nil {
			return err
		}
		_, err = checkpoint.Load(path, checkpoint.State{Model: model, DDP: dp, Optimizer: opt}, meta)
		return err
	}
	resumed := trainDDP(t, spec, p, m, second)
	for r := range p {
		for s := range m {
			if resumed.hashes[r][s] != straight.hashes[r][k+s] {
				t.Fatalf("rank %d, step %d: resumed parameters differ from the uninterrupted run's", r, k+s+1)
			}
		}
	}
}

// The spec: any hook after "hier:", with its own colon and options; canonical String;
// options reach the inner hook; bad specs and topologies are refused, saying why.
func TestHierSpec(t *testing.T) {
	c := mustConfig(t, "hier: spardl : teams=1,density=1e-2")
	if got, want := c.String(), "hier:"+mustConfig(t, "spardl").String(); got != want {
		t.Errorf("canonical %q, want %q", got, want)
	}
	if again := mustConfig(t, c.String()); again.String() != c.String() {
		t.Errorf("canonical %q parses to %q", c, again)
	}
	if c.Name() != "hier" || c.Option("density") != "0.01" {
		t.Errorf("name %q, density %q", c.Name(), c.Option("density"))
	}
	d, err := c.With("density", "0.05")
	if err != nil || !strings.HasPrefix(d.String(), "hier:spardl:density=0.05,") {
		t.Errorf("With(density=0.05): %q, %v", d, err)
	}
	for _, s := range []string{"hier:allreduce", "hier:oktopk:density=0.01,tau=2", "hier:fp16+powersgd:rank=2", "fp16+hier:topka:density=0.05", "hier:covap:interval=2"} {
		h, err := Parse(s)
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		if !strings.Contains(h.Name(), "hier:") {
			t.Errorf("%s: hook named %q", s, h.Name())
		}
	}
	for _, tc := range []struct{ spec, want string }{
		{"hier", "hier wraps a spec: write hier:SPEC"},
		{"hier:", "hier wraps a spec: write hier:SPEC"},
		{"hier:hier:allreduce", "hier cannot wrap hier:allreduce"},
		{"hier:fp16+hier:allreduce", "hier cannot wrap fp16+hier:allreduce"},
		{"hier:unknown", `unknown hook "unknown" in "hier:unknown"`},
		{"hier:density=0.01", "hier takes no options, only the spec it wraps"},
		{"hier:spardl,density=0.01", "write hier:spardl:key=value"},
		{"hier+spardl", "write hier:spardl"},
		{"hier:spardl:rank=2", `spardl has no option "rank"`},
		{"hier:osp", "hier cannot wrap osp"},
		{"hier:omgs", "per-tensor costs"},
	} {
		if _, err := ParseConfig(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
	if !strings.Contains(Help(), "hier:SPEC") {
		t.Error("Help does not show hier:SPEC")
	}

	// nodes of different sizes: refused on the first call, naming the nodes
	top, err := comm.NewTopology([]string{"a", "a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	w := newTopoWorld(t, top, "hier:allreduce")
	if _, _, err := w.try(0, grads(1, 3, 100)); err == nil || !strings.Contains(err.Error(), "node 0 has 2 ranks but node 1 has 1") {
		t.Errorf("uneven topology: %v", err)
	}
	// the inner hook checks the number of nodes, not P
	w, _ = newHierWorld(t, 3, 2, "hier:gtopk")
	if _, _, err := w.try(0, grads(1, 6, 100)); err == nil || !strings.Contains(err.Error(), "across the 3 nodes") || !strings.Contains(err.Error(), "power-of-two") {
		t.Errorf("hier:gtopk on 3 nodes: %v", err)
	}
	w, _ = newHierWorld(t, 2, 3, "hier:gtopk")
	if _, _, err := w.try(0, grads(1, 6, 100)); err != nil {
		t.Errorf("hier:gtopk on 2 nodes × 3: %v", err)
	}
}

// hier runs on simulated networks (spargo simulate's comm/simnet groups) seen through a
// topology: the same bits on every rank, conservation, and the words across nodes of a flat
// run on the node sums.
func TestHierOnSimnet(t *testing.T) {
	net, err := simnet.New(4, simnet.Config{Alpha: 50e-6, Beta: 1e-9})
	if err != nil {
		t.Fatal(err)
	}
	top, _ := comm.GridTopology(2, 2)
	w := &world{}
	for _, g := range net.Groups() {
		v, err := comm.WithTopology(g, top)
		if err != nil {
			t.Fatal(err)
		}
		w.groups = append(w.groups, v)
		w.hooks = append(w.hooks, mustParse(t, "hier:spardl:density=0.01"))
	}
	const n = 1600
	for it := range 2 {
		gs := grads(uint64(it), 4, n)
		before := hierResiduals(w, top, n)
		outs, stats := w.call(t, 0, gs)
		checkIdentical(t, "simnet 2×2", outs)
		checkConservation(t, "simnet 2×2", gs, before, hierResiduals(w, top, n), outs[0])
		c := w.hooks[0].(*Hier).CostSplit(n, 2, 2)
		for r, s := range stats {
			if s.InterWordsRecv() != c.Inter {
				t.Errorf("simnet 2×2 call %d rank %d: %v words across nodes, want %v (%s)", it, r, s.InterWordsRecv(), c.Inter, c.InterExpr)
			}
		}
	}
}

// A bucket smaller than the number of ranks per node leaves some shards empty: their ranks
// skip the inner hook and still get every element.
func TestHierTinyBucket(t *testing.T) {
	w, top := newHierWorld(t, 2, 3, "hier:spardl:density=0.5")
	gs := grads(5, 6, 2)
	before := hierResiduals(w, top, 2)
	outs, _ := w.call(t, 0, gs)
	checkIdentical(t, "n=2 on 2×3", outs)
	checkConservation(t, "n=2 on 2×3", gs, before, hierResiduals(w, top, 2), outs[0])
}
