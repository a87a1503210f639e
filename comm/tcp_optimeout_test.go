package comm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A live peer that waits under another tag (ranks out of step) fails the group after the
// operation timeout, naming it; it learns that it was declared failed. Heartbeats alone would
// keep both waiting forever.
func TestTCPOpTimeoutNamesOutOfStepPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const opTimeout = 200 * time.Millisecond
	groups, err := newTCPLoopback(ctx, 2, func(c *TCPConfig) {
		if c.Rank == 0 {
			c.OpTimeout = opTimeout // rank 1 has none: only rank 0 can time out
		}
		c.Logf = func(string, ...any) {}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(groups)
	// One exchange that completes: a finished operation never times out.
	done := make(chan error, 1)
	go func() { done <- groups[1].Send(ctx, 0, 1, []byte("ok")) }()
	if _, err := groups[0].Recv(ctx, 1, 1, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Out of step: rank 0 waits under tag 5, rank 1 under tag 6.
	errs := make(chan error, 2)
	for r, tag := range []uint32{5, 6} {
		go func() {
			_, err := groups[r].Recv(ctx, 1-r, tag, make([]byte, 4))
			errs <- err
		}()
	}
	for range 2 {
		select {
		case err := <-errs:
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Rank != 1 || !strings.Contains(err.Error(), "within the operation timeout 200ms") {
				t.Errorf("err = %v, want a PeerError naming rank 1 and the operation timeout", err)
			}
			if pe != nil && pe.self == 0 && !strings.Contains(err.Error(), "sent nothing for this rank's receive under tag 5") {
				t.Errorf("rank 0: %v, want the tag named", err)
			}
			if pe != nil && pe.self == 1 && !strings.Contains(err.Error(), "reports that this rank (1) failed") {
				t.Errorf("rank 1: %v, want to learn it was declared failed", err)
			}
		case <-ctx.Done():
			t.Fatal("ranks out of step still wait (no operation timeout)")
		}
	}
}

// checkOps drops completed operations and fails the group only for one past its deadline.
func TestTCPOpWatchList(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := newTCPLoopback(ctx, 2, func(c *TCPConfig) {
		c.OpTimeout = time.Hour // the watcher never fires by itself here
		c.Logf = func(string, ...any) {}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(groups)
	g := groups[0].(*tcpGroup)
	req := g.Irecv(ctx, 1, 3, make([]byte, 1))
	if err := groups[1].Send(ctx, 0, 3, []byte{7}); err != nil {
		t.Fatal(err)
	}
	if _, err := req.Wait(); err != nil {
		t.Fatal(err)
	}
	pending := g.Irecv(ctx, 1, 4, make([]byte, 1))
	g.checkOps(time.Now().Add(time.Minute)) // before the deadline: nothing fails
	g.watch.mu.Lock()
	n := len(g.watch.ops)
	g.watch.mu.Unlock()
	if n != 1 || g.failure.Load() != nil {
		t.Fatalf("after a check before the deadline: %d watched (want 1, the pending one), failure %v", n, g.failure.Load())
	}
	g.checkOps(time.Now().Add(2 * time.Hour))
	if _, err := pending.Wait(); err == nil || !strings.Contains(err.Error(), "peer rank 1 failed: alive, but sent nothing for this rank's receive under tag 4") {
		t.Fatalf("late receive: %v", err)
	}
}

// A rank whose receive times out while the peer's messages under other tags wait unreceived
// is the one out of step: it names itself, and the peer learns so from its goodbye.
func TestTCPOpTimeoutNamesItselfWhenBehind(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := newTCPLoopback(ctx, 2, func(c *TCPConfig) {
		if c.Rank == 0 {
			c.OpTimeout = 200 * time.Millisecond
		}
		c.Logf = func(string, ...any) {}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(groups)
	// Rank 1 has moved on: it sent under tag 9 (which rank 0 never asks for) and waits for
	// tag 9's answer; rank 0 still waits under tag 5.
	if err := groups[1].Send(ctx, 0, 9, []byte("ahead")); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { _, err := groups[0].Recv(ctx, 1, 5, make([]byte, 4)); errs <- err }()
	go func() { _, err := groups[1].Recv(ctx, 0, 9, make([]byte, 4)); errs <- err }()
	for range 2 {
		select {
		case err := <-errs:
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Rank != 0 || !strings.Contains(err.Error(), "out of step: waited 200ms (the operation timeout) for rank 1 under tag 5, while rank 1 sent it messages under tag(s) [9]") {
				t.Errorf("err = %v, want rank 0 named as out of step", err)
			}
			if pe != nil && pe.self == 0 && !strings.Contains(err.Error(), "this rank (0) failed: out of step") {
				t.Errorf("rank 0: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("still waiting")
		}
	}
}
