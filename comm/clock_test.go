package comm_test

import (
	"context"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/simnet"
)

// comm.Now reads a simulated rank's virtual clock, and wall time on other transports.
func TestNowReadsTheGroupsClock(t *testing.T) {
	net, err := simnet.New(2, simnet.Config{Beta: 1e-6})
	if err != nil {
		t.Fatal(err)
	}
	g := net.Groups()
	before := comm.Now(g[0])
	net.Advance(0, 0.25)
	if d := comm.Now(g[0]) - before; d != 250*time.Millisecond {
		t.Fatalf("after Advance(0.25 s) the clock moved %v", d)
	}
	done := make(chan error, 1)
	go func() { _, err := g[1].Recv(context.Background(), 0, 1, make([]byte, 1000)); done <- err }()
	if err := g[0].Send(context.Background(), 1, 1, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := comm.Now(g[1]); d != 251*time.Millisecond { // the sender's 0.25 s, then 1000 B at 1 µs/B
		t.Errorf("rank 1 received at %v, want 251ms", d)
	}

	local, err := comm.NewLocal(1)
	if err != nil {
		t.Fatal(err)
	}
	a := comm.Now(local[0])
	time.Sleep(time.Millisecond)
	if d := comm.Now(local[0]) - a; d < time.Millisecond {
		t.Errorf("wall clock moved %v over a 1 ms sleep", d)
	}
}
