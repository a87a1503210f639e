package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// ---- strangers ----

// stranger is a connection to a rank's port that is not its peer.
type stranger func(t *testing.T, addr string) error

// strangerGarbage writes bytes that are no hello.
func strangerGarbage(t *testing.T, addr string) error {
	return knock(addr, func(c net.Conn) error {
		_, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: spargo\r\n\r\n......................"))
		return err
	})
}

// strangerHello sends a well-formed hello claiming rank `from` and then the proof MACed with
// secret (no proof at all if secret is nil and hasSecret is false).
func strangerHello(from, to, size int, hasSecret bool, secret []byte) stranger {
	return func(t *testing.T, addr string) error {
		return knock(addr, func(c net.Conn) error {
			h := hello{version: frameVersion, hasSecret: hasSecret, size: uint32(size), from: uint32(from), to: uint32(to)}
			hd := h.encode()
			if _, err := c.Write(hd); err != nil {
				return err
			}
			if !hasSecret {
				return nil
			}
			resp := make([]byte, helloLen+helloMACLen)
			if _, err := io.ReadFull(c, resp); err != nil {
				return err
			}
			_, err := c.Write(helloMAC(secret, "dialer", hd, resp[:helloLen]))
			return err
		})
	}
}

// knock connects to addr, runs say, and requires the rank to close the connection without
// accepting it (no ack byte, EOF or reset).
func knock(addr string, say func(net.Conn) error) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(8 * time.Second))
	if err := say(c); err != nil {
		return nil // the rank already hung up
	}
	rest, err := io.ReadAll(c)
	if bytes.IndexByte(rest, tcpHelloAck) >= 0 && len(rest) == 1 {
		return fmt.Errorf("stranger was accepted (%v)", err)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return fmt.Errorf("the rank kept the stranger's connection open")
	}
	return nil
}

func TestTCPStrangersRejected(t *testing.T) {
	const p = 3
	log := &testLog{t: t}
	lns := make([]net.Listener, p)
	addrs := make([]string, p)
	for r := range p {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[r], addrs[r] = ln, ln.Addr().String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups := make([]Group, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	startRank := func(r int) {
		wg.Go(func() {
			groups[r], errs[r] = NewTCP(ctx, TCPConfig{Rank: r, Size: p, Listener: lns[r], Addrs: addrs,
				Secret: testSecret, Logf: log.logf, Timeout: 5 * time.Second})
		})
	}
	// Ranks 1 and 2 wait for rank 0, which starts only after the strangers have knocked.
	startRank(1)
	startRank(2)
	strangers := []struct {
		name string
		s    stranger
	}{
		{"garbage", strangerGarbage},
		{"no secret", strangerHello(0, 2, p, false, nil)},
		{"wrong secret", strangerHello(0, 2, p, true, []byte("guess"))},
		{"wrong size", strangerHello(0, 2, p+1, true, testSecret)},
		{"wrong direction", strangerHello(2, 1, p, true, testSecret)},
	}
	for _, s := range strangers {
		target := addrs[2]
		if s.name == "wrong direction" {
			target = addrs[1]
		}
		if err := s.s(t, target); err != nil {
			t.Fatalf("stranger %s during set-up: %v", s.name, err)
		}
	}
	// A silent stranger holds a connection open while the real peers connect.
	silent, err := net.Dial("tcp", addrs[2])
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if !waitFor(5*time.Second, func() bool { return log.count("rejected connection") >= len(strangers) }) {
		t.Fatalf("only %d rejections logged for %d strangers", log.count("rejected connection"), len(strangers))
	}
	for _, want := range []string{"not a spargo peer", "has no secret", "wrong secret", "group of 4 ranks", "only lower ranks dial"} {
		if log.count("rejected connection", want) == 0 {
			t.Errorf("no rejection logged with %q", want)
		}
	}
	startRank(0)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer closeAll(groups)

	// After set-up every connection is refused, and the job goes on.
	for _, s := range strangers[:3] {
		if err := s.s(t, addrs[1]); err != nil {
			t.Fatalf("stranger %s after set-up: %v", s.name, err)
		}
	}
	if !waitFor(5*time.Second, func() bool { return log.count("refused connection", "mesh is complete") >= 3 }) {
		t.Errorf("refusals after set-up not logged")
	}
	checkAllReduce(t, groups, 10_000)
}

// ---- malformed frames from an authenticated peer ----

// rawPeer completes the handshake with rank 1 of a 2-rank group as rank 0 and returns the raw
// connection together with rank 1's Group.
func rawPeer(t *testing.T, configure func(*TCPConfig)) (net.Conn, Group, *testLog) {
	t.Helper()
	conns, g, log := rawPeers(t, 2, configure)
	return conns[0], g, log
}

// rawPeers starts the last rank of a group of size ranks for real and connects to it as every
// other rank by hand: conns[r] is rank r's raw, authenticated connection.
func rawPeers(t *testing.T, size int, configure func(*TCPConfig)) ([]net.Conn, *tcpGroup, *testLog) {
	t.Helper()
	log := &testLog{t: t}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addrs := make([]string, size)
	for r := range addrs {
		addrs[r] = "127.0.0.1:1"
	}
	real := size - 1
	addrs[real] = ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		g   Group
		err error
	}
	done := make(chan result, 1)
	go func() {
		cfg := TCPConfig{Rank: real, Size: size, Listener: ln, Addrs: addrs, Secret: testSecret, Logf: log.logf}
		if configure != nil {
			configure(&cfg)
		}
		g, err := NewTCP(ctx, cfg)
		done <- result{g, err}
	}()
	conns := make([]net.Conn, real)
	for r := range conns {
		fake, err := newTCPGroup(TCPConfig{Rank: r, Size: size, Listener: ln, Addrs: addrs, Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", addrs[real])
		if err != nil {
			t.Fatal(err)
		}
		if err := fake.dialHandshake(ctx, c, real); err != nil {
			t.Fatal(err)
		}
		conns[r] = c
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
		res.g.Close()
	})
	return conns, res.g.(*tcpGroup), log
}

func TestTCPBadFramesRejected(t *testing.T) {
	header := func(h frameHeader) []byte {
		var b [frameHeaderLen]byte
		h.encode(&b)
		return b[:]
	}
	badVersion := header(frameHeader{kind: frameData, tag: 1, chunk: 4, total: 4})
	badVersion[2] = 9
	cases := []struct {
		name  string
		bytes []byte
		want  string
	}{
		{"bad version", badVersion, "frame version 9"},
		{"bad magic", append([]byte("XX"), badVersion[2:]...), "bad frame magic"},
		{"oversized message", header(frameHeader{kind: frameData, tag: 1, chunk: 4, total: 1 << 40}), "exceeds the limit of 1073741824 bytes"},
		{"oversized chunk", header(frameHeader{kind: frameData, tag: 1, chunk: 64 << 20, total: 1 << 29}), "exceeds the chunk limit"},
		{"unknown kind", header(frameHeader{kind: 9}), "unknown frame kind 9"},
		{"oversized goodbye", header(frameHeader{kind: frameBye, chunk: tcpMaxByeReason + 1}), "goodbye with a 257-byte reason"},
		{"goodbye naming no rank", append(header(frameHeader{kind: frameBye, chunk: 5}), 1, 2, 0, 0, 0), "goodbye names rank 2, the group has 2"},
		{"chunk out of sequence", header(frameHeader{kind: frameData, tag: 1, chunk: 4, total: 8, offset: 4}), "no message is in flight"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, g, log := rawPeer(t, nil)
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			allocBefore := ms.TotalAlloc
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req := g.Irecv(ctx, 0, 1, make([]byte, 16))
			if _, err := conn.Write(c.bytes); err != nil {
				t.Fatal(err)
			}
			_, err := req.Wait()
			if err == nil || !strings.Contains(err.Error(), "peer rank 0 failed") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want a failure of rank 0 mentioning %q", err, c.want)
			}
			runtime.ReadMemStats(&ms)
			if grew := ms.TotalAlloc - allocBefore; grew > 8<<20 {
				t.Errorf("%d bytes allocated while rejecting the frame", grew)
			}
			if log.count("peer rank 0 failed", c.want) != 1 {
				t.Errorf("failure not logged once")
			}
			// The connection is closed: the peer reads EOF (or a reset).
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := conn.Read(make([]byte, 64)); err == nil {
				for err == nil {
					_, err = conn.Read(make([]byte, 64)) // heartbeats may come first
				}
			}
		})
	}
}

