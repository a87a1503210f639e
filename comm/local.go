package comm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// NewLocal returns size in-process ranks, one Group each, meant to be driven by one goroutine
// (or several) per rank. Send copies the payload (straight into a waiting receive's buffer when
// one is posted, otherwise into an unbounded queue), so Send never blocks on the receiver.
// Sending to oneself is allowed. Closing one rank fails its own pending and later operations and
// any receive that waits, with nothing queued, for a message from it.
func NewLocal(size int) ([]Group, error) {
	if size < 1 {
		return nil, fmt.Errorf("comm: NewLocal: size %d, want >= 1", size)
	}
	w := &localWorld{ranks: make([]*localGroup, size)}
	groups := make([]Group, size)
	for r := range size {
		w.ranks[r] = &localGroup{world: w, rank: r, boxes: make(map[boxKey]*mailbox)}
		groups[r] = w.ranks[r]
	}
	return groups, nil
}

// NewInProcess is NewLocal.
func NewInProcess(size int) ([]Group, error) { return NewLocal(size) }

type localWorld struct {
	ranks []*localGroup
	msgs  sizedPool // copies of messages sent before their receive was posted
}

// boxKey names the queue of messages to one rank from rank `from` under `tag`.
type boxKey struct {
	from int
	tag  uint32
}

// mailbox holds, for one (from, tag) at one receiver, either queued messages or queued receives
// (never both non-empty: a message arriving while a receive waits completes that receive).
type mailbox struct {
	msgs    [][]byte
	waiting []*pendingRecv
}

type pendingRecv struct {
	req       *Request
	buf       []byte
	completed bool
	stop      func() bool // unregisters the context watcher; nil until registered
}

type localGroup struct {
	world    *localWorld
	rank     int
	counters Counters
	closed   atomic.Bool

	mu    sync.Mutex // guards boxes and the pendingRecvs in them
	boxes map[boxKey]*mailbox
}

var _ Group = (*localGroup)(nil)

func (g *localGroup) Rank() int           { return g.rank }
func (g *localGroup) Size() int           { return len(g.world.ranks) }
func (g *localGroup) Counters() *Counters { return &g.counters }

func (g *localGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	if err := checkPeer("send to", g.rank, to, g.Size(), tag); err != nil {
		return err
	}
	if g.closed.Load() {
		return fmt.Errorf("comm: rank %d: send to rank %d tag %d: %w", g.rank, to, tag, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("comm: rank %d: send to rank %d tag %d: %w", g.rank, to, tag, err)
	}
	dst := g.world.ranks[to]
	dst.mu.Lock()
	defer dst.mu.Unlock()
	if dst.closed.Load() {
		return fmt.Errorf("comm: rank %d: send to rank %d tag %d: %w", g.rank, to, tag, peerClosed(to))
	}
	g.counters.AddSent(len(payload))
	key := boxKey{from: g.rank, tag: tag}
	box := dst.boxes[key]
	if box != nil && len(box.waiting) > 0 {
		p := box.waiting[0]
		box.waiting[0] = nil
		box.waiting = box.waiting[1:]
		dst.dropIfEmpty(key, box)
		dst.deliverLocked(p, g.rank, tag, payload)
		return nil
	}
	if box == nil {
		box = &mailbox{}
		dst.boxes[key] = box
	}
	m := g.world.msgs.get(len(payload))
	copy(m, payload)
	box.msgs = append(box.msgs, m)
	return nil
}

// deliverLocked completes p with payload from rank `from`; g.mu is held.
func (g *localGroup) deliverLocked(p *pendingRecv, from int, tag uint32, payload []byte) {
	if len(payload) > len(p.buf) {
		g.finishLocked(p, 0, fmt.Errorf("comm: rank %d: recv from rank %d tag %d: message of %d bytes does not fit buffer of %d bytes",
			g.rank, from, tag, len(payload), len(p.buf)))
		return
	}
	n := copy(p.buf, payload)
	g.counters.AddRecv(n)
	g.finishLocked(p, n, nil)
}

func (g *localGroup) finishLocked(p *pendingRecv, n int, err error) {
	p.completed = true
	if p.stop != nil {
		p.stop()
	}
	p.req.complete(n, err)
}

func (g *localGroup) dropIfEmpty(key boxKey, box *mailbox) {
	if len(box.msgs) == 0 && len(box.waiting) == 0 {
		delete(g.boxes, key)
	}
}

func (g *localGroup) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	return g.Irecv(ctx, from, tag, buf).Wait()
}

