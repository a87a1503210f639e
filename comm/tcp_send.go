package comm

import (
	"context"
	"net"
	"slices"
	"time"
)

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
