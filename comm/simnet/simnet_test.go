package simnet

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// run calls fn on every rank of net concurrently and fails the test on any error.
func run(t *testing.T, net *Network, fn func(ctx context.Context, g comm.Group) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make([]error, net.Size())
	var wg sync.WaitGroup
	for r, g := range net.Groups() {
		wg.Go(func() { errs[r] = fn(ctx, g) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(b)) }

// A ring all-reduce of n floats at P = 4 is 2(P-1) rounds in which every rank sends one block
// of n/P floats to its right neighbour and receives one from its left: exactly
// 2(P-1)(α + (n/P)·4β) on every clock.
func TestRingAllReduceTime(t *testing.T) {
	const p, n = 4, 4000
	cfg := Config{Alpha: 50e-6, Beta: 8e-9}
	net, err := New(p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, net, func(ctx context.Context, g comm.Group) error {
		buf := make([]float32, n)
		for i := range buf {
			buf[i] = float32(g.Rank() + i)
		}
		return comm.AllReduce(ctx, g, 1, buf, comm.Ring)
	})
	want := 2 * (p - 1) * (cfg.Alpha + float64(n/p)*4*cfg.Beta)
	for r := range p {
		if got := net.Clock(r); !near(got, want) {
			t.Errorf("rank %d: clock %.9g s, want 2(P-1)(α + (n/P)·4β) = %.9g s", r, got, want)
		}
	}
}

// Two sends from one rank queue on its egress; two sends to one rank share its ingress.
func TestPortSerialisation(t *testing.T) {
	cfg := Config{Alpha: 1e-3, Beta: 1e-6}
	const l = 1000 // bytes: 1 ms on the wire
	net, err := New(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Egress: rank 0 posts to 1 and 2 at t = 0; the second starts when the first has left.
	run(t, net, func(ctx context.Context, g comm.Group) error {
		buf := make([]byte, l)
		switch g.Rank() {
		case 0:
			return comm.WaitAll(g.Isend(ctx, 1, 0, buf), g.Isend(ctx, 2, 0, buf))
		default:
			_, err := g.Recv(ctx, 0, 0, buf)
			return err
		}
	})
	for r, want := range []float64{2e-3, 2e-3, 3e-3} { // rank 0 busy 2 ms; arrivals α+Lβ and α+2Lβ
		if got := net.Clock(r); !near(got, want) {
			t.Errorf("egress: rank %d clock %g, want %g", r, got, want)
		}
	}
	// Ingress: ranks 1 and 2 send to 0 at the same time (after a free barrier).
	start := net.Sync()
	run(t, net, func(ctx context.Context, g comm.Group) error {
		buf := make([]byte, l)
		if g.Rank() == 0 {
			return comm.WaitAll(g.Irecv(ctx, 1, 1, buf), g.Irecv(ctx, 2, 1, make([]byte, l)))
		}
		return g.Send(ctx, 0, 1, buf)
	})
	if got, want := net.Clock(0)-start, cfg.Alpha+2*l*cfg.Beta; !near(got, want) {
		t.Errorf("ingress: rank 0 took %g, want α + 2Lβ = %g", got, want)
	}
	if got, want := net.Clock(1)-start, l*cfg.Beta; !near(got, want) {
		t.Errorf("ingress: sender took %g, want Lβ = %g", got, want)
	}
}

// A receive completes at max(arrival, receiver's clock); Scale multiplies the bytes on the
// clock but not in the counters; RecvCost and Advance are charged as computation.
func TestClockRules(t *testing.T) {
	cfg := Config{Alpha: 1e-3, Beta: 1e-6, Scale: 10, RecvCost: 1e-7}
	net, err := New(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, net, func(ctx context.Context, g comm.Group) error {
		buf := make([]byte, 100) // 1000 bytes on the clock: 1 ms on the wire
		if g.Rank() == 0 {
			return g.Send(ctx, 1, 0, buf)
		}
		net.Advance(1, 5e-3) // busy past the arrival (2 ms)
		_, err := g.Recv(ctx, 0, 0, buf)
		return err
	})
	if got, want := net.Clock(0), 1e-3; !near(got, want) {
		t.Errorf("sender clock %g, want %g", got, want)
	}
	if got, want := net.Clock(1), 5e-3+1000*1e-7; !near(got, want) {
		t.Errorf("receiver clock %g, want %g", got, want)
	}
	if got, want := net.Computed(1), 5e-3+1000*1e-7; !near(got, want) {
		t.Errorf("receiver computed %g, want %g", got, want)
	}
	if s := net.Groups()[1].Counters().Snapshot(); s.BytesRecv != 100 || s.MsgsRecv != 1 {
		t.Errorf("counters %v, want the real 100 bytes", s)
	}
}

// The same schedule gives the same clocks, bit for bit, however the goroutines ran.
func TestDeterministic(t *testing.T) {
	clocks := func() []float64 {
		net, err := New(6, Config{Alpha: 3e-5, Beta: 1e-9, RecvCost: 1e-10})
		if err != nil {
			t.Fatal(err)
		}
		run(t, net, func(ctx context.Context, g comm.Group) error {
			buf := make([]float32, 999+g.Rank()%2) // uneven work: rank-dependent advances
			net.Advance(g.Rank(), float64(g.Rank())*1e-4)
			for range 3 {
				if err := comm.AllReduce(ctx, g, 2, buf[:999], comm.Auto); err != nil {
					return err
				}
				if _, err := comm.AllGatherBytes(ctx, g, 3, make([]byte, 40*(g.Rank()+1))); err != nil {
					return err
				}
			}
			return nil
		})
		out := make([]float64, 6)
		for r := range out {
			out[r] = net.Clock(r)
		}
		return out
	}
	a := clocks()
	for range 3 {
		if b := clocks(); !slicesEqual(a, b) {
			t.Fatalf("clocks differ between runs: %v vs %v", a, b)
		}
	}
}

func slicesEqual(a, b []float64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func TestErrors(t *testing.T) {
	if _, err := New(0, Config{}); err == nil || !strings.Contains(err.Error(), "size 0") {
		t.Errorf("New(0): %v", err)
	}
	for _, c := range []Config{{Alpha: -1}, {Beta: math.NaN()}, {Scale: -2}, {RecvCost: math.Inf(1)}} {
		if _, err := New(2, c); err == nil {
			t.Errorf("New accepted %+v", c)
		}
	}
	net, _ := New(2, Config{})
	g := net.Groups()[0]
	if err := g.Send(context.Background(), 5, 0, nil); err == nil || !strings.Contains(err.Error(), "rank 5") {
		t.Errorf("send to rank 5: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := g.Recv(ctx, 1, 0, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("recv that nobody answers: %v, want a deadline error", err)
	}
}

// Scale applies to every tag but those Unscaled names; Bytes counts what the clock counts.
func TestUnscaledTags(t *testing.T) {
	cfg := Config{Beta: 1e-6, Scale: 10, Unscaled: func(tag uint32) bool { return tag == 7 }}
	net, err := New(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, net, func(ctx context.Context, g comm.Group) error {
		buf := make([]byte, 100)
		if g.Rank() == 0 {
			if err := g.Send(ctx, 1, 7, buf); err != nil {
				return err
			}
			return g.Send(ctx, 1, 8, buf)
		}
		if _, err := g.Recv(ctx, 0, 7, buf); err != nil {
			return err
		}
		_, err := g.Recv(ctx, 0, 8, buf)
		return err
	})
	if got, want := net.Clock(1), (100+1000)*1e-6; !near(got, want) {
		t.Errorf("receiver clock %g, want %g (100 bytes unscaled + 1000 scaled)", got, want)
	}
	if s, r := net.Bytes(0); s != 1100 || r != 0 {
		t.Errorf("rank 0 bytes sent %v received %v, want 1100 and 0", s, r)
	}
	if s, r := net.Bytes(1); s != 0 || r != 1100 {
		t.Errorf("rank 1 bytes sent %v received %v, want 0 and 1100", s, r)
	}
}

// Recursive doubling at P = 2^k on nodes of R = 2^j consecutive ranks: in each of log2 P steps
// every rank swaps the whole vector (4n bytes) with the rank at distance d = 1, 2, 4, …: the
// first log2 R steps inside its node (shared memory), the other log2(P/R) across nodes. Every
// clock ends exactly at log2(R)·(α' + 4nβ') + log2(P/R)·(α + 4nβ), and each rank received
// log2(P/R)·4n bytes from other nodes.
func TestNodePricing(t *testing.T) {
	const n = 1000
	for _, c := range []struct{ p, r int }{{4, 2}, {8, 2}, {8, 4}, {8, 8}, {4, 1}} {
		cfg := Config{Alpha: 50e-6, Beta: 8e-9, IntraAlpha: 1e-6, IntraBeta: 1e-10}
		top, err := comm.GridTopology(c.p/c.r, c.r)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Topology = top
		net, err := New(c.p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		run(t, net, func(ctx context.Context, g comm.Group) error {
			if got := comm.TopologyOf(g); !got.Equal(top) {
				t.Errorf("P=%d R=%d: rank %d reports topology %v", c.p, c.r, g.Rank(), got)
			}
			buf := make([]float32, n)
			return comm.AllReduce(ctx, g, 1, buf, comm.RecursiveDoubling)
		})
		intraSteps, interSteps := math.Log2(float64(c.r)), math.Log2(float64(c.p/c.r))
		want := intraSteps*(cfg.IntraAlpha+4*n*cfg.IntraBeta) + interSteps*(cfg.Alpha+4*n*cfg.Beta)
		for r := range c.p {
			if got := net.Clock(r); !near(got, want) {
				t.Errorf("P=%d R=%d: rank %d: clock %.9g s, want log2(R)(α'+4nβ') + log2(P/R)(α+4nβ) = %.9g s", c.p, c.r, r, got, want)
			}
			s := net.Groups()[r].Counters().Snapshot()
			wantInter := int64(interSteps) * 4 * n
			if s.InterBytesRecv != wantInter || s.InterBytesSent != wantInter {
				t.Errorf("P=%d R=%d: rank %d: inter-node bytes sent %d, received %d, want %d", c.p, c.r, r, s.InterBytesSent, s.InterBytesRecv, wantInter)
			}
			if _, recv := net.InterBytes(r); recv != float64(wantInter) {
				t.Errorf("P=%d R=%d: rank %d: InterBytes received %v, want %d", c.p, c.r, r, recv, wantInter)
			}
		}
	}
}

// A rank receives from its node and from another node at once: the two use different ports,
// so neither waits for the other.
func TestNodePortsAreSeparate(t *testing.T) {
	top, _ := comm.GridTopology(2, 2)
	cfg := Config{Alpha: 1e-3, Beta: 1e-6, IntraAlpha: 1e-5, IntraBeta: 1e-8, Topology: top}
	net, err := New(4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const l = 1000
	run(t, net, func(ctx context.Context, g comm.Group) error {
		switch g.Rank() {
		case 1, 2: // rank 1 from its node, rank 2 from the other
			return g.Send(ctx, 0, 1, make([]byte, l))
		case 0:
			a, b := g.Irecv(ctx, 1, 1, make([]byte, l)), g.Irecv(ctx, 2, 1, make([]byte, l))
			return comm.WaitAll(a, b)
		}
		return nil
	})
	if got, want := net.Clock(0), cfg.Alpha+l*cfg.Beta; !near(got, want) {
		t.Errorf("rank 0: clock %.9g, want the slower message alone, α + Lβ = %.9g", got, want)
	}
	if got, want := net.Clock(1), l*cfg.IntraBeta; !near(got, want) {
		t.Errorf("rank 1: clock %.9g, want Lβ' = %.9g", got, want)
	}
}

func TestTopologyMustMatch(t *testing.T) {
	top, _ := comm.GridTopology(2, 2)
	if _, err := New(6, Config{Topology: top}); err == nil || !strings.Contains(err.Error(), "topology of 4 ranks for 6") {
		t.Errorf("New(6) with a topology of 4: %v", err)
	}
	if _, err := New(4, Config{Topology: top, IntraBeta: -1}); err == nil || !strings.Contains(err.Error(), "IntraBeta") {
		t.Errorf("negative IntraBeta: %v", err)
	}
}
