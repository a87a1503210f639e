package comm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// wantBlamed checks that err is a PeerError naming rank failed, and returns it.
func wantBlamed(t *testing.T, who string, err error, failed int, texts ...string) *PeerError {
	t.Helper()
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != failed {
		t.Errorf("%s: %v, want a PeerError naming rank %d", who, err, failed)
		return nil
	}
	for _, s := range texts {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %v, want it to say %q", who, err, s)
		}
	}
	return pe
}

// A live rank that never sends what a receive waits for is named after the operation timeout
// (its heartbeat alone would keep the receive waiting forever), and the other ranks name it
// too.
func TestShmOpTimeoutNamesSilentPeer(t *testing.T) {
	const opTimeout = 300 * time.Millisecond
	groups := newShm(t, 3, func(c *ShmConfig) {
		if c.Rank == 0 {
			c.OpTimeout = opTimeout // only rank 0 can time out
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A completed exchange never times out.
	if err := groups[2].Send(ctx, 0, 1, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if _, err := groups[0].Recv(ctx, 2, 1, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	errs := make([]chan error, 3)
	start := time.Now()
	for r, from := range []int{2, 0, 0} { // rank 0 waits for rank 2, which sends nothing
		errs[r] = make(chan error, 1)
		go func() {
			_, err := groups[r].Recv(ctx, from, 5, make([]byte, 4))
			errs[r] <- err
		}()
	}
	select {
	case err := <-errs[0]:
		took := time.Since(start)
		wantBlamed(t, "rank 0", err, 2, "peer rank 2 failed: alive, but sent nothing for this rank's receive under tag 5 within the operation timeout 300ms")
		if took < opTimeout || took > opTimeout+opWatchTick(opTimeout)+time.Second {
			t.Errorf("rank 0 failed after %v, want about %v (the operation timeout and a tick)", took, opTimeout)
		}
	case <-ctx.Done():
		t.Fatal("rank 0 still waits for a live rank that sends nothing (no operation timeout)")
	}
	for r := 1; r < 3; r++ {
		select {
		case err := <-errs[r]:
			// Reported by rank 0 (rank 2 may also relay it to rank 1 first).
			if pe := wantBlamed(t, fmt.Sprintf("rank %d", r), err, 2); pe != nil && (pe.ReportedBy < 0 || pe.ReportedBy == r) {
				t.Errorf("rank %d: %v, want the failure reported by another rank", r, err)
			}
		case <-ctx.Done():
			t.Fatalf("rank %d did not learn of rank 2's failure", r)
		}
	}
}

// A rank that does not come to a shared all-reduce is named by the ranks that wait for it at
// the barrier; the rank itself, waiting for a message meanwhile, sees that it is the one out of
// step.
func TestShmOpTimeoutNamesAbsentReducer(t *testing.T) {
	const opTimeout = 300 * time.Millisecond
	groups := newShm(t, 4, func(c *ShmConfig) { c.OpTimeout = opTimeout })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// One all-reduce that every rank joins: it completes.
	errs := make(chan error, 4)
	for r := range 4 {
		go func() { errs <- AllReduce(ctx, groups[r], 0, make([]float32, 100), Auto) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Ranks 0, 1 and 3 all-reduce again; rank 2 waits for a message from rank 3 instead, and
	// starts waiting later, so that the barrier's timeout fires first.
	for _, r := range []int{0, 1, 3} {
		go func() { errs <- AllReduce(ctx, groups[r], 0, make([]float32, 100), Auto) }()
	}
	stuck := make(chan error, 1)
	go func() {
		time.Sleep(opTimeout)
		_, err := groups[2].Recv(ctx, 3, 77, make([]byte, 1))
		stuck <- err
	}()
	for range 3 {
		select {
		case err := <-errs:
			wantBlamed(t, "a waiting rank", err, 2, "did not reach the barrier of the shared all-reduce under tag 0 within the operation timeout 300ms")
		case <-ctx.Done():
			t.Fatal("the all-reduce still waits for a rank that does not come (no operation timeout)")
		}
	}
	select {
	case err := <-stuck:
		wantBlamed(t, "rank 2", err, 2)
	case <-ctx.Done():
		t.Fatal("rank 2 did not learn that it was named")
	}

	// The other order: the absent rank's receive times out first (the others reach the barrier
	// before, and start waiting after it), and it names itself.
	const opTimeout2 = 2 * opTimeout
	groups = newShm(t, 3, func(c *ShmConfig) { c.OpTimeout = opTimeout2 })
	stuck = make(chan error, 1)
	go func() {
		_, err := groups[2].Recv(ctx, 0, 77, make([]byte, 1))
		stuck <- err
	}()
	time.Sleep(opTimeout2 / 2)
	for _, r := range []int{0, 1} {
		go func() { errs <- AllReduce(ctx, groups[r], 0, make([]float32, 100), Auto) }()
	}
	select {
	case err := <-stuck:
		wantBlamed(t, "rank 2", err, 2, "this rank (2) failed: out of step", "wait for it in a shared all-reduce")
	case <-ctx.Done():
		t.Fatal("rank 2 still waits")
	}
	for range 2 {
		select {
		case err := <-errs:
			// Reported by rank 2, or relayed by the other waiting rank.
			if pe := wantBlamed(t, "a waiting rank", err, 2, "out of step"); pe != nil && (pe.ReportedBy < 0 || pe.ReportedBy == pe.self) {
				t.Errorf("%v: want the failure reported by another rank", err)
			}
		case <-ctx.Done():
			t.Fatal("the all-reduce still waits for a rank that does not come")
		}
	}
}
