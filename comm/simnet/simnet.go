// Package simnet is a simulated network for comm: P ranks in one process whose messages cost
// virtual time by the α-β model, so that a comm hook's real schedule can be timed on a cluster
// that is not there (`spargo simulate`). The data moves for real (through comm.NewLocal), the
// hooks run unchanged through the comm.Group interface, and every rank carries a virtual
// clock that the transport advances.
//
// # The model
//
// Each rank has one full-duplex NIC port: an egress queue and an ingress queue, each serving
// one message at a time at 1/β bytes per second.
//
//   - A send of L bytes posted at the sender's clock t starts on the egress at
//     s = max(t, egress free) and occupies it until s + L·β; its last byte reaches the receiver
//     at A = s + α + L·β. A blocking Send (and the Wait of an Isend) returns at s + L·β.
//   - The receiver's ingress serves the message ending at E = max(A, ingress free + L·β): two
//     messages that arrive together share the port. Messages are served in the order the
//     receiver completes them (its Recv and Wait calls), a point of its own program order.
//   - A receive completes at max(E, receiver's clock) + L·RecvCost (decoding and reducing what
//     arrived, when the caller models it).
//
// With a Topology, ranks that share a node exchange messages through shared memory instead:
// the same rules with IntraAlpha and IntraBeta, on a second pair of queues per rank (its
// memory port) that the NIC's traffic does not touch, so a rank can receive from its node while
// its NIC serves another node. Every rank still has a NIC of its own (one per GPU, as in most
// GPU clusters); ranks of one node do not share one. The groups report the Topology
// (comm.Topologist), so hooks that read it (hier:SPEC) see the simulated nodes, and count the
// payload that crosses nodes in Stats.InterBytesSent/InterBytesRecv.
//
// Local computation is charged explicitly with Advance (a cost model, see `spargo simulate`):
// the wall time a goroutine spends means nothing when 1024 ranks share two cores. Scale makes
// every message count Scale times its bytes on the clock, for runs that shrink the vectors of a
// size-oblivious schedule by that factor (Counters still count the real payload bytes).
//
// # Determinism
//
// Every clock is changed only by its own rank's calls, in its program order: a send stamps its
// arrival from the sender's clock, a receive reads that stamp when the receiver waits for it.
// So virtual times do not depend on how the goroutines were scheduled, provided each rank
// issues its operations from one goroutine (or in an order that does not depend on timing), as
// the hooks do. The same inputs give the same virtual times, bit for bit.
package simnet

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// Config is the network of a simulation.
type Config struct {
	// Alpha is the latency of one message, in seconds.
	Alpha float64
	// Beta is the time per byte of one NIC port, in seconds (8e-9 for 1 Gbit/s).
	Beta float64
	// RecvCost is the local processing time per received byte, in seconds, charged to the
	// receiver when a receive completes; 0 for none.
	RecvCost float64
	// Scale multiplies every message's bytes on the clock (not in Counters); 0 means 1.
	Scale float64
	// Unscaled, when set, names the tags whose messages Scale does not apply to: control
	// messages (counts, boundaries) whose size does not shrink with the vectors.
	Unscaled func(tag uint32) bool
	// Topology places the ranks on nodes; the zero value puts every rank on a node of its own
	// and prices every message with Alpha and Beta, self-sends included, as without nodes.
	Topology comm.Topology
	// IntraAlpha and IntraBeta price a message between two ranks of one node (a rank and
	// itself included) when Topology is set: latency in seconds and time per byte of a
	// rank's memory port (1e-10 for 10 GB/s).
	IntraAlpha, IntraBeta float64
}

