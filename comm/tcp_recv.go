package comm

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"
)

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
