//go:build linux

package comm

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// shmPeer is this rank's side of the two rings with one peer: what the rank's reader has
// taken out of the peer's ring (posted receives, messages that nobody waits for yet), and the
// writer that streams this rank's messages into the peer's ring. For the rank itself it
// only holds the queue of messages sent to oneself.
type shmPeer struct {
	g    *shmGroup
	rank int

	// Receiving from the peer. mu guards boxes, recvErr and the receives in boxes.
	mu      sync.Mutex
	boxes   map[uint32]*shmBox
	recvErr error  // why receives from the peer fail now (nil while it is open)
	in      int    // the peer's ring to this rank
	tail    uint64 // the reader's copy of the ring's tail
	cur     shmInMsg
	drained bool // the peer closed and its ring is empty, or it broke the protocol

	// Sending to the peer. smu guards queue, writing and sendErr.
	smu     sync.Mutex
	queue   []*shmOut
	writing bool // a message is being written (by the writer or inline by Isend)
	sendErr error
	kick    chan struct{}
	out     int    // this rank's ring to the peer
	head    uint64 // the writer's copy of the ring's head; used by whoever is writing
}

type shmBox struct {
	msgs    [][]byte   // arrived, not yet asked for
	waiting []*shmRecv // posted, not yet matched
}

type shmRecv struct {
	req       *Request
	buf       []byte
	started   bool // matched: the reader is filling buf
	completed bool
	stop      func() bool
}

type shmOut struct {
	tag     uint32
	payload []byte
	req     *Request
	started bool
	done    bool
	stop    func() bool
}

func newShmPeer(g *shmGroup, r int) *shmPeer {
	p := &shmPeer{g: g, rank: r, boxes: make(map[uint32]*shmBox), kick: make(chan struct{}, 1)}
	if r != g.rank {
		p.in, p.out = g.seg.ringOff(r, g.rank), g.seg.ringOff(g.rank, r)
	}
	return p
}

// shmSpinFor is how long a waiter yields before it sleeps on the futex: long enough to catch a
// peer that is tens of microseconds behind without a futex on either side (a sleep and wake-up
// costs 50-100µs on a virtual machine), short enough not to burn a shared core for long. Each
// spin yields to the process's goroutines (runtime.Gosched) and to the host's other threads
// (sched_yield): the peer may be waiting for this very core. A 4 KiB all-reduce between 2
// processes on 2 cores, five runs of 200 iterations each (median per run), took 0.13-0.17 ms in
// four of five runs when waiters spun 50µs with Gosched alone (0.003-0.006 ms in the others,
// when the two ranks ran on different cores), 0.03-0.06 ms in every run with sched_yield too. A
// group with more ranks than the host has cores does not spin (spinFor 0): the rank it waits for
// needs the core.
const shmSpinFor = 200 * time.Microsecond

// spinner counts a waiter's yields.
type spinner struct {
	spinFor time.Duration
	start   time.Time
	n       int
}

// spin yields and reports true while the waiter should keep spinning.
func (s *spinner) spin() bool {
	if s.spinFor <= 0 {
		return false
	}
	if s.n == 0 {
		s.start = time.Now()
	}
	s.n++
	if s.n < 2 || time.Since(s.start) < s.spinFor {
		runtime.Gosched()
		syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		return true
	}
	return false
}

// ---- receiving ----

func (p *shmPeer) irecv(ctx context.Context, tag uint32, buf []byte) *Request {
	g := p.g
	p.mu.Lock()
	if g.closed.Load() {
		p.mu.Unlock()
		return DoneRequest(0, g.opErr("recv from", p.rank, tag, ErrClosed))
	}
	box := p.boxes[tag]
	if box != nil && len(box.msgs) > 0 {
		msg := box.msgs[0]
		box.msgs[0] = nil
		box.msgs = box.msgs[1:]
		p.dropIfEmpty(tag, box)
		p.mu.Unlock()
		n, err := p.deliver(tag, buf, msg)
		g.msgs.put(msg)
		return DoneRequest(n, err)
	}
	if p.recvErr != nil {
		p.mu.Unlock()
		return DoneRequest(0, g.opErr("recv from", p.rank, tag, p.recvErr))
	}
	if err := ctx.Err(); err != nil {
		p.mu.Unlock()
		return DoneRequest(0, g.opErr("recv from", p.rank, tag, err))
	}
	if box == nil {
		box = &shmBox{}
		p.boxes[tag] = box
	}
	r := &shmRecv{req: newRequest(), buf: buf}
	box.waiting = append(box.waiting, r)
	p.mu.Unlock()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { p.cancelRecv(r, tag, ctx) })
		p.mu.Lock()
		if r.completed || r.started {
			stop()
		} else {
			r.stop = stop
		}
		p.mu.Unlock()
	}
	return r.req
}

