package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// testLog collects a transport's log lines so that tests can look for rejections and failures.
type testLog struct {
	mu    sync.Mutex
	lines []string
	t     testing.TB
}

func (l *testLog) logf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	l.t.Log(s)
}

// count is the number of lines containing every one of subs.
func (l *testLog) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		ok := true
		for _, sub := range subs {
			ok = ok && strings.Contains(s, sub)
		}
		if ok {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

var testSecret = []byte("correct horse battery staple")

// newTCP returns p ranks over loopback sockets (closed when the test ends), with an optional
// change to every rank's configuration.
func newTCP(t testing.TB, p int, configure ...func(*TCPConfig)) []Group {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	log := &testLog{t: t}
	groups, err := newTCPLoopback(ctx, p, func(c *TCPConfig) {
		c.Secret = testSecret
		c.Logf = log.logf
		for _, f := range configure {
			f(c)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(groups) })
	return groups
}

func closeAll(groups []Group) {
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { g.Close() })
	}
	wg.Wait()
}

// ---- collectives over TCP equal the in-process ones ----

// collCase is one collective call; it returns the rank's result as bytes.
type collCase struct {
	name string
	run  func(ctx context.Context, g Group) ([]byte, error)
}

func collectiveCases(p int) []collCase {
	var cs []collCase
	f32 := func(v []float32) []byte { return slices.Clone(F32Bytes(v)) }
	for _, alg := range []Algorithm{Auto, Ring, Rabenseifner, RecursiveDoubling} {
		for _, n := range []int{1, 1000, 700_000} {
			cs = append(cs, collCase{fmt.Sprintf("AllReduce/%v/n=%d", alg, n), func(ctx context.Context, g Group) ([]byte, error) {
				buf := rankData(uint64(n), g.Rank(), n)
				err := AllReduce(ctx, g, 1, buf, alg)
				return f32(buf), err
			}})
		}
	}
	for _, alg := range []Algorithm{Auto, Ring, Bruck, RecursiveDoubling} {
		if alg == RecursiveDoubling && !isPow2(p) {
			continue
		}
		for _, n := range []int{1, 300_000} {
			cs = append(cs, collCase{fmt.Sprintf("AllGather/%v/n=%d", alg, n), func(ctx context.Context, g Group) ([]byte, error) {
				recv := make([]float32, p*n)
				err := AllGather(ctx, g, 2, rankData(3, g.Rank(), n), recv, alg)
				return f32(recv), err
			}})
		}
	}
	size := func(r int) int { return []int{0, 5, 300_001, 17}[r%4] }
	cs = append(cs,
		collCase{"AllGatherV", func(ctx context.Context, g Group) ([]byte, error) {
			out, err := AllGatherV(ctx, g, 3, rankData(9, g.Rank(), size(g.Rank())))
			var b []byte
			for _, o := range out {
				b = append(b, F32Bytes(o)...)
			}
			return b, err
		}},
		collCase{"AllGatherBytes", func(ctx context.Context, g Group) ([]byte, error) {
			out, err := AllGatherBytes(ctx, g, 3, pattern(3, g.Rank(), size(g.Rank())))
			return bytes.Join(out, nil), err
		}},
		collCase{"AllGatherBytesSized", func(ctx context.Context, g Group) ([]byte, error) {
			sizes := make([]int, p)
			for i := range sizes {
				sizes[i] = size(i)
			}
			out, err := AllGatherBytesSized(ctx, g, 3, pattern(4, g.Rank(), size(g.Rank())), sizes)
			return bytes.Join(out, nil), err
		}},
		collCase{"Broadcast/root=0", func(ctx context.Context, g Group) ([]byte, error) {
			buf := make([]float32, 400_000)
			if g.Rank() == 0 {
				buf = rankData(7, 0, len(buf))
			}
			err := Broadcast(ctx, g, 4, 0, buf)
			return f32(buf), err
		}},
		collCase{"BroadcastBytes/root=last", func(ctx context.Context, g Group) ([]byte, error) {
			buf := make([]byte, 1001)
			if g.Rank() == p-1 {
				buf = pattern(5, p-1, len(buf))
			}
			err := BroadcastBytes(ctx, g, 4, p-1, buf)
			return buf, err
		}},
		collCase{"Barrier", func(ctx context.Context, g Group) ([]byte, error) {
			return nil, Barrier(ctx, g, 6)
		}},
		collCase{"SendRecv/shift", func(ctx context.Context, g Group) ([]byte, error) {
			r := g.Rank()
			recv := make([]byte, 2<<20)
			n, err := SendRecv(ctx, g, 7, (r+1)%p, pattern(7, r, 1000*r+(r%2)<<20), (r-1+p)%p, recv)
			return recv[:n], err
		}},
		collCase{"Sub/AllReduce", func(ctx context.Context, g Group) ([]byte, error) {
			members := []int{p - 1}
			for i := 0; i < p-1; i += 2 {
				members = append(members, i)
			}
			if !slices.Contains(members, g.Rank()) {
				members = nil
				for i := 1; i < p-1; i += 2 {
					members = append(members, i)
				}
			}
			s, err := Sub(g, members)
			if err != nil {
				return nil, err
			}
			buf := rankData(21, g.Rank(), 99_999)
			err = AllReduce(ctx, s, 8, buf, Ring)
			return f32(buf), err
		}},
	)
	return cs
}