func (c Config) check() error {
	switch {
	case !(c.Alpha >= 0) || math.IsInf(c.Alpha, 0):
		return fmt.Errorf("simnet: Alpha %v s, want a finite number >= 0", c.Alpha)
	case !(c.Beta >= 0) || math.IsInf(c.Beta, 0):
		return fmt.Errorf("simnet: Beta %v s/byte, want a finite number >= 0", c.Beta)
	case !(c.RecvCost >= 0) || math.IsInf(c.RecvCost, 0):
		return fmt.Errorf("simnet: RecvCost %v s/byte, want a finite number >= 0", c.RecvCost)
	case !(c.Scale >= 0) || math.IsInf(c.Scale, 0):
		return fmt.Errorf("simnet: Scale %v, want a finite number >= 0 (0 means 1)", c.Scale)
	case !(c.IntraAlpha >= 0) || math.IsInf(c.IntraAlpha, 0):
		return fmt.Errorf("simnet: IntraAlpha %v s, want a finite number >= 0", c.IntraAlpha)
	case !(c.IntraBeta >= 0) || math.IsInf(c.IntraBeta, 0):
		return fmt.Errorf("simnet: IntraBeta %v s/byte, want a finite number >= 0", c.IntraBeta)
	}
	return nil
}

// Network is P simulated ranks.
type Network struct {
	cfg    Config
	scale  float64
	local  []comm.Group
	ranks  []*rank
	groups []comm.Group

	mu     sync.Mutex
	stamps map[linkKey]*stampQueue
}

// rank is one rank's clock and NIC state; only that rank's own calls change it.
type rank struct {
	mu                      sync.Mutex
	clock                   float64
	egressFree, ingressFree float64 // the NIC port
	memOutFree, memInFree   float64 // the memory port, for ranks of the same node
	compute                 float64 // total charged by Advance
	sent, recv              float64 // bytes on the clock (Scale applied)
	interSent, interRecv    float64 // of which to and from other nodes
}

// linkKey names the messages from one rank to another under one tag.
type linkKey struct {
	from, to int
	tag      uint32
}

// stamp is a message's arrival on the virtual clock.
type stamp struct {
	arrival float64 // A: the last byte at the receiver
	wire    float64 // L·Scale·β: the time it occupies a port
	bytes   float64 // L·Scale
	real    int     // L, the payload
	intra   bool    // between ranks of one node: the memory port, not the NIC
	inter   bool    // between ranks of different nodes (only with a Topology)
	taken   bool
}

// stampQueue holds the stamps of one link in send order; receives take them in posting
// order, which is the order comm.NewLocal matches messages to receives.
type stampQueue struct {
	sent   []stamp // stamps not yet taken; sent[0] is message number base
	base   int64
	posted int64 // receives posted so far: the next receive takes message number posted
}

