package kernels

import (
	"sync"
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
