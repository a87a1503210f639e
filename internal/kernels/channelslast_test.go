package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// bitDiff returns the first index where a and b differ in their bits, or -1.
func bitDiff(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestChannelsLastLayout checks PadNHWCFromNHWC against PadNHWC of the NCHW
// image, and NCHWToNHWC against the loop, bit for bit.
func TestChannelsLastLayout(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(31, 32))
		for _, g := range convNHWCCases {
			x := randSpecials(r, g.N*g.C*g.H*g.W)
			want := make([]float32, PaddedLen(g))
			PadNHWC(g, x, want)
			xl := toNHWC(x, g.N, g.C, g.H*g.W)
			got := randSlice(r, len(want))
			PadNHWCFromNHWC(g, xl, got)
			if i := bitDiff(got, want); i >= 0 {
				t.Fatalf("PadNHWCFromNHWC %+v: element %d = %v, want %v", g, i, got[i], want[i])
			}
			got = randSlice(r, len(x))
			NCHWToNHWC(got, x, g.N, g.C, g.H*g.W)
			if i := bitDiff(got, xl); i >= 0 {
				t.Fatalf("NCHWToNHWC %+v: element %d = %v, want %v", g, i, got[i], xl[i])
			}
		}
	})
}

// TestConvWeightGradNHWCRows checks the weight gradient from a channels-last
// dY against ConvWeightGradNHWC of its [M, N·OH·OW] transpose: the same
// bits, at 1 and 3 goroutines, including chunked reductions.
func TestConvWeightGradNHWCRows(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(33, 34))
		cases := append([]ConvGeom{
			{N: 3, C: 16, H: 32, W: 32, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
			{N: 4, C: 32, H: 16, W: 16, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2},
		}, convNHWCCases...)
		for _, g := range cases {
			for _, m := range []int{1, 16, 37} {
				x := randSlice(r, g.N*g.C*g.H*g.W)
				xp := make([]float32, PaddedLen(g))
				PadNHWC(g, x, xp)
				plane := g.OutH() * g.OutW()
				dyT := randSlice(r, m*g.N*plane) // [m, N·plane]
				dy := make([]float32, len(dyT))  // [N·plane, m]
				for o := range m {
					for p := range g.N * plane {
						dy[p*m+o] = dyT[o*g.N*plane+p]
					}
				}
				dw0 := randSlice(r, m*g.ColRows())
				want := append([]float32(nil), dw0...)
				ConvWeightGradNHWC(g, xp, dyT, m, g.N*plane, want)
				for _, procs := range []int{1, 3} {
					got := append([]float32(nil), dw0...)
					withProcs(procs, func() { ConvWeightGradNHWCRows(g, xp, dy, m, got) })
					if i := bitDiff(got, want); i >= 0 {
						t.Fatalf("%+v m=%d procs=%d: dw[%d] = %v, want %v", g, m, procs, i, got[i], want[i])
					}
				}
			}
		}
	})
}

// naiveInputGradNHWC is the float64 input gradient of a convolution with
// weight w [m, C, KH, KW], dy [N·OH·OW, m] and dx [N, H, W, C], with the
// sum of the products' magnitudes for the tolerance.
func naiveInputGradNHWC(g ConvGeom, dy, w []float32, m int) (want, mag []float64) {
	oh, ow := g.OutH(), g.OutW()
	want = make([]float64, g.N*g.H*g.W*g.C)
	mag = make([]float64, len(want))
	for n := range g.N {
		for y := range oh {
			for xo := range ow {
				for o := range m {
					d := float64(dy[((n*oh+y)*ow+xo)*m+o])
					for i := range g.KH {
						for j := range g.KW {
							ih, iw := y*g.StrideH-g.PadH+i, xo*g.StrideW-g.PadW+j
							if ih < 0 || ih >= g.H || iw < 0 || iw >= g.W {
								continue
							}
							for c := range g.C {
								p := d * float64(w[((o*g.C+c)*g.KH+i)*g.KW+j])
								q := ((n*g.H+ih)*g.W+iw)*g.C + c
								want[q] += p
								mag[q] += math.Abs(p)
							}
						}
					}
				}
			}
		}
	}
	return want, mag
}

// TestConvInputGradNHWC checks the channels-last input gradient against the
// float64 reference for strided, padded and 1×1 convolutions, overwriting
// and accumulating, and the same bits at 1 and 3 goroutines.
func TestConvInputGradNHWC(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(35, 36))
		cases := append([]ConvGeom{
			{N: 3, C: 16, H: 16, W: 16, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2},
			{N: 2, C: 64, H: 8, W: 8, KH: 1, KW: 1, StrideH: 2, StrideW: 2},
			{N: 2, C: 3, H: 9, W: 9, KH: 7, KW: 7, PadH: 3, PadW: 3, StrideH: 2, StrideW: 2},
		}, convNHWCCases...)
		for _, g := range cases {
			for _, m := range []int{1, 16, 33} {
				name := fmt.Sprintf("%+v m=%d", g, m)
				plane := g.OutH() * g.OutW()
				dy := randSlice(r, g.N*plane*m)
				w := randSlice(r, m*g.ColRows())
				want, mag := naiveInputGradNHWC(g, dy, w, m)
				dx0 := randSlice(r, len(want))
				var first []float32
				for _, procs := range []int{1, 3} {
					for _, acc := range []bool{false, true} {
						dx := append([]float32(nil), dx0...)
						withProcs(procs, func() { ConvInputGradNHWC(g, dy, w, m, dx, acc) })
						for i, v := range dx {
							base := 0.0
							if acc {
								base = float64(dx0[i])
							}
							if math.Abs(float64(v)-base-want[i]) > 1e-5*(mag[i]+math.Abs(base))+1e-7 {
								t.Fatalf("%s acc=%v: dx[%d] = %v, want %v", name, acc, i, v, base+want[i])
							}
						}
						if !acc {
							if first == nil {
								first = dx
							} else if i := bitDiff(dx, first); i >= 0 {
								t.Fatalf("%s: procs=%d changes dx[%d]", name, procs, i)
							}
						}
					}
				}
			}
		}
	})
}

