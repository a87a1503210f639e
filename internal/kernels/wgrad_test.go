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
				ldd := g.ColCols() + 3
				x, dy, dw, want, tol := wgradCase(r, g, m, ldd)
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
		fill := func(n int) []float32 { return randSpecials(r, n) }
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

// wgradCase draws an input x of geometry g, an output gradient dy of m rows
// with row stride ldd and a starting dw, and returns them with the float64
// reference of dw + dy·im2col(x)ᵀ and its tolerances.
func wgradCase(r *rand.Rand, g ConvGeom, m, ldd int) (x, dy, dw []float32, want, tol []float64) {
	x = randSlice(r, g.N*g.C*g.H*g.W)
	kdim, cols := g.ColRows(), g.ColCols()
	dy = randSlice(r, m*ldd)
	dw = randSlice(r, m*kdim)
	col := make([]float32, kdim*cols)
	Im2col(g, x, col)
	want, tol = naiveSgemm(false, true, m, kdim, cols, 1, dy, ldd, col, cols, 1, dw, kdim)
	return x, dy, dw, want, tol
}

// TestConvWeightGradChunkedK covers ConvWeightGradNHWC's split of a long
// reduction into fixed chunks (small C, more than wgradKChunk pixels): the
// result against the float64 reference, with a non-zero dw and a row stride
// of dY larger than its width, and the same bits for every goroutine count.
func TestConvWeightGradChunkedK(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(15, 16))
		for _, g := range []ConvGeom{
			{N: 3, C: 16, H: 32, W: 32, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}, // 3,072 pixels: 2 chunks
			{N: 8, C: 32, H: 32, W: 32, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2}, // 2,048: 1 chunk
			{N: 9, C: 24, H: 31, W: 29, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}, // 8,091: 4 chunks, a short last one
			{N: 5, C: 16, H: 20, W: 24, KH: 1, KW: 1, PadH: 0, PadW: 0, StrideH: 1, StrideW: 1}, // 1×1
		} {
			for _, m := range []int{5, 16, 32} {
				name := fmt.Sprintf("%+v/m%d", g, m)
				ldd := g.ColCols() + 5
				x, dy, dw0, want, tol := wgradCase(r, g, m, ldd)
				xp := make([]float32, PaddedLen(g))
				PadNHWC(g, x, xp)
				var first []float32
				for _, procs := range []int{1, 2, 3, 8} {
					dw := append([]float32(nil), dw0...)
					withProcs(procs, func() { ConvWeightGradNHWC(g, xp, dy, m, ldd, dw) })
					for i := range want {
						if d := math.Abs(float64(dw[i]) - want[i]); !(d <= tol[i]) {
							t.Fatalf("%s, %d goroutines: dw[%d] = %g, want %g (tol %g)", name, procs, i, dw[i], want[i], tol[i])
						}
					}
					if first == nil {
						first = dw
					} else if !sameBits(dw, first) {
						t.Fatalf("%s: %d goroutines give other bits than 1", name, procs)
					}
				}
			}
		}
	})
}

