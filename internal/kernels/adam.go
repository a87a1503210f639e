package kernels

import "math"

// adamChunk is the number of elements one parallel task of AdamUpdateAll handles. The
// update is elementwise, so the split does not affect the result.
const adamChunk = 1 << 14

// AdamCoef holds one parameter's coefficients for one Adam / AdamW step, computed by the
// optimizer in float64 as torch.optim does (bias corrections from the step count t) and
// rounded to float32 once.
type AdamCoef struct {
	Beta1, Beta2  float32 // moment decay rates
	OneMinusBeta1 float32 // 1 − β1, rounded from float64
	OneMinusBeta2 float32 // 1 − β2, rounded from float64
	StepSize      float32 // lr / (1 − β1^t)
	BC2Sqrt       float32 // sqrt(1 − β2^t)
	Eps           float32 // added to the corrected root (outside the sqrt)
	L2            float32 // Adam's weight decay, added to the gradient (0 for none)
	Decay         float32 // AdamW's decoupled factor 1 − lr·wd on the value (1 for none)
	AMSGrad       bool    // normalise by the running maximum of the second moment
	Maximize      bool    // ascend: the gradient's sign is flipped
}

// AdamUpdate applies one torch.optim.Adam / AdamW step to w in place (see AdamUpdateAll).
// vmax may be nil unless c.AMSGrad.
func AdamUpdate(w, g, m, v, vmax []float32, c AdamCoef) {
	ws, gs, ms, vs, xs, cs := [1][]float32{w}, [1][]float32{g}, [1][]float32{m}, [1][]float32{v}, [1][]float32{vmax}, [1]AdamCoef{c}
	AdamUpdateAll(ws[:], gs[:], ms[:], vs[:], xs[:], cs[:])
}

// AdamUpdateAll applies, to every parameter i, one Adam step fused into a single pass per
// element, as torch.optim.Adam / AdamW's single-tensor path in PyTorch 1.13:
//
//	g = ±grad + L2·w              (sign − with Maximize)
//	w = Decay·w                   (AdamW; Decay is 1 for Adam)
//	m = β1·m + (1−β1)·g
//	v = β2·v + (1−β2)·g²
//	vmax = max(vmax, v)           (AMSGrad; the denominator then uses vmax)
//	w −= StepSize · m / (sqrt(v)/BC2Sqrt + Eps)
//
// All parameters share one parallel pass over fixed chunks of adamChunk elements. vmaxs
// may be nil when no coefficient asks for AMSGrad. Mismatched lengths panic (the
// optimizer owns the slices).
func AdamUpdateAll(ws, gs, ms, vs, vmaxs [][]float32, cs []AdamCoef) {
	checkLen("AdamUpdateAll", len(ws), len(gs), len(ms), len(vs), len(cs))
	chunks := 0
	for i, w := range ws {
		checkLen("AdamUpdateAll", len(w), len(gs[i]), len(ms[i]), len(vs[i]))
		if cs[i].AMSGrad {
			checkLen("AdamUpdateAll", len(w), len(vmaxs[i]))
		}
		chunks += (len(w) + adamChunk - 1) / adamChunk
	}
	j := adamJob{ws: ws, gs: gs, ms: ms, vs: vs, vmaxs: vmaxs, cs: cs}
	parallelFor(chunks, 12*adamChunk, j.run)
}

// adamJob holds the arguments of one AdamUpdateAll call; run updates the chunks [lo, hi) of
// the concatenation of the parameters' chunk lists.
type adamJob struct {
	ws, gs, ms, vs, vmaxs [][]float32
	cs                    []AdamCoef
}

func (j adamJob) run(lo, hi int) {
	base := 0 // index of the first chunk of parameter i
	for i, w := range j.ws {
		nc := (len(w) + adamChunk - 1) / adamChunk
		if base >= hi {
			return
		}
		if base+nc > lo {
			a := max(lo-base, 0) * adamChunk
			b := min((hi-base)*adamChunk, len(w))
			var vmax []float32
			if j.cs[i].AMSGrad {
				vmax = j.vmaxs[i][a:b]
			}
			adamGeneric(w[a:b], j.gs[i][a:b], j.ms[i][a:b], j.vs[i][a:b], vmax, &j.cs[i])
		}
		base += nc
	}
}

// adamGeneric is the scalar loop. Go does not vectorise it; the parallel split over the
// cores is what AdamUpdateAll adds (BenchmarkAdamUpdate compares the two).
func adamGeneric(w, g, m, v, vmax []float32, c *AdamCoef) {
	g, m, v = g[:len(w)], m[:len(w)], v[:len(w)]
	if c.AMSGrad {
		vmax = vmax[:len(w)]
	}
	b1, b2, a1, a2 := c.Beta1, c.Beta2, c.OneMinusBeta1, c.OneMinusBeta2
	step, bc2, eps, l2, decay := c.StepSize, c.BC2Sqrt, c.Eps, c.L2, c.Decay
	for i, x := range w {
		d := g[i]
		if c.Maximize {
			d = -d
		}
		if l2 != 0 {
			d += l2 * x
		}
		if decay != 1 {
			x *= decay
		}
		mi := b1*m[i] + a1*d
		vi := b2*v[i] + a2*d*d
		m[i], v[i] = mi, vi
		if c.AMSGrad {
			vi = max(vmax[i], vi)
			vmax[i] = vi
		}
		den := float32(math.Sqrt(float64(vi)))/bc2 + eps
		w[i] = x - step*mi/den
	}
}