// deliver copies a queued message into a receive's buffer.
func (p *shmPeer) deliver(tag uint32, buf, msg []byte) (int, error) {
	if len(msg) > len(buf) {
		return 0, p.tooLong(tag, len(msg), len(buf))
	}
	n := copy(buf, msg)
	p.g.counters.AddRecv(n)
	return n, nil
}

func (p *shmPeer) tooLong(tag uint32, n, room int) error {
	return p.g.opErr("recv from", p.rank, tag, fmt.Errorf("message of %d bytes does not fit buffer of %d bytes", n, room))
}

// cancelRecv withdraws r if nothing has matched it yet.
func (p *shmPeer) cancelRecv(r *shmRecv, tag uint32, ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.completed || r.started {
		return
	}
	if box := p.boxes[tag]; box != nil {
		for i, q := range box.waiting {
			if q == r {
				box.waiting = append(box.waiting[:i], box.waiting[i+1:]...)
				break
			}
		}
		p.dropIfEmpty(tag, box)
	}
	p.finishLocked(r, 0, p.g.opErr("recv from", p.rank, tag, ctx.Err()))
}

func (p *shmPeer) finishLocked(r *shmRecv, n int, err error) {
	if r.completed {
		return
	}
	r.completed = true
	if r.stop != nil {
		r.stop()
	}
	r.req.complete(n, err)
}

func (p *shmPeer) dropIfEmpty(tag uint32, box *shmBox) {
	if len(box.msgs) == 0 && len(box.waiting) == 0 {
		delete(p.boxes, tag)
	}
}

// deliverSelf handles a message a rank sends to itself: it completes a waiting receive or
// queues a copy.
func (p *shmPeer) deliverSelf(tag uint32, payload []byte) {
	p.mu.Lock()
	box := p.boxes[tag]
	if box != nil && len(box.waiting) > 0 {
		r := box.waiting[0]
		box.waiting = box.waiting[1:]
		p.dropIfEmpty(tag, box)
		var n int
		var err error
		if len(payload) > len(r.buf) {
			err = p.tooLong(tag, len(payload), len(r.buf))
		} else {
			n = copy(r.buf, payload)
			p.g.counters.AddRecv(n)
		}
		p.finishLocked(r, n, err)
		p.mu.Unlock()
		return
	}
	if box == nil {
		box = &shmBox{}
		p.boxes[tag] = box
	}
	m := p.g.msgs.get(len(payload))
	copy(m, payload)
	box.msgs = append(box.msgs, m)
	p.mu.Unlock()
}

// failAll makes later operations with the peer fail with err and fails the pending ones that
// have not started; the reader and the writer finish the ones they are working on.
func (p *shmPeer) failAll(err error) {
	p.mu.Lock()
	if p.recvErr == nil || err == ErrClosed {
		p.recvErr = err
	}
	for tag, box := range p.boxes {
		for _, r := range box.waiting {
			p.finishLocked(r, 0, p.g.opErr("recv from", p.rank, tag, err))
		}
		box.waiting = nil
		p.dropIfEmpty(tag, box)
	}
	p.mu.Unlock()
	p.smu.Lock()
	if p.sendErr == nil || err == ErrClosed {
		p.sendErr = err
	}
	for _, m := range p.queue {
		p.finishSendLocked(m, 0, p.g.opErr("send to", p.rank, m.tag, err))
	}
	p.queue = nil
	p.smu.Unlock()
}

// gone records that the peer closed and its ring is drained: receives from it fail.
func (p *shmPeer) gone() {
	err := peerClosed(p.rank)
	p.mu.Lock()
	if p.recvErr == nil {
		p.recvErr = err
	}
	for tag, box := range p.boxes {
		for _, r := range box.waiting {
			p.finishLocked(r, 0, p.g.opErr("recv from", p.rank, tag, err))
		}
		box.waiting = nil
		p.dropIfEmpty(tag, box)
	}
	p.mu.Unlock()
}