// runCase runs c on every rank and returns each rank's result and counter difference.
func runCase(ctx context.Context, groups []Group, c collCase) ([][]byte, []Stats, error) {
	p := len(groups)
	outs := make([][]byte, p)
	stats := make([]Stats, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			before := g.Counters().Snapshot()
			outs[r], errs[r] = c.run(ctx, g)
			stats[r] = g.Counters().Snapshot().Sub(before)
		})
	}
	wg.Wait()
	return outs, stats, errors.Join(errs...)
}

func TestTCPCollectivesMatchLocal(t *testing.T) {
	for _, p := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			local, err := NewLocal(p)
			if err != nil {
				t.Fatal(err)
			}
			tcp := newTCP(t, p)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, c := range collectiveCases(p) {
				wantOut, wantStats, err := runCase(ctx, local, c)
				if err != nil {
					t.Fatalf("%s in process: %v", c.name, err)
				}
				gotOut, gotStats, err := runCase(ctx, tcp, c)
				if err != nil {
					t.Fatalf("%s over TCP: %v", c.name, err)
				}
				for r := range p {
					if !bytes.Equal(gotOut[r], wantOut[r]) {
						t.Errorf("%s rank %d: result over TCP differs from the in-process one (%d vs %d bytes)", c.name, r, len(gotOut[r]), len(wantOut[r]))
					}
					if gotStats[r] != wantStats[r] {
						t.Errorf("%s rank %d: counters over TCP %v, in process %v", c.name, r, gotStats[r], wantStats[r])
					}
				}
			}
		})
	}
}

// ---- cancellation in the middle of a large message ----

