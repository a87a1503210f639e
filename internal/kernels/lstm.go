package kernels

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// The fused elementwise part of an LSTM time step (PyTorch's nn.LSTM gate order i, f, g, o).
// The matrix products around it (the input projection of all time steps, the recurrent
// product of each step) are Sgemm calls made by the caller; these kernels do everything
// between two of them in one pass over the batch rows, so a step touches its gates once
// forward and once backward.
//
// Layouts: gates is [n, 4·hidden] with each row holding the i, f, g, o blocks of hidden
// elements; the cell and hidden tensors are [n, hidden]. Rows are independent, so large
// batches are split over the worker pool by rows (results do not depend on the split), and
// the dispatch reuses pooled tasks: a step allocates nothing.

// sigmoid32 returns 1/(1+e^−x), through exp32 (relative error of a few ulps).
func sigmoid32(x float32) float32 { return 1 / (1 + exp32(-x)) }

// tanh32 returns tanh(x) with an absolute error below 2e-7: an odd Taylor polynomial near 0
// (where 1 − e^−2|x| would cancel) and (1 − e^−2|x|)/(1 + e^−2|x|) elsewhere.
func tanh32(x float32) float32 {
	a := x
	if a < 0 {
		a = -a
	}
	if a < 0.0625 {
		x2 := x * x
		return x * (1 + x2*(-1.0/3+x2*(2.0/15+x2*(-17.0/315))))
	}
	if !(a < 20) { // also NaN
		if a != a {
			return x
		}
		return float32(math.Copysign(1, float64(x)))
	}
	e := exp32(-2 * a)
	r := (1 - e) / (1 + e)
	if x < 0 {
		return -r
	}
	return r
}

// LSTMCellForward finishes one time step for n rows: on entry gates holds the
// pre-activations (x·W_ihᵀ + h_{t−1}·W_hhᵀ + b_ih + b_hh); on return it holds the
// activations i = σ, f = σ, g = tanh, o = σ of them, and
//
//	c = f·cPrev + i·g,   tc = tanh(c),   h = o·tc.
//
// cPrev is the previous cell state (nil means zeros). h may be a strided view: row r is
// written to h[r·ldh : r·ldh+hidden].
func LSTMCellForward(gates, cPrev, c, tc, h []float32, ldh, n, hidden int) {
	const fn = "LSTMCellForward"
	lstmCheck(fn, n, hidden)
	mustLen(fn, "gates", len(gates), n*4*hidden)
	if cPrev != nil {
		mustLen(fn, "cPrev", len(cPrev), n*hidden)
	}
	mustLen(fn, "c", len(c), n*hidden)
	mustLen(fn, "tc", len(tc), n*hidden)
	if ldh < hidden || len(h) < (n-1)*ldh+hidden {
		panic(fmt.Sprintf("kernels.%s: h has %d elements and stride %d, need %d rows of %d", fn, len(h), ldh, n, hidden))
	}
	runLSTM(lstmJob{forward: true, n: n, hid: hidden, gates: gates, cPrev: cPrev, c: c, tc: tc, h: h, ldh: ldh})
}

// LSTMCellBackward is the backward of one LSTMCellForward step. acts are the step's gate
// activations, cPrev its previous cell state (nil: zeros), tc its tanh(c). The gradient
// reaching the step's hidden output is dy + dhRec (dy from the layer above or the loss,
// dhRec from the next step's recurrent product; either may be nil for zero); dc holds on
// entry the gradient reaching c through the next step's cell (zeros at the last step) and
// on return the gradient reaching cPrev. dGates receives the gradient of the
// pre-activations, [n, 4·hidden]. dy may be strided like LSTMCellForward's h (ldy).
func LSTMCellBackward(dGates, acts, cPrev, tc, dy []float32, ldy int, dhRec, dc []float32, n, hidden int) {
	const fn = "LSTMCellBackward"
	lstmCheck(fn, n, hidden)
	mustLen(fn, "dGates", len(dGates), n*4*hidden)
	mustLen(fn, "acts", len(acts), n*4*hidden)
	if cPrev != nil {
		mustLen(fn, "cPrev", len(cPrev), n*hidden)
	}
	mustLen(fn, "tc", len(tc), n*hidden)
	if dy != nil && (ldy < hidden || len(dy) < (n-1)*ldy+hidden) {
		panic(fmt.Sprintf("kernels.%s: dy has %d elements and stride %d, need %d rows of %d", fn, len(dy), ldy, n, hidden))
	}
	if dhRec != nil {
		mustLen(fn, "dhRec", len(dhRec), n*hidden)
	}
	mustLen(fn, "dc", len(dc), n*hidden)
	runLSTM(lstmJob{n: n, hid: hidden, gates: acts, dGates: dGates, cPrev: cPrev, tc: tc, dy: dy, ldy: ldy, dhRec: dhRec, c: dc})
}

func lstmCheck(fn string, n, hidden int) {
	if n < 0 || hidden <= 0 {
		panic(fmt.Sprintf("kernels.%s: invalid shape n=%d hidden=%d", fn, n, hidden))
	}
}

