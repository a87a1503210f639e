package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"syscall"
	"testing"
)

// processCPUSeconds is the CPU time (user + system, all threads) this
// process has used: on a shared machine, GFLOP per CPU-second is steadier
// than per wall-clock second.
func processCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// convNHWCCases cover odd sizes and the edges of the driver: pixel counts
// and output channels that are not multiples of the tile, channel counts
// above KC (split into chunks), below it (several taps per K block), one
// channel, strides, padding wider than the kernel, 1×1 and non-square
// kernels.
var convNHWCCases = []ConvGeom{
	{N: 1, C: 1, H: 1, W: 1, KH: 1, KW: 1, StrideH: 1, StrideW: 1},
	{N: 2, C: 3, H: 5, W: 6, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	{N: 3, C: 5, H: 7, W: 4, KH: 3, KW: 3, PadH: 0, PadW: 0, StrideH: 1, StrideW: 1},
	{N: 2, C: 16, H: 8, W: 8, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	{N: 4, C: 64, H: 4, W: 4, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	{N: 2, C: 300, H: 2, W: 3, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	{N: 3, C: 7, H: 9, W: 11, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2},
	{N: 1, C: 9, H: 6, W: 5, KH: 2, KW: 3, PadH: 2, PadW: 0, StrideH: 1, StrideW: 2},
	{N: 2, C: 33, H: 10, W: 10, KH: 1, KW: 1, StrideH: 1, StrideW: 1},
	{N: 1, C: 2, H: 2, W: 2, KH: 3, KW: 3, PadH: 2, PadW: 2, StrideH: 1, StrideW: 1},
	{N: 2, C: 513, H: 1, W: 2, KH: 1, KW: 2, PadH: 0, PadW: 0, StrideH: 1, StrideW: 1},
	// 16-wide rows (PadNHWC's direct tiles), 16×16 tiles across rows with a
	// scalar tail, and channel counts with a scalar remainder.
	{N: 2, C: 32, H: 3, W: 16, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	{N: 1, C: 18, H: 3, W: 20, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	// 8-wide rows with a channel remainder past the 8×8 tiles (AVX2's layout passes).
	{N: 2, C: 12, H: 3, W: 8, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	// ResNet's stride-2 16→32 block and a map of more pixels than a unit's rows
	// (units start mid-row, mid-image: the offset table's running position).
	{N: 3, C: 16, H: 12, W: 10, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2},
	{N: 2, C: 16, H: 16, W: 14, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
}

// TestConvNHWC checks ConvNHWC (and PadNHWC, NHWCToNCHW with bias and
// accumulation) against a float64 direct convolution on every
// implementation, for the forward and the flipped (input-gradient) kernel.
func TestConvNHWC(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		for _, g := range convNHWCCases {
			for _, m := range []int{1, 5, 16, 40, 48, 64} {
				for _, flip := range []bool{false, true} {
					name := fmt.Sprintf("%+v m=%d flip=%v", g, m, flip)
					x := randSlice(r, g.N*g.C*g.H*g.W)
					w := randSlice(r, m*g.C*g.KH*g.KW)
					kk := g.KH * g.KW
					kern := func(o, c, i, j int) float32 { return w[(o*g.C+c)*kk+i*g.KW+j] }
					if flip { // w is [C, m, KH, KW], rotated
						kern = func(o, c, i, j int) float32 { return w[(c*m+o)*kk+kk-1-(i*g.KW+j)] }
					}
					bias := randSlice(r, m)
					want, mag := naiveConv(g, x, kern, m, bias)
					xp := make([]float32, g.N*(g.H+2*g.PadH)*(g.W+2*g.PadW)*g.C)
					for i := range xp {
						xp[i] = float32(math.NaN()) // PadNHWC must write every element
					}
					PadNHWC(g, x, xp)
					plane := g.OutH() * g.OutW()
					y := randSlice(r, g.N*plane*m) // overwritten
					ConvNHWC(g, xp, w, m, flip, y)
					out := randSlice(r, len(y))
					prev := append([]float32(nil), out...)
					NHWCToNCHW(out, y, g.N, plane, m, bias, true)
					for i, v := range out {
						d := float64(v) - float64(prev[i]) - want[i]
						if math.Abs(d) > 1e-5*(mag[i]+1)+1e-6*math.Abs(float64(prev[i])) {
							t.Fatalf("%s: element %d = %v, want %v (+%v)", name, i, v, want[i], prev[i])
						}
					}
					for _, withBias := range []bool{true, false} {
						var bs []float32
						if withBias {
							bs = bias
						}
						NHWCToNCHW(out, y, g.N, plane, m, bs, false)
						for i, v := range out {
							var b float64
							if !withBias {
								b = float64(bias[(i/plane)%m])
							}
							if math.Abs(float64(v)+b-want[i]) > 1e-5*(mag[i]+1) {
								t.Fatalf("%s (bias %v): element %d = %v, want %v", name, withBias, i, v, want[i]-b)
							}
						}
					}
				}
			}
		}
	})
}

// TestConvNHWCNarrow: the slivers of at most half a tile's output channels
// (the narrow kernel, in place or through the scratch tile, written or added)
// give the bits of the full-width kernel, on every implementation.
func TestConvNHWCNarrow(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		if impl.indirectNarrow == nil {
			t.Fatalf("%s has no narrow indirect kernel", impl.name)
		}
		wide := *impl
		wide.indirectNarrow = nil
		r := rand.New(rand.NewPCG(11, 12))
		half := impl.nr / 2
		for _, g := range convNHWCCases {
			for _, m := range []int{half - 3, half, impl.nr + half, 2*impl.nr + 1} {
				for _, flip := range []bool{false, true} {
					xp := randSlice(r, PaddedLen(g))
					w := randSlice(r, m*g.ColRows())
					pix := g.N * g.OutH() * g.OutW()
					y0 := randSlice(r, pix*m)
					var out [2][2][]float32 // [narrow, wide][written, added]
					for k, p := range []*gemmImpl{impl, &wide} {
						func() {
							old := impl
							impl = p
							defer func() { impl = old }()
							out[k][0] = make([]float32, pix*m)
							ConvNHWC(g, xp, w, m, flip, out[k][0])
							out[k][1] = append([]float32(nil), y0...)
							ConvNHWCAdd(g, xp, w, m, flip, out[k][1])
						}()
					}
					for a, what := range []string{"ConvNHWC", "ConvNHWCAdd"} {
						if i := firstBitDiff(out[0][a], out[1][a]); i >= 0 {
							t.Fatalf("%s %+v m=%d flip=%v: element %d = %v narrow, %v wide", what, g, m, flip, i, out[0][a][i], out[1][a][i])
						}
					}
				}
			}
		}
	})
}

// TestConvNHWCMatchesPortable compares each implementation's indirect
// micro-kernel with the portable one on the VGG-like shapes, and checks
// that the result does not depend on the number of goroutines.
func TestConvNHWCMatchesPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, g := range []ConvGeom{
		{N: 8, C: 64, H: 8, W: 8, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
		{N: 8, C: 260, H: 2, W: 2, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
		{N: 3, C: 3, H: 13, W: 12, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
		// ResNet-20's 16- and 32-channel maps.
		{N: 4, C: 16, H: 32, W: 32, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
		{N: 4, C: 32, H: 16, W: 16, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	} {
		const m = 72
		x := randSlice(r, g.N*g.C*g.H*g.W)
		w := randSlice(r, m*g.C*9)
		xp := make([]float32, g.N*(g.H+2)*(g.W+2)*g.C)
		PadNHWC(g, x, xp)
		n := g.N * g.OutH() * g.OutW() * m
		run := func(name string, procs int) []float32 {
			defer setImpl(name)()
			y := make([]float32, n)
			withProcs(procs, func() { ConvNHWC(g, xp, w, m, false, y) })
			return y
		}
		ref := run("generic", 2)
		for _, name := range availableImpls() {
			one, two := run(name, 1), run(name, 2)
			assertBitEqual(t, fmt.Sprintf("%s %+v 1 vs 2 goroutines", name, g), one, two)
			for i := range ref {
				if d := math.Abs(float64(one[i] - ref[i])); d > 1e-4*(1+math.Abs(float64(ref[i]))) {
					t.Fatalf("%s %+v: element %d = %v, portable %v", name, g, i, one[i], ref[i])
				}
			}
		}
	}
}

// TestTranspose16 checks each implementation's 16×16 and 8×8 tile transposes against
// its definition, with strides wider than the tiles and several blocks.
func TestTranspose16(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, name := range availableImpls() {
		for _, tile := range []int{16, 8} {
			tr := implTable[name].vec.transpose16
			if tile == 8 {
				tr = implTable[name].vec.transpose8
			}
			if tr == nil {
				continue
			}
			for _, tc := range []struct{ ldd, lds, blocks int }{{16, 16, 1}, {19, 40, 2}, {16, 64, 4}, {33, 17, 1}, {8, 8, 3}, {9, 27, 3}} {
				if tc.ldd < tile { // overlapping destination columns

					continue
				}
				src := randSlice(r, (tile-1)*tc.lds+tile*tc.blocks)
				dst := randSlice(r, (tile*tc.blocks-1)*tc.ldd+tile)
				want := append([]float32(nil), dst...)
				for b := range tc.blocks {
					for i := range tile {
						for j := range tile {
							want[(tile*b+j)*tc.ldd+i] = src[i*tc.lds+tile*b+j]
						}
					}
				}
				tr(dst, tc.ldd, src, tc.lds, tc.blocks)
				assertBitEqual(t, fmt.Sprintf("%s %d×%d %+v", name, tile, tile, tc), dst, want)
			}
		}
	}
}

// ConvNHWC allocates nothing in the steady state (pooled job, workspaces and
// packing buffer); the layout passes allocate at most their parallelFor closure.
func TestConvNHWCAllocations(t *testing.T) {
	g := ConvGeom{N: 8, C: 64, H: 8, W: 8, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
	r := rand.New(rand.NewPCG(1, 2))
	x, w := randSlice(r, g.N*g.C*g.H*g.W), randSlice(r, 64*64*9)
	xp, y, out := make([]float32, PaddedLen(g)), make([]float32, g.N*64*64), make([]float32, g.N*64*64)
	for _, tc := range []struct {
		name string
		max  float64
		f    func()
	}{
		{"PadNHWC", 1, func() { PadNHWC(g, x, xp) }},
		{"ConvNHWC", 0, func() { ConvNHWC(g, xp, w, 64, false, y) }},
		{"ConvNHWC/flip", 0, func() { ConvNHWC(g, xp, w, 64, true, y) }},
		{"NHWCToNCHW", 1, func() { NHWCToNCHW(out, y, g.N, 64, 64, nil, false) }},
	} {
		for range 3 { // let every pool worker take its workspace once
			tc.f()
		}
		if got := testing.AllocsPerRun(20, tc.f); got > tc.max {
			t.Errorf("%s: %v allocations per call, want at most %v", tc.name, got, tc.max)
		}
	}
}

// TestConvNHWCErrors checks that wrong buffer sizes are refused with the geometry named.
func TestConvNHWCErrors(t *testing.T) {
	g := ConvGeom{N: 1, C: 2, H: 3, W: 3, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
	xp, w, y := make([]float32, 25*2), make([]float32, 4*2*9), make([]float32, 9*4)
	for name, f := range map[string]func(){
		"short image":  func() { ConvNHWC(g, xp[:49], w, 4, false, y) },
		"short weight": func() { ConvNHWC(g, xp, w[:70], 4, false, y) },
		"short y":      func() { ConvNHWC(g, xp, w, 4, false, y[:35]) },
		"pad dst":      func() { PadNHWC(g, make([]float32, 18), xp[:48]) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: accepted", name)
				}
			}()
			f()
		}()
	}
}

// BenchmarkConvPass compares the implicit-im2col GEMM with the indirect NHWC
// convolution for the VGG-16 and ResNet-20 CIFAR layers at batch 32, each with the layout
// passes a layer needs around it (NCHW in, NCHW out), for the forward pass
// and the stride-1 input gradient:
//
//	go test -run '^$' -bench ConvPass ./internal/kernels/
func BenchmarkConvPass(b *testing.B) {
	type layer struct{ c, o, hw int }
	for _, l := range []layer{{3, 64, 32}, {64, 64, 32}, {128, 128, 16}, {256, 256, 8}, {512, 512, 4}, {512, 512, 2},
		{16, 16, 32}, {32, 32, 16}, {64, 64, 8}} {
		g := ConvGeom{N: 32, C: l.c, H: l.hw, W: l.hw, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
		r := rand.New(rand.NewPCG(1, 1))
		x := randSlice(r, g.N*g.C*g.H*g.W)
		w := randSlice(r, l.o*l.c*9)
		plane := l.hw * l.hw
		cols := g.N * plane
		tmp := make([]float32, max(l.o, l.c)*cols)
		y := make([]float32, l.o*cols)
		dx := make([]float32, len(x))
		xp := make([]float32, g.N*(l.hw+2)*(l.hw+2)*max(l.c, l.o))
		gt := g // input gradient: dy has o channels
		gt.C = l.o
		flops := 2 * float64(l.o*l.c*9) * float64(cols)
		name := fmt.Sprintf("c%d_o%d_hw%d", l.c, l.o, l.hw)
		report := func(b *testing.B, cpu0 float64) {
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			b.ReportMetric(flops*float64(b.N)/(processCPUSeconds()-cpu0)/1e9, "GFLOP/cpu-s")
		}
		b.Run(name+"/fwd/im2col", func(b *testing.B) {
			cpu0 := processCPUSeconds()
			for range b.N {
				SgemmIm2col(l.o, 1, w, l.c*9, g, x, 0, tmp[:l.o*cols], cols)
				CNToNC(y, tmp[:l.o*cols], l.o, g.N, plane, nil, false)
			}
			report(b, cpu0)
		})
		b.Run(name+"/fwd/nhwc", func(b *testing.B) {
			cpu0 := processCPUSeconds()
			for range b.N {
				PadNHWC(g, x, xp[:g.N*(l.hw+2)*(l.hw+2)*l.c])
				ConvNHWC(g, xp[:g.N*(l.hw+2)*(l.hw+2)*l.c], w, l.o, false, tmp[:l.o*cols])
				NHWCToNCHW(y, tmp[:l.o*cols], g.N, plane, l.o, nil, false)
			}
			report(b, cpu0)
		})
		if l.c < 16 {
			continue
		}
		b.Run(name+"/dgrad/im2col", func(b *testing.B) {
			cpu0 := processCPUSeconds()
			for range b.N {
				SgemmFlippedKernelIm2col(w, l.o, l.c, gt, y, tmp[:l.c*cols], cols)
				CNToNC(dx, tmp[:l.c*cols], l.c, g.N, plane, nil, false)
			}
			report(b, cpu0)
		})
		b.Run(name+"/dgrad/nhwc", func(b *testing.B) {
			cpu0 := processCPUSeconds()
			for range b.N {
				PadNHWC(gt, y, xp[:g.N*(l.hw+2)*(l.hw+2)*l.o])
				ConvNHWC(gt, xp[:g.N*(l.hw+2)*(l.hw+2)*l.o], w, l.c, true, tmp[:l.c*cols])
				NHWCToNCHW(dx, tmp[:l.c*cols], g.N, plane, l.c, nil, false)
			}
			report(b, cpu0)
		})
	}
}

// A 3×3 convolution with padding 1 through the NHWC path: copy the image into
// the padded NHWC layout, convolve, and bring the result back to NCHW.
func ExampleConvNHWC() {
	g := ConvGeom{N: 1, C: 1, H: 3, W: 3, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	w := []float32{1, 1, 1, 1, 1, 1, 1, 1, 1} // [out 1, in 1, 3, 3]: neighbourhood sums
	xp := make([]float32, PaddedLen(g))
	PadNHWC(g, x, xp)
	yNHWC := make([]float32, 9)
	ConvNHWC(g, xp, w, 1, false, yNHWC)
	y := make([]float32, 9)
	NHWCToNCHW(y, yNHWC, 1, 9, 1, nil, false)
	fmt.Println(y)
	// Output: [12 21 16 27 45 33 24 39 28]
}

// TestNHWCToNCHWBits checks NHWCToNCHW bit for bit against the element loop
// dst = src (+ bias) or dst += src (+ bias) on every implementation and
// goroutine count, for channel counts on and off the transposes' tiles, maps
// smaller than a tile, maps of a tile plus a remainder and maps larger than
// the accumulating path's scratch block, with signed zeros, infinities and
// NaNs among the values.
func TestNHWCToNCHWBits(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(13, 14))
		fill := func(n int) []float32 { return randSpecials(r, n) }
		for _, c := range []int{5, 8, 16, 24, 64, 512} {
			for _, plane := range []int{4, 8, 9, 17, 64, 100, 1024} {
				for _, n := range []int{1, 3} {
					src, prev, bias := fill(n*plane*c), fill(n*plane*c), fill(c)
					for _, acc := range []bool{false, true} {
						for _, withBias := range []bool{false, true} {
							var bs []float32
							if withBias {
								bs = bias
							}
							want := append([]float32(nil), prev...)
							for img := range n {
								for ch := range c {
									for p := range plane {
										v := src[(img*plane+p)*c+ch]
										if bs != nil {
											v += bs[ch]
										}
										i := (img*c+ch)*plane + p
										if acc {
											v = want[i] + v
										}
										want[i] = v
									}
								}
							}
							for _, procs := range []int{1, 3} {
								got := append([]float32(nil), prev...)
								withProcs(procs, func() { NHWCToNCHW(got, src, n, plane, c, bs, acc) })
								for i := range want {
									if !sameValue(got[i], want[i]) {
										t.Fatalf("c %d, plane %d, n %d, accumulate %v, bias %v, %d goroutines: element %d = %g, want %g",
											c, plane, n, acc, withBias, procs, i, got[i], want[i])
									}
								}
							}
						}
					}
				}
			}
		}
	})
}

// sameValue reports whether x and y have the same bits, or are both NaN
// (which NaN an addition of two NaNs returns depends on the operand order
// an instruction takes).
func sameValue(x, y float32) bool {
	return math.Float32bits(x) == math.Float32bits(y) || x != x && y != y
}

// BenchmarkNHWCToNCHW times the layout pass after ConvNHWC at ResNet's batch-32
// CIFAR shapes, overwriting and accumulating (the input gradient of a layer
// whose input also feeds the residual path):
//
//	go test -run '^$' -bench NHWCToNCHW ./internal/kernels/
func BenchmarkNHWCToNCHW(b *testing.B) {
	for _, l := range []struct{ c, hw int }{{16, 32}, {32, 16}, {64, 8}, {256, 16}, {2048, 2}} {
		n, plane := 32, l.hw*l.hw
		src := randSlice(rand.New(rand.NewPCG(1, 2)), n*plane*l.c)
		dst := make([]float32, len(src))
		for _, acc := range []bool{false, true} {
			b.Run(fmt.Sprintf("c%d_hw%d/accumulate=%v", l.c, l.hw, acc), func(b *testing.B) {
				b.SetBytes(int64(len(src) * 4))
				for range b.N {
					NHWCToNCHW(dst, src, n, plane, l.c, nil, acc)
				}
			})
		}
	}
}

// randSpecials returns n normal values with one in eight replaced by a signed
// zero, an infinity or a NaN.
func randSpecials(r *rand.Rand, n int) []float32 {
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	s := randSlice(r, n)
	for i := range s {
		if r.IntN(8) == 0 {
			s[i] = special[r.IntN(len(special))]
		}
	}
	return s
}
