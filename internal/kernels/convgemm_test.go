package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The implicit-im2col GEMMs pack the same panels as Sgemm on the explicit
// column matrix, so their results must be bit-identical to it, for every
// implementation, geometry, and shape (including shapes that take the shared
// prepacked-A and prepacked-B paths).
func TestSgemmIm2colMatchesExplicit(t *testing.T) {
	geoms := append(convGeoms(),
		ConvGeom{N: 5, C: 4, H: 32, W: 32, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}, // N·plane > NC
		ConvGeom{N: 3, C: 40, H: 2, W: 2, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},  // tiny planes
		ConvGeom{N: 2, C: 3, H: 9, W: 11, KH: 3, KW: 3, PadH: 0, PadW: 2, StrideH: 2, StrideW: 3},
	)
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		for gi, g := range geoms {
			for _, m := range []int{1, 7, 64, 300} {
				if m == 300 && gi%5 != 0 {
					continue // keep the test fast; big M on a sample of geometries
				}
				name := fmt.Sprintf("%+v/m%d", g, m)
				x := randSlice(r, g.N*g.C*g.H*g.W)
				col := make([]float32, g.ColRows()*g.ColCols())
				Im2col(g, x, col)
				kdim, cols := g.ColRows(), g.ColCols()

				// Forward: C[m, cols] = alpha*A[m, kdim]·col + beta*C.
				lda, ldc := kdim+3, cols+1
				a := randSlice(r, m*lda)
				c0 := randSlice(r, m*ldc)
				want := append([]float32(nil), c0...)
				got := append([]float32(nil), c0...)
				Sgemm(false, false, m, cols, kdim, 0.5, a, lda, col, cols, 0.25, want, ldc)
				SgemmIm2col(m, 0.5, a, lda, g, x, 0.25, got, ldc)
				assertBitEqual(t, name+"/im2col", got, want)

				// Weight gradient: C[m, kdim] = A[m, cols]·colᵀ + C.
				lda, ldc = cols+2, kdim
				a = randSlice(r, m*lda)
				c0 = randSlice(r, m*ldc)
				want = append(want[:0], c0...)
				got = append(got[:0], c0...)
				Sgemm(false, true, m, kdim, cols, 1, a, lda, col, cols, 1, want, ldc)
				SgemmIm2colT(m, 1, a, lda, g, x, 1, got, ldc)
				assertBitEqual(t, name+"/im2colT", got, want)
			}
		}
	})
}

func assertBitEqual(t *testing.T, name string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d = %g, want %g (explicit im2col + Sgemm)", name, i, got[i], want[i])
		}
	}
}

