package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// ConvWeightGrad against a float64 reference of dw += dY·im2col(x)ᵀ, on both
// of its paths (fewer and more than minNHWCChannels channels), with strides,
// paddings, row strides of dY larger than its width, and a non-zero dw.
func TestConvWeightGrad(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(9, 10))
		for _, g := range []ConvGeom{
			{N: 2, C: 3, H: 7, W: 6, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 2, C: 16, H: 5, W: 5, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 3, C: 20, H: 9, W: 7, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2},
			{N: 1, C: 33, H: 6, W: 8, KH: 1, KW: 1, PadH: 0, PadW: 0, StrideH: 1, StrideW: 1},
			{N: 2, C: 64, H: 4, W: 4, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 1, C: 17, H: 6, W: 5, KH: 5, KW: 3, PadH: 2, PadW: 0, StrideH: 1, StrideW: 2},
			{N: 4, C: 48, H: 16, W: 16, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			// Multiples of 32 channels: the B-indirect micro-kernel (ConvWeightGradNHWC).
			{N: 3, C: 32, H: 9, W: 7, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2},
			{N: 2, C: 96, H: 5, W: 6, KH: 2, KW: 3, PadH: 0, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 1, C: 24, H: 9, W: 9, KH: 7, KW: 8, PadH: 3, PadW: 3, StrideH: 1, StrideW: 1},
			// Padding wider than the kernel: output pixels far into the padding whose
			// receptive field is inside the image again (found by nn/gorgonia's oracle test;
			// packIm2colT sliced x past its end: garbage values, or a panic).
			{N: 3, C: 2, H: 2, W: 1, KH: 1, KW: 1, PadH: 2, PadW: 2, StrideH: 2, StrideW: 2},
			{N: 2, C: 1, H: 1, W: 1, KH: 1, KW: 1, PadH: 2, PadW: 2, StrideH: 2, StrideW: 2},
		} {
			for _, m := range []int{1, 9, 40} {
				name := fmt.Sprintf("%+v/m%d", g, m)
				x := randSlice(r, g.N*g.C*g.H*g.W)
				kdim, cols := g.ColRows(), g.ColCols()
				ldd := cols + 3
				dy := randSlice(r, m*ldd)
				dw := randSlice(r, m*kdim)
				col := make([]float32, kdim*cols)
				Im2col(g, x, col)
				want, tol := naiveSgemm(false, true, m, kdim, cols, 1, dy, ldd, col, cols, 1, dw, kdim)
				// ConvWeightGradNHWC (any channel count) from a PadNHWC copy.
				dw2 := append([]float32(nil), dw...)
				xp := make([]float32, g.N*(g.H+2*g.PadH)*(g.W+2*g.PadW)*g.C)
				PadNHWC(g, x, xp)
				ConvWeightGradNHWC(g, xp, dy, m, ldd, dw2)
				ConvWeightGrad(g, x, dy, m, ldd, dw)
				for i := range want {
					if d := math.Abs(float64(dw[i]) - want[i]); !(d <= tol[i]) {
						t.Fatalf("%s: dw[%d] = %g, want %g (tol %g)", name, i, dw[i], want[i], tol[i])
					}
					if d := math.Abs(float64(dw2[i]) - want[i]); !(d <= tol[i]) {
						t.Fatalf("%s: NHWC dw[%d] = %g, want %g (tol %g)", name, i, dw2[i], want[i], tol[i])
					}
				}
			}
		}
	})
}

// addTapsToChannels against the element loop it replaces, bit for bit: every
// tap count from 1 to 50, channel counts around the 8-channel groups, and
// signed zeros, infinities and NaNs among the values.
func TestAddTapsToChannels(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
		fill := func(n int) []float32 {
			s := randSlice(r, n)
			for i := range s {
				if r.IntN(8) == 0 {
					s[i] = special[r.IntN(len(special))]
				}
			}
			return s
		}
		for kk := 1; kk <= 50; kk++ {
			for _, c := range []int{1, 7, 8, 16, 19, 64} {
				src, dst := fill(kk*c), fill(kk*c)
				want := append([]float32(nil), dst...)
				for ij := range kk {
					for ch := range c {
						want[ch*kk+ij] += src[ij*c+ch]
					}
				}
				addTapsToChannels(dst, src, make([]float32, len(dst)), c, kk)
				for i := range want {
					if !sameValue(dst[i], want[i]) {
						t.Fatalf("kk %d, c %d: dst[%d] = %g, want %g", kk, c, i, dst[i], want[i])
					}
				}
			}
		}
	})
}
