package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func naiveIm2col(g ConvGeom, x []float32) []float32 {
	oh, ow := g.OutH(), g.OutW()
	col := make([]float32, g.ColRows()*g.ColCols())
	for c := range g.C {
		for i := range g.KH {
			for j := range g.KW {
				r := (c*g.KH+i)*g.KW + j
				for n := range g.N {
					for y := range oh {
						for q := range ow {
							h, w := y*g.StrideH-g.PadH+i, q*g.StrideW-g.PadW+j
							var v float32
							if h >= 0 && h < g.H && w >= 0 && w < g.W {
								v = x[((n*g.C+c)*g.H+h)*g.W+w]
							}
							col[r*g.ColCols()+n*oh*ow+y*ow+q] = v
						}
					}
				}
			}
		}
	}
	return col
}

func naiveCol2im(g ConvGeom, col, dx []float32) {
	oh, ow := g.OutH(), g.OutW()
	for c := range g.C {
		for i := range g.KH {
			for j := range g.KW {
				r := (c*g.KH+i)*g.KW + j
				for n := range g.N {
					for y := range oh {
						for q := range ow {
							h, w := y*g.StrideH-g.PadH+i, q*g.StrideW-g.PadW+j
							if h >= 0 && h < g.H && w >= 0 && w < g.W {
								dx[((n*g.C+c)*g.H+h)*g.W+w] += col[r*g.ColCols()+n*oh*ow+y*ow+q]
							}
						}
					}
				}
			}
		}
	}
}

func convGeoms() []ConvGeom {
	var gs []ConvGeom
	for _, k := range [][2]int{{1, 1}, {3, 3}, {5, 5}, {3, 1}, {1, 5}} {
		for _, s := range [][2]int{{1, 1}, {2, 2}, {1, 2}} {
			for _, p := range [][2]int{{0, 0}, {1, 1}, {2, 2}, {1, 0}} {
				for _, hw := range [][2]int{{7, 7}, {8, 5}, {5, 9}, {32, 32}} {
					g := ConvGeom{N: 2, C: 3, H: hw[0], W: hw[1], KH: k[0], KW: k[1], PadH: p[0], PadW: p[1], StrideH: s[0], StrideW: s[1]}
					if g.H+2*g.PadH < g.KH || g.W+2*g.PadW < g.KW {
						continue
					}
					gs = append(gs, g)
				}
			}
		}
	}
	gs = append(gs, ConvGeom{N: 5, C: 16, H: 16, W: 16, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1})
	return gs
}

func TestIm2colCol2im(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, g := range convGeoms() {
		x := randSlice(r, g.N*g.C*g.H*g.W)
		col := make([]float32, g.ColRows()*g.ColCols())
		for i := range col {
			col[i] = float32(math.NaN())
		}
		Im2col(g, x, col)
		want := naiveIm2col(g, x)
		for i := range col {
			if math.Float32bits(col[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%+v: Im2col[%d] = %g, want %g", g, i, col[i], want[i])
			}
		}
		y := randSlice(r, len(col))
		dx := randSlice(r, len(x))
		dxWant := append([]float32(nil), dx...)
		Col2im(g, y, dx)
		naiveCol2im(g, y, dxWant)
		for i := range dx {
			if math.Abs(float64(dx[i]-dxWant[i])) > 1e-5*float64(1+g.KH*g.KW) {
				t.Fatalf("%+v: Col2im[%d] = %g, want %g", g, i, dx[i], dxWant[i])
			}
		}
		// adjoint: <Im2col(x), y> == <x, Col2im(y)>
		z := make([]float32, len(x))
		Col2im(g, y, z)
		var l, rr, mag float64
		for i := range col {
			l += float64(col[i]) * float64(y[i])
			mag += math.Abs(float64(col[i]) * float64(y[i]))
		}
		for i := range x {
			rr += float64(x[i]) * float64(z[i])
		}
		if math.Abs(l-rr) > 1e-5*mag+1e-6 {
			t.Fatalf("%+v: adjoint mismatch %g vs %g", g, l, rr)
		}
	}
}

func TestConvGeomPanics(t *testing.T) {
	g := ConvGeom{N: 1, C: 1, H: 4, W: 4, KH: 3, KW: 3, StrideH: 1, StrideW: 1}
	defer func() {
		if recover() == nil {
			t.Fatal("expected panic on short col")
		}
	}()
	Im2col(g, make([]float32, 16), make([]float32, 3))
}

func BenchmarkIm2col(b *testing.B) {
	for _, g := range []ConvGeom{
		{N: 32, C: 3, H: 32, W: 32, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
		{N: 32, C: 128, H: 16, W: 16, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1},
	} {
		x := make([]float32, g.N*g.C*g.H*g.W)
		col := make([]float32, g.ColRows()*g.ColCols())
		b.Run(fmt.Sprintf("im2col_C%d_H%d", g.C, g.H), func(b *testing.B) {
			b.SetBytes(int64(4 * len(col)))
			for b.Loop() {
				Im2col(g, x, col)
			}
		})
		b.Run(fmt.Sprintf("col2im_C%d_H%d", g.C, g.H), func(b *testing.B) {
			b.SetBytes(int64(4 * len(col)))
			for b.Loop() {
				Col2im(g, col, x)
			}
		})
	}
}