// shmInMsg is the message the reader is taking out of a peer's ring.
type shmInMsg struct {
	active  bool
	tag     uint32
	n, got  int
	r       *shmRecv // the receive it fills, or nil: it is queued in dst
	dst     []byte
	discard bool // too long for r's buffer: consumed and reported
}

// readLoop is the rank's reader: it drains every peer's ring into the posted receives (or
// queues the messages nobody waits for yet), and sleeps on the rank's inbox doorbell, which
// the peers ring when they write, when nothing moves. It returns when the rank closes or
// fails, or when every peer has closed and its ring is drained.
func (g *shmGroup) readLoop() {
	bell, sleep := g.mem.u32(g.slot(g.rank)+sInbox), g.mem.u32(g.slot(g.rank)+sInboxSleep)
	defer func() {
		err := g.termErr()
		if err == nil {
			return
		}
		for _, p := range g.peers {
			if p.cur.active && p.cur.r != nil {
				p.mu.Lock()
				p.finishLocked(p.cur.r, 0, g.opErr("recv from", p.rank, p.cur.tag, err))
				p.mu.Unlock()
			}
			p.cur = shmInMsg{}
		}
	}()
	scan := func() (moved bool, open int) {
		for _, p := range g.peers {
			if p.rank == g.rank || p.drained {
				continue
			}
			open++
			for p.progress() {
				moved = true
			}
		}
		return moved, open
	}
	sp := spinner{spinFor: g.spinFor}
	for {
		if g.termErr() != nil {
			return
		}
		if g.stallForTest.Load() {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		moved, open := scan()
		switch {
		case open == 0:
			return
		case moved:
			sp = spinner{spinFor: g.spinFor}
			continue
		case sp.spin():
			continue
		}
		atomic.StoreUint32(sleep, 1)
		v := atomic.LoadUint32(bell)
		if moved, _ := scan(); !moved && g.termErr() == nil {
			// Writers, Close and failures ring the bell; the timeout is a safety net only.
			futexWait(bell, v, time.Second)
		}
		atomic.StoreUint32(sleep, 0)
	}
}

// progress moves the peer's ring forward as far as it can without waiting and reports whether
// anything moved.
func (p *shmPeer) progress() bool {
	g := p.g
	if g.termErr() != nil {
		return false
	}
	rb := uint64(g.seg.layout.ringBytes)
	avail := p.avail()
	if avail > rb {
		g.peerFailed(p.rank, fmt.Errorf("corrupt ring in the shared segment: %d bytes pending in a ring of %d", avail, rb))
		p.drained = true
		return false
	}
	m := &p.cur
	if !m.active && avail < shmMsgHeader || m.active && avail == 0 {
		// Nothing to do, unless the peer closed: then its ring is drained, or a message was
		// cut short.
		if g.peerState(p.rank) == shmClosed && p.avail() == avail {
			if m.active && m.r != nil {
				p.mu.Lock()
				p.finishLocked(m.r, 0, g.opErr("recv from", p.rank, m.tag, peerClosed(p.rank)))
				p.mu.Unlock()
			}
			p.cur = shmInMsg{}
			p.gone()
			p.drained = true
		}
		return false
	}
	if !m.active {
		var hdr [shmMsgHeader]byte
		p.ringRead(hdr[:])
		tag, n, err := decodeShmMsg(hdr[:], g.maxMessage)
		if err != nil {
			g.peerFailed(p.rank, err)
			p.drained = true
			return false
		}
		*m = shmInMsg{active: true, tag: tag, n: n}
		// Match the message: a posted receive, or a queue entry of its own.
		p.mu.Lock()
		if box := p.boxes[tag]; box != nil && len(box.waiting) > 0 {
			m.r = box.waiting[0]
			box.waiting = box.waiting[1:]
			m.r.started = true
			if m.r.stop != nil {
				m.r.stop()
				m.r.stop = nil
			}
			p.dropIfEmpty(tag, box)
		}
		p.mu.Unlock()
		switch {
		case m.r == nil:
			m.dst = g.msgs.get(n)
		case n > len(m.r.buf):
			m.discard = true
		default:
			m.dst = m.r.buf[:n]
		}
	} else {
		k := min(int(avail), m.n-m.got)
		if m.discard {
			p.skip(k)
		} else {
			p.ringRead(m.dst[m.got : m.got+k])
		}
		m.got += k
	}
	if m.got == m.n {
		p.finishIn(m)
		p.cur = shmInMsg{}
	}
	return true
}

// finishIn hands a message that has come in whole to its receive, or to its tag's queue.
func (p *shmPeer) finishIn(m *shmInMsg) {
	g := p.g
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case m.r == nil:
		box := p.boxes[m.tag]
		if box == nil {
			box = &shmBox{}
			p.boxes[m.tag] = box
		}
		if len(box.waiting) == 0 {
			box.msgs = append(box.msgs, m.dst)
			return
		}
		// A receive was posted while the message streamed in.
		q := box.waiting[0]
		box.waiting = box.waiting[1:]
		p.dropIfEmpty(m.tag, box)
		n, err := p.deliver(m.tag, q.buf, m.dst)
		g.msgs.put(m.dst)
		p.finishLocked(q, n, err)
	case m.discard:
		p.finishLocked(m.r, 0, p.tooLong(m.tag, m.n, len(m.r.buf)))
	default:
		g.counters.AddRecv(m.n)
		p.finishLocked(m.r, m.n, nil)
	}
}

