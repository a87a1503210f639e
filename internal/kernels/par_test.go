package kernels

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseSpin(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 200 * time.Microsecond},
		{"0", 0},
		{"off", 0},
		{"500us", 500 * time.Microsecond},
		{"1ms", time.Millisecond},
		{"-1ms", 200 * time.Microsecond},
		{"fast", 200 * time.Microsecond},
	} {
		if got := parseSpin(tc.in); got != tc.want {
			t.Errorf("parseSpin(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// countTask counts the calls of run across every participant.
type countTask struct {
	n    atomic.Int64
	wg   joiner
	slow bool
}

func (c *countTask) run() {
	c.n.Add(1)
	if c.slow {
		time.Sleep(50 * time.Microsecond)
	}
}
func (c *countTask) done() { c.wg.Done() }

// TestDispatchJoins runs many back-to-back dispatches with polling on and off, with
// helpers finishing before and after the caller: each dispatch runs every participant
// once and returns only after all of them have finished (a reused task would
// otherwise count a late helper into the next round).
func TestDispatchJoins(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	defer spinWait.Store(spinWait.Load())
	for _, spin := range []time.Duration{0, 200 * time.Microsecond, 10 * time.Millisecond} {
		spinWait.Store(int64(spin))
		var c countTask
		for i := range 2000 {
			c.n.Store(0)
			c.slow = i%7 == 0
			dispatch(&c, &c.wg, 4)
			if got := c.n.Load(); got != 4 {
				t.Fatalf("spin %v, round %d: %d participants ran, want 4", spin, i, got)
			}
		}
	}
}

// TestDispatchContention: dispatches from two goroutines at once (in-process
// data-parallel workers) all complete, and turn the polling off while they overlap.
func TestDispatchContention(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	defer spinWait.Store(spinWait.Load())
	spinWait.Store(int64(200 * time.Microsecond))
	contendedAt.Store(clock() - int64(contendedHold) - 1)
	if spinFor() == 0 {
		t.Fatal("polling off before any contention")
	}
	done := make(chan int64)
	for range 2 {
		go func() {
			c := countTask{slow: true} // 50 µs each: the two loops overlap
			var runs int64
			for range 500 {
				c.n.Store(0)
				dispatch(&c, &c.wg, 2)
				runs += c.n.Load()
			}
			done <- runs
		}()
	}
	for range 2 {
		if runs := <-done; runs != 1000 {
			t.Fatalf("%d participants ran over 500 dispatches of 2, want 1000", runs)
		}
	}
	if spinFor() != 0 {
		t.Error("polling still on right after overlapping dispatches")
	}
}
