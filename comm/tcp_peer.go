package comm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
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

// tcpBox holds, for one (peer, tag), queued messages or waiting receives, never both.
type tcpBox struct {
	msgs    []*tcpIncoming // oldest first; only the last may be incomplete
	waiting []*tcpRecv
}

// tcpRecv is a posted receive.
type tcpRecv struct {
	req      *Request
	buf      []byte
	from     int
	tag      uint32
	done     bool
	deferred error       // completion postponed until the reader leaves buf
	stop     func() bool // unregisters the context watcher
	owns     *tcpIncoming
	msg      *tcpIncoming // the message whose bytes live in buf (msg.dest == this)
}

type msgPlace uint8

const (
	inPool msgPlace = iota // a pooled buffer of the transport
	inRecv                 // the buffer of the receive it is matched to
	inSink                 // nowhere: discarded as it arrives
)

// tcpIncoming is a message from the peer, being read or queued.
type tcpIncoming struct {
	tag      uint32
	total    int
	got      int // bytes read so far
	buf      []byte
	place    msgPlace
	dest     *tcpRecv // the receive whose buffer is buf (place == inRecv)
	owner    *tcpRecv // the receive the message is matched to; nil while queued or discarded
	discard  bool
	busy     bool // the reader is writing into buf without the lock
	complete bool
}

type tcpSendQueue struct {
	items []*tcpOutgoing
	ready bool // listed in p.ready
}

// tcpOutgoing is a send (or, with abort set, an abort frame) queued for the writer.
type tcpOutgoing struct {
	tag       uint32
	payload   []byte
	size      int
	sent      int // bytes written by finished batches
	abort     bool
	inBatch   bool
	done      bool
	cancelErr error
	req       *Request
	stop      func() bool
	hdr       [frameHeaderLen]byte
}

type tcpBatchEntry struct {
	m    *tcpOutgoing
	n    int
	last bool
}

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

// ---- receive matching ----

func (p *tcpPeer) boxLocked(tag uint32) *tcpBox {
	b := p.boxes[tag]
	if b == nil {
		b = &tcpBox{}
		p.boxes[tag] = b
	}
	return b
}

func (p *tcpPeer) dropIfEmptyLocked(tag uint32, b *tcpBox) {
	if len(b.msgs) == 0 && len(b.waiting) == 0 {
		delete(p.boxes, tag)
	}
}

func (p *tcpPeer) recvErr(tag uint32, err error) error {
	return p.g.opErr("recv from", p.rank, tag, err)
}

func (p *tcpPeer) tooLong(q *tcpRecv, size int) error {
	return p.recvErr(q.tag, fmt.Errorf("message of %d bytes does not fit buffer of %d bytes", size, len(q.buf)))
}

// completeRecvLocked completes q, whose buffer no message uses any more.
func (p *tcpPeer) completeRecvLocked(q *tcpRecv, n int, err error) {
	if q.done {
		return
	}
	q.done = true
	if q.stop != nil {
		q.stop()
	}
	q.req.complete(n, err)
}

// deliverCopyLocked completes q with a copy of a whole message.
func (p *tcpPeer) deliverCopyLocked(q *tcpRecv, data []byte) {
	if len(data) > len(q.buf) {
		p.completeRecvLocked(q, 0, p.tooLong(q, len(data)))
		return
	}
	n := copy(q.buf, data)
	p.g.counters.AddRecv(n)
	p.completeRecvLocked(q, n, nil)
}

// relocateLocked moves m's bytes to where its owner wants them: the owner's buffer, a pooled
// buffer while it has none, or nowhere once discarded. The reader must not be writing into
// m.buf (m is not busy, or the reader itself calls). A receive whose buffer m leaves, and whose
// completion was postponed for that, completes now.
func (p *tcpPeer) relocateLocked(m *tcpIncoming) {
	want := inPool
	switch {
	case m.discard:
		want = inSink
	case m.owner != nil:
		want = inRecv
	}
	if want == m.place && (want != inRecv || m.dest == m.owner) {
		return
	}
	var nb []byte
	switch want {
	case inRecv:
		nb = m.owner.buf[:m.total]
	case inPool:
		nb = p.g.msgs.get(m.total)
	}
	if want != inSink && m.place != inSink {
		copy(nb, m.buf[:m.got])
	}
	if m.place == inPool {
		p.g.msgs.put(m.buf)
	}
	old := m.dest
	m.buf, m.place, m.dest = nb, want, nil
	if want == inRecv {
		m.dest = m.owner
		m.owner.msg = m
	}
	if old != nil {
		old.msg = nil
		if old.deferred != nil {
			p.completeRecvLocked(old, 0, old.deferred)
		}
	}
}

