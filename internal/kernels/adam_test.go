package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// refAdam is the update of AdamUpdateAll in float64 arithmetic on the float32 state.
func refAdam(w, g, m, v, vmax []float32, c AdamCoef) (nw, nm, nv, nx []float64) {
	n := len(w)
	nw, nm, nv, nx = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for i := range w {
		d := float64(g[i])
		if c.Maximize {
			d = -d
		}
		x := float64(w[i])
		d += float64(c.L2) * x
		x *= float64(c.Decay)
		nm[i] = float64(c.Beta1)*float64(m[i]) + float64(c.OneMinusBeta1)*d
		nv[i] = float64(c.Beta2)*float64(v[i]) + float64(c.OneMinusBeta2)*d*d
		den := nv[i]
		if c.AMSGrad {
			nx[i] = math.Max(float64(vmax[i]), nv[i])
			den = nx[i]
		}
		nw[i] = x - float64(c.StepSize)*nm[i]/(math.Sqrt(den)/float64(c.BC2Sqrt)+float64(c.Eps))
	}
	return nw, nm, nv, nx
}

func adamCoef(t int, lr, b1, b2, eps, l2, wd float64, ams, maximize bool) AdamCoef {
	return AdamCoef{Beta1: float32(b1), Beta2: float32(b2), OneMinusBeta1: float32(1 - b1), OneMinusBeta2: float32(1 - b2),
		StepSize: float32(lr / (1 - math.Pow(b1, float64(t)))), BC2Sqrt: float32(math.Sqrt(1 - math.Pow(b2, float64(t)))),
		Eps: float32(eps), L2: float32(l2), Decay: float32(1 - lr*wd), AMSGrad: ams, Maximize: maximize}
}

func TestAdamUpdate(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	coefs := []AdamCoef{
		adamCoef(1, 1e-3, 0.9, 0.999, 1e-8, 0, 0, false, false),
		adamCoef(7, 0.05, 0.9, 0.999, 1e-8, 0.1, 0, false, false),
		adamCoef(3, 0.05, 0.8, 0.99, 1e-3, 0, 0.3, true, false),
		adamCoef(12, 0.01, 0.9, 0.98, 1e-6, 0.02, 0, true, true),
	}
	for _, n := range []int{0, 1, 17, 1000, adamChunk, 2*adamChunk + 5} {
		for k, c := range coefs {
			w, g, m := randSlice(r, n), randSlice(r, n), randSlice(r, n)
			v, vmax := randSlice(r, n), randSlice(r, n)
			for i := range v { // second moments are non-negative
				v[i], vmax[i] = v[i]*v[i], vmax[i]*vmax[i]
			}
			ww, wm, wv, wx := refAdam(w, g, m, v, vmax, c)
			x := vmax
			if !c.AMSGrad {
				x = nil
			}
			AdamUpdate(w, g, m, v, x, c)
			for i := range n {
				for _, p := range []struct {
					name      string
					got, want float64
				}{{"w", float64(w[i]), ww[i]}, {"m", float64(m[i]), wm[i]}, {"v", float64(v[i]), wv[i]}} {
					if math.Abs(p.got-p.want) > 2e-6*(1+math.Abs(p.want)) {
						t.Fatalf("n=%d coef %d: %s[%d] = %v, want %v", n, k, p.name, i, p.got, p.want)
					}
				}
				if c.AMSGrad && float64(vmax[i]) != wx[i] && math.Abs(float64(vmax[i])-wx[i]) > 2e-6*wx[i] {
					t.Fatalf("n=%d coef %d: vmax[%d] = %v, want %v", n, k, i, vmax[i], wx[i])
				}
			}
		}
	}
}

func TestAdamUpdateAllMatchesPerParameter(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	sizes := []int{3, adamChunk + 1, 100, 2 * adamChunk}
	cs := []AdamCoef{adamCoef(2, 0.01, 0.9, 0.999, 1e-8, 0, 0.1, false, false), adamCoef(2, 0.01, 0.9, 0.999, 1e-8, 0, 0, true, false),
		adamCoef(2, 0.01, 0.9, 0.999, 1e-8, 0.2, 0, false, false), adamCoef(2, 0.01, 0.9, 0.999, 1e-8, 0, 0, false, true)}
	var ws, gs, ms, vs, xs, ws2, ms2, vs2, xs2 [][]float32
	for _, n := range sizes {
		w, g, m, v, x := randSlice(r, n), randSlice(r, n), randSlice(r, n), randSlice(r, n), randSlice(r, n)
		for i := range v {
			v[i], x[i] = v[i]*v[i], x[i]*x[i]
		}
		ws, gs, ms, vs, xs = append(ws, w), append(gs, g), append(ms, m), append(vs, v), append(xs, x)
		ws2, ms2, vs2, xs2 = append(ws2, clone(w)), append(ms2, clone(m)), append(vs2, clone(v)), append(xs2, clone(x))
	}
	withProcs(2, func() { AdamUpdateAll(ws, gs, ms, vs, xs, cs) })
	for i := range sizes {
		adamGeneric(ws2[i], gs[i], ms2[i], vs2[i], xs2[i], &cs[i])
		if !sameBits(ws[i], ws2[i]) || !sameBits(ms[i], ms2[i]) || !sameBits(vs[i], vs2[i]) || !sameBits(xs[i], xs2[i]) {
			t.Fatalf("parameter %d (%d elements): the fused pass differs from a serial update", i, sizes[i])
		}
	}
}

// BenchmarkAdamUpdate updates 25 M parameters (AdamW; BERT-base has 110 M), in one 25 M
// tensor and in 200 tensors of 125 k, with the fused parallel kernel (AdamUpdateAll) and
// with a serial loop over the parameters; GB/s counts reading w, g, m, v and writing w, m, v.
//
// First measurement (2-core EPYC dev machine shared with other builds, load average 6 to
// 20, so not a clean number): about 0.1 to 0.3 s per step for both, within the noise of
// each other. Re-measure on an idle machine before drawing conclusions.
func BenchmarkAdamUpdate(b *testing.B) {
	const n = 25_000_000
	w, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range w {
		w[i], g[i], m[i], v[i] = r.Float32(), r.Float32()-0.5, 0.01, 0.001 // touch every page before timing
	}
	c := adamCoef(10, 1e-3, 0.9, 0.999, 1e-8, 0, 0.01, false, false)
	for _, parts := range []int{1, 200} {
		split := func(x []float32) [][]float32 {
			out := make([][]float32, parts)
			for i := range out {
				out[i] = x[i*n/parts : (i+1)*n/parts]
			}
			return out
		}
		ws, gs, ms, vs := split(w), split(g), split(m), split(v)
		cs := make([]AdamCoef, parts)
		for i := range cs {
			cs[i] = c
		}
		b.Run(fmt.Sprintf("25M/tensors=%d/fused/procs=%d", parts, runtime.GOMAXPROCS(0)), func(b *testing.B) {
			b.SetBytes(28 * n)
			for b.Loop() {
				AdamUpdateAll(ws, gs, ms, vs, nil, cs)
			}
		})
		b.Run(fmt.Sprintf("25M/tensors=%d/serial", parts), func(b *testing.B) {
			b.SetBytes(28 * n)
			for b.Loop() {
				for i := range ws {
					adamGeneric(ws[i], gs[i], ms[i], vs[i], nil, &cs[i])
				}
			}
		})
	}
}