// BenchmarkConvWeightGrad times ConvWeightGradNHWC at ResNet's batch-32 CIFAR
// 3×3 shapes (a small dw over 2,048–32,768 pixels), a VGG one and 24 channels
// (a multiple of half an AVX2 tile only, as 16 is of an AVX-512 one); "packed"
// is the route without the B-indirect kernel:
//
//	go test -run '^$' -bench ConvWeightGrad ./internal/kernels/
func BenchmarkConvWeightGrad(b *testing.B) {
	for _, l := range []struct{ c, o, hw int }{{16, 16, 32}, {32, 32, 16}, {64, 64, 8}, {256, 256, 8}, {24, 24, 16}} {
		g := ConvGeom{N: 32, C: l.c, H: l.hw, W: l.hw, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
		r := rand.New(rand.NewPCG(1, 1))
		xp := make([]float32, PaddedLen(g))
		PadNHWC(g, randSlice(r, g.N*g.C*g.H*g.W), xp)
		cols := g.ColCols()
		dy := randSlice(r, l.o*cols)
		dw := make([]float32, l.o*g.ColRows())
		// dY as the layer's gradient: NCHW planes, or channels-last rows.
		for _, layout := range []string{"planes", "rows", "rows_packed"} {
			b.Run(fmt.Sprintf("c%d_o%d_hw%d_%s", l.c, l.o, l.hw, layout), func(b *testing.B) {
				if layout == "rows_packed" {
					p := *impl
					p.bIndirect, p.bIndirectRows = nil, nil
					defer func(old *gemmImpl) { impl = old }(impl)
					impl = &p
				}
				for range b.N {
					if layout != "planes" {
						ConvWeightGradNHWCRows(g, xp, dy, l.o, dw)
					} else {
						ConvWeightGradNHWCPlanes(g, xp, dy, l.o, dw)
					}
				}
				b.ReportMetric(2*float64(l.o*g.ColRows()*cols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// TestBIndirectRows checks the edge micro-kernels of the weight gradient
// (gemmImpl.bIndirectRows: the last rows of an M that is not a multiple of
// the tile's) against the scratch-tile path they replace, bit for bit, for
// every edge height.
func TestBIndirectRows(t *testing.T) {
	for _, name := range availableImpls() {
		p := implTable[name]
		if p.bIndirectRows == nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			defer setImpl(name)()
			r := rand.New(rand.NewPCG(17, 18))
			g := ConvGeom{N: 2, C: 2 * p.nr, H: 9, W: 11, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
			xp := make([]float32, PaddedLen(g))
			PadNHWC(g, randSlice(r, g.N*g.C*g.H*g.W), xp)
			cols := g.ColCols()
			for m := 1; m <= 3*p.mr; m++ {
				dy := randSlice(r, m*cols)
				dw0 := randSlice(r, m*g.ColRows())
				got := append([]float32(nil), dw0...)
				ConvWeightGradNHWC(g, xp, dy, m, cols, got)
				scratch := *p
				scratch.bIndirectRows = nil
				impl = &scratch
				want := append([]float32(nil), dw0...)
				ConvWeightGradNHWC(g, xp, dy, m, cols, want)
				impl = p
				if !sameBits(got, want) {
					t.Fatalf("m %d: the edge kernels give other bits than the scratch tile", m)
				}
			}
		})
	}
}

// TestConvWeightGradHalfSlivers: with channels a multiple of half a tile but not
// of a tile (16 on AVX-512, 8 or 24 on AVX2), the B-indirect kernel reads each
// sliver as two runs of channels (the second from the next tap, or an edge's first
// half twice) and gives the bits of the packed route it replaces, written into dw
// and added to it, with M edges, on every implementation.
func TestConvWeightGradHalfSlivers(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(19, 20))
		h := impl.nr / 2
		for _, g := range []ConvGeom{
			{N: 2, C: h, H: 9, W: 11, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 3, C: 3 * h, H: 7, W: 5, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2},
			{N: 1, C: h, H: 6, W: 6, KH: 2, KW: 3, PadH: 0, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 2, C: 5 * h, H: 5, W: 4, KH: 1, KW: 1, StrideH: 1, StrideW: 1},
		} {
			if g.C%impl.nr == 0 {
				t.Fatalf("%+v: channels a multiple of the tile", g)
			}
			xp := make([]float32, PaddedLen(g))
			PadNHWC(g, randSlice(r, g.N*g.C*g.H*g.W), xp)
			cols := g.ColCols()
			for _, m := range []int{impl.mr - 1, 2*impl.mr + 1} {
				dy := randSlice(r, m*cols)
				dw0 := randSlice(r, m*g.ColRows())
				var out [2][]float32 // read in place, packed
				for k := range out {
					func() {
						p := *impl
						if k == 1 {
							p.bIndirect, p.bIndirectRows = nil, nil
						}
						old := impl
						impl = &p
						defer func() { impl = old }()
						out[k] = append([]float32(nil), dw0...)
						ConvWeightGradNHWC(g, xp, dy, m, cols, out[k])
					}()
				}
				if i := firstBitDiff(out[0], out[1]); i >= 0 {
					t.Fatalf("%+v m=%d: dw[%d] = %v in place, %v packed", g, m, i, out[0][i], out[1][i])
				}
			}
		}
	})
}

// TestConvWeightGradNHWCPlanes checks that reading dY as the layer's NCHW
// gradient gives the bits of ConvWeightGradNHWC on its [M, N·OH·OW] copy:
// maps whose planes are smaller than a KC block, odd ones, long reductions
// split into chunks, on every implementation and goroutine count.
func TestConvWeightGradNHWCPlanes(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(19, 20))
		for _, g := range []ConvGeom{
			{N: 5, C: 16, H: 8, W: 8, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 3, C: 32, H: 5, W: 7, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 7, C: 16, H: 4, W: 4, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2},
			{N: 3, C: 16, H: 32, W: 32, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 4, C: 20, H: 9, W: 6, KH: 1, KW: 1, PadH: 0, PadW: 0, StrideH: 1, StrideW: 1},
		} {
			for _, m := range []int{3, 16, 40} {
				name := fmt.Sprintf("%+v/m%d", g, m)
				plane, cols := g.OutH()*g.OutW(), g.ColCols()
				xp := make([]float32, PaddedLen(g))
				PadNHWC(g, randSlice(r, g.N*g.C*g.H*g.W), xp)
				dy := randSlice(r, g.N*m*plane)
				dyT := make([]float32, len(dy))
				NCToCN(dyT, dy, g.N, m, plane)
				dw0 := randSlice(r, m*g.ColRows())
				want := append([]float32(nil), dw0...)
				ConvWeightGradNHWC(g, xp, dyT, m, cols, want)
				for _, procs := range []int{1, 3} {
					got := append([]float32(nil), dw0...)
					withProcs(procs, func() { ConvWeightGradNHWCPlanes(g, xp, dy, m, got) })
					if !sameBits(got, want) {
						t.Fatalf("%s, %d goroutines: other bits than from the [M, N·OH·OW] copy", name, procs)
					}
				}
			}
		}
	})
}