// reassignLocked finds a new owner for the incomplete message m, whose receive went away: the
// next waiting receive, or else the front of its box's queue (the oldest message again: it was
// matched because nothing was queued before it, and nothing of its tag can arrive before it
// ends). When receiving is over (closed, failed, goodbye), m is discarded.
func (p *tcpPeer) reassignLocked(m *tcpIncoming) {
	if p.g.termErr() != nil || p.goneErr != nil {
		m.discard = true
	} else {
		box := p.boxLocked(m.tag)
		if len(box.waiting) > 0 {
			q := box.waiting[0]
			box.waiting[0] = nil
			box.waiting = box.waiting[1:]
			if m.total > len(q.buf) {
				m.discard = true
				p.completeRecvLocked(q, 0, p.tooLong(q, m.total))
			} else {
				m.owner, q.owns = q, m
			}
		} else {
			box.msgs = append([]*tcpIncoming{m}, box.msgs...)
		}
		p.dropIfEmptyLocked(m.tag, box)
	}
	if !m.busy {
		p.relocateLocked(m)
	}
}

// abandonRecvLocked ends the pending receive q with err (cancellation, failure, Close). A
// message matched to it goes to the next receive; if the reader is writing into q's buffer,
// the reader is poked and completes q once it has moved the bytes elsewhere.
func (p *tcpPeer) abandonRecvLocked(q *tcpRecv, err error) {
	if q.done || q.deferred != nil {
		return
	}
	if m := q.owns; m != nil {
		q.owns, m.owner = nil, nil
		p.reassignLocked(m)
	} else if box := p.boxes[q.tag]; box != nil {
		if i := slices.Index(box.waiting, q); i >= 0 {
			box.waiting = slices.Delete(box.waiting, i, i+1)
		}
		p.dropIfEmptyLocked(q.tag, box)
	}
	if m := q.msg; m != nil {
		if m.busy {
			q.deferred = err
			p.poke()
			return
		}
		p.relocateLocked(m)
	}
	p.completeRecvLocked(q, 0, err)
}

// unqueueLocked removes the unmatched message m from its box.
func (p *tcpPeer) unqueueLocked(m *tcpIncoming) {
	if box := p.boxes[m.tag]; box != nil {
		if i := slices.Index(box.msgs, m); i >= 0 {
			box.msgs = slices.Delete(box.msgs, i, i+1)
		}
		p.dropIfEmptyLocked(m.tag, box)
	}
}

// poke wakes the reader from a blocking read so that it reaches a safe point.
func (p *tcpPeer) poke() {
	if p.conn != nil {
		p.conn.SetReadDeadline(aLongTimeAgo)
	}
}

func (p *tcpPeer) irecv(ctx context.Context, tag uint32, buf []byte) *Request {
	g := p.g
	q := &tcpRecv{req: newRequest(), buf: buf, from: p.rank, tag: tag}
	p.mu.Lock()
	if err := g.termErr(); err != nil {
		p.mu.Unlock()
		return DoneRequest(0, p.recvErr(tag, err))
	}
	box := p.boxes[tag]
	switch {
	case box != nil && len(box.msgs) > 0:
		m := box.msgs[0]
		box.msgs[0] = nil
		box.msgs = box.msgs[1:]
		p.dropIfEmptyLocked(tag, box)
		switch {
		case m.complete:
			p.deliverCopyLocked(q, m.buf[:m.total])
			g.msgs.put(m.buf)
		case m.total > len(buf):
			// Consumed and reported, like a complete message that does not fit.
			m.discard = true
			if !m.busy {
				p.relocateLocked(m)
			}
			p.completeRecvLocked(q, 0, p.tooLong(q, m.total))
		default:
			m.owner, q.owns = q, m
			if !m.busy {
				p.relocateLocked(m)
			}
		}
	case p.goneErr != nil:
		err := p.goneErr
		if f := g.termErr(); f != nil { // a failure set since the check above outranks the goodbye
			err = f
		}
		p.mu.Unlock()
		return DoneRequest(0, p.recvErr(tag, err))
	case ctx.Err() != nil:
		p.mu.Unlock()
		return DoneRequest(0, p.recvErr(tag, ctx.Err()))
	default:
		box = p.boxLocked(tag)
		box.waiting = append(box.waiting, q)
	}
	done := q.done
	p.mu.Unlock()
	if !done && ctx.Done() != nil {
		// Registered outside the lock: AfterFunc may run its function at once.
		stop := context.AfterFunc(ctx, func() {
			p.mu.Lock()
			p.abandonRecvLocked(q, p.recvErr(tag, ctx.Err()))
			p.mu.Unlock()
		})
		p.mu.Lock()
		if q.done {
			stop()
		} else {
			q.stop = stop
		}
		p.mu.Unlock()
	}
	return q.req
}

