package comm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

const (
	// tcpBatchBytes and tcpBatchFrames bound one vectored write: frames of several tags go out
	// together up to about one chunk's worth of bytes.
	tcpBatchBytes  = tcpMaxChunk
	tcpBatchFrames = 64
	// tcpReadBuffer is the reader's buffer: small frames arrive many per read system call.
	tcpReadBuffer = 64 << 10
)

// tcpPeer is this rank's end of its connection to one peer: the matching of the peer's messages
// to receives, the reader goroutine that fills them and the writer goroutine that sends to the
// peer. The peer at this rank's own index is the in-memory loop back: no connection, no
// goroutines.
//
// A message is matched when its first frame arrives: to the oldest receive waiting for its
// (peer, tag), whose buffer the reader then fills directly, or else to a pooled buffer queued
// in the box until a receive takes it. The reader writes into a message's buffer without the
// lock ("busy"); anyone else who changes a message's owner meanwhile (a receive posted for a
// queued message, a cancelled receive) only records it, and the reader moves the data at its
// next safe point (end of a chunk, or at once when poked through a read deadline). A receive
// whose buffer the reader is writing into completes only after the reader has left it.
type tcpPeer struct {
	g       *tcpGroup
	rank    int
	conn    net.Conn    // nil for the loop back
	gone    atomic.Bool // the peer said goodbye
	saidBye atomic.Bool // this rank said (or is saying) goodbye: the connection may end
	failed  atomic.Bool // the peer was declared failed, by this rank or in a report

	// Receive side, guarded by mu.
	mu       sync.Mutex
	boxes    map[uint32]*tcpBox
	inflight map[uint32]*tcpIncoming // messages partly read, by tag
	goneErr  error                   // once the peer said goodbye: why receives from it fail

	br         *bufio.Reader
	sink       []byte       // where discarded payload is read to
	reads      atomic.Int64 // the reader's progress, watched by the monitor
	readerDone chan struct{}

	// Send side, guarded by wmu.
	wmu        sync.Mutex
	queues     map[uint32]*tcpSendQueue
	ready      []uint32 // tags with queued frames, in round-robin order
	readySpare []uint32
	hbDue      bool
	wstop      bool  // the writer is to exit (after a goodbye when byeDue)
	byeDue     bool  // the writer says goodbye before it exits
	sendErr    error // later sends to this peer fail with it
	kick       chan struct{}
	interrupt  atomic.Bool  // a send in the batch being written was cancelled
	writes     atomic.Int64 // batches written, watched by the monitor for idleness

	// Writer-owned.
	iov     [][]byte
	batch   []tcpBatchEntry
	visited int // p.ready[:visited] contributed to the batch
	ctrl    [frameHeaderLen]byte
}

const (
	inPool msgPlace = iota // a pooled buffer of the transport
	inRecv                 // the buffer of the receive it is matched to
	inSink                 // nowhere: discarded as it arrives
)

func newTCPPeer(g *tcpGroup, rank int, conn net.Conn) *tcpPeer {
	p := &tcpPeer{
		g:          g,
		rank:       rank,
		conn:       conn,
		boxes:      make(map[uint32]*tcpBox),
		inflight:   make(map[uint32]*tcpIncoming),
		queues:     make(map[uint32]*tcpSendQueue),
		kick:       make(chan struct{}, 1),
		readerDone: make(chan struct{}),
	}
	if conn != nil {
		p.br = bufio.NewReaderSize(conn, tcpReadBuffer)
	}
	return p
}

