package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// naiveConv computes y[n,o,h,w] = Σ x[n,c,h·s-p+i,w·s-p+j]·k(o,c,i,j) (+ bias)
// in float64, with a magnitude bound for the tolerance.
func naiveConv(g ConvGeom, x []float32, kern func(o, c, i, j int) float32, m int, bias []float32) (want, mag []float64) {
	oh, ow := g.OutH(), g.OutW()
	want = make([]float64, g.N*m*oh*ow)
	mag = make([]float64, len(want))
	for n := range g.N {
		for o := range m {
			for yy := range oh {
				for xx := range ow {
					var s, a float64
					if bias != nil {
						s, a = float64(bias[o]), math.Abs(float64(bias[o]))
					}
					for c := range g.C {
						for i := range g.KH {
							for j := range g.KW {
								h, w := yy*g.StrideH-g.PadH+i, xx*g.StrideW-g.PadW+j
								if h < 0 || h >= g.H || w < 0 || w >= g.W {
									continue
								}
								p := float64(x[((n*g.C+c)*g.H+h)*g.W+w]) * float64(kern(o, c, i, j))
								s += p
								a += math.Abs(p)
							}
						}
					}
					idx := ((n*m+o)*oh+yy)*ow + xx
					want[idx], mag[idx] = s, a
				}
			}
		}
	}
	return want, mag
}

func TestWinogradConv3x3(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, tc := range []struct{ n, k, m, h, w, pad int }{
			{1, 1, 1, 3, 3, 0}, {1, 1, 1, 3, 3, 1}, {2, 3, 4, 5, 6, 1}, {1, 2, 3, 7, 4, 0}, {2, 4, 2, 2, 2, 1},
			{1, 3, 5, 1, 1, 1}, {3, 2, 2, 6, 5, 2}, {1, 1, 1, 4, 4, 2}, {2, 16, 24, 8, 8, 1}, {1, 40, 9, 9, 11, 1},
		} {
			for _, flip := range []bool{false, true} {
				for _, acc := range []bool{false, true} {
					g := ConvGeom{N: tc.n, C: tc.k, H: tc.h, W: tc.w, KH: 3, KW: 3, PadH: tc.pad, PadW: tc.pad, StrideH: 1, StrideW: 1}
					x := randSlice(r, tc.n*tc.k*tc.h*tc.w)
					w := randSlice(r, tc.m*tc.k*9)
					var bias []float32
					if !flip {
						bias = randSlice(r, tc.m)
					}
					kern := func(o, c, i, j int) float32 { return w[((o*tc.k+c)*3+i)*3+j] }
					if flip { // w stored [k, m, 3, 3]
						kern = func(o, c, i, j int) float32 { return w[((c*tc.m+o)*3+2-i)*3+2-j] }
					}
					want, mag := naiveConv(g, x, kern, tc.m, bias)
					y := randSlice(r, len(want))
					y0 := append([]float32(nil), y...)
					WinogradConv3x3(g, x, w, tc.m, flip, bias, y, acc)
					for i := range want {
						exp := want[i]
						if acc {
							exp += float64(y0[i])
						}
						tol := 1e-5*(mag[i]+math.Abs(exp)) + 1e-6
						if d := math.Abs(float64(y[i]) - exp); !(d <= tol) {
							t.Fatalf("%+v flip=%v acc=%v: y[%d] = %g, want %g (tol %g)", tc, flip, acc, i, y[i], exp, tol)
						}
					}
				}
			}
		}
	})
}

func TestWinogradOK(t *testing.T) {
	ok := ConvGeom{N: 1, C: 1, H: 4, W: 4, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
	if !WinogradOK(ok) {
		t.Fatal("3×3 stride 1 pad 1 rejected")
	}
	for _, mod := range []func(*ConvGeom){
		func(g *ConvGeom) { g.KH, g.KW = 5, 5 },
		func(g *ConvGeom) { g.StrideH, g.StrideW = 2, 2 },
		func(g *ConvGeom) { g.PadW = 0 },
		func(g *ConvGeom) { g.PadH, g.PadW = 3, 3 },
	} {
		g := ok
		mod(&g)
		if WinogradOK(g) {
			t.Errorf("%+v accepted", g)
		}
	}
}

// BenchmarkConv3x3 compares Winograd with the implicit-im2col GEMM for the
// VGG CIFAR layers at batch 32 (forward pass; GFLOP/s counts direct-convolution flops):
//
//	go test -run '^$' -bench Conv3x3 ./internal/kernels/
func BenchmarkConv3x3(b *testing.B) {
	type layer struct{ c, o, hw int }
	for _, l := range []layer{{64, 64, 32}, {128, 128, 16}, {256, 256, 8}, {512, 512, 4}, {512, 512, 2}} {
		g := ConvGeom{N: 32, C: l.c, H: l.hw, W: l.hw, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
		r := rand.New(rand.NewPCG(1, 1))
		x := randSlice(r, g.N*g.C*g.H*g.W)
		w := randSlice(r, l.o*l.c*9)
		cols := g.ColCols()
		out := make([]float32, l.o*cols)
		flops := 2 * float64(l.o) * float64(g.ColRows()) * float64(cols)
		name := fmt.Sprintf("c%d_o%d_hw%d", l.c, l.o, l.hw)
		b.Run(name+"/implicit", func(b *testing.B) {
			for range b.N {
				SgemmIm2col(l.o, 1, w, g.ColRows(), g, x, 0, out, cols)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(name+"/winograd", func(b *testing.B) {
			for range b.N {
				WinogradConv3x3(g, x, w, l.o, false, nil, out, false)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