// sendSelf delivers a message to this rank in memory, as the local transport does.
func (p *tcpPeer) sendSelf(tag uint32, payload []byte) error {
	g := p.g
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := g.termErr(); err != nil {
		return g.opErr("send to", p.rank, tag, err)
	}
	g.counters.AddSent(len(payload))
	box := p.boxLocked(tag)
	if len(box.waiting) > 0 {
		q := box.waiting[0]
		box.waiting[0] = nil
		box.waiting = box.waiting[1:]
		p.dropIfEmptyLocked(tag, box)
		p.deliverCopyLocked(q, payload)
		return nil
	}
	m := &tcpIncoming{tag: tag, total: len(payload), got: len(payload), buf: g.msgs.get(len(payload)), complete: true}
	copy(m.buf, payload)
	box.msgs = append(box.msgs, m)
	return nil
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

// ---- reader ----

func (p *tcpPeer) readLoop() {
	defer close(p.readerDone)
	p.readerExit(p.readFrames())
}

func (p *tcpPeer) readFrames() error {
	var hdr [frameHeaderLen]byte
	for {
		if err := p.readFull(hdr[:]); err != nil {
			return err
		}
		h, err := decodeFrameHeader(hdr[:], uint64(p.g.maxMessage))
		if err != nil {
			return err
		}
		if p.gone.Load() {
			return fmt.Errorf("%w: %v frame after goodbye", errProtocol, h.kind)
		}
		switch h.kind {
		case frameHeartbeat:
		case frameBye:
			var reason [tcpMaxByeReason]byte
			if err := p.readFull(reason[:h.chunk]); err != nil {
				return err
			}
			r, err := decodeByeReason(reason[:h.chunk], p.g.size)
			if err != nil {
				return err
			}
			p.peerSaidBye(r)
		case frameAbort:
			if err := p.abortMessage(h.tag); err != nil {
				return err
			}
		case frameData:
			if err := p.readData(h); err != nil {
				return err
			}
		}
	}
}

// readFull fills b from the connection; a poke only resets the deadline (no message is busy
// between frames).
func (p *tcpPeer) readFull(b []byte) error {
	for got := 0; got < len(b); {
		n, err := p.br.Read(b[got:])
		got += n
		if n > 0 {
			p.reads.Add(1)
		}
		if err != nil {
			if isTimeout(err) {
				p.conn.SetReadDeadline(time.Time{})
				continue
			}
			if err == io.EOF && got > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// readData reads one data frame's payload into its message.
func (p *tcpPeer) readData(h frameHeader) error {
	p.mu.Lock()
	m := p.inflight[h.tag]
	switch {
	case m == nil && h.offset != 0:
		p.mu.Unlock()
		return fmt.Errorf("%w: chunk at offset %d under tag %d, but no message is in flight there", errProtocol, h.offset, h.tag)
	case m == nil:
		m = p.startLocked(h.tag, int(h.total))
	case h.offset != uint64(m.got) || h.total != uint64(m.total):
		p.mu.Unlock()
		return fmt.Errorf("%w: chunk at offset %d of a %d-byte message under tag %d, expected offset %d of %d bytes",
			errProtocol, h.offset, h.total, h.tag, m.got, m.total)
	}
	m.busy = true
	buf, got, sink := m.buf, m.got, m.place == inSink
	p.mu.Unlock()

	remaining, progress := int(h.chunk), 0
	for remaining > 0 {
		var dst []byte
		if sink {
			if p.sink == nil {
				p.sink = make([]byte, tcpReadBuffer)
			}
			dst = p.sink[:min(remaining, len(p.sink))]
		} else {
			dst = buf[got+progress : got+progress+remaining]
		}
		n, err := p.br.Read(dst)
		progress += n
		remaining -= n
		if n > 0 {
			p.reads.Add(1)
		}
		if err != nil {
			if isTimeout(err) {
				// Poked: the message may have a new owner, or its receive was cancelled.
				p.conn.SetReadDeadline(time.Time{})
				p.mu.Lock()
				m.got += progress
				progress = 0
				p.relocateLocked(m)
				buf, got, sink = m.buf, m.got, m.place == inSink
				p.mu.Unlock()
				continue
			}
			p.mu.Lock()
			m.got += progress
			p.mu.Unlock()
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	p.mu.Lock()
	m.got += progress
	m.busy = false
	p.relocateLocked(m)
	if m.got == m.total {
		p.finishMessageLocked(m)
	}
	p.mu.Unlock()
	return nil
}

// startLocked begins a message of total bytes under tag: matched to the oldest waiting receive,
// or queued in a pooled buffer sized by the validated length.
func (p *tcpPeer) startLocked(tag uint32, total int) *tcpIncoming {
	m := &tcpIncoming{tag: tag, total: total}
	p.inflight[tag] = m
	if p.g.termErr() != nil {
		m.discard, m.place = true, inSink
		return m
	}
	box := p.boxLocked(tag)
	if len(box.waiting) > 0 {
		q := box.waiting[0]
		box.waiting[0] = nil
		box.waiting = box.waiting[1:]
		if total > len(q.buf) {
			m.discard, m.place = true, inSink
			p.completeRecvLocked(q, 0, p.tooLong(q, total))
		} else {
			m.owner, q.owns = q, m
			m.place, m.dest, m.buf = inRecv, q, q.buf[:total]
			q.msg = m
		}
	} else {
		m.place, m.buf = inPool, p.g.msgs.get(total)
		box.msgs = append(box.msgs, m)
	}
	p.dropIfEmptyLocked(tag, box)
	return m
}

// finishMessageLocked ends m, whose last byte has arrived and which sits where its owner wants.
func (p *tcpPeer) finishMessageLocked(m *tcpIncoming) {
	delete(p.inflight, m.tag)
	m.complete = true
	if q := m.owner; q != nil {
		m.owner, m.dest, q.owns, q.msg = nil, nil, nil, nil
		p.g.counters.AddRecv(m.total)
		p.completeRecvLocked(q, m.total, nil)
	}
	// A queued message stays in its box, complete; a discarded one is dropped.
}

// abortMessage drops the partly received message under tag: its sender cancelled it.
func (p *tcpPeer) abortMessage(tag uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.inflight[tag]
	if m == nil {
		return fmt.Errorf("%w: abort under tag %d with no message in flight", errProtocol, tag)
	}
	delete(p.inflight, tag)
	if q := m.owner; q != nil {
		// The receive waits for the next message, ahead of those posted after it.
		m.owner, q.owns = nil, nil
		box := p.boxLocked(tag)
		box.waiting = append([]*tcpRecv{q}, box.waiting...)
	} else if !m.discard {
		p.unqueueLocked(m)
	}
	m.discard = true
	p.relocateLocked(m)
	return nil
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
	p.mu.Lock()
	p.goneErr = fmt.Errorf("peer rank %d closed its group: %w", p.rank, ErrClosed)
	// A failure of this rank outranks the goodbye: the one reported here, or one that another
	// goroutine has just set and whose failReceives has not reached this peer yet.
	why := p.g.termErr()
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
	p.stopWriter(false, why)
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

// ---- writer ----

func (p *tcpPeer) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *tcpPeer) isend(ctx context.Context, tag uint32, payload []byte) *Request {
	g := p.g
	m := &tcpOutgoing{tag: tag, payload: payload, size: len(payload), req: newRequest()}
	p.wmu.Lock()
	if err := p.sendErr; err != nil {
		p.wmu.Unlock()
		return DoneRequest(0, g.opErr("send to", p.rank, tag, err))
	}
	p.enqueueLocked(m)
	p.wmu.Unlock()
	p.wake()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			p.wmu.Lock()
			p.cancelSendLocked(m, g.opErr("send to", p.rank, tag, ctx.Err()))
			p.wmu.Unlock()
		})
		p.wmu.Lock()
		if m.done {
			stop()
		} else {
			m.stop = stop
		}
		p.wmu.Unlock()
	}
	return m.req
}

func (p *tcpPeer) enqueueLocked(m *tcpOutgoing) {
	q := p.queues[m.tag]
	if q == nil {
		q = &tcpSendQueue{}
		p.queues[m.tag] = q
	}
	q.items = append(q.items, m)
	if !q.ready {
		q.ready = true
		p.ready = append(p.ready, m.tag)
	}
}

func (p *tcpPeer) finishSendLocked(m *tcpOutgoing, err error) {
	if m.done {
		return
	}
	m.done = true
	if m.stop != nil {
		m.stop()
	}
	n := 0
	if err == nil {
		n = m.size
		p.g.counters.AddSent(n)
	}
	m.payload = nil
	m.req.complete(n, err)
}

// cancelSendLocked ends the send m with err. A send not started is dropped; one partly sent is
// replaced by an abort frame so the peer drops its beginning; one in the batch being written is
// flagged and the writer interrupted, which copies the rest of the batch and completes it.
func (p *tcpPeer) cancelSendLocked(m *tcpOutgoing, err error) {
	if m.done || m.abort {
		return
	}
	if m.inBatch {
		if m.cancelErr == nil {
			m.cancelErr = err
		}
		p.interrupt.Store(true)
		p.conn.SetWriteDeadline(aLongTimeAgo)
		return
	}
	if q := p.queues[m.tag]; q != nil {
		if i := slices.Index(q.items, m); i >= 0 {
			if m.sent > 0 {
				q.items[i] = &tcpOutgoing{tag: m.tag, abort: true}
				p.wake()
			} else {
				q.items = slices.Delete(q.items, i, i+1)
			}
		}
	}
	p.finishSendLocked(m, err)
}

// cancelAllLocked cancels every queued send with err (wrapped per send).
func (p *tcpPeer) cancelAllLocked(err error) {
	for tag, q := range p.queues {
		for _, m := range slices.Clone(q.items) {
			p.cancelSendLocked(m, p.g.opErr("send to", p.rank, tag, err))
		}
	}
}

// stopWriter fails queued and later sends with err and stops the writer, after a goodbye frame
// when bye is set.
func (p *tcpPeer) stopWriter(bye bool, err error) {
	if bye {
		p.saidBye.Store(true)
	}
	p.wmu.Lock()
	if p.sendErr == nil {
		p.sendErr = err
	}
	p.cancelAllLocked(err)
	p.wstop = true
	p.byeDue = p.byeDue || bye
	p.wmu.Unlock()
	p.wake()
}

func (p *tcpPeer) requestHeartbeat() {
	p.wmu.Lock()
	p.hbDue = true
	p.wmu.Unlock()
	p.wake()
}

func (p *tcpPeer) writeLoop() {
	err := p.writeFrames()
	p.wmu.Lock()
	why := p.g.termErr()
	if why == nil {
		why = p.sendErr
	}
	if why == nil {
		why = describeConnErr(err)
	}
	if p.sendErr == nil {
		p.sendErr = why
	}
	p.wstop = true
	for tag, q := range p.queues {
		for _, m := range q.items {
			if !m.abort {
				p.finishSendLocked(m, p.g.opErr("send to", p.rank, tag, why))
			}
		}
		delete(p.queues, tag)
	}
	p.ready = nil
	p.wmu.Unlock()
}

func (p *tcpPeer) writeFrames() error {
	for {
		p.wmu.Lock()
		for !p.wstop && (p.g.stallForTest.Load() || (!p.hbDue && len(p.ready) == 0)) {
			p.wmu.Unlock()
			<-p.kick
			p.wmu.Lock()
		}
		if p.wstop {
			bye := p.byeDue && !p.g.stallForTest.Load()
			p.wmu.Unlock()
			if bye {
				p.writeBye()
			}
			return nil
		}
		p.buildBatchLocked()
		p.wmu.Unlock()

		err := p.writeBatch()
		if err != nil {
			p.g.peerFailed(p, err)
		}
		p.wmu.Lock()
		var why error
		if err != nil {
			if why = p.g.termErr(); why == nil {
				if why = p.sendErr; why == nil {
					why = err
				}
			}
		}
		p.finishBatchLocked(why)
		p.wmu.Unlock()
		if err != nil {
			return err
		}
		p.writes.Add(1)
	}
}

// buildBatchLocked collects the next frames: a heartbeat if one is due, then round-robin over
// the tags with queued sends, one chunk of each (several whole messages of a tag while they are
// small), up to about tcpBatchBytes.
func (p *tcpPeer) buildBatchLocked() {
	p.iov, p.batch = p.iov[:0], p.batch[:0]
	if p.hbDue {
		p.hbDue = false
		frameHeader{kind: frameHeartbeat}.encode(&p.ctrl)
		p.iov = append(p.iov, p.ctrl[:])
	}
	bytes := 0
	p.visited = 0
	for p.visited < len(p.ready) && bytes < tcpBatchBytes && len(p.batch) < tcpBatchFrames {
		tag := p.ready[p.visited]
		p.visited++
		for _, m := range p.queues[tag].items {
			if m.abort {
				frameHeader{kind: frameAbort, tag: tag}.encode(&m.hdr)
				p.iov = append(p.iov, m.hdr[:])
				m.inBatch = true
				p.batch = append(p.batch, tcpBatchEntry{m: m, last: true})
				bytes += frameHeaderLen
				continue
			}
			n := min(tcpMaxChunk, m.size-m.sent)
			frameHeader{kind: frameData, tag: tag, chunk: uint32(n), total: uint64(m.size), offset: uint64(m.sent)}.encode(&m.hdr)
			p.iov = append(p.iov, m.hdr[:])
			if n > 0 {
				p.iov = append(p.iov, m.payload[m.sent:m.sent+n])
			}
			m.inBatch = true
			last := m.sent+n == m.size
			p.batch = append(p.batch, tcpBatchEntry{m: m, n: n, last: last})
			bytes += frameHeaderLen + n
			if !last || bytes >= tcpBatchBytes || len(p.batch) >= tcpBatchFrames {
				break
			}
		}
	}
}

// writeBatch writes the batch with one vectored write. When a send in it is cancelled the
// write is interrupted: the unwritten rest is copied so no caller's buffer is referenced any
// more, the cancelled sends complete, and writing goes on from the copy.
func (p *tcpPeer) writeBatch() error {
	if len(p.iov) == 0 {
		return nil
	}
	bufs := net.Buffers(p.iov)
	copied := false
	for {
		_, err := bufs.WriteTo(p.conn)
		if err == nil {
			return nil
		}
		if !isTimeout(err) {
			return err
		}
		p.interrupt.Store(false)
		p.conn.SetWriteDeadline(time.Time{})
		if !copied && len(bufs) > 0 {
			total := 0
			for _, b := range bufs {
				total += len(b)
			}
			own := make([]byte, 0, total)
			for _, b := range bufs {
				own = append(own, b...)
			}
			bufs, copied = net.Buffers{own}, true
		}
		p.wmu.Lock()
		for _, e := range p.batch {
			if m := e.m; m.cancelErr != nil {
				if e.last {
					p.finishSendLocked(m, nil) // all its bytes are in the kernel or in the copy
				} else {
					p.finishSendLocked(m, m.cancelErr)
				}
			}
		}
		p.wmu.Unlock()
	}
}

// finishBatchLocked accounts for a written batch (err == nil) or fails its sends with err.
func (p *tcpPeer) finishBatchLocked(err error) {
	for _, e := range p.batch {
		m := e.m
		m.inBatch = false
		if err != nil {
			if !m.abort {
				p.finishSendLocked(m, p.g.opErr("send to", p.rank, m.tag, err))
			}
			continue
		}
		q := p.queues[m.tag]
		m.sent += e.n
		switch {
		case e.last:
			if q.items[0] == m {
				q.items[0] = nil
				q.items = q.items[1:]
			}
			if !m.abort {
				p.finishSendLocked(m, nil)
			}
		case m.cancelErr != nil || m.done:
			// Cancelled after some chunks went out: the peer must drop them.
			p.finishSendLocked(m, m.cancelErr)
			if q.items[0] == m {
				q.items[0] = &tcpOutgoing{tag: m.tag, abort: true}
			}
		}
	}
	// The tags that contributed go to the back of the round-robin.
	next := append(p.readySpare[:0], p.ready[p.visited:]...)
	for _, tag := range p.ready[:p.visited] {
		if q := p.queues[tag]; q != nil && len(q.items) > 0 {
			next = append(next, tag)
		} else if q != nil {
			delete(p.queues, tag)
		}
	}
	p.ready, p.readySpare = next, p.ready
	p.visited = 0
}

// writeBye sends the goodbye frame, with this rank's failure if it has one, and shuts down the
// sending half of the connection; the peer answers by closing its end once it has read
// everything.
func (p *tcpPeer) writeBye() {
	reason := p.g.byeReason().encode()
	frameHeader{kind: frameBye, chunk: uint32(len(reason))}.encode(&p.ctrl)
	p.conn.SetWriteDeadline(time.Now().Add(tcpCloseGrace))
	bufs := net.Buffers{p.ctrl[:], reason}
	bufs.WriteTo(p.conn)
	if tc, ok := p.conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}
