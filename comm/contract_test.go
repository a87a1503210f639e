package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// The Group contract: every transport (NewLocal, NewTCP over loopback, NewShmLocal) must pass the same
// cases, so each case is written once, as a function of the ranks it runs on.
// transports are the constructors the Group contract tests run against.
var transports = []struct {
	name string
	make func(t testing.TB, p int) []Group
}{
	{"local", func(t testing.TB, p int) []Group {
		g, err := NewLocal(p)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}},
	{"tcp", func(t testing.TB, p int) []Group { return newTCP(t, p) }},
	// Route over TCP loopback and in-process node groups, nodes of two ranks: 0 and 1 share a
	// node, so do 2 and 3 (at P = 3, rank 2 is alone on the second node).
	{"routed-consecutive", func(t testing.TB, p int) []Group { return newRouted(t, p, func(r int) int { return r / 2 }) }},
	// The same with ranks dealt round-robin to two nodes: 0 and 2 share a node, 1 is on the other.
	{"routed-interleaved", func(t testing.TB, p int) []Group { return newRouted(t, p, func(r int) int { return r % 2 }) }},
	{"shm", func(t testing.TB, p int) []Group { return newShm(t, p) }},
	// A job's group on one host (cluster.Init): TCP world routed through one shared-memory node,
	// and two nodes of shared memory joined over TCP.
	{"routed-shm-one-node", func(t testing.TB, p int) []Group { return newRoutedShm(t, p, func(int) int { return 0 }) }},
	{"routed-shm-two-nodes", func(t testing.TB, p int) []Group { return newRoutedShm(t, p, func(r int) int { return r / 2 }) }},
}

// TestGroupContract runs the Group contract against every transport.
func TestGroupContract(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Run("FIFOAndCopy", func(t *testing.T) { contractFIFOAndCopy(t, tr.make(t, 3)) })
			t.Run("IrecvPostedBeforeSend", func(t *testing.T) { contractIrecvPostedFirst(t, tr.make(t, 2)) })
			t.Run("SelfSendAndZeroLength", func(t *testing.T) { contractSelfSend(t, tr.make(t, 2)) })
			t.Run("Errors", func(t *testing.T) { contractErrors(t, tr.make(t, 2)) })
			t.Run("RecvHonoursContext", func(t *testing.T) { contractRecvContext(t, tr.make(t, 2)) })
			t.Run("Close", func(t *testing.T) { contractClose(t, tr.make(t, 3)) })
			t.Run("UnexpectedMessages", func(t *testing.T) { contractUnexpected(t, tr.make(t, 2)) })
			t.Run("LargeMessagesAcrossTags", func(t *testing.T) { contractLargeMixed(t, tr.make(t, 3)) })
		})
	}
}

