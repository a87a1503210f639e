package comm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Route returns this rank's view of a job whose ranks are placed on nodes by t: messages to and
// from ranks on this rank's node (itself included) travel through local, and all others through
// world. world is a group of all t.Size() ranks (the job's TCP group); local is a group of just
// this node's ranks, numbered in ascending world order (local rank i is t.Members(node)[i]),
// typically shared memory. The two must not be used directly while the view is in use.
//
// The view keeps the Group contract in world ranks: FIFO per (sender, receiver, tag) holds
// because a pair of ranks always uses the same path, errors name world ranks (a failure the
// local group reports in its own numbering is translated, PeerError included), and Close closes
// both groups. The first peer failure either group reports fails every pending and later
// operation of the view; a failure of world (a TCP peer declared failed by heartbeats) also
// releases operations waiting on local. Its Counters are its own: every message, plus the
// payload that crosses nodes in Stats.InterBytesSent/InterBytesRecv. It is a Topologist
// reporting t.
func Route(world, local Group, t Topology) (Group, error) {
	if err := checkGroup("Route", world); err != nil {
		return nil, err
	}
	if err := checkGroup("Route", local); err != nil {
		return nil, err
	}
	self := world.Rank()
	if t.Size() != world.Size() {
		return nil, fmt.Errorf("comm: Route: rank %d: topology of %d ranks for a world of %d", self, t.Size(), world.Size())
	}
	node := t.Node(self)
	members := t.Members(node)
	if local.Size() != len(members) {
		return nil, fmt.Errorf("comm: Route: rank %d: node %d has ranks %v but the local group has %d", self, node, members, local.Size())
	}
	if lr := t.LocalRank(self); local.Rank() != lr {
		return nil, fmt.Errorf("comm: Route: rank %d: the local group numbers this rank %d, but it is local rank %d of node %d (ranks %v)",
			self, local.Rank(), lr, node, members)
	}
	localOf := make([]int, t.Size()) // world rank → local rank, -1 for other nodes
	for r := range localOf {
		localOf[r] = -1
	}
	for i, m := range members {
		localOf[m] = i
	}
	failCtx, failCancel := context.WithCancelCause(context.Background())
	g := &routedGroup{world: world, local: local, top: t, self: self, members: members, localOf: localOf,
		failCtx: failCtx, failCancel: failCancel, closing: make(chan struct{})}
	if s, ok := world.(failureSignaller); ok {
		// A failure of the world group is this view's failure, even while this rank only waits
		// on its node's group.
		failed := s.failedSignal()
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			select {
			case <-failed:
				if err := s.termErr(); err != nil {
					g.fail(err)
				}
			case <-g.closing:
			}
		}()
	}
	return g, nil
}

// failureSignaller is implemented by transports that can tell when they have failed (TCP).
type failureSignaller interface {
	// failedSignal is closed when the group has failed; termErr then says why.
	failedSignal() <-chan struct{}
	termErr() error
}

type routedGroup struct {
	world, local Group
	top          Topology
	self         int
	members      []int // world ranks of this node, ascending
	localOf      []int // world rank → local rank, -1 off this node
	counters     Counters

	failure    atomic.Pointer[error] // the first peer failure; every operation fails with it
	failCtx    context.Context       // cancelled, with the failure as cause, on the first failure
	failCancel context.CancelCauseFunc

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	closing   chan struct{} // closed by Close: stops the watcher
	wg        sync.WaitGroup
}

var (
	_ Group      = (*routedGroup)(nil)
	_ Topologist = (*routedGroup)(nil)
)

func (g *routedGroup) Rank() int           { return g.self }
func (g *routedGroup) Size() int           { return g.world.Size() }
func (g *routedGroup) Counters() *Counters { return &g.counters }
func (g *routedGroup) Topology() Topology  { return g.top }

// Underlying is the node group when the whole group is one node (its local ranks are then the
// world's), else nil (comm.Underlier).
func (g *routedGroup) Underlying() Group {
	if len(g.members) == g.world.Size() {
		return g.local
	}
	return nil
}

// underlyingOf is the node group when members are this node's ranks in their local order: a
// sub-group of exactly them is a view of it (subGroup.Underlying).
func (g *routedGroup) underlyingOf(members []int) Group {
	if slices.Equal(members, g.members) {
		return g.local
	}
	return nil
}

// fail records err as the view's failure (the first one wins) and releases the operations that
// wait on the local group.
func (g *routedGroup) fail(err error) {
	if g.failure.CompareAndSwap(nil, &err) {
		g.failCancel(err)
	}
}

// termErr is why every operation fails now (closed, or a peer failed), or nil.
func (g *routedGroup) termErr() error {
	if g.closed.Load() {
		return ErrClosed
	}
	if f := g.failure.Load(); f != nil {
		return *f
	}
	return nil
}

func (g *routedGroup) opErr(op string, peer int, tag uint32, err error) error {
	return fmt.Errorf("comm: rank %d: %s rank %d tag %d: %w", g.self, op, peer, tag, err)
}

