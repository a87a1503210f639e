package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Allocation-free dispatch for the layer kernels. Each kernel keeps its arguments
// in a small job struct whose methods process an index range. Small problems call
// the method directly; large ones copy the job into a pooled layerTask and run it
// on the worker pool (dispatch in workers.go) with parallelFor's split, so neither
// path allocates in the steady state.

// runsSerial reports whether a loop of n items of the given cost runs on the
// calling goroutine alone (parallelFor and the layer kernels share it).
func runsSerial(n, cost int) bool {
	return n <= 1 || n*max(cost, 1) < 1<<15 || runtime.GOMAXPROCS(0) <= 1
}

// elemChunk is the slice length one parallel task of an elementwise kernel handles.
// Elementwise results do not depend on the split.
const elemChunk = 1 << 14

// elemChunks is the number of elemChunk-sized chunks covering n elements.
func elemChunks(n int) int { return (n + elemChunk - 1) / elemChunk }

// elemSpan converts a range of chunk indices into element bounds within [0, n).
func elemSpan(lo, hi, n int) (int, int) { return lo * elemChunk, min(hi*elemChunk, n) }

// Job kinds a layerTask can run.
const (
	jobBNForwardTrain = iota + 1
	jobBNApply
	jobBNBackward
	jobMaxForward
	jobMaxBackward
	jobAvgForward
	jobAvgBackward
	jobMaxForwardNHWC
	jobMaxBackwardNHWC
	jobAvgForwardNHWC
	jobAvgBackwardNHWC
	jobCEForward
	jobCEBackward
	jobSGD
	jobElem
	jobFunc   // parallelFor's closure
	jobBNNHWC // batchnorm_nhwc.go's blocks
)

// layerTask is a pooled parallel loop over [0, n) running one job kind.
type layerTask struct {
	kind  int
	bn    bnJob
	bnh   bnhJob
	pool  poolJob
	ce    ceJob
	sgd   sgdJob
	elem  elemJob
	fn    func(lo, hi int)
	n     int
	grain int
	next  atomic.Int64
	wg    joiner
}

var layerTaskPool = sync.Pool{New: func() any { return new(layerTask) }}

func (t *layerTask) body(lo, hi int) {
	switch t.kind {
	case jobBNForwardTrain:
		t.bn.forwardTrain(lo, hi)
	case jobBNApply:
		t.bn.apply(lo, hi)
	case jobBNBackward:
		t.bn.backward(lo, hi)
	case jobMaxForward, jobMaxBackward, jobAvgForward, jobAvgBackward,
		jobMaxForwardNHWC, jobMaxBackwardNHWC, jobAvgForwardNHWC, jobAvgBackwardNHWC:
		t.pool.run(t.kind, lo, hi)
	case jobCEForward:
		t.ce.forward(lo, hi)
	case jobCEBackward:
		t.ce.backward(lo, hi)
	case jobSGD:
		t.sgd.run(lo, hi)
	case jobElem:
		t.elem.run(lo, hi)
	case jobFunc:
		t.fn(lo, hi)
	case jobBNNHWC:
		t.bnh.runBlocks(lo, hi)
	default:
		panic("kernels: unknown layer job")
	}
}

func (t *layerTask) run() {
	for {
		lo := int(t.next.Add(int64(t.grain))) - t.grain
		if lo >= t.n {
			return
		}
		t.body(lo, min(lo+t.grain, t.n))
	}
}

func (t *layerTask) done() { t.wg.Done() }

// runTask runs t over [0, n) like parallelFor(n, …) (the caller has checked that the
// work is worth splitting), then clears it and returns it to the pool.
func runTask(t *layerTask, n int) {
	nw := min(runtime.GOMAXPROCS(0), n)
	t.n = n
	t.grain = max(1, n/(4*nw)) // about 4 chunks per worker, as parallelFor
	t.next.Store(0)
	dispatch(t, &t.wg, nw)
	*t = layerTask{}
	layerTaskPool.Put(t)
}

// newTask returns a pooled task of the given kind.
func newTask(kind int) *layerTask {
	t := layerTaskPool.Get().(*layerTask)
	t.kind = kind
	return t
}

// Elementwise operations run through elemJob.
const (
	elemReluFwd = iota + 1
	elemReluBwd
	elemReluBwdSet
	elemZero
	elemCopy
	elemAxpy
	elemReluBwdAxpy
)

// elemJob applies one elementwise operation to chunks [lo, hi) of n elements.
type elemJob struct {
	op      int
	n       int
	a, b, c []float32
	alpha   float32
	v       *vecOps
}

func (j *elemJob) run(lo, hi int) {
	lo, hi = elemSpan(lo, hi, j.n)
	a, b, c := j.a, j.b, j.c
	switch j.op {
	case elemReluFwd:
		j.v.reluFwd(a[lo:hi], b[lo:hi])
	case elemReluBwd:
		j.v.reluBwd(a[lo:hi], b[lo:hi], c[lo:hi])
	case elemReluBwdSet:
		j.v.reluBwdSet(a[lo:hi], b[lo:hi], c[lo:hi])
	case elemZero:
		clear(a[lo:hi])
	case elemCopy:
		copy(a[lo:hi], b[lo:hi])
	case elemAxpy:
		j.v.axpy(j.alpha, a[lo:hi], b[lo:hi])
	case elemReluBwdAxpy:
		reluBwdAxpyGeneric(a[lo:hi], b[lo:hi], c[lo:hi])
	}
}

// runElem runs an elementwise job over n elements, in parallel when n exceeds one
// chunk.
func runElem(j elemJob) {
	j.v = impl.vec
	if j.n <= elemChunk {
		j.run(0, 1)
		return
	}
	t := newTask(jobElem)
	t.elem = j
	runTask(t, elemChunks(j.n))
}