func contractFIFOAndCopy(t *testing.T, g []Group) {
	ctx := context.Background()
	payload := make([]byte, 8)
	const msgs = 50
	for i := range msgs {
		payload[0] = byte(i)
		if err := g[0].Send(ctx, 2, 9, payload); err != nil {
			t.Fatal(err)
		}
		payload[0] = 0xff // the sender may reuse the buffer at once
	}
	// A message under another tag or from another sender must not be matched.
	if err := g[1].Send(ctx, 2, 9, []byte{0xee}); err != nil {
		t.Fatal(err)
	}
	if err := g[0].Send(ctx, 2, 10, []byte{0xdd}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	for i := range msgs {
		n, err := g[2].Recv(ctx, 0, 9, buf)
		if err != nil {
			t.Fatal(err)
		}
		if n != 8 || buf[0] != byte(i) {
			t.Fatalf("message %d: n=%d first byte %d", i, n, buf[0])
		}
	}
	if n, err := g[2].Recv(ctx, 1, 9, buf); err != nil || n != 1 || buf[0] != 0xee {
		t.Fatalf("from rank 1: n=%d err=%v byte %x", n, err, buf[0])
	}
	if n, err := g[2].Recv(ctx, 0, 10, buf); err != nil || n != 1 || buf[0] != 0xdd {
		t.Fatalf("tag 10: n=%d err=%v byte %x", n, err, buf[0])
	}
	s0, s2 := g[0].Counters().Snapshot(), g[2].Counters().Snapshot()
	if s0.MsgsSent != msgs+1 || s0.BytesSent != 8*msgs+1 {
		t.Errorf("rank 0 counters %v", s0)
	}
	if s2.MsgsRecv != msgs+2 || s2.BytesRecv != 8*msgs+2 {
		t.Errorf("rank 2 counters %v", s2)
	}
}

func contractIrecvPostedFirst(t *testing.T, g []Group) {
	ctx := context.Background()
	bufs := [][]byte{make([]byte, 4), make([]byte, 4), make([]byte, 4)}
	reqs := make([]*Request, len(bufs))
	for i := range bufs {
		reqs[i] = g[1].Irecv(ctx, 0, 3, bufs[i])
	}
	select {
	case <-reqs[0].Done():
		t.Fatal("receive completed before any send")
	case <-time.After(10 * time.Millisecond):
	}
	for i := range bufs {
		if _, err := g[0].Isend(ctx, 1, 3, []byte{byte(i + 1), 0, 0, byte(i)}).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if err := WaitAll(reqs...); err != nil {
		t.Fatal(err)
	}
	for i, b := range bufs {
		if b[0] != byte(i+1) || b[3] != byte(i) {
			t.Errorf("receive %d got %v", i, b)
		}
	}
}

func contractSelfSend(t *testing.T, g []Group) {
	ctx := context.Background()
	if err := g[1].Send(ctx, 1, 0, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := g[1].Recv(ctx, 1, 0, nil); err != nil || n != 0 {
		t.Fatalf("self zero-length: n=%d err=%v", n, err)
	}
	if err := g[1].Send(ctx, 1, 4, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if n, err := g[1].Recv(ctx, 1, 4, buf); err != nil || n != 3 || string(buf) != "abc" {
		t.Fatalf("self send: n=%d err=%v %q", n, err, buf)
	}
	// Zero-length messages between ranks, posted before and after they arrive.
	req := g[0].Irecv(ctx, 1, 5, nil)
	if err := g[1].Send(ctx, 0, 5, nil); err != nil {
		t.Fatal(err)
	}
	if err := g[1].Send(ctx, 0, 5, []byte{}); err != nil {
		t.Fatal(err)
	}
	if n, err := req.Wait(); err != nil || n != 0 {
		t.Fatalf("zero-length, posted first: n=%d err=%v", n, err)
	}
	if n, err := g[0].Recv(ctx, 1, 5, make([]byte, 1)); err != nil || n != 0 {
		t.Fatalf("zero-length, posted after: n=%d err=%v", n, err)
	}
	if s := g[1].Counters().Snapshot(); s.MsgsSent != 4 || s.MsgsRecv != 2 || s.BytesSent != 3 || s.BytesRecv != 3 {
		t.Errorf("rank 1 counters %v", s)
	}
}

func contractErrors(t *testing.T, g []Group) {
	ctx := context.Background()
	cases := []struct {
		name string
		run  func() error
		want []string
	}{
		{"send to rank 2", func() error { return g[0].Send(ctx, 2, 5, []byte{1}) }, []string{"rank 0", "rank 2", "tag 5", "out of range"}},
		{"send to rank -1", func() error { return g[0].Send(ctx, -1, 5, []byte{1}) }, []string{"rank -1", "out of range"}},
		{"recv from rank 7", func() error { _, err := g[1].Recv(ctx, 7, 5, nil); return err }, []string{"rank 1", "rank 7", "out of range"}},
		{"message too large", func() error {
			if err := g[0].Send(ctx, 1, 6, make([]byte, 10)); err != nil {
				return fmt.Errorf("send: %w", err)
			}
			_, err := g[1].Recv(ctx, 0, 6, make([]byte, 4))
			return err
		}, []string{"rank 1", "rank 0", "tag 6", "10 bytes", "4 bytes"}},
		{"message too large, receive posted first", func() error {
			req := g[1].Irecv(ctx, 0, 7, make([]byte, 3))
			if err := g[0].Send(ctx, 1, 7, make([]byte, 3<<20)); err != nil {
				return fmt.Errorf("send: %w", err)
			}
			_, err := req.Wait()
			return err
		}, []string{"rank 1", "rank 0", "tag 7", "3145728 bytes", "3 bytes"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.run()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// The oversized messages were consumed: the next ones on their tags arrive.
	for _, tag := range []uint32{6, 7} {
		if err := g[0].Send(ctx, 1, tag, []byte{42}); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1)
		if n, err := g[1].Recv(ctx, 0, tag, buf); err != nil || n != 1 || buf[0] != 42 {
			t.Fatalf("tag %d after the oversized message: n=%d err=%v buf=%v", tag, n, err, buf)
		}
	}
}

func contractRecvContext(t *testing.T, g []Group) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	deadline, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	later, cancel3 := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, cancel3)
	cases := []struct {
		name string
		ctx  context.Context
		want error
	}{
		{"cancelled", cancelled, context.Canceled},
		{"deadline", deadline, context.DeadlineExceeded},
		{"cancelled while waiting", later, context.Canceled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, err := g[1].Recv(c.ctx, 0, 42, make([]byte, 4))
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if time.Since(start) > 5*time.Second {
				t.Errorf("took %v", time.Since(start))
			}
			for _, w := range []string{"rank 1", "rank 0", "tag 42"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// A withdrawn receive must not swallow the next message.
	if err := g[0].Send(context.Background(), 1, 42, []byte{7}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if n, err := g[1].Recv(context.Background(), 0, 42, buf); err != nil || n != 1 || buf[0] != 7 {
		t.Fatalf("after cancellations: n=%d err=%v buf=%v", n, err, buf)
	}
}

func contractClose(t *testing.T, g []Group) {
	ctx := context.Background()
	// A message queued by rank 0 before it closes stays readable.
	if err := g[0].Send(ctx, 2, 1, []byte{5}); err != nil {
		t.Fatal(err)
	}
	pendingOwn := g[0].Irecv(ctx, 1, 1, make([]byte, 1))  // rank 0's own pending receive
	pendingPeer := g[1].Irecv(ctx, 0, 1, make([]byte, 1)) // rank 1 waits for rank 0
	if err := g[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := g[0].Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	check := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s: err = %v, want ErrClosed", name, err)
		}
	}
	_, err := pendingOwn.Wait()
	check("pending receive on the closed rank", err)
	_, err = pendingPeer.Wait()
	check("pending receive from the closed rank", err)
	check("send from the closed rank", g[0].Send(ctx, 1, 1, nil))
	_, err = g[0].Recv(ctx, 1, 1, nil)
	check("receive on the closed rank", err)
	check("send to the closed rank", g[1].Send(ctx, 0, 1, nil))
	_, err = g[1].Recv(ctx, 0, 2, nil)
	check("later receive from the closed rank", err)
	buf := make([]byte, 1)
	if n, err := g[2].Recv(ctx, 0, 1, buf); err != nil || n != 1 || buf[0] != 5 {
		t.Errorf("queued message from closed rank: n=%d err=%v", n, err)
	}
	// The ranks that stay open still talk to each other.
	if err := g[1].Send(ctx, 2, 3, []byte{9}); err != nil {
		t.Fatal(err)
	}
	if n, err := g[2].Recv(ctx, 1, 3, buf); err != nil || n != 1 || buf[0] != 9 {
		t.Errorf("between open ranks after a Close: n=%d err=%v", n, err)
	}
}

// Messages that arrive before their receive is posted are copied into pooled buffers; the
// pool must hand every buffer back and never let two messages share one.
func contractUnexpected(t *testing.T, gs []Group) {
	ctx := context.Background()
	for round := range 50 {
		for i := range 4 { // four queued messages of different sizes
			msg := bytes.Repeat([]byte{byte(round + i)}, 100+i*1000)
			if err := gs[0].Send(ctx, 1, 7, msg); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 4 {
			buf := make([]byte, 100+i*1000)
			n, err := gs[1].Irecv(ctx, 0, 7, buf).Wait()
			if err != nil || n != len(buf) {
				t.Fatalf("round %d message %d: %d bytes, %v", round, i, n, err)
			}
			for _, b := range buf {
				if b != byte(round+i) {
					t.Fatalf("round %d message %d: byte %d, want %d", round, i, b, round+i)
				}
			}
		}
	}
}

// pattern fills a message so that any misplaced or stale byte shows.
func pattern(tag uint32, seq, n int) []byte {
	b := make([]byte, n)
	x := uint32(tag)*2654435761 + uint32(seq)*40503 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// Two senders, several tags, sizes across the 1 MiB chunk boundary, receives posted before,
// during and after the messages arrive: every message lands whole, in order per tag.
func contractLargeMixed(t *testing.T, g []Group) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sizes := []int{0, 1, 1000, tcpMaxChunk - 1, tcpMaxChunk, tcpMaxChunk + 1, 3*tcpMaxChunk + 17, 70_000}
	tags := []uint32{1, 2, 3}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for _, from := range []int{0, 1} {
		for _, tag := range tags {
			wg.Go(func() {
				reqs := make([]*Request, len(sizes))
				for i, n := range sizes {
					reqs[i] = g[from].Isend(ctx, 2, tag, pattern(tag+uint32(10*from), i, n))
				}
				if err := WaitAll(reqs...); err != nil {
					errs <- err
				}
			})
			wg.Go(func() {
				for i, n := range sizes {
					if (i+int(tag))%3 == 0 {
						time.Sleep(time.Millisecond) // let some messages arrive first
					}
					buf := make([]byte, n+5)
					got, err := g[2].Recv(ctx, from, tag, buf)
					if err != nil {
						errs <- err
						return
					}
					if got != n || !bytes.Equal(buf[:n], pattern(tag+uint32(10*from), i, n)) {
						errs <- fmt.Errorf("from %d tag %d message %d: %d bytes, want %d, or the content differs", from, tag, i, got, n)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
