package cluster

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// dialFrom connects to srv from the loopback address src (127.0.0.0/8 is all local).
func dialFrom(t *testing.T, srv *StoreServer, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// Without a secret, a connection that sends nothing within the handshake deadline is closed;
// one that spoke stays, however long it then waits.
func TestStoreClosesIdleStrangers(t *testing.T) {
	logs := &logSink{}
	srv := startServer(t, StoreOptions{HandshakeTimeout: 100 * time.Millisecond, Logf: logs.logf})
	client := dial(t, srv, StoreOptions{})
	if err := client.Set(testCtx(t), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	idle := &rawConn{t, dialFrom(t, srv, "127.0.0.1")}
	if !idle.closedByServer() {
		t.Fatal("an idle stranger's connection stays open")
	}
	if !logs.contains("no query within 100ms") {
		t.Errorf("not logged: %q", logs.lines)
	}
	time.Sleep(300 * time.Millisecond) // past the deadline: the client that spoke is still served
	if v, err := client.Get(testCtx(t), "k"); err != nil || string(v) != "v" {
		t.Fatalf("a client that spoke was cut off: %q %v", v, err)
	}
}

// Strangers on one address cannot take every handshake slot; the ranks, from another
// address, still get in.
func TestStoreHandshakeSlotsPerSource(t *testing.T) {
	logs := &logSink{}
	opts := StoreOptions{Secret: []byte("s"), Logf: logs.logf, HandshakeTimeout: time.Minute}
	srv := startServer(t, opts)
	for range maxAuthenticatingPerSource + 4 { // silent strangers
		dialFrom(t, srv, "127.0.0.2")
	}
	waitLog(t, logs, "refused connection from 127.0.0.2")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := DialStore(ctx, srv.Addr().String(), opts) // from 127.0.0.1
	if err != nil {
		t.Fatalf("a rank could not get in past strangers of another address: %v", err)
	}
	defer s.Close()
	if err := s.Set(ctx, "k", nil); err != nil {
		t.Fatal(err)
	}
}

// One address holds at most MaxConnsPerSource connections; others are unaffected.
func TestStoreConnsPerSource(t *testing.T) {
	logs := &logSink{}
	srv := startServer(t, StoreOptions{Logf: logs.logf, HandshakeTimeout: time.Minute, MaxConnsPerSource: 3})
	for range 3 {
		dialFrom(t, srv, "127.0.0.2")
	}
	extra := &rawConn{t, dialFrom(t, srv, "127.0.0.2")}
	if !extra.closedByServer() {
		t.Fatal("a connection over the per-source cap was kept")
	}
	waitLog(t, logs, "refused connection from 127.0.0.2")
	if !logs.contains("3 connections from 127.0.0.2 are open") {
		t.Errorf("logged %q", logs.lines)
	}
	if err := dial(t, srv, StoreOptions{}).Set(testCtx(t), "k", nil); err != nil {
		t.Fatal(err)
	}
}

func waitLog(t *testing.T, logs *logSink, sub string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !logs.contains(sub); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never logged %q: %q", sub, logs.lines)
		}
	}
}

// Without a secret the store holds at most UnauthenticatedBytes of keys and values.
func TestStoreUnauthenticatedBudget(t *testing.T) {
	logs := &logSink{}
	srv := startServer(t, StoreOptions{UnauthenticatedBytes: 1000, Logf: logs.logf})
	a := dial(t, srv, StoreOptions{})
	ctx := testCtx(t)
	if err := a.Set(ctx, "a", make([]byte, 600)); err != nil {
		t.Fatal(err)
	}
	if err := a.Set(ctx, "a", make([]byte, 900)); err != nil { // a replaced value counts once
		t.Fatalf("replacing within the budget: %v", err)
	}
	if v, err := a.Get(ctx, "a"); err != nil || len(v) != 900 { // SET has no reply: sync
		t.Fatalf("replacing within the budget: %d bytes, %v", len(v), err)
	}
	b := dial(t, srv, StoreOptions{})
	b.Set(ctx, "b", make([]byte, 200)) // SET has no reply: the server closes the connection
	waitLog(t, logs, "over its budget of 1000 bytes")
	if n, err := a.NumKeys(ctx); err != nil || n != 1 {
		t.Fatalf("keys after the refused SET: %d %v\n%q", n, err, logs.lines)
	}
	if _, err := a.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := a.Set(ctx, "c", make([]byte, 900)); err != nil {
		t.Fatalf("after a delete the budget is free again: %v", err)
	}
	// With a secret there is no such budget.
	srv2 := startServer(t, StoreOptions{Secret: []byte("s"), UnauthenticatedBytes: 10})
	if err := dial(t, srv2, StoreOptions{Secret: []byte("s")}).Set(ctx, "big", make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
}

// A flood of rejected connections logs 10 lines and a count, not a line each.
func TestStoreRejectionLogIsLimited(t *testing.T) {
	logs := &logSink{}
	srv := startServer(t, StoreOptions{Secret: []byte("s"), Logf: logs.logf})
	for range 30 {
		c := dialFrom(t, srv, "127.0.0.3")
		c.Write(make([]byte, authNonceLen+authMACLen)) // a wrong proof
		c.Read(make([]byte, 64))
		c.Close()
	}
	waitLog(t, logs, "rejected connection")
	srv.Close()
	logs.mu.Lock()
	defer logs.mu.Unlock()
	n := 0
	for _, l := range logs.lines {
		if strings.Contains(l, "rejected connection") {
			n++
		}
	}
	if n != 10 || !strings.Contains(strings.Join(logs.lines, "\n"), "20 more connections refused or rejected by the store") {
		t.Fatalf("%d rejection lines: %q", n, logs.lines)
	}
}

// An empty SPARGO_SECRET counts as none: Init warns, and spargo launch makes a secret.
func TestEmptySecret(t *testing.T) {
	logs := &logSink{}
	_, _, err := Init(context.Background(), Options{Lookup: rankEnv(1, 2, 1, "SPARGO_SECRET="), Logf: logs.logf, RendezvousTimeout: 50 * time.Millisecond})
	if err == nil {
		t.Fatal("rank 1 alone joined a job")
	}
	if !logs.contains("SPARGO_SECRET is set but empty, which counts as none") {
		t.Errorf("no warning: %q", logs.lines)
	}
	_, secret, err := launchBaseEnv(LaunchConfig{Env: []string{"PATH=/bin", "SPARGO_SECRET=", "SPARGO_SECRET_FILE= "}})
	if err != nil || len(secret) != 1 || !strings.HasPrefix(secret[0], "SPARGO_SECRET=") || len(secret[0]) != len("SPARGO_SECRET=")+64 {
		t.Fatalf("launch with an empty inherited secret: %q %v", secret, err)
	}
}

// Under spargo launch (a loopback MASTER_ADDR) the store listens on loopback only.
func TestStoreHost(t *testing.T) {
	for _, tc := range []struct{ bind, master, want string }{
		{"", "127.0.0.1", "127.0.0.1"},
		{"", "::1", "::1"},
		{"", "localhost", "localhost"},
		{"", "10.0.0.5", ""},
		{"node1", "10.0.0.5", ""},
		{"0.0.0.0", "127.0.0.1", "0.0.0.0"},
		{"10.0.0.7", "127.0.0.1", "10.0.0.7"},
	} {
		want := tc.want
		if tc.bind == "node1" {
			want = "node1"
		}
		if got := storeHost(tc.bind, tc.master); got != want {
			t.Errorf("storeHost(%q, %q) = %q, want %q", tc.bind, tc.master, got, want)
		}
	}
}
