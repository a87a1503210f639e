package comm

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

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