func (p *shmPeer) avail() uint64 {
	return atomic.LoadUint64(p.g.mem.u64(p.in+cHead)) - p.tail
}

// ringRead copies len(dst) bytes from the ring at the tail and frees them.
func (p *shmPeer) ringRead(dst []byte) {
	g := p.g
	rb := g.seg.layout.ringBytes
	data := g.mem[p.in+shmRingCtl : p.in+shmRingCtl+rb]
	off := int(p.tail % uint64(rb))
	n := copy(dst, data[off:])
	copy(dst[n:], data)
	p.skip(len(dst))
}

// skip frees n bytes at the tail and wakes the writer if it waits for space.
func (p *shmPeer) skip(n int) {
	p.tail += uint64(n)
	atomic.StoreUint64(p.g.mem.u64(p.in+cTail), p.tail)
	ring(p.g.mem.u32(p.in+cSpace), p.g.mem.u32(p.in+cTxSleep))
}

// ---- sending ----

func (p *shmPeer) isend(ctx context.Context, tag uint32, payload []byte) *Request {
	g := p.g
	if !g.enter() {
		return DoneRequest(0, g.opErr("send to", p.rank, tag, ErrClosed))
	}
	defer g.leave()
	p.smu.Lock()
	if err := p.sendErr; err != nil {
		p.smu.Unlock()
		return DoneRequest(0, g.opErr("send to", p.rank, tag, err))
	}
	if g.peerState(p.rank) == shmClosed {
		p.smu.Unlock()
		return DoneRequest(0, g.opErr("send to", p.rank, tag, peerClosed(p.rank)))
	}
	// Fast path: nothing queued and the whole message fits now: write it here.
	if len(p.queue) == 0 && !p.writing && p.free() >= uint64(shmMsgHeader+len(payload)) {
		p.writing = true
		p.smu.Unlock()
		err := p.writeMsg(tag, payload)
		p.smu.Lock()
		p.writing = false
		if len(p.queue) > 0 {
			p.wake()
		}
		p.smu.Unlock()
		if err != nil {
			return DoneRequest(0, g.opErr("send to", p.rank, tag, err))
		}
		g.counters.AddSent(len(payload))
		return DoneRequest(len(payload), nil)
	}
	m := &shmOut{tag: tag, payload: payload, req: newRequest()}
	p.queue = append(p.queue, m)
	p.smu.Unlock()
	g.watchOp(m.req, "send to", p.rank, tag)
	p.wake()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			p.smu.Lock()
			defer p.smu.Unlock()
			if m.started || m.done {
				return
			}
			for i, q := range p.queue {
				if q == m {
					p.queue = append(p.queue[:i], p.queue[i+1:]...)
					break
				}
			}
			p.finishSendLocked(m, 0, g.opErr("send to", p.rank, tag, ctx.Err()))
		})
		p.smu.Lock()
		if m.started || m.done {
			stop()
		} else {
			m.stop = stop
		}
		p.smu.Unlock()
	}
	return m.req
}

func (p *shmPeer) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *shmPeer) finishSendLocked(m *shmOut, n int, err error) {
	if m.done {
		return
	}
	m.done = true
	if m.stop != nil {
		m.stop()
	}
	m.req.complete(n, err)
}

// free is the space in the ring to the peer, as the writer sees it.
func (p *shmPeer) free() uint64 {
	tail := atomic.LoadUint64(p.g.mem.u64(p.out + cTail))
	return uint64(p.g.seg.layout.ringBytes) - (p.head - tail)
}

