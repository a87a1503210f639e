package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
