package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// logSink collects log lines of a server for assertions.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (l *logSink) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *logSink) contains(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func startServer(t *testing.T, opts StoreOptions) *StoreServer {
	t.Helper()
	srv, err := NewStoreServer(context.Background(), "127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

func dial(t *testing.T, srv *StoreServer, opts StoreOptions) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := DialStore(ctx, srv.Addr().String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStoreOperations(t *testing.T) {
	for _, secret := range []string{"", "s3cret"} {
		t.Run(fmt.Sprintf("secret=%q", secret), func(t *testing.T) {
			opts := StoreOptions{Secret: []byte(secret)}
			srv := startServer(t, opts)
			s := dial(t, srv, opts)
			ctx := testCtx(t)

			if err := s.Set(ctx, "a", []byte("1")); err != nil {
				t.Fatal(err)
			}
			if v, err := s.Get(ctx, "a"); err != nil || string(v) != "1" {
				t.Fatalf("Get a = %q, %v", v, err)
			}
			if err := s.Set(ctx, "empty", nil); err != nil {
				t.Fatal(err)
			}
			if v, err := s.Get(ctx, "empty"); err != nil || len(v) != 0 {
				t.Fatalf("Get empty = %q, %v", v, err)
			}
			for i, want := range []int64{5, 3, 103} {
				got, err := s.Add(ctx, "n", []int64{5, -2, 100}[i])
				if err != nil || got != want {
					t.Fatalf("Add #%d = %d, %v; want %d", i, got, err, want)
				}
			}
			if v, _ := s.Get(ctx, "n"); string(v) != "103" {
				t.Fatalf("Add stores decimal text, got %q", v)
			}
			if ok, err := s.Check(ctx, "a", "n"); err != nil || !ok {
				t.Fatalf("Check a, n = %v, %v", ok, err)
			}
			if ok, err := s.Check(ctx, "a", "missing"); err != nil || ok {
				t.Fatalf("Check a, missing = %v, %v", ok, err)
			}
			// CompareSet: missing key with empty expected creates it; wrong expected leaves it;
			// right expected swaps it; missing key with non-empty expected echoes expected.
			steps := []struct{ key, expected, desired, reply string }{
				{"cas", "", "x", "x"},
				{"cas", "y", "z", "x"},
				{"cas", "x", "z", "z"},
				{"nokey", "e", "d", "e"},
			}
			for _, st := range steps {
				v, err := s.CompareSet(ctx, st.key, []byte(st.expected), []byte(st.desired))
				if err != nil || string(v) != st.reply {
					t.Fatalf("CompareSet(%q, %q, %q) = %q, %v; want %q", st.key, st.expected, st.desired, v, err, st.reply)
				}
			}
			if ok, _ := s.Check(ctx, "nokey"); ok {
				t.Fatal("CompareSet with non-empty expected created a missing key")
			}
			n, err := s.NumKeys(ctx)
			if err != nil || n != 4 { // a, empty, n, cas
				t.Fatalf("NumKeys = %d, %v; want 4", n, err)
			}
			if ok, err := s.Delete(ctx, "a"); err != nil || !ok {
				t.Fatalf("Delete a = %v, %v", ok, err)
			}
			if ok, err := s.Delete(ctx, "a"); err != nil || ok {
				t.Fatalf("second Delete a = %v, %v", ok, err)
			}
			// Views share the key space the way PyTorch's PrefixStore does.
			v := s.WithPrefix("run1")
			if err := v.Set(ctx, "k", []byte("in-view")); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.Get(ctx, "run1/k"); string(got) != "in-view" {
				t.Fatalf("prefixed key: got %q", got)
			}
		})
	}
}

func TestStoreGetBlocksUntilSet(t *testing.T) {
	srv := startServer(t, StoreOptions{})
	waiter := dial(t, srv, StoreOptions{})
	setter := dial(t, srv, StoreOptions{})
	ctx := testCtx(t)
	got := make(chan string, 1)
	go func() {
		v, err := waiter.Get(ctx, "late")
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(v)
	}()
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before the key was set", v)
	case <-time.After(100 * time.Millisecond):
	}
	if err := setter.Set(ctx, "late", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; v != "v" {
		t.Fatalf("Get = %q", v)
	}
	// Wait on several keys returns only when the last one is set.
	done := make(chan error, 1)
	go func() { done <- waiter.Wait(ctx, "w1", "w2", "late") }()
	setter.Set(ctx, "w1", nil)
	select {
	case err := <-done:
		t.Fatalf("Wait returned with w2 missing: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	setter.Add(ctx, "w2", 1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestStoreWaitTimeoutAndReconnect(t *testing.T) {
	srv := startServer(t, StoreOptions{})
	s := dial(t, srv, StoreOptions{Timeout: 150 * time.Millisecond})
	start := time.Now()
	_, err := s.Get(context.Background(), "never")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `get "never"`) {
		t.Fatalf("Get of a missing key: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	// A cancelled context interrupts a wait, and the client reconnects for the next call.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if err := s.Wait(ctx, "never"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait: %v", err)
	}
	if err := s.Set(testCtx(t), "after", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(testCtx(t), "after"); err != nil || string(v) != "ok" {
		t.Fatalf("after reconnect: %q, %v", v, err)
	}
	// The server forgot the abandoned waits: setting "never" must not confuse anyone.
	if err := s.Set(testCtx(t), "never", nil); err != nil {
		t.Fatal(err)
	}
	if n, err := s.NumKeys(testCtx(t)); err != nil || n != 2 {
		t.Fatalf("NumKeys = %d, %v", n, err)
	}
}

func TestStoreConcurrentClients(t *testing.T) {
	srv := startServer(t, StoreOptions{})
	const clients, adds = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		s := dial(t, srv, StoreOptions{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range adds {
				if _, err := s.Add(testCtx(t), "counter", 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := dial(t, srv, StoreOptions{})
	if v, _ := s.Get(testCtx(t), "counter"); string(v) != fmt.Sprint(clients*adds) {
		t.Fatalf("counter = %q, want %d", v, clients*adds)
	}
}

func TestStoreAuthentication(t *testing.T) {
	logs := &logSink{}
	opts := StoreOptions{Secret: []byte("right"), Logf: logs.logf, HandshakeTimeout: 300 * time.Millisecond}
	srv := startServer(t, opts)
	good := dial(t, srv, opts)
	ctx := testCtx(t)
	if err := good.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}

	// Wrong secret: both sides refuse, quickly.
	_, err := DialStore(ctx, srv.Addr().String(), StoreOptions{Secret: []byte("wrong")})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong secret: %v", err)
	}
	// No secret: a PyTorch-style client sends a query at once; it gets no answer and the
	// server drops it when the handshake time is up.
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write(appendString([]byte{queryGet}, "/k"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	hello := make([]byte, len(authMagic)+authNonceLen)
	if _, err := io.ReadFull(c, hello); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("expected the server to close the connection, got %v", err)
	}
	c.Close()
	// A client that expects a secret refuses a server without one instead of talking to it.
	plain := startServer(t, StoreOptions{})
	_, err = DialStore(ctx, plain.Addr().String(), StoreOptions{Secret: []byte("x"), HandshakeTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("secret client on a plain server: %v", err)
	}
	// The server logged the strangers and still serves the good client.
	deadline := time.Now().Add(5 * time.Second)
	for !logs.contains("rejected connection") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !logs.contains("rejected connection") || !logs.contains("wrong proof") {
		t.Fatalf("server logs lack the rejections: %q", logs.lines)
	}
	if v, err := good.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("good client after strangers: %q, %v", v, err)
	}
}

// rawConn speaks the wire protocol byte by byte, the way PyTorch's client does.
type rawConn struct {
	t *testing.T
	c net.Conn
}

func rawDial(t *testing.T, srv *StoreServer) *rawConn {
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	t.Cleanup(func() { c.Close() })
	return &rawConn{t, c}
}

func (r *rawConn) send(b []byte) {
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) read(n int) []byte {
	b := make([]byte, n)
	if _, err := io.ReadFull(r.c, b); err != nil {
		r.t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

func (r *rawConn) readBytes() []byte {
	n := binary.LittleEndian.Uint64(r.read(8))
	return r.read(int(n))
}

func (r *rawConn) closedByServer() bool {
	_, err := r.c.Read(make([]byte, 1))
	return err == io.EOF
}

func TestStoreWireProtocol(t *testing.T) {
	srv := startServer(t, StoreOptions{Logf: t.Logf})
	a, b := rawDial(t, srv), rawDial(t, srv)

	// The exact bytes of PyTorch 1.13's client for set("key", "val") and get("key")
	// (recorded from torch 1.13 against a listening socket).
	a.send([]byte("\x00\x04\x00\x00\x00\x00\x00\x00\x00/key\x03\x00\x00\x00\x00\x00\x00\x00val"))
	a.send([]byte("\x05\x01\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00/key"))
	if got := a.read(1); got[0] != waitStopWaiting {
		t.Fatalf("WAIT reply %v", got)
	}
	a.send([]byte("\x02\x04\x00\x00\x00\x00\x00\x00\x00/key"))
	if v := a.readBytes(); string(v) != "val" {
		t.Fatalf("GET reply %q", v)
	}

	// WATCH_KEY: registration, then created / updated / deleted updates in order.
	b.send(appendString([]byte{queryWatchKey}, "w"))
	if got := b.read(1); got[0] != watchRegistered {
		t.Fatalf("WATCH_KEY reply %v", got)
	}
	a.send(appendBytes(appendString([]byte{querySet}, "w"), []byte("1")))
	a.send(appendUint64(appendString([]byte{queryAdd}, "w"), 2))
	if got := binary.LittleEndian.Uint64(a.read(8)); got != 3 {
		t.Fatalf("ADD reply %d", got)
	}
	a.send(appendString([]byte{queryDeleteKey}, "w"))
	if got := binary.LittleEndian.Uint64(a.read(8)); got != 1 {
		t.Fatalf("DELETE_KEY reply %d", got)
	}
	for _, want := range []struct {
		kind     byte
		old, new string
	}{{watchCreated, "", "1"}, {watchUpdated, "1", "3"}, {watchDeleted, "3", ""}} {
		if kind := b.read(1)[0]; kind != want.kind {
			t.Fatalf("watch update kind %d, want %d", kind, want.kind)
		}
		if k, o, n := b.readBytes(), b.readBytes(), b.readBytes(); string(k) != "w" || string(o) != want.old || string(n) != want.new {
			t.Fatalf("watch update %q %q %q, want w %q %q", k, o, n, want.old, want.new)
		}
	}

	// PyTorch 2.0/2.1 additions: APPEND, MULTI_SET, MULTI_GET, CANCEL_WAIT.
	a.send(appendBytes(appendString([]byte{queryAppend}, "/key"), []byte("ue")))
	msg := appendUint64([]byte{queryMultiSet}, 2)
	msg = appendBytes(appendString(msg, "m1"), []byte("x"))
	msg = appendBytes(appendString(msg, "m2"), []byte("yy"))
	a.send(msg)
	a.send(appendKeys([]byte{queryMultiGet}, []string{"/key", "m1", "m2"}))
	for _, want := range []string{"value", "x", "yy"} {
		if v := a.readBytes(); string(v) != want {
			t.Fatalf("MULTI_GET value %q, want %q", v, want)
		}
	}
	a.send(appendKeys([]byte{queryWait}, []string{"never"}))
	a.send([]byte{queryCancelWait})
	if got := a.read(1); got[0] != waitCanceled {
		t.Fatalf("CANCEL_WAIT reply %v", got)
	}
	a.send([]byte{queryNumKeys})
	if got := binary.LittleEndian.Uint64(a.read(8)); got != 3 {
		t.Fatalf("GETNUMKEYS = %d, want 3", got)
	}

	// Protocol errors close only the offending connection, as in PyTorch.
	for name, bad := range map[string][]byte{
		"get of a missing key":  appendString([]byte{queryGet}, "missing"),
		"add to a non-integer":  appendUint64(appendString([]byte{queryAdd}, "m1"), 1),
		"unknown query type":    {42},
		"oversized value":       appendUint64(appendString([]byte{querySet}, "big"), 1<<62),
		"oversized key count":   appendUint64([]byte{queryWait}, 1<<40),
		"truncated then closed": {querySet, 5, 0},
	} {
		c := rawDial(t, srv)
		c.send(bad)
		if name == "truncated then closed" {
			c.c.(*net.TCPConn).CloseWrite()
		}
		if !c.closedByServer() {
			t.Errorf("%s: server kept the connection", name)
		}
	}
	a.send([]byte{queryNumKeys})
	if got := binary.LittleEndian.Uint64(a.read(8)); got != 3 {
		t.Fatalf("server state changed by bad clients: %d keys", got)
	}
}

func TestStoreLargeValue(t *testing.T) {
	srv := startServer(t, StoreOptions{MaxValueBytes: 8 << 20, Logf: t.Logf})
	s := dial(t, srv, StoreOptions{MaxValueBytes: 8 << 20})
	ctx := testCtx(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 5<<16) // 5 MiB: several read chunks
	if err := s.Set(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, "big"); err != nil || !bytes.Equal(v, big) {
		t.Fatalf("big value round trip: %d bytes, %v", len(v), err)
	}
	// SET has no reply: the server drops the connection, which the client notices while
	// writing or at its next query.
	if err := s.Set(ctx, "huge", make([]byte, 9<<20)); err == nil {
		if _, err := s.NumKeys(ctx); err == nil {
			t.Fatal("a value over the server's limit did not break the connection")
		}
	}
	if n, err := s.NumKeys(ctx); err != nil || n != 1 {
		t.Fatalf("after reconnecting: NumKeys = %d, %v", n, err)
	}
}

func TestStoreCloseInterruptsAndCleansUp(t *testing.T) {
	srv := startServer(t, StoreOptions{})
	s := dial(t, srv, StoreOptions{})
	errc := make(chan error, 1)
	go func() { errc <- s.Wait(context.Background(), "never") }()
	time.Sleep(50 * time.Millisecond)
	s.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrStoreClosed) {
			t.Fatalf("Wait after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not interrupt Wait")
	}
	if err := s.Set(testCtx(t), "k", nil); !errors.Is(err, ErrStoreClosed) {
		t.Fatalf("Set after Close: %v", err)
	}
	// The server's Close ends connected clients' calls too.
	s2 := dial(t, srv, StoreOptions{})
	go func() { errc <- s2.Wait(context.Background(), "never") }()
	time.Sleep(50 * time.Millisecond)
	srv.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Wait succeeded on a closed server")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server Close did not end the client's Wait")
	}
}

func TestDialStoreRetriesUntilServerStarts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	go func() {
		time.Sleep(200 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return // port taken meanwhile; the dial below then fails the test
		}
		srv := ServeStore(context.Background(), ln, StoreOptions{})
		t.Cleanup(func() { srv.Close() })
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := DialStore(ctx, addr, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// Nothing listening: DialStore gives up at the deadline and says so.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln2.Addr().String()
	ln2.Close()
	if _, err := DialStore(ctx2, dead, StoreOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial of a dead address: %v", err)
	}
}

func TestStoreHandshakeFlood(t *testing.T) {
	logs := &logSink{}
	opts := StoreOptions{Secret: []byte("s"), Logf: logs.logf, HandshakeTimeout: 500 * time.Millisecond}
	srv := startServer(t, opts)
	var conns []net.Conn
	for range maxAuthenticating + 6 {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !logs.contains("too many connections authenticating") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !logs.contains("too many connections authenticating") {
		t.Fatalf("%d silent strangers were all let into the handshake", len(conns))
	}
	// Once the strangers' handshake time is up, a real client gets in.
	s := dial(t, srv, opts)
	if err := s.Set(testCtx(t), "k", nil); err != nil {
		t.Fatal(err)
	}
}
