package comm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// These tests drive a real rank from hand-written frames so that each matching path (a receive
// posted for a message half arrived, a cancelled receive giving its message up, the reader
// poked out of a receive buffer, a goodbye or a failure in the middle of a message) happens at
// a known moment instead of by chance.

func writeRaw(t *testing.T, c net.Conn, h frameHeader, payload []byte) {
	t.Helper()
	var b [frameHeaderLen]byte
	h.encode(&b)
	if _, err := c.Write(append(b[:], payload...)); err != nil {
		t.Fatal(err)
	}
}

// writeChunk writes chunk i (of tcpMaxChunk bytes, the last one shorter) of msg under tag.
func writeChunk(t *testing.T, c net.Conn, tag uint32, msg []byte, i int) {
	t.Helper()
	lo, hi := i*tcpMaxChunk, min((i+1)*tcpMaxChunk, len(msg))
	writeRaw(t, c, frameHeader{kind: frameData, tag: tag, chunk: uint32(hi - lo), total: uint64(len(msg)), offset: uint64(lo)}, msg[lo:hi])
}

// waitIncoming waits until the message in flight under tag satisfies cond (checked under the
// peer's lock) and returns what inspect reports about it.
func waitIncoming(t *testing.T, p *tcpPeer, tag uint32, cond func(m *tcpIncoming) bool) {
	t.Helper()
	ok := waitFor(5*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		m := p.inflight[tag]
		return m != nil && cond(m)
	})
	if !ok {
		t.Fatalf("the message under tag %d never reached the expected state", tag)
	}
}

func placeOf(p *tcpPeer, tag uint32) msgPlace {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight[tag].place
}

func between(got int) func(m *tcpIncoming) bool {
	return func(m *tcpIncoming) bool { return m.got == got && !m.busy }
}

func wantMessage(t *testing.T, req *Request, buf, want []byte) {
	t.Helper()
	n, err := req.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if n != len(want) || !bytes.Equal(buf[:n], want) {
		t.Fatalf("received %d bytes, want %d, or the content differs", n, len(want))
	}
}

// waitDone requires req to complete within a few seconds with an error containing want.
func waitDone(t *testing.T, req *Request, want string) error {
	t.Helper()
	select {
	case <-req.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("request still pending, want an error with %q", want)
	}
	_, err := req.Wait()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want one with %q", err, want)
	}
	return err
}

func TestTCPReceivePostedForPartialMessage(t *testing.T) {
	conns, g, _ := rawPeers(t, 2, nil)
	c, p := conns[0], g.peers[0]
	msg := pattern(1, 0, 3*tcpMaxChunk)
	writeChunk(t, c, 1, msg, 0)
	waitIncoming(t, p, 1, between(tcpMaxChunk))
	if pl := placeOf(p, 1); pl != inPool {
		t.Fatalf("unexpected message kept in place %d, want the pool", pl)
	}
	buf := make([]byte, len(msg)+10)
	req := g.Irecv(context.Background(), 0, 1, buf)
	if pl := placeOf(p, 1); pl != inRecv {
		t.Fatalf("after the receive was posted the message is in place %d, want its buffer", pl)
	}
	writeChunk(t, c, 1, msg, 1)
	writeChunk(t, c, 1, msg, 2)
	wantMessage(t, req, buf, msg)
	if s := g.Counters().Snapshot(); s.MsgsRecv != 1 || s.BytesRecv != int64(len(msg)) {
		t.Errorf("counters %v", s)
	}
}

func TestTCPCancelledReceiveGivesUpPartialMessage(t *testing.T) {
	msg := pattern(2, 0, 2*tcpMaxChunk+5)
	start := func(t *testing.T) (net.Conn, *tcpGroup, *Request, context.CancelFunc) {
		conns, g, _ := rawPeers(t, 2, nil)
		writeChunk(t, conns[0], 1, msg, 0)
		waitIncoming(t, g.peers[0], 1, between(tcpMaxChunk))
		ctx, cancel := context.WithCancel(context.Background())
		a := g.Irecv(ctx, 0, 1, make([]byte, len(msg)))
		if pl := placeOf(g.peers[0], 1); pl != inRecv {
			t.Fatalf("message in place %d, want the receive's buffer", pl)
		}
		return conns[0], g, a, cancel
	}
	t.Run("back to the queue", func(t *testing.T) {
		c, g, a, cancel := start(t)
		cancel()
		waitDone(t, a, "context canceled")
		if pl := placeOf(g.peers[0], 1); pl != inPool {
			t.Fatalf("message in place %d after its receive was cancelled, want the pool", pl)
		}
		writeChunk(t, c, 1, msg, 1)
		writeChunk(t, c, 1, msg, 2)
		buf := make([]byte, len(msg))
		wantMessage(t, g.Irecv(context.Background(), 0, 1, buf), buf, msg)
	})
	t.Run("to the next receive", func(t *testing.T) {
		c, g, a, cancel := start(t)
		buf := make([]byte, len(msg))
		b := g.Irecv(context.Background(), 0, 1, buf)
		cancel()
		waitDone(t, a, "context canceled")
		writeChunk(t, c, 1, msg, 1)
		writeChunk(t, c, 1, msg, 2)
		wantMessage(t, b, buf, msg)
	})
	t.Run("to a receive too small", func(t *testing.T) {
		c, g, a, cancel := start(t)
		b := g.Irecv(context.Background(), 0, 1, make([]byte, 100))
		cancel()
		waitDone(t, a, "context canceled")
		waitDone(t, b, "message of 2097157 bytes does not fit buffer of 100 bytes")
		writeChunk(t, c, 1, msg, 1)
		writeChunk(t, c, 1, msg, 2)
		next := []byte("next")
		writeChunk(t, c, 1, next, 0)
		buf := make([]byte, 10)
		wantMessage(t, g.Irecv(context.Background(), 0, 1, buf), buf, next)
	})
}