// A message longer than MaxMessage cannot be sent either.
func TestTCPMaxMessage(t *testing.T) {
	g := newTCP(t, 2, func(c *TCPConfig) { c.MaxMessage = 1000 })
	err := g[0].Send(context.Background(), 1, 1, make([]byte, 1001))
	if err == nil || !strings.Contains(err.Error(), "limit of 1000 bytes") {
		t.Fatalf("oversized send: %v", err)
	}
	if err := g[0].Send(context.Background(), 1, 1, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if n, err := g[1].Recv(context.Background(), 0, 1, make([]byte, 1000)); err != nil || n != 1000 {
		t.Fatalf("n=%d err=%v", n, err)
	}
}

func TestNewTCPBadConfig(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, c := range []struct {
		cfg  TCPConfig
		want string
	}{
		{TCPConfig{Size: 0}, "size 0"},
		{TCPConfig{Rank: 2, Size: 2, Listener: ln, Addrs: []string{"a", "b"}}, "rank 2 out of range"},
		{TCPConfig{Rank: 0, Size: 2, Addrs: []string{"a", "b"}}, "no Listener"},
		{TCPConfig{Rank: 0, Size: 2, Listener: ln, Addrs: []string{"a"}}, "1 addresses for 2 ranks"},
	} {
		if _, err := NewTCP(context.Background(), c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewTCP(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
	// One rank needs no network.
	g, err := NewTCP(context.Background(), TCPConfig{Rank: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	buf := []float32{1, 2}
	if err := AllReduce(context.Background(), g, 0, buf, Auto); err != nil || buf[1] != 2 {
		t.Fatal(err)
	}
	g.Close()
}

// A peer that never starts costs a clear error after DialTimeout.
func TestNewTCPMissingPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	log := &testLog{t: t}
	start := time.Now()
	_, err = NewTCP(context.Background(), TCPConfig{Rank: 0, Size: 3, Listener: ln, Addrs: []string{ln.Addr().String(), deadAddr, deadAddr},
		DialTimeout: 300 * time.Millisecond, Logf: log.logf})
	if err == nil || !strings.Contains(err.Error(), "no connection with rank(s) [1 2]") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v with a 300ms dial timeout", d)
	}
}
