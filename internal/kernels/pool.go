package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
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
		t.run()
		t.done()
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

// dispatch runs t on the calling goroutine plus helpers-1 pool workers and
// returns when all have finished. wg is the WaitGroup t.done signals.
func dispatch(t task, wg *sync.WaitGroup, helpers int) {
	if helpers > 1 {
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

// forJob implements parallelFor.
type forJob struct {
	fn    func(lo, hi int)
	n     int
	grain int
	next  atomic.Int64
	wg    sync.WaitGroup
}

func (j *forJob) run() {
	for {
		lo := int(j.next.Add(int64(j.grain))) - j.grain
		if lo >= j.n {
			return
		}
		j.fn(lo, min(lo+j.grain, j.n))
	}
}

func (j *forJob) done() { j.wg.Done() }

// parallelFor calls fn on disjoint ranges covering [0,n) using up to
// GOMAXPROCS goroutines. cost is a rough per-item work estimate (in
// floating-point operations / element moves) used to avoid spawning
// goroutines for small problems.
func parallelFor(n int, cost int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	nw := runtime.GOMAXPROCS(0)
	if nw <= 1 || n == 1 || n*max(cost, 1) < 1<<15 {
		fn(0, n)
		return
	}
	nw = min(nw, n)
	// about 4 chunks per worker for balance
	grain := max(1, n/(4*nw))
	j := &forJob{fn: fn, n: n, grain: grain}
	dispatch(j, &j.wg, nw)
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