// check validates peer and the view's state before an operation.
func (g *routedGroup) check(op string, peer int, tag uint32) error {
	if err := checkPeer(op, g.self, peer, g.Size(), tag); err != nil {
		return err
	}
	if err := g.termErr(); err != nil {
		return g.opErr(op, peer, tag, err)
	}
	return nil
}

// localCtx is ctx, also cancelled when the view fails; release must be called when the
// operation is over.
func (g *routedGroup) localCtx(ctx context.Context) (context.Context, func()) {
	c, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(g.failCtx, func() { cancel(context.Cause(g.failCtx)) })
	return c, func() { stop(); cancel(nil) }
}

// worldResult counts a completed world operation or records the failure it reports.
func (g *routedGroup) worldResult(n int, err error, sent bool) (int, error) {
	if err != nil {
		var pe *PeerError
		if errors.As(err, &pe) {
			g.fail(err)
		}
		return n, err
	}
	if sent {
		g.counters.AddSent(n)
		g.counters.AddInterSent(n)
	} else {
		g.counters.AddRecv(n)
		g.counters.AddInterRecv(n)
	}
	return n, nil
}

// localResult counts a completed local operation or translates its error into world ranks.
// callerCtx is the caller's context: when it is still live and the operation was cancelled, the
// view's failure released it.
func (g *routedGroup) localResult(callerCtx context.Context, op string, peer int, tag uint32, n int, err error, sent bool) (int, error) {
	if err == nil {
		if sent {
			g.counters.AddSent(n)
		} else {
			g.counters.AddRecv(n)
		}
		return n, nil
	}
	var pe *PeerError
	switch {
	case callerCtx.Err() == nil && g.failure.Load() != nil && errors.Is(err, context.Canceled):
		return n, g.opErr(op, peer, tag, *g.failure.Load())
	case errors.As(err, &pe):
		// The local group numbers ranks by their place on the node: name world ranks instead.
		f := &PeerError{Rank: g.worldOf(pe.Rank), Cause: pe.Cause, ReportedBy: -1, self: g.self}
		if pe.ReportedBy >= 0 {
			f.ReportedBy = g.worldOf(pe.ReportedBy)
		}
		werr := g.opErr(op, peer, tag, f)
		g.fail(f)
		return n, werr
	}
	return n, fmt.Errorf("comm: rank %d: %s rank %d tag %d, through this node's group (where they are local ranks %d and %d): %w",
		g.self, op, peer, tag, g.localOf[g.self], g.localOf[peer], err)
}

// worldOf maps a local rank to its world rank (an out-of-range one is left as it is).
func (g *routedGroup) worldOf(local int) int {
	if local >= 0 && local < len(g.members) {
		return g.members[local]
	}
	return local
}

func (g *routedGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	_, err := g.Isend(ctx, to, tag, payload).Wait()
	return err
}

func (g *routedGroup) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	return g.Irecv(ctx, from, tag, buf).Wait()
}

func (g *routedGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *Request {
	if err := g.check("send to", to, tag); err != nil {
		return DoneRequest(0, err)
	}
	if lr := g.localOf[to]; lr >= 0 {
		lctx, release := g.localCtx(ctx)
		return thenRequest(g.local.Isend(lctx, lr, tag, payload), func(n int, err error) (int, error) {
			release()
			return g.localResult(ctx, "send to", to, tag, n, err, true)
		})
	}
	return thenRequest(g.world.Isend(ctx, to, tag, payload), func(n int, err error) (int, error) {
		return g.worldResult(n, err, true)
	})
}

func (g *routedGroup) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *Request {
	if err := g.check("recv from", from, tag); err != nil {
		return DoneRequest(0, err)
	}
	if lr := g.localOf[from]; lr >= 0 {
		lctx, release := g.localCtx(ctx)
		return thenRequest(g.local.Irecv(lctx, lr, tag, buf), func(n int, err error) (int, error) {
			release()
			return g.localResult(ctx, "recv from", from, tag, n, err, false)
		})
	}
	return thenRequest(g.world.Irecv(ctx, from, tag, buf), func(n int, err error) (int, error) {
		return g.worldResult(n, err, false)
	})
}

// Close closes the local and the world group: the other ranks' operations that need this rank
// fail with ErrClosed. Closing twice is a no-op.
func (g *routedGroup) Close() error {
	g.closeOnce.Do(func() {
		g.closed.Store(true)
		close(g.closing)
		g.closeErr = errors.Join(g.local.Close(), g.world.Close())
		g.failCancel(ErrClosed)
		g.wg.Wait()
	})
	return g.closeErr
}

// thenRequest returns a request that completes with f applied to r's result. When r has
// completed already (a send that was copied, a receive of a queued message) it does so at once,
// without a goroutine.
func thenRequest(r *Request, f func(n int, err error) (int, error)) *Request {
	select {
	case <-r.Done():
		return DoneRequest(f(r.Wait()))
	default:
	}
	return GoRequest(func() (int, error) { return f(r.Wait()) })
}
