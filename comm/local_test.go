package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func newLocal(t *testing.T, p int) []Group {
	t.Helper()
	groups, err := NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	return groups
}

func TestNewLocalRejectsBadSize(t *testing.T) {
	for _, p := range []int{0, -1} {
		if _, err := NewLocal(p); err == nil {
			t.Errorf("NewLocal(%d): no error", p)
		}
	}
}

func TestLocalSendRecvFIFOAndCopy(t *testing.T) {
	g := newLocal(t, 3)
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

func TestLocalIrecvPostedBeforeSendMatchInOrder(t *testing.T) {
	g := newLocal(t, 2)
	ctx := context.Background()
	bufs := [][]byte{make([]byte, 4), make([]byte, 4), make([]byte, 4)}
	reqs := make([]*Request, len(bufs))
	for i := range bufs {
		reqs[i] = g[1].Irecv(ctx, 0, 3, bufs[i])
	}
	select {
	case <-reqs[0].Done():
		t.Fatal("receive completed before any send")
	default:
	}
	for i := range bufs {
		sreq := g[0].Isend(ctx, 1, 3, []byte{byte(i + 1), 0, 0, byte(i)})
		if _, err := sreq.Wait(); err != nil {
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

func TestLocalSelfSendAndZeroLength(t *testing.T) {
	g := newLocal(t, 2)
	ctx := context.Background()
	if err := g[1].Send(ctx, 1, 0, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := g[1].Recv(ctx, 1, 0, nil); err != nil || n != 0 {
		t.Fatalf("self zero-length: n=%d err=%v", n, err)
	}
}

func TestLocalErrors(t *testing.T) {
	g := newLocal(t, 2)
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
}

func TestLocalRecvHonoursContext(t *testing.T) {
	g := newLocal(t, 2)
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

func TestLocalClose(t *testing.T) {
	g := newLocal(t, 3)
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
}

func TestCountersSubResetAdd(t *testing.T) {
	var c Counters
	c.AddSent(10)
	c.AddRecv(4)
	c.AddRound(2)
	before := c.Snapshot()
	c.AddSent(6)
	c.AddRound(1)
	d := c.Snapshot().Sub(before)
	if want := (Stats{BytesSent: 6, MsgsSent: 1, Rounds: 1}); d != want {
		t.Errorf("Sub = %+v, want %+v", d, want)
	}
	if s := before.Add(d); s != c.Snapshot() {
		t.Errorf("Add = %+v, want %+v", s, c.Snapshot())
	}
	c.Reset()
	if s := c.Snapshot(); s != (Stats{}) {
		t.Errorf("after Reset %+v", s)
	}
}

// Messages that arrive before their receive is posted are copied into pooled
// buffers; the pool must hand every buffer back and never let two messages
// share one.
func TestLocalUnexpectedMessagesReuseBuffers(t *testing.T) {
	gs, err := NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
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

func TestScratchPoolKeepsCapacity(t *testing.T) {
	s := getScratch(1000)
	if len(s) != 1000 || cap(s) != 1024 {
		t.Fatalf("getScratch(1000): len %d cap %d, want 1000 and 1024", len(s), cap(s))
	}
	putScratch(s)
	s2 := getScratch(900)
	if &s2[0] != &s[0] {
		t.Error("a returned scratch buffer of the same class was not reused")
	}
	putScratch(s2)
}
