package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// SgemmPackedB is Sgemm with B packed beforehand: the results must be the same bits, for
// every implementation, transposition, edge shape (M, N, K past MC, NR, KC and ragged)
// and goroutine count (with several, M may be split and A shared).
func TestSgemmPackedBMatchesSgemm(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(61, 62))
		dims := [][3]int{{1, 1, 1}, {20, 800, 200}, {20, 200, 800}, {7, 13, 11}, {300, 70, 40}, {65, 33, 300}, {3, 600, 513}, {530, 100, 20}}
		for _, d := range dims {
			for v := range 4 {
				ta, tb := v&1 != 0, v&2 != 0
				m, n, k := d[0], d[1], d[2]
				lda, ldb := k+1, n+3
				if ta {
					lda = m + 2
				}
				if tb {
					ldb = k + 3
				}
				a := randSlice(r, max(m, k)*lda)
				b := randSlice(r, max(n, k)*ldb)
				c0 := randSlice(r, m*(n+1))
				for _, ab := range [][2]float32{{1, 0}, {0.7, 0.3}} {
					want := clone(c0)
					Sgemm(ta, tb, m, n, k, ab[0], a, lda, b, ldb, ab[1], want, n+1)
					for _, procs := range []int{1, 2, 3} {
						old := runtime.GOMAXPROCS(procs)
						pb := PackB(tb, k, n, b, ldb)
						got := clone(c0)
						SgemmPackedB(ta, m, ab[0], a, lda, &pb, ab[1], got, n+1)
						pb.Release()
						runtime.GOMAXPROCS(old)
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%v ta=%v tb=%v alpha,beta=%v procs=%d: C[%d] = %v, Sgemm %v", d, ta, tb, ab, procs, i, got[i], want[i])
							}
						}
					}
				}
			}
		}
	})
}

// The packed copy is a copy (B may change afterwards), is reused across calls, and the
// steady state allocates nothing.
func TestPackedBReuseAndAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	const m, n, k = 20, 800, 200
	a, b := randSlice(r, m*k), randSlice(r, n*k)
	want := make([]float32, m*n)
	Sgemm(false, true, m, n, k, 1, a, k, b, k, 0, want, n)
	pb := PackB(true, k, n, b, k)
	if pb.K() != k || pb.N() != n {
		t.Fatalf("PackedB is %d×%d, want %d×%d", pb.K(), pb.N(), k, n)
	}
	saved := clone(b)
	for i := range b {
		b[i] = float32(math.NaN())
	}
	for range 3 {
		got := make([]float32, m*n)
		SgemmPackedB(false, m, 1, a, k, &pb, 0, got, n)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("C[%d] = %v, want %v (B changed after packing)", i, got[i], want[i])
			}
		}
	}
	pb.Release()
	copy(b, saved)
	c := make([]float32, m*n)
	allocs := testing.AllocsPerRun(20, func() {
		pb := PackB(true, k, n, b, k)
		SgemmPackedB(false, m, 1, a, k, &pb, 0, c, n)
		pb.Release()
	})
	if allocs != 0 {
		t.Fatalf("PackB + SgemmPackedB + Release allocate %v times per run, want 0", allocs)
	}
}

func TestPackedBErrors(t *testing.T) {
	b := make([]float32, 6)
	mustPanicT(t, "short B", func() { PackB(false, 2, 4, b, 4) })
	mustPanicT(t, "negative", func() { PackB(false, -1, 3, b, 3) })
	pb := PackB(false, 2, 3, b, 3)
	mustPanicT(t, "short A", func() { SgemmPackedB(false, 2, 1, make([]float32, 3), 2, &pb, 0, make([]float32, 6), 3) })
	mustPanicT(t, "short C", func() { SgemmPackedB(false, 2, 1, make([]float32, 4), 2, &pb, 0, make([]float32, 5), 3) })
	pb.Release()
	mustPanicT(t, "released", func() {
		pb2 := PackB(false, 2, 3, b, 3)
		pb2.Release()
		pb2.k, pb2.n = 2, 3 // a stale copy of the dimensions
		SgemmPackedB(false, 2, 1, make([]float32, 4), 2, &pb2, 0, make([]float32, 6), 3)
	})
	var empty PackedB // k = 0: C = beta·C
	c := []float32{1, 2}
	SgemmPackedB(false, 2, 1, nil, 0, &empty, 0, c, 0)
}

// An RNN's recurrent product: the same weight for every step, packed once.
func ExamplePackB() {
	const steps, batch, hidden = 3, 2, 4
	w := make([]float32, hidden*hidden) // W [hidden, hidden]: h_t = h_{t−1}·Wᵀ
	for i := range hidden {
		w[i*hidden+i] = 0.5
	}
	h := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	next := make([]float32, batch*hidden)
	pw := PackB(true, hidden, hidden, w, hidden) // op(B) = Wᵀ
	defer pw.Release()
	for range steps {
		SgemmPackedB(false, batch, 1, h, hidden, &pw, 0, next, hidden)
		h, next = next, h
	}
	fmt.Println(h)
	// Output: [0.125 0.25 0.375 0.5 0.625 0.75 0.875 1]
}
