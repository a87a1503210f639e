package comm

import (
	"context"
	"fmt"
	"strings"
)

// Topology says which host (node) each rank of a group runs on. Ranks on one node can share
// memory; traffic between nodes crosses the network. Nodes are numbered 0..Nodes()-1 in the
// order of their lowest rank, so equal topologies compare equal whatever labels built them.
// The zero value is the topology of an empty group.
type Topology struct {
	node []int // node[r] is rank r's node
}

// NewTopology builds the topology in which rank r runs on the node labelled labels[r]. Labels
// are any strings (host names, launcher node indices); ranks with equal labels share a node.
func NewTopology(labels []string) (Topology, error) {
	if len(labels) == 0 {
		return Topology{}, fmt.Errorf("comm: topology of no ranks")
	}
	ids := make(map[string]int)
	node := make([]int, len(labels))
	for r, l := range labels {
		if l == "" {
			return Topology{}, fmt.Errorf("comm: topology: rank %d has an empty node label", r)
		}
		id, ok := ids[l]
		if !ok {
			id = len(ids)
			ids[l] = id
		}
		node[r] = id
	}
	return Topology{node: node}, nil
}

// GridTopology is the topology of nodes×perNode ranks where ranks r·perNode … r·perNode+perNode−1
// share node r (the numbering launchers use: consecutive ranks on one host).
func GridTopology(nodes, perNode int) (Topology, error) {
	if nodes < 1 || perNode < 1 {
		return Topology{}, fmt.Errorf("comm: grid topology of %d nodes × %d ranks per node: both must be ≥ 1", nodes, perNode)
	}
	node := make([]int, nodes*perNode)
	for r := range node {
		node[r] = r / perNode
	}
	return Topology{node: node}, nil
}

// FlatTopology puts each of size ranks on a node of its own: nothing is assumed shared. It is
// the topology of a group that does not know better (TopologyOf).
func FlatTopology(size int) Topology {
	node := make([]int, size)
	for r := range node {
		node[r] = r
	}
	return Topology{node: node}
}

// Size is the number of ranks.
func (t Topology) Size() int { return len(t.node) }

// Nodes is the number of distinct nodes.
func (t Topology) Nodes() int {
	n := 0
	for _, id := range t.node {
		n = max(n, id+1)
	}
	return n
}

// Node is rank r's node.
func (t Topology) Node(r int) int { return t.node[r] }

// SameNode reports whether ranks a and b share a node.
func (t Topology) SameNode(a, b int) bool { return t.node[a] == t.node[b] }

// Members lists the ranks on node, ascending.
func (t Topology) Members(node int) []int {
	var m []int
	for r, id := range t.node {
		if id == node {
			m = append(m, r)
		}
	}
	return m
}

// LocalRank is rank r's index among the ranks of its node (0 for the lowest).
func (t Topology) LocalRank(r int) int {
	i := 0
	for q := 0; q < r; q++ {
		if t.node[q] == t.node[r] {
			i++
		}
	}
	return i
}

// RanksPerNode returns the number of ranks on each node when every node has the same number,
// and an error naming two nodes that differ otherwise. Hierarchical algorithms need it.
func (t Topology) RanksPerNode() (int, error) {
	if len(t.node) == 0 {
		return 0, fmt.Errorf("comm: topology of no ranks")
	}
	count := make([]int, t.Nodes())
	for _, id := range t.node {
		count[id]++
	}
	for id, c := range count {
		if c != count[0] {
			return 0, fmt.Errorf("comm: topology %v: node 0 has %d ranks but node %d has %d; hierarchical algorithms need the same number of ranks on every node",
				t, count[0], id, c)
		}
	}
	return count[0], nil
}

// Restrict is the topology of the sub-group made of members (ranks of t, in the sub-group's order).
func (t Topology) Restrict(members []int) Topology {
	labels := make([]string, len(members))
	for i, m := range members {
		labels[i] = fmt.Sprint(t.node[m])
	}
	if len(labels) == 0 {
		return Topology{}
	}
	s, _ := NewTopology(labels) // labels are non-empty
	return s
}

// Equal reports whether t and o place every rank alike.
func (t Topology) Equal(o Topology) bool {
	if len(t.node) != len(o.node) {
		return false
	}
	for r := range t.node {
		if t.node[r] != o.node[r] {
			return false
		}
	}
	return true
}

// String lists the ranks of each node: "[0 1] [2 3]".
func (t Topology) String() string {
	var b strings.Builder
	for id := 0; id < t.Nodes(); id++ {
		if id > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprint(&b, t.Members(id))
	}
	return b.String()
}

