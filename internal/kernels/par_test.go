package kernels

import (
	"runtime"
	"sync"
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

// gateTask's first run blocks until release is closed; started is closed when it does.
type gateTask struct {
	started, release chan struct{}
	once             sync.Once
	wg               joiner
}

func (g *gateTask) run()  { g.once.Do(func() { close(g.started); <-g.release }) }
func (g *gateTask) done() { g.wg.Done() }

// TestDispatchContention: a dispatch made while another is in flight (in-process
// data-parallel workers) turns the polling off, and both complete.
func TestDispatchContention(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	defer spinWait.Store(spinWait.Load())
	spinWait.Store(int64(200 * time.Microsecond))
	start := clock()
	contendedAt.Store(start - int64(contendedHold) - 1)
	if spinFor() == 0 {
		t.Fatal("polling off before any contention")
	}
	g := &gateTask{started: make(chan struct{}), release: make(chan struct{})}
	first := make(chan struct{})
	go func() { dispatch(g, &g.wg, 2); close(first) }()
	<-g.started
	var c countTask
	second := make(chan struct{})
	go func() { dispatch(&c, &c.wg, 2); close(second) }()
	deadline := time.Now().Add(10 * time.Second)
	for contendedAt.Load() < start {
		if time.Now().After(deadline) {
			close(g.release)
			t.Fatal("a dispatch during another was not seen as contention")
		}
		runtime.Gosched()
	}
	if c0, sp := contendedAt.Load(), spinFor(); sp != 0 && clock()-c0 < int64(contendedHold) {
		t.Error("polling still on right after overlapping dispatches")
	}
	close(g.release)
	<-first
	<-second
	if got := c.n.Load(); got != 2 {
		t.Fatalf("second dispatch: %d participants ran, want 2", got)
	}
}
