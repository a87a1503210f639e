package kernels

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// task is a unit of parallel work handed to the persistent worker pool.
// run is called by every participating goroutine; done by pool workers
// once they return from run.
type task interface {
	run()
	done()
}

var (
	poolMu      sync.Mutex
	poolWorkers int
	poolCh      = make(chan task, 256)
)

func poolLoop() {
	for t := range poolCh {
		for t != nil {
			t.run()
			t.done()
			t = nextTask()
		}
	}
}

// spinWait is how long a pool worker polls for the next task before it parks, and
// how long a dispatching goroutine polls for its helpers before it sleeps.
// Waking a parked goroutine costs a futex wake and a work steal, 50–100 µs on a
// virtual machine, and a training step dispatches hundreds of kernels back to back
// (ResNet-20 at batch 32: about 500 per step, a third of the wall time with one
// core idle); the poll yields to other runnable goroutines, so in-process workers
// sharing the cores still run. SPARGO_SPIN=0 turns it off (the OMP_WAIT_POLICY=PASSIVE
// of this pool), e.g. on a machine shared with other jobs; SPARGO_SPIN=500us sets it.
//
// Polling pays only while one goroutine feeds the pool. In-process data-parallel
// workers dispatch at the same time, each polling for helpers the others keep
// busy (ResNet-20 with 2 in-process workers on 2 cores: 10 % slower polling), so
// a dispatch that overlaps another turns polling off for contendedHold.
var spinWait atomic.Int64 // a time.Duration

var (
	dispatching atomic.Int32 // dispatches in flight
	contendedAt atomic.Int64 // clock() of the last dispatch that overlapped another
	clockStart  = time.Now()
)

// contendedHold is how long polling stays off after overlapping dispatches.
const contendedHold = 50 * time.Millisecond

func clock() int64 { return int64(time.Since(clockStart)) }

// spinFor is how long to poll now: spinWait, or 0 while dispatches overlap.
func spinFor() time.Duration {
	spin := time.Duration(spinWait.Load())
	if spin > 0 && clock()-contendedAt.Load() < int64(contendedHold) {
		return 0
	}
	return spin
}

func init() { spinWait.Store(int64(parseSpin(os.Getenv("SPARGO_SPIN")))) }

func parseSpin(v string) time.Duration {
	const def = 200 * time.Microsecond
	switch v {
	case "":
		return def
	case "0", "off", "false":
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d
	}
	return def
}

// nextTask polls the pool's queue for up to spinFor(); nil when nothing came.
func nextTask() task {
	spin := spinFor()
	if spin <= 0 {
		return nil
	}
	var start time.Time
	for i := 0; ; i++ {
		select {
		case t := <-poolCh:
			return t
		default:
		}
		if i&63 == 0 {
			if i == 0 {
				start = time.Now()
			} else if time.Since(start) > spin {
				return nil
			}
		}
		runtime.Gosched()
	}
}

// ensureWorkers makes sure at least n pool goroutines exist.
func ensureWorkers(n int) {
	poolMu.Lock()
	for poolWorkers < n {
		poolWorkers++
		go poolLoop()
	}
	poolMu.Unlock()
}

// joiner counts a dispatch's helpers still running: each calls Done once, the
// dispatching goroutine Waits. Wait polls for up to spinWait before it sleeps on
// the WaitGroup, so a helper finishing shortly after the caller wakes nobody.
type joiner struct {
	left atomic.Int32
	wg   sync.WaitGroup
}

func (j *joiner) Add(n int) {
	j.wg.Add(n)
	j.left.Add(int32(n))
}

// Done is a helper's last touch of the task: the WaitGroup first, so that a
// Wait that saw left reach 0 may reuse the task at once.
func (j *joiner) Done() {
	j.wg.Done()
	j.left.Add(-1)
}

func (j *joiner) Wait() {
	if spin := spinFor(); spin > 0 {
		var start time.Time
		for i := 0; j.left.Load() != 0; i++ {
			if i&63 == 0 {
				if i == 0 {
					start = time.Now()
				} else if time.Since(start) > spin {
					break
				}
			}
			runtime.Gosched()
		}
	}
	j.wg.Wait()
	for j.left.Load() != 0 { // a helper between its wg.Done and left.Add
		runtime.Gosched()
	}
}

// dispatch runs t on the calling goroutine plus helpers-1 pool workers and
// returns when all have finished. wg is the joiner t.done signals.
func dispatch(t task, wg *joiner, helpers int) {
	if helpers > 1 {
		if dispatching.Add(1) > 1 {
			contendedAt.Store(clock())
		}
		defer dispatching.Add(-1)
		ensureWorkers(helpers - 1)
		wg.Add(helpers - 1)
		for i := 1; i < helpers; i++ {
			poolCh <- t
		}
	}
	t.run()
	if helpers > 1 {
		wg.Wait()
	}
}

// parallelFor calls fn on disjoint ranges covering [0,n) using up to
// GOMAXPROCS goroutines. cost is a rough per-item work estimate (in
// floating-point operations / element moves) used to avoid spawning
// goroutines for small problems. It runs on the same pooled task as the
// layer kernels (par.go), so only fn's closure is allocated.
func parallelFor(n int, cost int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if runsSerial(n, cost) {
		fn(0, n)
		return
	}
	t := newTask(jobFunc)
	t.fn = fn
	runTask(t, n)
}

// alignedFloats returns a zeroed slice of n float32 whose first element is
// 64-byte aligned.
func alignedFloats(n int) []float32 {
	buf := make([]float32, n+16)
	off := 0
	if r := uintptr(unsafe.Pointer(&buf[0])) % 64; r != 0 {
		off = int((64 - r) / 4)
	}
	return buf[off : off+n : off+n]
}