// A receive cancelled while its message streams into its buffer gives the message up intact to
// the next receive (or, if the message won the race, has it whole).
func TestTCPRecvCancelledMidMessage(t *testing.T) {
	g := newTCP(t, 2)
	ctx := context.Background()
	const big = 48 << 20
	want := pattern(1, 0, big)
	cancelledOnce := false
	for attempt := range 3 {
		sent := make(chan error, 1)
		go func() {
			err := g[0].Send(ctx, 1, 1, want)
			if err == nil {
				err = g[0].Send(ctx, 1, 1, []byte("next"))
			}
			sent <- err
		}()
		buf := make([]byte, big)
		cctx, cancel := context.WithCancel(ctx)
		req := g[1].Irecv(cctx, 0, 1, buf)
		time.AfterFunc(time.Duration(2+3*attempt)*time.Millisecond, cancel)
		n, err := req.Wait()
		cancel()
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled receive: %v", err)
			}
			cancelledOnce = true
			clear(buf)
			if n, err = g[1].Recv(ctx, 0, 1, buf); err != nil {
				t.Fatal(err)
			}
		}
		if n != big || !bytes.Equal(buf, want) {
			t.Fatalf("attempt %d: the large message arrived damaged (%d bytes)", attempt, n)
		}
		small := make([]byte, 8)
		if n, err := g[1].Recv(ctx, 0, 1, small); err != nil || string(small[:n]) != "next" {
			t.Fatalf("attempt %d: next message: %q, %v", attempt, small[:n], err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("a receive was cancelled mid-message: %v", cancelledOnce)
}

// A send cancelled after part of it went out is dropped by the receiver (abort frame); the
// next message under the same tag arrives as the next message.
func TestTCPSendCancelledMidMessage(t *testing.T) {
	g := newTCP(t, 2)
	ctx := context.Background()
	const big = 48 << 20
	payload := pattern(2, 0, big)
	for attempt := range 3 {
		cctx, cancel := context.WithCancel(ctx)
		req := g[0].Isend(cctx, 1, 2, payload)
		time.AfterFunc(time.Duration(1+2*attempt)*time.Millisecond, cancel)
		_, serr := req.Wait()
		cancel()
		if serr != nil && !errors.Is(serr, context.Canceled) {
			t.Fatalf("cancelled send: %v", serr)
		}
		if err := g[0].Send(ctx, 1, 2, []byte("after")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, big)
		n, err := g[1].Recv(ctx, 0, 2, buf)
		if err != nil {
			t.Fatal(err)
		}
		if serr == nil {
			if n != big || !bytes.Equal(buf, payload) {
				t.Fatalf("attempt %d: completed send arrived damaged", attempt)
			}
			n, err = g[1].Recv(ctx, 0, 2, buf)
			if err != nil {
				t.Fatal(err)
			}
		} else {
			t.Logf("attempt %d: send cancelled: %v", attempt, serr)
		}
		if string(buf[:n]) != "after" {
			t.Fatalf("attempt %d (send error %v): got %d bytes, want the message sent after", attempt, serr, n)
		}
	}
}

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

// checkAllReduce runs one all-reduce on groups and compares it with the float64 sum.
func checkAllReduce(t *testing.T, groups []Group, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := len(groups)
	inputs := make([][]float32, p)
	bufs := make([][]float32, p)
	for r := range p {
		inputs[r] = rankData(11, r, n)
		bufs[r] = slices.Clone(inputs[r])
	}
	var wg sync.WaitGroup
	errs := make([]error, p)
	for r, g := range groups {
		wg.Go(func() { errs[r] = AllReduce(ctx, g, 9, bufs[r], Auto) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	checkIdentical(t, "all-reduce", bufs)
	checkSum(t, "all-reduce", bufs[0], inputs)
}

// ---- failures ----

// killAfter is a rank that dies (all sockets closed, no goodbye) at its k-th receive.
type killAfter struct {
	Group
	mu       sync.Mutex
	k        int
	killedAt time.Time
}

func (d *killAfter) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	d.mu.Lock()
	d.k--
	if d.k == 0 {
		d.Group.(*tcpGroup).killForTest()
		d.killedAt = time.Now()
	}
	d.mu.Unlock()
	return d.Group.Recv(ctx, from, tag, buf)
}

const testTimeout = 300 * time.Millisecond

func shortTimeout(c *TCPConfig) { c.Timeout = testTimeout }

// failureCase runs an all-reduce on ranks 0 and 1 of a 3-rank group while rank 2 is made to
// fail by act (which returns when it did); both must fail within `within` with an error naming
// rank 2.
func failureCase(t *testing.T, groups []Group, rank2 func(ctx context.Context, g Group) time.Time, within time.Duration, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, 3)
	ended := make([]time.Time, 3)
	var failedAt time.Time
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			errs[r] = AllReduce(ctx, groups[r], 1, rankData(1, r, 300_000), Ring)
			ended[r] = time.Now()
		})
	}
	wg.Go(func() { failedAt = rank2(ctx, groups[2]) })
	wg.Wait()
	for r := range 2 {
		if errs[r] == nil {
			t.Fatalf("rank %d: all-reduce succeeded with rank 2 gone", r)
		}
		if !strings.Contains(errs[r].Error(), "peer rank 2 failed") || !strings.Contains(errs[r].Error(), want) {
			t.Errorf("rank %d: error %q does not name rank 2's failure (%q)", r, errs[r], want)
		}
		var pe *PeerError
		if !errors.As(errs[r], &pe) || pe.Rank != 2 {
			t.Errorf("rank %d: errors.As(%q, *PeerError) gives %+v, want Rank 2", r, errs[r], pe)
		}
		if d := ended[r].Sub(failedAt); d > within {
			t.Errorf("rank %d: failure noticed after %v, want within %v", r, d, within)
		}
		// Later operations fail too, even with the live peer.
		if err := groups[r].Send(ctx, 1-r, 0, nil); err == nil || !strings.Contains(err.Error(), "peer rank 2 failed") {
			t.Errorf("rank %d: send to a live peer after the failure: %v", r, err)
		}
	}
}

func TestTCPPeerDeathMidCollective(t *testing.T) {
	before := runtime.NumGoroutine()
	groups := newTCP(t, 3, shortTimeout)
	failureCase(t, groups, func(ctx context.Context, g Group) time.Time {
		dying := &killAfter{Group: g, k: 2} // dies at its second receive, mid reduce-scatter
		if err := AllReduce(ctx, dying, 1, rankData(1, 2, 300_000), Ring); err == nil {
			t.Error("the dying rank's all-reduce succeeded")
		}
		return dying.killedAt
	}, testTimeout, "")
	closeAll(groups)
	checkNoLeak(t, before)
}

