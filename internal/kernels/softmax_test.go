package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestSoftmaxCrossEntropy(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, s := range [][2]int{{1, 1}, {1, 3}, {3, 1}, {4, 5}, {32, 10}, {7, 1000}, {2000, 10}, {0, 4}} {
		n, k := s[0], s[1]
		x := randSlice(r, n*k)
		for i := range x {
			x[i] *= 20
		}
		labels := make([]int, n)
		for i := range labels {
			labels[i] = r.IntN(k)
		}
		prob, rl := make([]float32, n*k), make([]float32, n)
		got := SoftmaxCrossEntropy(prob, rl, x, labels, n, k)
		var want float64
		wp := make([]float64, n*k)
		for i := 0; i < n; i++ {
			mx := math.Inf(-1)
			for _, v := range x[i*k : (i+1)*k] {
				mx = math.Max(mx, float64(v))
			}
			var z float64
			for _, v := range x[i*k : (i+1)*k] {
				z += math.Exp(float64(v) - mx)
			}
			for j, v := range x[i*k : (i+1)*k] {
				wp[i*k+j] = math.Exp(float64(v)-mx) / z
			}
			want += math.Log(z) + mx - float64(x[i*k+labels[i]])
		}
		if math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
			t.Fatalf("%v: loss %v, want %v", s, got, want)
		}
		for i := range prob {
			if !closeTo(prob[i], wp[i], 1e-7, 1e-6) {
				t.Fatalf("%v: prob[%d] = %v, want %v", s, i, prob[i], wp[i])
			}
		}
		for _, acc := range []bool{false, true} {
			dx0 := randSlice(r, n*k)
			dx := clone(dx0)
			SoftmaxCrossEntropyBackward(dx, prob, labels, n, k, 0.25, acc)
			for i := range dx {
				want := float64(prob[i])
				if i%k == labels[i/k] {
					want--
				}
				want *= 0.25
				if acc {
					want += float64(dx0[i])
				}
				if !closeTo(dx[i], want, 1e-7, 1e-6) {
					t.Fatalf("%v acc=%v: dx[%d] = %v, want %v", s, acc, i, dx[i], want)
				}
			}
		}
	}
}

func TestSoftmaxCrossEntropyDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	n, k := 5000, 10
	x := randSlice(r, n*k)
	labels := make([]int, n)
	for i := range labels {
		labels[i] = r.IntN(k)
	}
	run := func() float64 {
		return SoftmaxCrossEntropy(make([]float32, n*k), make([]float32, n), x, labels, n, k)
	}
	var a, b float64
	withProcs(1, func() { a = run() })
	withProcs(4, func() { b = run() })
	if a != b {
		t.Fatalf("loss depends on GOMAXPROCS: %v vs %v", a, b)
	}
}
