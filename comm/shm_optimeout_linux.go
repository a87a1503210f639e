//go:build linux

package comm

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// The operation timeout of a shared-memory group (ShmConfig.OpTimeout), as TCP's: receives
// and queued sends are watched by a goroutine (opWatcher) every quarter of the timeout; the
// shared all-reduce's waits check it themselves, since they wake at least that often.

// watchOp puts r (an operation with peer) under the operation timeout, if there is one, and
// returns it. Operations with this rank itself are not watched: they wait for this rank alone.
func (g *shmGroup) watchOp(r *Request, op string, peer int, tag uint32) *Request {
	if g.opTimeout <= 0 || peer == g.rank {
		return r
	}
	g.watch.add(r, op, peer, tag, g.opTimeout)
	return r
}

// opWatcher checks the watched operations until the group closes.
func (g *shmGroup) opWatcher() { watchOps(g.done, g.opTimeout, g.checkOps) }

// checkOps drops the completed operations and, if one is still pending past its deadline,
// declares its peer failed: alive (its heartbeat moves) but not taking part. A receive whose
// peer sent this rank messages under other tags, or that keeps this rank from a shared
// all-reduce the others wait in, makes this rank the one out of step.
func (g *shmGroup) checkOps(now time.Time) {
	w, late := g.watch.late(now)
	if !late || g.failure.Load() != nil || g.closed.Load() || g.reportedFailure() {
		return
	}
	if w.op == "recv from" {
		if tags := g.peers[w.peer].queuedTags(w.tag); len(tags) > 0 {
			g.fail(&PeerError{Rank: g.rank, ReportedBy: -1, self: g.rank, Cause: fmt.Errorf(
				"out of step: waited %v (the operation timeout) for rank %d under tag %d, while rank %d sent it messages under tag(s) %v that it has not received",
				g.opTimeout, w.peer, w.tag, w.peer, tags)})
			return
		}
		if ahead := g.reduceAhead(); len(ahead) > 0 {
			g.fail(&PeerError{Rank: g.rank, ReportedBy: -1, self: g.rank, Cause: fmt.Errorf(
				"out of step: waited %v (the operation timeout) for rank %d under tag %d, while rank(s) %v wait for it in a shared all-reduce",
				g.opTimeout, w.peer, w.tag, ahead)})
			return
		}
	}
	g.peerFailed(w.peer, opTimeoutCause(w.op, w.tag, g.opTimeout))
}

// reportedFailure makes this rank fail as a peer whose slot reports a failure does, and
// reports whether there was one: a failure already found elsewhere is named before a timeout
// of this rank's own.
func (g *shmGroup) reportedFailure() bool {
	for r := range g.size {
		if r != g.rank && g.peerState(r) == shmFailed {
			g.peerReported(r)
			return true
		}
	}
	return false
}

// queuedTags lists the tags other than except under which the peer's messages wait for a
// receive (at most 8, ascending).
func (p *shmPeer) queuedTags(except uint32) []uint32 {
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

// reduceBarriers is the number of shared all-reduce barriers rank r has reached, as its slot
// says.
func (g *shmGroup) reduceBarriers(r int) uint64 { return g.mem.load64(g.slot(r) + sRBarriers) }

// reduceAhead lists the ranks that wait at a shared all-reduce barrier this rank has not
// reached.
func (g *shmGroup) reduceAhead() []int {
	mine := g.ar.barriers.Load()
	if atomic.LoadUint64(g.mem.u64(hRArrive)) <= mine*uint64(g.size) {
		return nil
	}
	var ahead []int
	for r := range g.size {
		if r != g.rank && g.reduceBarriers(r) > mine {
			ahead = append(ahead, r)
		}
	}
	return ahead
}

// reduceLate handles a wait in the shared all-reduce under tag that has lasted the operation
// timeout: the ranks that have not reached barrier k (k 0: the furthest barrier any rank has
// reached) are named, the first as the failed peer. If this rank is one of them (a wait for
// its turn while the others wait for it), it is the one out of step.
func (g *shmGroup) reduceLate(tag uint32, k uint64) {
	if g.failure.Load() != nil || g.closed.Load() || g.reportedFailure() {
		return
	}
	if k == 0 {
		for r := range g.size {
			k = max(k, g.reduceBarriers(r))
		}
	}
	var late []int
	for r := range g.size {
		if g.reduceBarriers(r) < k {
			late = append(late, r)
		}
	}
	switch {
	case len(late) == 0:
		return // every rank is there: the wait ends now
	case slices.Contains(late, g.rank):
		var ahead []int
		for r := range g.size {
			if !slices.Contains(late, r) {
				ahead = append(ahead, r)
			}
		}
		g.fail(&PeerError{Rank: g.rank, ReportedBy: -1, self: g.rank, Cause: fmt.Errorf(
			"out of step: waited %v (the operation timeout) to start a shared all-reduce under tag %d, while rank(s) %v wait for it in another one",
			g.opTimeout, tag, ahead)})
		return
	}
	cause := fmt.Sprintf("alive, but did not reach the barrier of the shared all-reduce under tag %d within the operation timeout %v (are the ranks out of step?)",
		tag, g.opTimeout)
	if len(late) > 1 {
		cause += fmt.Sprintf("; nor did rank(s) %v", late[1:])
	}
	g.peerFailed(late[0], errors.New(cause))
}
