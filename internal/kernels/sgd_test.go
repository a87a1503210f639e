package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// refSGD is torch.optim.SGD's update in float64 arithmetic on float32 state.
func refSGD(w, g, buf []float32, lr, wd, mom, damp float64, nesterov, first bool) (nw, nb []float64) {
	nw, nb = make([]float64, len(w)), make([]float64, len(w))
	for i := range w {
		d := float64(g[i]) + wd*float64(w[i])
		if mom != 0 {
			b := d
			if !first {
				b = mom*float64(buf[i]) + (1-damp)*d
			}
			nb[i] = b
			if nesterov {
				d += mom * b
			} else {
				d = b
			}
		}
		nw[i] = float64(w[i]) - lr*d
	}
	return nw, nb
}

func TestSGDUpdate(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(41, 42))
		type cfg struct {
			lr, wd, mom, damp float32
			nesterov, first   bool
		}
		cfgs := []cfg{
			{0.1, 0, 0, 0, false, false}, {0.05, 5e-4, 0, 0, false, false},
			{0.1, 5e-4, 0.9, 0, false, true}, {0.1, 5e-4, 0.9, 0, false, false},
			{0.1, 1e-2, 0.9, 0.3, false, false}, {0.1, 5e-4, 0.9, 0, true, true},
			{0.2, 5e-4, 0.8, 0, true, false}, {0.01, 0, 0.5, 0.5, false, true},
		}
		for _, n := range []int{0, 1, 5, 15, 16, 17, 63, 64, 65, 1000, sgdChunk, 3*sgdChunk + 13} {
			for _, c := range cfgs {
				name := fmt.Sprintf("n=%d %+v", n, c)
				w, g, buf := randSlice(r, n), randSlice(r, n), randSlice(r, n)
				ww, wb := refSGD(w, g, buf, float64(c.lr), float64(c.wd), float64(c.mom), float64(c.damp), c.nesterov, c.first)
				b := buf
				if c.mom == 0 {
					b = nil
				}
				SGDUpdate(w, g, b, c.lr, c.wd, c.mom, c.damp, c.nesterov, c.first)
				for i := range n {
					if math.Abs(float64(w[i])-ww[i]) > 1e-6 {
						t.Fatalf("%s: w[%d] = %v, want %v", name, i, w[i], ww[i])
					}
					if c.mom != 0 && math.Abs(float64(buf[i])-wb[i]) > 1e-6 {
						t.Fatalf("%s: buf[%d] = %v, want %v", name, i, buf[i], wb[i])
					}
				}
			}
		}
	})
}

func TestSGDUpdateDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	n := 5*sgdChunk + 7
	w0, g, b0 := randSlice(r, n), randSlice(r, n), randSlice(r, n)
	run := func() ([]float32, []float32) {
		w, b := clone(w0), clone(b0)
		SGDUpdate(w, g, b, 0.1, 5e-4, 0.9, 0, true, false)
		return w, b
	}
	var w1, b1, w2, b2 []float32
	withProcs(1, func() { w1, b1 = run() })
	withProcs(3, func() { w2, b2 = run() })
	if !sameBits(w1, w2) || !sameBits(b1, b2) {
		t.Fatal("SGDUpdate depends on GOMAXPROCS")
	}
}

// BenchmarkSGDStep updates VGG-16's 14.7M parameters (momentum and weight decay),
// reporting GB/s for reading w, g, buf and writing w, buf.
func BenchmarkSGDStep(b *testing.B) {
	const n = 14_728_266
	w, g, buf := make([]float32, n), make([]float32, n), make([]float32, n)
	for _, nesterov := range []bool{false, true} {
		b.Run(fmt.Sprintf("14.7M/nesterov=%v", nesterov), func(b *testing.B) {
			b.SetBytes(20 * n)
			for b.Loop() {
				SGDUpdate(w, g, buf, 0.01, 5e-4, 0.9, 0, nesterov, false)
			}
		})
	}
}