func (g *localGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *Request {
	return DoneRequest(len(payload), g.Send(ctx, to, tag, payload))
}

func (g *localGroup) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *Request {
	if err := checkPeer("recv from", g.rank, from, g.Size(), tag); err != nil {
		return DoneRequest(0, err)
	}
	p := &pendingRecv{req: newRequest(), buf: buf}
	key := boxKey{from: from, tag: tag}

	g.mu.Lock()
	if g.closed.Load() {
		g.mu.Unlock()
		return DoneRequest(0, fmt.Errorf("comm: rank %d: recv from rank %d tag %d: %w", g.rank, from, tag, ErrClosed))
	}
	box := g.boxes[key]
	if box != nil && len(box.msgs) > 0 {
		msg := box.msgs[0]
		box.msgs[0] = nil
		box.msgs = box.msgs[1:]
		g.dropIfEmpty(key, box)
		g.deliverLocked(p, from, tag, msg)
		g.world.msgs.put(msg) // delivered by copy; the buffer is free again
		g.mu.Unlock()
		return p.req
	}
	if g.world.ranks[from].closed.Load() {
		g.mu.Unlock()
		return DoneRequest(0, fmt.Errorf("comm: rank %d: recv from rank %d tag %d: %w", g.rank, from, tag, peerClosed(from)))
	}
	if err := ctx.Err(); err != nil {
		g.mu.Unlock()
		return DoneRequest(0, fmt.Errorf("comm: rank %d: recv from rank %d tag %d: %w", g.rank, from, tag, err))
	}
	if box == nil {
		box = &mailbox{}
		g.boxes[key] = box
	}
	box.waiting = append(box.waiting, p)
	g.mu.Unlock()

	// The watcher withdraws the receive when ctx ends first. It is registered outside the lock
	// (AfterFunc may run its function at once) and unregistered when the receive completes.
	stop := context.AfterFunc(ctx, func() { g.cancelRecv(p, key, ctx) })
	g.mu.Lock()
	if p.completed {
		stop()
	} else {
		p.stop = stop
	}
	g.mu.Unlock()
	return p.req
}

// cancelRecv withdraws p if it is still waiting, completing it with ctx's error.
func (g *localGroup) cancelRecv(p *pendingRecv, key boxKey, ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.completed {
		return
	}
	if box := g.boxes[key]; box != nil {
		for i, q := range box.waiting {
			if q == p {
				box.waiting = append(box.waiting[:i], box.waiting[i+1:]...)
				break
			}
		}
		g.dropIfEmpty(key, box)
	}
	g.finishLocked(p, 0, fmt.Errorf("comm: rank %d: recv from rank %d tag %d: %w", g.rank, key.from, key.tag, ctx.Err()))
}

// peerClosed is the error of an operation that needs rank r after r closed its group: a
// rank that returns early or fails closes its group (defer g.Close()) so that the others'
// collectives fail with this error, naming it, instead of waiting for it.
func peerClosed(r int) error {
	return fmt.Errorf("rank %d closed its group (it returned or failed): %w", r, ErrClosed)
}

// Close fails this rank's pending receives and all its later operations with ErrClosed, and
// fails other ranks' receives that wait, with nothing queued, for a message from this rank.
// Closing twice is a no-op.
func (g *localGroup) Close() error {
	g.mu.Lock()
	if g.closed.Swap(true) {
		g.mu.Unlock()
		return nil
	}
	for key, box := range g.boxes {
		for _, p := range box.waiting {
			g.finishLocked(p, 0, fmt.Errorf("comm: rank %d: recv from rank %d tag %d: %w", g.rank, key.from, key.tag, ErrClosed))
		}
		delete(g.boxes, key)
	}
	g.mu.Unlock()

	for _, peer := range g.world.ranks {
		if peer == g {
			continue
		}
		peer.mu.Lock()
		for key, box := range peer.boxes {
			if key.from != g.rank {
				continue
			}
			for _, p := range box.waiting {
				peer.finishLocked(p, 0, fmt.Errorf("comm: rank %d: recv from rank %d tag %d: %w", peer.rank, key.from, key.tag, peerClosed(key.from)))
			}
			box.waiting = nil
			peer.dropIfEmpty(key, box)
		}
		peer.mu.Unlock()
	}
	return nil
}