// New returns a simulated network of size ranks. All clocks start at 0.
func New(size int, cfg Config) (*Network, error) {
	if size < 1 {
		return nil, fmt.Errorf("simnet: New: size %d, want >= 1", size)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if s := cfg.Topology.Size(); s != 0 && s != size {
		return nil, fmt.Errorf("simnet: New: topology of %d ranks for %d ranks", s, size)
	}
	local, err := comm.NewLocal(size)
	if err != nil {
		return nil, err
	}
	n := &Network{cfg: cfg, scale: cfg.Scale, local: local, ranks: make([]*rank, size),
		groups: make([]comm.Group, size), stamps: map[linkKey]*stampQueue{}}
	if n.scale == 0 {
		n.scale = 1
	}
	for r := range size {
		n.ranks[r] = &rank{}
		n.groups[r] = &group{net: n, rank: r, inner: local[r]}
	}
	return n, nil
}

// Groups returns the ranks' groups: Groups()[r] is rank r's.
func (n *Network) Groups() []comm.Group { return n.groups }

// Size is the number of ranks.
func (n *Network) Size() int { return len(n.ranks) }

// Clock returns rank r's virtual time in seconds.
func (n *Network) Clock(r int) float64 {
	rk := n.ranks[r]
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return rk.clock
}

// Computed returns the total local computation charged to rank r by Advance, in seconds.
func (n *Network) Computed(r int) float64 {
	rk := n.ranks[r]
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return rk.compute
}

// Bytes returns the bytes rank r has sent and received so far as the clock counts them: with
// Scale applied (Counters count the real payload).
func (n *Network) Bytes(r int) (sent, recv float64) {
	rk := n.ranks[r]
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return rk.sent, rk.recv
}

// InterBytes returns the part of Bytes(r) exchanged with ranks on other nodes (0 without a
// Topology).
func (n *Network) InterBytes(r int) (sent, recv float64) {
	rk := n.ranks[r]
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return rk.interSent, rk.interRecv
}

// Topology is the ranks' placement on nodes: Config.Topology, or a node per rank.
func (n *Network) Topology() comm.Topology {
	if n.cfg.Topology.Size() == 0 {
		return comm.FlatTopology(len(n.ranks))
	}
	return n.cfg.Topology
}

// intra reports whether a message from one rank to another moves through shared memory.
func (n *Network) intra(from, to int) bool {
	return n.cfg.Topology.Size() != 0 && n.cfg.Topology.SameNode(from, to)
}

// inter reports whether a message from one rank to another crosses nodes; without a Topology,
// none is counted as crossing.
func (n *Network) inter(from, to int) bool {
	return n.cfg.Topology.Size() != 0 && !n.cfg.Topology.SameNode(from, to)
}

// Advance charges d seconds of local computation to rank r: its clock moves forward by d.
// Call it from rank r's goroutine (or while rank r is idle).
func (n *Network) Advance(r int, d float64) {
	if !(d > 0) {
		return
	}
	rk := n.ranks[r]
	rk.mu.Lock()
	rk.clock += d
	rk.compute += d
	rk.mu.Unlock()
}

// Sync sets every clock to the latest one and returns it: a barrier that costs nothing, such
// as the start of an iteration after a forward and backward pass of equal length everywhere.
// Call it while no rank communicates.
func (n *Network) Sync() float64 {
	t := 0.0
	for _, rk := range n.ranks {
		rk.mu.Lock()
		t = max(t, rk.clock)
		rk.mu.Unlock()
	}
	for _, rk := range n.ranks {
		rk.mu.Lock()
		rk.clock = t
		rk.mu.Unlock()
	}
	return t
}

// send stamps a message of L bytes posted by rank from at its current clock, queues the stamp
// for its receive and returns when the sender is done with it.
func (n *Network) send(from, to int, tag uint32, l int) float64 {
	rk := n.ranks[from]
	bytes := float64(l)
	if n.cfg.Unscaled == nil || !n.cfg.Unscaled(tag) {
		bytes *= n.scale
	}
	intra, inter := n.intra(from, to), n.inter(from, to)
	alpha, beta, free := n.cfg.Alpha, n.cfg.Beta, &rk.egressFree
	if intra {
		alpha, beta, free = n.cfg.IntraAlpha, n.cfg.IntraBeta, &rk.memOutFree
	}
	wire := bytes * beta
	rk.mu.Lock()
	start := max(rk.clock, *free)
	*free = start + wire
	rk.sent += bytes
	if inter {
		rk.interSent += bytes
	}
	done := *free
	rk.mu.Unlock()
	st := stamp{arrival: start + alpha + wire, wire: wire, bytes: bytes, real: l, intra: intra, inter: inter}
	n.mu.Lock()
	q := n.queue(linkKey{from, to, tag})
	q.sent = append(q.sent, st)
	n.mu.Unlock()
	return done
}

// queue returns the stamp queue of a link; n.mu is held.
func (n *Network) queue(k linkKey) *stampQueue {
	q := n.stamps[k]
	if q == nil {
		q = &stampQueue{}
		n.stamps[k] = q
	}
	return q
}

// postRecv numbers a receive posted by rank to from rank from under tag.
func (n *Network) postRecv(from, to int, tag uint32) int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.queue(linkKey{from, to, tag})
	i := q.posted
	q.posted++
	return i
}

// takeStamp removes and returns message number i of a link. Its message has been delivered,
// so its stamp is there.
func (n *Network) takeStamp(k linkKey, i int64) (stamp, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.stamps[k]
	if q == nil || i < q.base || i-q.base >= int64(len(q.sent)) {
		return stamp{}, false
	}
	st := q.sent[i-q.base]
	if st.taken {
		return stamp{}, false
	}
	q.sent[i-q.base].taken = true
	for len(q.sent) > 0 && q.sent[0].taken { // receives usually complete in order
		q.sent[0] = stamp{}
		q.sent = q.sent[1:]
		q.base++
	}
	if len(q.sent) == 0 && q.posted == q.base {
		delete(n.stamps, k)
	}
	return st, true
}