func TestTCPPeerStallDetected(t *testing.T) {
	before := runtime.NumGoroutine()
	groups := newTCP(t, 3, shortTimeout)
	failureCase(t, groups, func(ctx context.Context, g Group) time.Time {
		g.(*tcpGroup).stallForTest.Store(true) // hangs: no data, no heartbeats
		return time.Now()
	}, 2*testTimeout, "silent for 300ms")
	closeAll(groups)
	checkNoLeak(t, before)
}

// A goodbye that reports a failure (here from raw rank 0: rank 1 was silent) fails the rank at
// once naming the failed rank, also for what waited on the reporter; the rank tells the failed
// rank why in its own goodbye, and its Close does not wait for the failed rank, which never
// acknowledges.
func TestTCPGoodbyeReportsFailure(t *testing.T) {
	conns, g, log := rawPeers(t, 3, func(c *TCPConfig) { c.Timeout = time.Minute })
	ctx := context.Background()
	fromReporter := g.Irecv(ctx, 0, 1, make([]byte, 8))
	fromFailed := g.Irecv(ctx, 1, 2, make([]byte, 8))
	reason := byeReason{failedRank: 1, cause: "silent for 30s"}.encode()
	writeRaw(t, conns[0], frameHeader{kind: frameBye, chunk: uint32(len(reason))}, reason)
	const want = "peer rank 1 failed: silent for 30s (reported by rank 0)"
	for _, req := range []*Request{fromReporter, fromFailed} {
		if err := waitDone(t, req, want); errors.Is(err, ErrClosed) {
			t.Errorf("%v counts as ErrClosed", err)
		}
	}
	if err := g.Send(ctx, 0, 3, nil); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("later send: %v", err)
	}
	if log.count(want) != 1 {
		t.Errorf("the reported failure was not logged once")
	}
	// Rank 1 hears why: a goodbye naming it.
	conns[1].SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [frameHeaderLen]byte
	for {
		if _, err := io.ReadFull(conns[1], hdr[:]); err != nil {
			t.Fatalf("no goodbye to the failed rank: %v", err)
		}
		h, err := decodeFrameHeader(hdr[:], 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if h.kind == frameHeartbeat {
			continue
		}
		payload := make([]byte, h.chunk)
		if _, err := io.ReadFull(conns[1], payload); err != nil {
			t.Fatal(err)
		}
		if r, err := decodeByeReason(payload, 3); h.kind != frameBye || err != nil || r != (byeReason{failedRank: 1, cause: "silent for 30s"}) {
			t.Fatalf("rank 1 got a %v frame with reason %+v, %v", h.kind, r, err)
		}
		break
	}
	// Close waits for rank 0's acknowledgement (it closes its end), never for rank 1.
	conns[0].(*net.TCPConn).CloseWrite()
	start := time.Now()
	g.Close()
	if d := time.Since(start); d > tcpCloseGrace/2 {
		t.Errorf("Close took %v: it waited for the failed rank", d)
	}
}

// A goodbye may name the receiving rank: a rank that stalled and resumed learns that it was
// declared failed, and why.
func TestTCPGoodbyeReportsThisRankFailed(t *testing.T) {
	conns, g, _ := rawPeers(t, 2, func(c *TCPConfig) { c.Timeout = time.Minute })
	req := g.Irecv(context.Background(), 0, 1, nil)
	reason := byeReason{failedRank: 1, cause: "silent for 30s"}.encode()
	writeRaw(t, conns[0], frameHeader{kind: frameBye, chunk: uint32(len(reason))}, reason)
	waitDone(t, req, "peer rank 0 reports that this rank (1) failed: silent for 30s")
}

// A plain goodbye that arrives while another goroutine is failing this rank (its failure set,
// its failReceives not yet at the peer) fails the receives waiting on that peer with the
// failure, not with the goodbye: the race behind TestTCPPeerDeathMidCollective's rare
// "peer rank 0 closed its group".
func TestTCPGoodbyeDuringOwnFailure(t *testing.T) {
	conns, g, _ := rawPeers(t, 3, func(c *TCPConfig) { c.Timeout = time.Minute })
	req := g.Irecv(context.Background(), 0, 1, make([]byte, 8))
	var f error = &PeerError{Rank: 1, Cause: errors.New("silent for 30s"), ReportedBy: -1, self: g.rank}
	if !g.failure.CompareAndSwap(nil, &f) {
		t.Fatal("the group had failed already")
	}
	reason := byeReason{failedRank: -1}.encode()
	writeRaw(t, conns[0], frameHeader{kind: frameBye, chunk: uint32(len(reason))}, reason)
	err := waitDone(t, req, "peer rank 1 failed: silent for 30s")
	if pe := (*PeerError)(nil); !errors.As(err, &pe) || pe.Rank != 1 {
		t.Errorf("errors.As(%v, *PeerError) gives %+v, want Rank 1", err, pe)
	}
	waitDone(t, g.Irecv(context.Background(), 0, 2, make([]byte, 8)), "peer rank 1 failed: silent for 30s")
}

