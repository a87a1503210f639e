package comm

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// tcpOpWatch lists the operations started under TCPConfig.OpTimeout, oldest first; the
// watcher drops the completed ones and fails the group when one is late.
type tcpOpWatch struct {
	mu  sync.Mutex
	ops []tcpWatched
}

type tcpWatched struct {
	req      *Request
	op       string // "send to", "recv from"
	peer     int
	tag      uint32
	deadline time.Time
}

// watchOp puts r (an operation with peer) under the operation timeout, if there is one, and
// returns it. Operations with this rank itself are not watched: they wait for this rank alone.
func (g *tcpGroup) watchOp(r *Request, op string, peer int, tag uint32) *Request {
	if g.opTimeout <= 0 || peer == g.rank {
		return r
	}
	select {
	case <-r.done:
		return r
	default:
	}
	g.watch.mu.Lock()
	g.watch.ops = append(g.watch.ops, tcpWatched{req: r, op: op, peer: peer, tag: tag, deadline: time.Now().Add(g.opTimeout)})
	g.watch.mu.Unlock()
	return r
}

// opWatchTick is how often the watcher looks: a quarter of the timeout, at most a second.
func opWatchTick(timeout time.Duration) time.Duration {
	return max(min(timeout/4, time.Second), time.Millisecond)
}

// opWatcher checks the watched operations until the group closes.
func (g *tcpGroup) opWatcher() {
	tick := time.NewTicker(opWatchTick(g.opTimeout))
	defer tick.Stop()
	for {
		select {
		case <-g.done:
			return
		case now := <-tick.C:
			g.checkOps(now)
		}
	}
}

// checkOps drops the completed operations and, if one is still pending past its deadline,
// declares its peer failed: alive (its heartbeats arrive) but not taking part.
func (g *tcpGroup) checkOps(now time.Time) {
	g.watch.mu.Lock()
	live := g.watch.ops[:0]
	var late *tcpWatched
	for _, w := range g.watch.ops {
		select {
		case <-w.req.done:
			continue
		default:
		}
		live = append(live, w)
		if late == nil && !now.Before(w.deadline) {
			late = &live[len(live)-1]
		}
	}
	clear(g.watch.ops[len(live):])
	g.watch.ops = live
	var lateOp tcpWatched
	if late != nil {
		lateOp = *late
	}
	g.watch.mu.Unlock()
	if late == nil || g.failure.Load() != nil {
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
	what := "sent nothing for this rank's receive"
	if lateOp.op == "send to" {
		what = "did not take this rank's message"
	}
	g.peerFailed(p, fmt.Errorf("alive, but %s under tag %d within the operation timeout %v (are the ranks out of step?)",
		what, lateOp.tag, g.opTimeout))
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