// A receive cancelled while the reader is blocked filling its buffer completes at once (the
// reader is poked out of the read and moves the bytes to the pool); the message survives.
func TestTCPReceiveCancelledWhileReaderFillsIt(t *testing.T) {
	conns, g, _ := rawPeers(t, 2, nil)
	c, p := conns[0], g.peers[0]
	msg := pattern(3, 0, 2*tcpMaxChunk)
	ctx, cancel := context.WithCancel(context.Background())
	a := g.Irecv(ctx, 0, 1, make([]byte, len(msg)))
	const part = 300 << 10
	var hdr [frameHeaderLen]byte
	frameHeader{kind: frameData, tag: 1, chunk: tcpMaxChunk, total: uint64(len(msg))}.encode(&hdr)
	if _, err := c.Write(append(hdr[:], msg[:part]...)); err != nil {
		t.Fatal(err)
	}
	waitIncoming(t, p, 1, func(m *tcpIncoming) bool { return m.busy })
	time.Sleep(20 * time.Millisecond) // let the reader block for the rest of the chunk
	cancel()
	waitDone(t, a, "context canceled")
	p.mu.Lock()
	m := p.inflight[1]
	got, place, busy := m.got, m.place, m.busy
	p.mu.Unlock()
	if place != inPool || got != part || !busy {
		t.Fatalf("after the poke: place %d, %d bytes, busy %v; want the pool, %d bytes, still reading", place, got, busy, part)
	}
	if _, err := c.Write(msg[part:tcpMaxChunk]); err != nil {
		t.Fatal(err)
	}
	writeChunk(t, c, 1, msg, 1)
	buf := make([]byte, len(msg))
	wantMessage(t, g.Irecv(context.Background(), 0, 1, buf), buf, msg)
}

// A goodbye in the middle of a message: the receive waiting for it fails with ErrClosed,
// complete messages stay readable, later operations with the peer fail with ErrClosed.
func TestTCPGoodbyeWithPartialMessage(t *testing.T) {
	conns, g, _ := rawPeers(t, 2, nil)
	c := conns[0]
	ctx := context.Background()
	a := g.Irecv(ctx, 0, 1, make([]byte, 2*tcpMaxChunk))
	writeChunk(t, c, 1, pattern(4, 0, 2*tcpMaxChunk), 0)
	writeChunk(t, c, 2, []byte("keep"), 0)
	writeRaw(t, c, frameHeader{kind: frameBye}, nil)
	err := waitDone(t, a, "peer rank 0 closed its group")
	if !errors.Is(err, ErrClosed) {
		t.Errorf("err = %v, want ErrClosed", err)
	}
	buf := make([]byte, 8)
	wantMessage(t, g.Irecv(ctx, 0, 2, buf), buf, []byte("keep"))
	if _, err := g.Recv(ctx, 0, 3, buf); !errors.Is(err, ErrClosed) {
		t.Errorf("receive after the goodbye: %v", err)
	}
	if err := g.Send(ctx, 0, 3, buf); !errors.Is(err, ErrClosed) {
		t.Errorf("send after the goodbye: %v", err)
	}
	// The rank answers the goodbye by closing its end once the peer's stream ends.
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("the rank did not close its end after the goodbye: %v", err)
	}
	if g.failure.Load() != nil {
		t.Errorf("a goodbye counted as a failure: %v", *g.failure.Load())
	}
}