// lstmJob holds one step's arguments; forward or backward over rows [lo, hi).
type lstmJob struct {
	v       *vecOps
	forward bool
	n, hid  int
	gates   []float32 // forward: pre-activations in, activations out; backward: activations
	dGates  []float32
	cPrev   []float32
	c       []float32 // forward: the new cell; backward: dc in/out
	tc      []float32
	h       []float32
	ldh     int
	dy      []float32
	ldy     int
	dhRec   []float32
}

func (j *lstmJob) rows(lo, hi int) {
	if j.forward {
		j.forwardRows(lo, hi)
	} else {
		j.backwardRows(lo, hi)
	}
}

func (j *lstmJob) forwardRows(lo, hi int) {
	hd := j.hid
	for r := lo; r < hi; r++ {
		var cp []float32
		if j.cPrev != nil {
			cp = j.cPrev[r*hd : (r+1)*hd]
		}
		j.v.lstmFwd(j.gates[r*4*hd:(r+1)*4*hd], cp, j.c[r*hd:(r+1)*hd], j.tc[r*hd:(r+1)*hd], j.h[r*j.ldh:r*j.ldh+hd])
	}
}

func (j *lstmJob) backwardRows(lo, hi int) {
	hd := j.hid
	for r := lo; r < hi; r++ {
		var cp, dy, dr []float32
		if j.cPrev != nil {
			cp = j.cPrev[r*hd : (r+1)*hd]
		}
		if j.dy != nil {
			dy = j.dy[r*j.ldy : r*j.ldy+hd]
		}
		if j.dhRec != nil {
			dr = j.dhRec[r*hd : (r+1)*hd]
		}
		j.v.lstmBwd(j.dGates[r*4*hd:(r+1)*4*hd], j.gates[r*4*hd:(r+1)*4*hd], cp, j.tc[r*hd:(r+1)*hd], dy, dr, j.c[r*hd:(r+1)*hd])
	}
}

// lstmFwdGeneric is vecOps.lstmFwd in Go: one row's gates g = [i | f | g | o] of
// hidden = len(c) pre-activations become their activations, and c, tc = tanh(c) and
// h = o·tc are written; cPrev nil is zeros.
func lstmFwdGeneric(g, cPrev, c, tc, h []float32) {
	hd := len(c)
	gi, gf, gg, gO := g[:hd], g[hd:2*hd], g[2*hd:3*hd], g[3*hd:4*hd]
	tc, h = tc[:hd], h[:hd]
	for k := range c {
		i := sigmoid32(gi[k])
		f := sigmoid32(gf[k])
		gv := tanh32(gg[k])
		o := sigmoid32(gO[k])
		gi[k], gf[k], gg[k], gO[k] = i, f, gv, o
		cv := i * gv
		if cPrev != nil {
			cv += f * cPrev[k]
		}
		t := tanh32(cv)
		c[k], tc[k], h[k] = cv, t, o*t
	}
}

// lstmBwdGeneric is vecOps.lstmBwd in Go: the gradient of one row's pre-activations
// into d from its activations a, tc = tanh(c), dh = dy + dhRec and dc (in: from the
// next step's cell; out: to cPrev's); nil cPrev, dy and dhRec are zeros.
func lstmBwdGeneric(d, a, cPrev, tc, dy, dhRec, dc []float32) {
	hd := len(dc)
	ai, af, ag, ao := a[:hd], a[hd:2*hd], a[2*hd:3*hd], a[3*hd:4*hd]
	di, df, dg, do := d[:hd], d[hd:2*hd], d[2*hd:3*hd], d[3*hd:4*hd]
	tc = tc[:hd]
	for k := range dc {
		var dh float32
		if dy != nil {
			dh = dy[k]
		}
		if dhRec != nil {
			dh += dhRec[k]
		}
		i, f, g, o, t := ai[k], af[k], ag[k], ao[k], tc[k]
		dcv := dc[k] + dh*o*(1-t*t)
		var cpv float32
		if cPrev != nil {
			cpv = cPrev[k]
		}
		di[k] = dcv * g * i * (1 - i)
		df[k] = dcv * cpv * f * (1 - f)
		dg[k] = dcv * i * (1 - g*g)
		do[k] = dh * t * o * (1 - o)
		dc[k] = dcv * f
	}
}

// lstmTask runs an lstmJob over row chunks on the worker pool.
type lstmTask struct {
	job   lstmJob
	n     int
	grain int
	next  atomic.Int64
	wg    joiner
}

var lstmTaskPool = sync.Pool{New: func() any { return new(lstmTask) }}

func (t *lstmTask) run() {
	for {
		lo := int(t.next.Add(int64(t.grain))) - t.grain
		if lo >= t.n {
			return
		}
		t.job.rows(lo, min(lo+t.grain, t.n))
	}
}

func (t *lstmTask) done() { t.wg.Done() }

// lstmRowCost is about the flops of one gate element (three exponentials forward).
const lstmRowCost = 40

func runLSTM(j lstmJob) {
	j.v = impl.vec
	if runsSerial(j.n, lstmRowCost*4*j.hid) {
		j.rows(0, j.n)
		return
	}
	nw := min(runtime.GOMAXPROCS(0), j.n)
	t := lstmTaskPool.Get().(*lstmTask)
	t.job, t.n = j, j.n
	t.grain = max(1, j.n/(2*nw))
	t.next.Store(0)
	dispatch(t, &t.wg, nw)
	*t = lstmTask{}
	lstmTaskPool.Put(t)
}