func TestSgemmIm2colPanics(t *testing.T) {
	g := ConvGeom{N: 1, C: 2, H: 4, W: 4, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
	for name, f := range map[string]func(){
		"short image": func() { SgemmIm2col(1, 1, make([]float32, 18), 18, g, make([]float32, 31), 0, make([]float32, 16), 16) },
		"short C":     func() { SgemmIm2col(1, 1, make([]float32, 18), 18, g, make([]float32, 32), 0, make([]float32, 15), 16) },
		"short A": func() {
			SgemmIm2colT(1, 1, make([]float32, 15), 16, g, make([]float32, 32), 0, make([]float32, 18), 18)
		},
		"bad stride": func() {
			SgemmIm2col(1, 1, nil, 0, ConvGeom{N: 1, C: 1, H: 1, W: 1, KH: 1, KW: 1}, []float32{1}, 0, nil, 0)
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// BenchmarkConvGemm compares the explicit im2col + Sgemm lowering with the
// implicit one for the VGG-16 CIFAR layers at batch 32 (forward, weight
// gradient):
//
//	go test -run '^$' -bench ConvGemm ./internal/kernels/
func BenchmarkConvGemm(b *testing.B) {
	type layer struct{ c, o, hw int }
	for _, l := range []layer{{3, 64, 32}, {64, 64, 32}, {128, 128, 16}, {256, 256, 8}, {512, 512, 4}, {512, 512, 2}} {
		g := ConvGeom{N: 32, C: l.c, H: l.hw, W: l.hw, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
		r := rand.New(rand.NewPCG(1, 1))
		x := randSlice(r, g.N*g.C*g.H*g.W)
		kdim, cols := g.ColRows(), g.ColCols()
		w := randSlice(r, l.o*kdim)
		dy := randSlice(r, l.o*cols)
		out := make([]float32, l.o*cols)
		dw := make([]float32, l.o*kdim)
		col := make([]float32, kdim*cols)
		flops := 2 * float64(l.o) * float64(kdim) * float64(cols)
		name := fmt.Sprintf("c%d_o%d_hw%d", l.c, l.o, l.hw)
		report := func(b *testing.B) {
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		}
		b.Run(name+"/fwd/explicit", func(b *testing.B) {
			for range b.N {
				Im2col(g, x, col)
				Sgemm(false, false, l.o, cols, kdim, 1, w, kdim, col, cols, 0, out, cols)
			}
			report(b)
		})
		b.Run(name+"/fwd/implicit", func(b *testing.B) {
			for range b.N {
				SgemmIm2col(l.o, 1, w, kdim, g, x, 0, out, cols)
			}
			report(b)
		})
		b.Run(name+"/wgrad/explicit", func(b *testing.B) {
			for range b.N {
				Im2col(g, x, col)
				Sgemm(false, true, l.o, kdim, cols, 1, dy, cols, col, cols, 0, dw, kdim)
			}
			report(b)
		})
		b.Run(name+"/wgrad/implicit", func(b *testing.B) {
			for range b.N {
				SgemmIm2colT(l.o, 1, dy, cols, g, x, 0, dw, kdim)
			}
			report(b)
		})
		b.Run(name+"/wgrad/nhwc", func(b *testing.B) {
			for range b.N {
				ConvWeightGrad(g, x, dy, l.o, cols, dw)
			}
			report(b)
		})
	}
}

// The flipped-kernel GEMM reads the transposed convolution's weight straight
// from the stored kernel; it must match an explicitly flipped kernel + SgemmIm2col bit for bit.
func TestSgemmFlippedKernelIm2col(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, tc := range []struct{ out, in, n, h, w, k, pad int }{
			{3, 2, 2, 5, 6, 3, 1}, {4, 3, 1, 3, 3, 1, 0}, {2, 2, 1, 6, 5, 5, 2}, {64, 64, 4, 16, 16, 3, 1},
			{40, 300, 2, 4, 4, 3, 1}, {5, 9, 3, 40, 40, 3, 0}, {16, 7, 2, 2, 2, 3, 2}, {2, 11, 1, 10, 10, 9, 4}, // 9×9: the plain path
		} {
			g := ConvGeom{N: tc.n, C: tc.out, H: tc.h, W: tc.w, KH: tc.k, KW: tc.k, PadH: tc.pad, PadW: tc.pad, StrideH: 1, StrideW: 1}
			w := randSlice(r, tc.out*tc.in*tc.k*tc.k)
			dy := randSlice(r, tc.n*tc.out*tc.h*tc.w)
			wt := make([]float32, len(w))
			flipTransposeKernel(wt, w, tc.out, tc.in, tc.k*tc.k)
			cols := g.ColCols()
			want := make([]float32, tc.in*cols)
			got := randSlice(r, tc.in*cols) // overwritten (beta 0)
			SgemmIm2col(tc.in, 1, wt, tc.out*tc.k*tc.k, g, dy, 0, want, cols)
			SgemmFlippedKernelIm2col(w, tc.out, tc.in, g, dy, got, cols)
			assertBitEqual(t, fmt.Sprintf("%+v", tc), got, want)
		}
	})
}

// flipTransposeKernel writes w [out, in, kk] as [in, out, kk] with each kernel
// rotated by 180°, plainly.
func flipTransposeKernel(dst, w []float32, out, in, kk int) {
	for o := range out {
		for c := range in {
			for q := range kk {
				dst[(c*out+o)*kk+kk-1-q] = w[(o*in+c)*kk+q]
			}
		}
	}
}