func TestByeReason(t *testing.T) {
	for _, r := range []byeReason{
		{failedRank: -1},
		{failedRank: 0, cause: "silent for 30s"},
		{failedRank: 6, cause: "connection closed without goodbye"},
	} {
		got, err := decodeByeReason(r.encode(), 7)
		if err != nil || got != r {
			t.Errorf("%+v: decoded as %+v, %v", r, got, err)
		}
	}
	// Long causes are cut at a character boundary, control characters and bad UTF-8 replaced.
	long := strings.Repeat("é", tcpMaxByeReason)
	got, err := decodeByeReason(byeReason{failedRank: 1, cause: long}.encode(), 2)
	if err != nil || len(got.cause) > tcpMaxByeReason-byeReasonHeader || !strings.HasPrefix(long, got.cause) || len(got.cause) < tcpMaxByeReason-byeReasonHeader-1 {
		t.Errorf("long cause: %d bytes, %v", len(got.cause), err)
	}
	got, err = decodeByeReason(byeReason{failedRank: 1, cause: "a\nb\x00c\xff"}.encode(), 2)
	if err != nil || got.cause != "a b c?" {
		t.Errorf("cleaned cause %q, %v", got.cause, err)
	}
	for _, c := range []struct {
		name   string
		reason []byte
		want   string
	}{
		{"short", []byte{1, 0, 0}, "reason of 3 bytes"},
		{"unknown code", []byte{9, 0, 0, 0, 0}, "unknown reason code 9"},
		{"rank outside the group", []byte{1, 7, 0, 0, 0}, "names rank 7, the group has 7"},
		{"huge rank", []byte{1, 0xff, 0xff, 0xff, 0xff}, "names rank 4294967295"},
		{"bad UTF-8", []byte{1, 0, 0, 0, 0, 0xc3}, "not UTF-8"},
		{"control character", []byte{1, 0, 0, 0, 0, 'a', 0x1b, '['}, "control character U+001B"},
		{"too long", append([]byte{1, 0, 0, 0, 0}, make([]byte, tcpMaxByeReason)...), "reason of 261 bytes"},
	} {
		if _, err := decodeByeReason(c.reason, 7); !errors.Is(err, errProtocol) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a protocol error mentioning %q", c.name, err, c.want)
		}
	}
}

// Heartbeats keep an idle mesh alive far past the timeout.
func TestTCPIdleMeshStaysUp(t *testing.T) {
	groups := newTCP(t, 3, shortTimeout)
	time.Sleep(4 * testTimeout)
	checkAllReduce(t, groups, 1000)
}

// checkNoLeak waits for the goroutine count to come back to before.
func checkNoLeak(t *testing.T, before int) {
	t.Helper()
	var now int
	if !waitFor(5*time.Second, func() bool { now = runtime.NumGoroutine(); return now <= before }) {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines before, %d after Close:\n%s", before, now, buf[:runtime.Stack(buf, true)])
	}
}

func TestTCPCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	groups, err := NewTCPLoopback(ctx, 4, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	checkAllReduce(t, groups, 100_000)
	// A pending receive and a queued message at Close.
	pending := groups[1].Irecv(ctx, 2, 77, make([]byte, 4))
	if err := groups[3].Send(ctx, 0, 78, make([]byte, 3<<20)); err != nil {
		t.Fatal(err)
	}
	closeAll(groups)
	if _, err := pending.Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("pending receive at Close: %v", err)
	}
	checkNoLeak(t, before)
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

func BenchmarkTCPAllReduce(b *testing.B) {
	const n = 16 << 20 // 64 MiB of float32
	for _, p := range []int{2, 4} {
		b.Run(fmt.Sprintf("P=%d", p), func(b *testing.B) {
			groups := newTCP(b, p)
			bufs := make([][]float32, p)
			for r := range bufs {
				bufs[r] = rankData(1, r, n)
			}
			ctx := context.Background()
			b.SetBytes(4 * n)
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				errs := make([]error, p)
				for r, g := range groups {
					wg.Go(func() { errs[r] = AllReduce(ctx, g, 0, bufs[r], Auto) })
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