// Another peer fails while the reader fills a receive: the receive fails promptly, naming the
// failed peer, although its own peer is alive and mid-message.
func TestTCPFailureWhileReaderFillsReceive(t *testing.T) {
	conns, g, log := rawPeers(t, 3, nil)
	ctx := context.Background()
	a := g.Irecv(ctx, 0, 1, make([]byte, 2*tcpMaxChunk))
	other := g.Irecv(ctx, 0, 5, make([]byte, 4))
	msg := pattern(5, 0, 2*tcpMaxChunk)
	var hdr [frameHeaderLen]byte
	frameHeader{kind: frameData, tag: 1, chunk: tcpMaxChunk, total: uint64(len(msg))}.encode(&hdr)
	if _, err := conns[0].Write(append(hdr[:], msg[:100<<10]...)); err != nil {
		t.Fatal(err)
	}
	waitIncoming(t, g.peers[0], 1, func(m *tcpIncoming) bool { return m.busy })
	conns[1].(*net.TCPConn).SetLinger(0)
	conns[1].Close()
	waitDone(t, a, "peer rank 1 failed")
	waitDone(t, other, "peer rank 1 failed")
	if _, err := g.Recv(ctx, 0, 6, nil); err == nil || !strings.Contains(err.Error(), "peer rank 1 failed") {
		t.Errorf("later receive from the live peer: %v", err)
	}
	if log.count("peer rank 1 failed") != 1 {
		t.Errorf("failure of rank 1 logged %d times, want once", log.count("peer rank 1 failed"))
	}
	// The live peer's data is still drained: writing the rest does not block or break anything.
	if _, err := conns[0].Write(msg[100<<10:]); err != nil {
		t.Fatal(err)
	}
}

// captureConn records what a writer sends.
type captureConn struct {
	fakeConn
	out *bytes.Buffer
}

func (c captureConn) Write(b []byte) (int, error) { return c.out.Write(b) }

// The writer interleaves tags chunk by chunk, and a send cancelled between its chunks becomes
// an abort frame; a receiver fed the resulting stream drops the partial message and gives the
// tag's next message to the waiting receive.
func TestTCPWriterRoundRobinAndAbort(t *testing.T) {
	g, err := newTCPGroup(TCPConfig{Rank: 0, Size: 2, Listener: fakeListener{}, Addrs: []string{"", ""}})
	if err != nil {
		t.Fatal(err)
	}
	var wire bytes.Buffer
	p := newTCPPeer(g, 1, captureConn{fakeConn{bytes.NewReader(nil)}, &wire})
	batch := func() {
		p.wmu.Lock()
		p.buildBatchLocked()
		p.wmu.Unlock()
		if err := p.writeBatch(); err != nil {
			t.Fatal(err)
		}
		p.wmu.Lock()
		p.finishBatchLocked(nil)
		p.wmu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	big := p.isend(ctx, 1, pattern(6, 0, 3*tcpMaxChunk))
	small := p.isend(context.Background(), 2, []byte("small"))
	batch() // tag 1, chunk 0: a whole batch
	batch() // tag 2's message, then tag 1's chunk 1
	if _, err := small.Wait(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := big.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled send: %v", err)
	}
	fresh := p.isend(context.Background(), 1, []byte("fresh"))
	batch() // the abort frame and the next message of tag 1
	if _, err := fresh.Wait(); err != nil {
		t.Fatal(err)
	}
	type frame struct {
		kind          frameKind
		tag           uint32
		chunk, offset uint64
	}
	var got []frame
	for b := wire.Bytes(); len(b) > 0; {
		h, err := decodeFrameHeader(b, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, frame{h.kind, h.tag, uint64(h.chunk), h.offset})
		b = b[frameHeaderLen+int(h.chunk):]
	}
	want := []frame{
		{frameData, 1, tcpMaxChunk, 0},
		{frameData, 2, 5, 0},
		{frameData, 1, tcpMaxChunk, tcpMaxChunk},
		{frameAbort, 1, 0, 0},
		{frameData, 1, 5, 0},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("frames on the wire:\n%v\nwant\n%v", got, want)
	}
	if s := g.Counters().Snapshot(); s.MsgsSent != 2 || s.BytesSent != 10 {
		t.Errorf("sender counters %v: the cancelled send must not count", s)
	}

	// The receiving side of that stream.
	rg, err := newTCPGroup(TCPConfig{Rank: 1, Size: 2, Listener: fakeListener{}, Addrs: []string{"", ""}, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	rp := newTCPPeer(rg, 0, fakeConn{bytes.NewReader(wire.Bytes())})
	rg.peers[0] = rp
	buf1, buf2 := make([]byte, 3*tcpMaxChunk), make([]byte, 8)
	r1 := rg.Irecv(context.Background(), 0, 1, buf1)
	r2 := rg.Irecv(context.Background(), 0, 2, buf2)
	rp.readLoop() // to the end of the stream
	wantMessage(t, r2, buf2, []byte("small"))
	wantMessage(t, r1, buf1, []byte("fresh"))
}