// writeLoop writes the queued messages, in order, until the group closes.
func (p *shmPeer) writeLoop() {
	g := p.g
	for {
		select {
		case <-p.kick:
		case <-g.done:
			return
		}
		for {
			p.smu.Lock()
			if len(p.queue) == 0 || p.writing {
				p.smu.Unlock()
				break
			}
			m := p.queue[0]
			p.queue = p.queue[1:]
			m.started, p.writing = true, true
			if m.stop != nil {
				m.stop()
				m.stop = nil
			}
			p.smu.Unlock()
			err := p.writeMsg(m.tag, m.payload)
			if err == nil {
				g.counters.AddSent(len(m.payload))
			}
			p.smu.Lock()
			p.writing = false
			if err != nil {
				p.finishSendLocked(m, 0, g.opErr("send to", p.rank, m.tag, err))
			} else {
				p.finishSendLocked(m, len(m.payload), nil)
			}
			p.smu.Unlock()
		}
	}
}

// writeMsg streams one message into the peer's ring: its header, then its payload as space
// frees up. The caller owns the ring (p.writing).
func (p *shmPeer) writeMsg(tag uint32, payload []byte) error {
	var hdr [shmMsgHeader]byte
	encodeShmMsg(hdr[:], tag, len(payload))
	if err := p.waitSpace(shmMsgHeader); err != nil {
		return err
	}
	p.ringWrite(hdr[:], false)
	// Publish every quarter ring, so that the reader copies out while the writer copies in.
	piece := max(p.g.seg.layout.ringBytes/4, 1)
	for len(payload) > 0 {
		free, err := p.waitSpaceAny()
		if err != nil {
			return err
		}
		k := min(int(free), len(payload), piece)
		p.ringWrite(payload[:k], len(payload) > k)
		payload = payload[k:]
	}
	p.publish()
	return nil
}

// waitSpaceAny waits for at least one free byte, but publishes what was written first.
func (p *shmPeer) waitSpaceAny() (uint64, error) {
	if f := p.free(); f > 0 {
		return f, nil
	}
	p.publish()
	if err := p.waitSpace(1); err != nil {
		return 0, err
	}
	return p.free(), nil
}

// ringWrite copies src into the ring at the head (the caller checked the space); the bytes
// become visible to the reader at the next publish.
func (p *shmPeer) ringWrite(src []byte, publish bool) {
	g := p.g
	rb := g.seg.layout.ringBytes
	data := g.mem[p.out+shmRingCtl : p.out+shmRingCtl+rb]
	off := int(p.head % uint64(rb))
	n := copy(data[off:], src)
	copy(data, src[n:])
	p.head += uint64(len(src))
	if publish {
		p.publish()
	}
}

// publish makes the written bytes visible and wakes the reader if it sleeps.
func (p *shmPeer) publish() {
	head := p.g.mem.u64(p.out + cHead)
	if atomic.LoadUint64(head) == p.head {
		return
	}
	atomic.StoreUint64(head, p.head)
	slot := p.g.slot(p.rank)
	ring(p.g.mem.u32(slot+sInbox), p.g.mem.u32(slot+sInboxSleep))
}

// waitSpace waits until want bytes are free in the peer's ring, or fails when this rank closes
// or fails or the peer closes.
func (p *shmPeer) waitSpace(want uint64) error {
	g := p.g
	bell, sleep := g.mem.u32(p.out+cSpace), g.mem.u32(p.out+cTxSleep)
	rb := uint64(g.seg.layout.ringBytes)
	sp := spinner{spinFor: g.spinFor}
	for {
		if err := g.termErr(); err != nil {
			return err
		}
		used := p.head - atomic.LoadUint64(g.mem.u64(p.out+cTail))
		if used > rb {
			err := fmt.Errorf("corrupt ring in the shared segment: the reader's tail is %d bytes past the writer's head", -int64(used))
			g.peerFailed(p.rank, err)
			return err
		}
		if rb-used >= want {
			return nil
		}
		if g.peerState(p.rank) == shmClosed {
			return peerClosed(p.rank)
		}
		if g.stallForTest.Load() {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if sp.spin() {
			continue
		}
		v := atomic.LoadUint32(bell)
		atomic.StoreUint32(sleep, 1)
		if rb-(p.head-atomic.LoadUint64(g.mem.u64(p.out+cTail))) < want && g.termErr() == nil {
			futexWait(bell, v, g.waitTick)
		}
		atomic.StoreUint32(sleep, 0)
	}
}