// TestBiasNHWC checks AddBiasNHWC and BiasGradNHWC against float64 sums,
// and BiasGradNHWC's bits on 1 and 3 goroutines.
func TestBiasNHWC(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(37, 38))
		for _, s := range [][2]int{{1, 1}, {7, 3}, {1000, 16}, {513, 64}, {5000, 40}} {
			rows, c := s[0], s[1]
			y := randSlice(r, rows*c)
			bias := randSlice(r, c)
			got := append([]float32(nil), y...)
			AddBiasNHWC(got, bias)
			for i, v := range got {
				if v != y[i]+bias[i%c] {
					t.Fatalf("AddBiasNHWC %v: element %d = %v, want %v", s, i, v, y[i]+bias[i%c])
				}
			}
			db := randSlice(r, c)
			db0 := append([]float32(nil), db...)
			withProcs(3, func() { BiasGradNHWC(db, y) })
			db1 := append([]float32(nil), db0...)
			withProcs(1, func() { BiasGradNHWC(db1, y) })
			if i := bitDiff(db1, db); i >= 0 {
				t.Fatalf("BiasGradNHWC %v: 1 and 3 goroutines differ at %d", s, i)
			}
			for ch := range c {
				want, mag := float64(db0[ch]), math.Abs(float64(db0[ch]))
				for q := range rows {
					want += float64(y[q*c+ch])
					mag += math.Abs(float64(y[q*c+ch]))
				}
				if math.Abs(float64(db[ch])-want) > 1e-6*mag+1e-7 {
					t.Fatalf("BiasGradNHWC %v: db[%d] = %v, want %v", s, ch, db[ch], want)
				}
			}
		}
	})
}

// TestConvNHWCAdd checks that ConvNHWCAdd adds ConvNHWC's result to y
// (to rounding: the blocks' sums are added to y one by one), with and
// without flip, on every implementation.
func TestConvNHWCAdd(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(39, 40))
		for _, g := range convNHWCCases {
			for _, m := range []int{1, 16, 40} {
				for _, flip := range []bool{false, true} {
					xp := randSlice(r, PaddedLen(g))
					w := randSlice(r, m*g.ColRows())
					pix := g.N * g.OutH() * g.OutW()
					conv := make([]float32, pix*m)
					ConvNHWC(g, xp, w, m, flip, conv)
					y0 := randSlice(r, pix*m)
					y := append([]float32(nil), y0...)
					ConvNHWCAdd(g, xp, w, m, flip, y)
					for i, v := range y {
						want := float64(y0[i]) + float64(conv[i])
						if math.Abs(float64(v)-want) > 1e-5*(math.Abs(float64(y0[i]))+float64(g.ColRows())) {
							t.Fatalf("%+v m=%d flip=%v: y[%d] = %v, want %v", g, m, flip, i, v, want)
						}
					}
				}
			}
		}
	})
}

// TestChannelsLastAllocations checks the channels-last passes' allocations
// once warm: none but the one closure of a parallelFor (as PadNHWC's).
func TestChannelsLastAllocations(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	g := ConvGeom{N: 8, C: 64, H: 8, W: 8, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2}
	m := 64
	x := randSlice(r, g.N*g.C*g.H*g.W)
	xp := make([]float32, PaddedLen(g))
	pix := g.N * g.OutH() * g.OutW()
	dy, w := randSlice(r, pix*m), randSlice(r, m*g.ColRows())
	dw, dx, db := make([]float32, len(w)), make([]float32, len(x)), make([]float32, m)
	g1 := g
	g1.StrideH, g1.StrideW = 1, 1
	y1 := make([]float32, g.N*g.H*g.W*m)
	for _, tc := range []struct {
		name string
		max  float64
		f    func()
	}{
		{"PadNHWCFromNHWC", 1, func() { PadNHWCFromNHWC(g, x, xp) }},
		{"AddBiasNHWC", 1, func() { AddBiasNHWC(dy, db) }},
		{"BiasGradNHWC", 1, func() { BiasGradNHWC(db, dy) }},
		{"ConvWeightGradNHWCRows", 1, func() { ConvWeightGradNHWCRows(g, xp, dy, m, dw) }},
		{"ConvInputGradNHWC", 1, func() { ConvInputGradNHWC(g, dy, w, m, dx, true) }},
		{"ConvNHWCAdd", 0, func() { ConvNHWCAdd(g1, xp, w, m, false, y1) }},
	} {
		for range 3 { // let every pool worker take its workspace once
			tc.f()
		}
		if got := testing.AllocsPerRun(10, tc.f); got > tc.max {
			t.Errorf("%s: %v allocations per call, want at most %v", tc.name, got, tc.max)
		}
	}
}