// complete moves rank r's clock past a completed receive with stamp st.
func (n *Network) complete(r int, st stamp) {
	rk := n.ranks[r]
	rk.mu.Lock()
	free := &rk.ingressFree
	if st.intra {
		free = &rk.memInFree
	}
	if st.inter {
		rk.interRecv += st.bytes
	}
	end := max(st.arrival, *free+st.wire)
	*free = end
	rk.recv += st.bytes
	proc := st.bytes * n.cfg.RecvCost
	rk.clock = max(rk.clock, end) + proc
	rk.compute += proc
	rk.mu.Unlock()
}

// waitSend moves rank r's clock to the moment its send left the egress.
func (n *Network) waitSend(r int, done float64) {
	rk := n.ranks[r]
	rk.mu.Lock()
	rk.clock = max(rk.clock, done)
	rk.mu.Unlock()
}

// group is one rank's comm.Group: the in-process transport moves the data, the Network keeps
// the time.
type group struct {
	net   *Network
	rank  int
	inner comm.Group
}

var (
	_ comm.Group      = (*group)(nil)
	_ comm.Clocked    = (*group)(nil)
	_ comm.Topologist = (*group)(nil)
)

// Topology is the network's placement of the ranks on nodes (comm.Topologist).
func (g *group) Topology() comm.Topology { return g.net.Topology() }

// Now is the rank's virtual time (comm.Clocked): code that times its communication through
// comm.Now measures the simulated network.
func (g *group) Now() time.Duration { return time.Duration(g.net.Clock(g.rank) * float64(time.Second)) }

func (g *group) Rank() int                { return g.rank }
func (g *group) Size() int                { return g.inner.Size() }
func (g *group) Counters() *comm.Counters { return g.inner.Counters() }
func (g *group) Close() error             { return g.inner.Close() }
func (g *group) peerOK(op string, p int, tag uint32) error {
	if p < 0 || p >= g.Size() {
		return fmt.Errorf("simnet: rank %d: %s rank %d tag %d: rank out of range [0, %d)", g.rank, op, p, tag, g.Size())
	}
	return nil
}

// Send stamps the message, delivers it and returns once it has left the sender's egress on
// the virtual clock.
func (g *group) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	_, err := g.Isend(ctx, to, tag, payload).Wait()
	return err
}

// Isend posts the message at the rank's current virtual time; its Wait moves the clock to the
// moment the message has left the egress.
func (g *group) Isend(ctx context.Context, to int, tag uint32, payload []byte) *comm.Request {
	if err := g.peerOK("send to", to, tag); err != nil {
		return comm.DoneRequest(0, err)
	}
	if err := ctx.Err(); err != nil {
		return comm.DoneRequest(0, fmt.Errorf("simnet: rank %d: send to rank %d tag %d: %w", g.rank, to, tag, err))
	}
	done := g.net.send(g.rank, to, tag, len(payload))
	err := g.inner.Send(ctx, to, tag, payload)
	if err == nil && g.net.inter(g.rank, to) {
		g.Counters().AddInterSent(len(payload))
	}
	return comm.DoneRequest(len(payload), err).Observe(func() {
		if err == nil {
			g.net.waitSend(g.rank, done)
		}
	})
}

// Recv receives and moves the clock past the message's arrival (see the package doc).
func (g *group) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	return g.Irecv(ctx, from, tag, buf).Wait()
}

// Irecv posts a receive; its Wait moves the clock past the message's arrival.
func (g *group) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *comm.Request {
	if err := g.peerOK("recv from", from, tag); err != nil {
		return comm.DoneRequest(0, err)
	}
	i := g.net.postRecv(from, g.rank, tag)
	req := g.inner.Irecv(ctx, from, tag, buf)
	key := linkKey{from, g.rank, tag}
	return req.Observe(func() {
		if st, ok := g.net.takeStamp(key, i); ok {
			g.net.complete(g.rank, st)
			if st.inter {
				g.Counters().AddInterRecv(st.real)
			}
		}
	})
}