// failReceives ends every pending receive from this peer with err and drops what is queued:
// the rank is closing or has failed, so no later receive will want it.
func (p *tcpPeer) failReceives(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for tag, box := range p.boxes {
		for _, q := range box.waiting {
			p.completeRecvLocked(q, 0, p.recvErr(tag, err))
		}
		for _, m := range box.msgs {
			if m.complete {
				p.g.msgs.put(m.buf)
			}
			m.discard = true
			if !m.complete && !m.busy {
				p.relocateLocked(m)
			}
		}
		delete(p.boxes, tag)
	}
	for _, m := range p.inflight {
		m.discard = true
		if q := m.owner; q != nil {
			q.owns, m.owner = nil, nil
			if !m.busy {
				p.relocateLocked(m)
			}
			if q.msg != nil {
				q.deferred = p.recvErr(q.tag, err)
				p.poke()
			} else {
				p.completeRecvLocked(q, 0, p.recvErr(q.tag, err))
			}
		} else if !m.busy {
			p.relocateLocked(m)
		} else if m.dest != nil {
			p.poke() // a cancelled receive waits for the reader
		}
	}
}

// peerSaidBye handles the peer's goodbye: its partial messages are dropped, receives that
// wait for it and later ones with nothing queued fail with ErrClosed, sends to it too. A
// goodbye that reports a failure fails this rank with it first (see tcpGroup.peerReported), so
// that what waited for the peer fails naming the rank that failed.
func (p *tcpPeer) peerSaidBye(r byeReason) {
	p.gone.Store(true) // before the report: this rank's own goodbye does not go to p
	if r.failedRank >= 0 {
		p.g.peerReported(p.rank, r)
	}
	goneErr := fmt.Errorf("peer rank %d closed its group: %w", p.rank, ErrClosed)
	// Sends fail before any receive reports the goodbye: a caller that has seen a receive from
	// p fail must not see a later send to p succeed (the writer would still deliver it).
	why := p.g.termErr()
	if why == nil {
		why = goneErr
	}
	p.stopWriter(false, why)
	p.mu.Lock()
	p.goneErr = goneErr
	// A failure of this rank outranks the goodbye: the one reported here, or one that another
	// goroutine has just set and whose failReceives has not reached this peer yet.
	why = p.g.termErr()
	if why == nil {
		why = p.goneErr
	}
	for tag, m := range p.inflight {
		delete(p.inflight, tag)
		q := m.owner
		if q != nil {
			m.owner, q.owns = nil, nil
		} else if !m.discard {
			p.unqueueLocked(m)
		}
		m.discard = true
		p.relocateLocked(m)
		if q != nil {
			p.completeRecvLocked(q, 0, p.recvErr(tag, why))
		}
	}
	for tag, box := range p.boxes {
		for _, q := range box.waiting {
			p.completeRecvLocked(q, 0, p.recvErr(tag, why))
		}
		box.waiting = nil
		p.dropIfEmptyLocked(tag, box)
	}
	p.mu.Unlock()
}

// readerExit runs when the connection ends: after the peer's goodbye, or this rank's Close or
// goodbye, that is expected; otherwise the peer has failed. Whatever was in flight cannot complete.
func (p *tcpPeer) readerExit(err error) {
	g := p.g
	if !g.closed.Load() && !p.gone.Load() {
		g.peerFailed(p, describeConnErr(err))
	}
	p.mu.Lock()
	why := g.termErr()
	if why == nil {
		why = p.goneErr
	}
	if why == nil {
		why = describeConnErr(err)
	}
	for tag, m := range p.inflight {
		delete(p.inflight, tag)
		m.busy = false
		q := m.owner
		if q != nil {
			m.owner, q.owns = nil, nil
		} else if !m.discard {
			p.unqueueLocked(m)
		}
		m.discard = true
		p.relocateLocked(m)
		if q != nil {
			p.completeRecvLocked(q, 0, p.recvErr(tag, why))
		}
	}
	p.mu.Unlock()
	if p.gone.Load() {
		p.conn.Close() // the peer closed; closing our end tells it we are done too
	}
}

// describeConnErr words a broken connection for the failure message.
func describeConnErr(err error) error {
	switch {
	case err == nil:
		return errors.New("connection ended")
	case errors.Is(err, io.EOF):
		return errors.New("connection closed without goodbye")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("connection closed in the middle of a frame")
	}
	return err
}