// Topologist is implemented by groups that know which node each of their ranks runs on:
// the groups of WithTopology, sub-groups of those (Sub), and transports that learn it when they
// connect.
type Topologist interface {
	Topology() Topology
}

// TopologyOf returns g's topology: the one g reports when it is a Topologist, else
// FlatTopology(g.Size()) — a group that does not know assumes nothing is shared.
func TopologyOf(g Group) Topology {
	if t, ok := g.(Topologist); ok {
		if top := t.Topology(); top.Size() == g.Size() {
			return top
		}
	}
	return FlatTopology(g.Size())
}

// WithTopology returns a view of g that reports t as its topology and counts, in g's Counters,
// the payload that crosses nodes (Stats.InterBytesSent/InterBytesRecv) next to the totals the
// transport counts. Messages still travel through g. In-process tests use it to simulate hosts
// (comm.NewLocal(4) viewed as GridTopology(2, 2)); t.Size() must be g.Size().
func WithTopology(g Group, t Topology) (Group, error) {
	if err := checkGroup("WithTopology", g); err != nil {
		return nil, err
	}
	if t.Size() != g.Size() {
		return nil, fmt.Errorf("comm: WithTopology: rank %d: topology of %d ranks for a group of %d", g.Rank(), t.Size(), g.Size())
	}
	return &topoGroup{Group: g, top: t}, nil
}

type topoGroup struct {
	Group
	top Topology
}

var _ Topologist = (*topoGroup)(nil)

func (g *topoGroup) Topology() Topology { return g.top }

// inter reports whether peer is on another node than this rank (an out-of-range peer is left
// for the transport to refuse).
func (g *topoGroup) inter(peer int) bool {
	return peer >= 0 && peer < g.top.Size() && !g.top.SameNode(g.Rank(), peer)
}

func (g *topoGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	err := g.Group.Send(ctx, to, tag, payload)
	if err == nil && g.inter(to) {
		g.Counters().AddInterSent(len(payload))
	}
	return err
}

func (g *topoGroup) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	n, err := g.Group.Recv(ctx, from, tag, buf)
	if err == nil && g.inter(from) {
		g.Counters().AddInterRecv(n)
	}
	return n, err
}

func (g *topoGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *Request {
	return g.counted(g.Group.Isend(ctx, to, tag, payload), g.inter(to), (*Counters).AddInterSent)
}

func (g *topoGroup) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *Request {
	return g.counted(g.Group.Irecv(ctx, from, tag, buf), g.inter(from), (*Counters).AddInterRecv)
}

// counted returns a request that completes with r's result after adding its bytes to the
// inter-node counter add, when the peer is on another node; otherwise r itself.
func (g *topoGroup) counted(r *Request, inter bool, add func(*Counters, int)) *Request {
	if !inter {
		return r
	}
	return GoRequest(func() (int, error) {
		n, err := r.Wait()
		if err == nil {
			add(g.Counters(), n)
		}
		return n, err
	})
}

// Underlier is implemented by views whose ranks are, one for one and in the same order, those of
// a group underneath (Underlying returns nil when they are not). A collective that a transport
// runs its own way (the shared all-reduce, which Auto picks on shared memory) finds the
// transport through such views. A wrapper that embeds a Group and passes its traffic through
// should implement it, and every rank must wrap alike: ranks that see different transports
// would pick different algorithms and wait for each other until the timeout.
type Underlier interface {
	Underlying() Group
}

// Underlying is the group WithTopology views.
func (g *topoGroup) Underlying() Group { return g.Group }

// subUnderlier is implemented by groups that have a group underneath some of their sub-groups.
type subUnderlier interface {
	// underlyingOf is the group whose ranks are, one for one, members (ranks of the receiver),
	// or nil.
	underlyingOf(members []int) Group
}

// Underlying is the group under the parent whose ranks are the view's: the node group of a
// Route when the members are that node's ranks in order (so that comm.AllReduce on a node's
// sub-group runs the shared all-reduce), else nil. The parent may be a view of such a group
// (Underlier): its ranks are the group's.
func (s *subGroup) Underlying() Group {
	for g := s.parent; g != nil; {
		switch v := g.(type) {
		case subUnderlier:
			return v.underlyingOf(s.members)
		case Underlier:
			g = v.Underlying()
		default:
			return nil
		}
	}
	return nil
}

// Topology of a sub-group is its parent's, restricted to its members.
func (s *subGroup) Topology() Topology { return TopologyOf(s.parent).Restrict(s.members) }
