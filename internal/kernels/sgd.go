package kernels

// sgdChunk is the number of elements one parallel task of SGDUpdate handles. The
// update is elementwise, so the split does not affect the result.
const sgdChunk = 1 << 14

// SGDUpdate applies one torch.optim.SGD step to w in place, fused into one pass:
//
//	d = g + wd·w
//	momentum ≠ 0: buf = d on the first step, else momentum·buf + (1−dampening)·d;
//	              d = d + momentum·buf (Nesterov) or buf
//	w −= lr·d
//
// buf is the momentum buffer (same length as w; unused and may be nil when momentum
// is 0). Large slices are updated in parallel.
func SGDUpdate(w, g, buf []float32, lr, wd, momentum, dampening float32, nesterov, first bool) {
	ws, gs, bs, fs := [1][]float32{w}, [1][]float32{g}, [1][]float32{buf}, [1]bool{first}
	SGDUpdateAll(ws[:], gs[:], bs[:], fs[:], lr, wd, momentum, dampening, nesterov)
}

// SGDUpdateAll applies SGDUpdate to every parameter i (ws[i], gs[i], bufs[i],
// first[i]) in a single parallel pass over fixed chunks of sgdChunk elements, so
// small parameters share the pass and the call allocates at most a closure and a
// job however many parameters there are. bufs may be nil when momentum is 0.
func SGDUpdateAll(ws, gs, bufs [][]float32, first []bool, lr, wd, momentum, dampening float32, nesterov bool) {
	checkLen("SGDUpdateAll", len(ws), len(gs))
	if momentum != 0 {
		checkLen("SGDUpdateAll", len(ws), len(bufs), len(first))
	} else if nesterov {
		panic("kernels.SGDUpdateAll: Nesterov without momentum")
	}
	chunks := 0
	for i, w := range ws {
		checkLen("SGDUpdateAll", len(w), len(gs[i]))
		if momentum != 0 {
			checkLen("SGDUpdateAll", len(w), len(bufs[i]))
		}
		chunks += (len(w) + sgdChunk - 1) / sgdChunk
	}
	j := sgdJob{ws: ws, gs: gs, bufs: bufs, first: first, lr: lr, wd: wd, mom: momentum,
		damp: 1 - dampening, nesterov: nesterov, v: impl.vec}
	if cost := 5 * sgdChunk; runsSerial(chunks, cost) {
		j.run(0, chunks)
	} else {
		t := newTask(jobSGD)
		t.sgd = j
		runTask(t, chunks)
	}
}

// sgdJob holds the arguments of one SGDUpdateAll call; run updates the chunks
// [lo, hi) of the concatenation of the parameters' chunk lists.
type sgdJob struct {
	ws, gs, bufs      [][]float32
	first             []bool
	lr, wd, mom, damp float32
	nesterov          bool
	v                 *vecOps
}

func (j *sgdJob) run(lo, hi int) {
	base := 0 // index of the first chunk of parameter i
	for i, w := range j.ws {
		nc := (len(w) + sgdChunk - 1) / sgdChunk
		if base >= hi {
			return
		}
		if base+nc > lo {
			a := max(lo-base, 0) * sgdChunk
			b := min((hi-base)*sgdChunk, len(w))
			g := j.gs[i]
			switch {
			case j.mom == 0:
				j.v.sgdPlain(w[a:b], g[a:b], j.lr, j.wd)
			case j.first[i]:
				sgdFirstGeneric(w[a:b], g[a:b], j.bufs[i][a:b], j.lr, j.wd, j.mom, j.nesterov)
			default:
				j.v.sgdMom(w[a:b], g[a:b], j.bufs[i][a:b], j.lr, j.wd, j.mom, j.damp, j.nesterov)
			}
		}
		base += nc
	}
}

func sgdPlainGeneric(w, g []float32, lr, wd float32) {
	g = g[:len(w)]
	for i, x := range w {
		w[i] = x - lr*(g[i]+wd*x)
	}
}

func sgdFirstGeneric(w, g, buf []float32, lr, wd, mom float32, nesterov bool) {
	g = g[:len(w)]
	buf = buf[:len(w)]
	for i, x := range w {
		d := g[i] + wd*x
		buf[i] = d
		if nesterov {
			d += mom * d
		}
		w[i] = x - lr*d
	}
}

// sgdMomGeneric: damp is 1−dampening.
func sgdMomGeneric(w, g, buf []float32, lr, wd, mom, damp float32, nesterov bool) {
	g = g[:len(w)]
	buf = buf[:len(w)]
	if nesterov {
		for i, x := range w {
			d := g[i] + wd*x
			b := mom*buf[i] + damp*d
			buf[i] = b
			w[i] = x - lr*(d+mom*b)
		}
		return
	}
	for i, x := range w {
		d := g[i] + wd*x
		b := mom*buf[i] + damp*d
		buf[i] = b
		w[i] = x - lr*b
	}
}
