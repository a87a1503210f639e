package comm

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// opWatch lists the operations started under an operation timeout (TCPConfig.OpTimeout,
// ShmConfig.OpTimeout), oldest first; the transport's watcher drops the completed ones and
// fails the group when one is late.
type opWatch struct {
	mu  sync.Mutex
	ops []watchedOp
}

type watchedOp struct {
	req      *Request
	op       string // "send to", "recv from"
	peer     int
	tag      uint32
	deadline time.Time
}

// add puts r, an operation with a peer, under the timeout unless it is already complete.
func (w *opWatch) add(r *Request, op string, peer int, tag uint32, timeout time.Duration) {
	select {
	case <-r.done:
		return
	default:
	}
	w.mu.Lock()
	w.ops = append(w.ops, watchedOp{req: r, op: op, peer: peer, tag: tag, deadline: time.Now().Add(timeout)})
	w.mu.Unlock()
}

// late drops the completed operations and returns the oldest pending one past its deadline,
// if there is one.
func (w *opWatch) late(now time.Time) (watchedOp, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	live := w.ops[:0]
	var late watchedOp
	found := false
	for _, o := range w.ops {
		select {
		case <-o.req.done:
			continue
		default:
		}
		live = append(live, o)
		if !found && !now.Before(o.deadline) {
			late, found = o, true
		}
	}
	clear(w.ops[len(live):])
	w.ops = live
	return late, found
}

// opTimeoutCause is why a live peer is declared failed when the operation op ("send to",
// "recv from") with it under tag has waited for timeout.
func opTimeoutCause(op string, tag uint32, timeout time.Duration) error {
	what := "sent nothing for this rank's receive"
	if op == "send to" {
		what = "did not take this rank's message"
	}
	return fmt.Errorf("alive, but %s under tag %d within the operation timeout %v (are the ranks out of step?)",
		what, tag, timeout)
}

// watchOp puts r (an operation with peer) under the operation timeout, if there is one, and
// returns it. Operations with this rank itself are not watched: they wait for this rank alone.
func (g *tcpGroup) watchOp(r *Request, op string, peer int, tag uint32) *Request {
	if g.opTimeout <= 0 || peer == g.rank {
		return r
	}
	g.watch.add(r, op, peer, tag, g.opTimeout)
	return r
}

// opWatchTick is how often the watcher looks: a quarter of the timeout, at most a second.
func opWatchTick(timeout time.Duration) time.Duration {
	return max(min(timeout/4, time.Second), time.Millisecond)
}

// opWatcher checks the watched operations until the group closes.
func (g *tcpGroup) opWatcher() { watchOps(g.done, g.opTimeout, g.checkOps) }

// watchOps calls check every opWatchTick(timeout) until done is closed: a transport's
// operation-timeout watcher.
func watchOps(done <-chan struct{}, timeout time.Duration, check func(now time.Time)) {
	tick := time.NewTicker(opWatchTick(timeout))
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			check(now)
		}
	}
}

// checkOps drops the completed operations and, if one is still pending past its deadline,
// declares its peer failed: alive (its heartbeats arrive) but not taking part.
func (g *tcpGroup) checkOps(now time.Time) {
	lateOp, late := g.watch.late(now)
	if !late || g.failure.Load() != nil {
		return
	}
	p := g.peers[lateOp.peer]
	if lateOp.op == "recv from" {
		if tags := p.queuedTags(lateOp.tag); len(tags) > 0 {
			// The peer is busy with other messages for this rank, which this rank has not
			// asked for: this rank is the one out of step.
			g.fail(&PeerError{Rank: g.rank, ReportedBy: -1, self: g.rank, Cause: fmt.Errorf(
				"out of step: waited %v (the operation timeout) for rank %d under tag %d, while rank %d sent it messages under tag(s) %v that it has not received",
				g.opTimeout, lateOp.peer, lateOp.tag, lateOp.peer, tags)})
			return
		}
	}
	g.peerFailed(p, opTimeoutCause(lateOp.op, lateOp.tag, g.opTimeout))
}

// queuedTags lists the tags other than except under which the peer's messages wait for a
// receive (in no particular order, at most 8).
func (p *tcpPeer) queuedTags(except uint32) []uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var tags []uint32
	for tag, b := range p.boxes {
		if tag != except && len(b.msgs) > 0 && len(tags) < 8 {
			tags = append(tags, tag)
		}
	}
	slices.Sort(tags)
	return tags
}
