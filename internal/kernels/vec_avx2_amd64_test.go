package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// axpyAVX2 multiplies, then adds, rounding after each like the unfused Go loop;
// mulAVX2 and scaleAVX2 round like it. Each writes its n elements and no more.
func TestVecAVX2MatchesGoLoop(t *testing.T) {
	if !implSupported("avx2") {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(15, 16))
	const alpha = float32(-0.37)
	for _, n := range []int{8, 16, 24, 32, 40, 64, 88, 1024} {
		for _, off := range []int{0, 1, 3} { // unaligned starts
			x := randSlice(r, off+n+1)[off:]
			y := randSlice(r, off+n+1)[off:]
			b := randSlice(r, n+1)
			got := append([]float32(nil), y...)
			axpyAVX2(alpha, &x[0], &got[0], n)
			for i := range n {
				prod := float32(alpha * x[i]) // the conversion rounds: no fused multiply-add
				if want := y[i] + prod; math.Float32bits(got[i]) != math.Float32bits(want) {
					t.Fatalf("axpyAVX2 n %d off %d: y[%d] = %v, want %v", n, off, i, got[i], want)
				}
			}
			if got[n] != y[n] {
				t.Fatalf("axpyAVX2 n %d: wrote past n", n)
			}
			got = append(got[:0], x...)
			scaleAVX2(alpha, &got[0], n)
			for i := range n {
				if want := alpha * x[i]; math.Float32bits(got[i]) != math.Float32bits(want) {
					t.Fatalf("scaleAVX2 n %d off %d: x[%d] = %v, want %v", n, off, i, got[i], want)
				}
			}
			if got[n] != x[n] {
				t.Fatalf("scaleAVX2 n %d: wrote past n", n)
			}
			dst := make([]float32, n+1)
			dst[n] = 7
			mulAVX2(&dst[0], &x[0], &b[0], n)
			for i := range n {
				if want := x[i] * b[i]; math.Float32bits(dst[i]) != math.Float32bits(want) {
					t.Fatalf("mulAVX2 n %d off %d: dst[%d] = %v, want %v", n, off, i, dst[i], want)
				}
			}
			if dst[n] != 7 {
				t.Fatalf("mulAVX2 n %d: wrote past n", n)
			}
		}
	}
}
