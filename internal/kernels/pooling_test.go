package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refMaxPool is the plain reference (PyTorch's rule: first maximum in row-major
// window order, a NaN always replaces the choice; padding is −∞).
func refMaxPool(g PoolGeom, x []float32) ([]float32, []int32) {
	oh, ow := g.OutH(), g.OutW()
	y := make([]float32, g.Planes*oh*ow)
	arg := make([]int32, len(y))
	for p := 0; p < g.Planes; p++ {
		src := x[p*g.H*g.W:]
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				best, bi := float32(math.Inf(-1)), int32(-1)
				for a := 0; a < g.K; a++ {
					for b := 0; b < g.K; b++ {
						r, q := i*g.Stride-g.Pad+a, j*g.Stride-g.Pad+b
						if r < 0 || r >= g.H || q < 0 || q >= g.W {
							continue
						}
						if v := src[r*g.W+q]; bi < 0 || v > best || v != v {
							best, bi = v, int32(r*g.W+q)
						}
					}
				}
				y[(p*oh+i)*ow+j], arg[(p*oh+i)*ow+j] = best, bi
			}
		}
	}
	return y, arg
}

var poolGeoms = []PoolGeom{
	{1, 2, 2, 2, 2, 0}, {1, 1, 5, 1, 1, 0}, {2, 4, 6, 2, 2, 0}, {3, 5, 7, 2, 2, 0}, {1, 3, 3, 2, 2, 0},
	{5, 32, 32, 2, 2, 0}, {2, 33, 65, 2, 2, 0}, {3, 16, 16, 2, 2, 0}, {4, 9, 30, 2, 2, 0}, {2, 7, 34, 2, 2, 0},
	{2, 5, 5, 3, 2, 1}, {3, 7, 6, 3, 1, 1}, {1, 8, 8, 2, 1, 0}, {2, 6, 9, 3, 3, 0}, {1, 4, 4, 4, 1, 2},
	{3, 11, 13, 5, 2, 2}, {1, 2, 3, 2, 2, 1}, {64, 4, 4, 2, 2, 0}, {9, 2, 2, 2, 2, 0},
}

// poolInput returns random values with ties (small integers) and, when nan, a few NaNs.
func poolInput(r *rand.Rand, n int, nan bool) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch k := r.IntN(10); {
		case k < 3:
			x[i] = float32(r.IntN(3)) // ties
		case k == 3 && nan && r.IntN(8) == 0:
			x[i] = float32(math.NaN())
		default:
			x[i] = float32(r.NormFloat64())
		}
	}
	return x
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func TestMaxPool2d(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(21, 22))
		for _, g := range poolGeoms {
			for _, nan := range []bool{false, true} {
				name := fmt.Sprintf("%+v nan=%v", g, nan)
				x := poolInput(r, g.Planes*g.H*g.W, nan)
				wy, warg := refMaxPool(g, x)
				y := make([]float32, len(wy))
				arg := make([]int32, len(wy))
				MaxPool2dForward(g, y, arg, x)
				if !sameBits(y, wy) || !slices.Equal(arg, warg) {
					t.Fatalf("%s: forward differs\n got %v %v\nwant %v %v", name, y, arg, wy, warg)
				}
				dy := randSlice(r, len(y))
				for _, acc := range []bool{false, true} {
					dx0 := randSlice(r, len(x))
					want := make([]float32, len(x))
					if acc {
						copy(want, dx0)
					}
					hw, ohw := g.H*g.W, g.OutH()*g.OutW()
					for k, v := range dy {
						want[(k/ohw)*hw+int(warg[k])] += v
					}
					dx := clone(dx0)
					MaxPool2dBackward(g, dx, dy, arg, acc)
					if !slices.Equal(dx, want) {
						t.Fatalf("%s acc=%v: backward differs", name, acc)
					}
				}
			}
		}
	})
}

func TestMaxPool2x2RowAllLengths(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(23, 24))
		for n := 1; n <= 50; n++ {
			w := 2*n + r.IntN(3)
			x := poolInput(r, 2*w, true)
			g := PoolGeom{1, 2, w, 2, 2, 0}
			wy, warg := refMaxPool(g, x)
			y, arg := make([]float32, n+1), make([]int32, n+1)
			y[n], arg[n] = 42, 42 // must not be written
			impl.vec.maxPool2x2Row(y[:n], arg[:n], x[:2*n], x[w:w+2*n], 0, int32(w))
			if !sameBits(y[:n], wy[:n]) || !slices.Equal(arg[:n], warg[:n]) || y[n] != 42 || arg[n] != 42 {
				t.Fatalf("n=%d w=%d: got %v %v want %v %v", n, w, y, arg, wy, warg)
			}
		}
	})
}

func refAvgPool(g PoolGeom, x []float32) []float32 {
	oh, ow := g.OutH(), g.OutW()
	y := make([]float32, g.Planes*oh*ow)
	for p := 0; p < g.Planes; p++ {
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				r0, r1, q0, q1, div := g.avgWindow(i, j)
				var s float32
				for r := r0; r < r1; r++ {
					for q := q0; q < q1; q++ {
						s += x[p*g.H*g.W+r*g.W+q]
					}
				}
				y[(p*oh+i)*ow+j] = s / div
			}
		}
	}
	return y
}

func TestAvgPool2d(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, g := range poolGeoms {
		x := randSlice(r, g.Planes*g.H*g.W)
		want := refAvgPool(g, x)
		y := make([]float32, len(want))
		AvgPool2dForward(g, y, x)
		if !slices.Equal(y, want) {
			t.Fatalf("%+v: forward differs", g)
		}
		dy := randSlice(r, len(y))
		for _, acc := range []bool{false, true} {
			dx0 := randSlice(r, len(x))
			wdx := make([]float64, len(x))
			if acc {
				for i, v := range dx0 {
					wdx[i] = float64(v)
				}
			}
			oh, ow := g.OutH(), g.OutW()
			for p := 0; p < g.Planes; p++ {
				for i := 0; i < oh; i++ {
					for j := 0; j < ow; j++ {
						r0, r1, q0, q1, div := g.avgWindow(i, j)
						for rr := r0; rr < r1; rr++ {
							for q := q0; q < q1; q++ {
								wdx[p*g.H*g.W+rr*g.W+q] += float64(dy[(p*oh+i)*ow+j]) / float64(div)
							}
						}
					}
				}
			}
			dx := clone(dx0)
			AvgPool2dBackward(g, dx, dy, acc)
			for i := range dx {
				if !closeTo(dx[i], wdx[i], 1e-6, 1e-5) {
					t.Fatalf("%+v acc=%v: dx[%d] = %v, want %v", g, acc, i, dx[i], wdx[i])
				}
			}
		}
	}
}

func TestPoolBadGeometryPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("expected panic")
		}
	}()
	g := PoolGeom{1, 4, 4, 2, 2, 0}
	MaxPool2dForward(g, make([]float32, 3), make([]int32, 3), make([]float32, 16))
}

// BenchmarkMaxPool reports GB/s counting x read once, y and arg written once
// (forward) and dy, arg read and dx written once (backward).
func BenchmarkMaxPool(b *testing.B) {
	g := PoolGeom{32 * 64, 32, 32, 2, 2, 0}
	r := rand.New(rand.NewPCG(1, 1))
	x := randSlice(r, g.Planes*g.H*g.W)
	ny := g.Planes * g.OutH() * g.OutW()
	y, arg, dx := make([]float32, ny), make([]int32, ny), make([]float32, len(x))
	b.Run("forward/32x64x32x32", func(b *testing.B) {
		b.SetBytes(int64(4*len(x) + 8*ny))
		for b.Loop() {
			MaxPool2dForward(g, y, arg, x)
		}
	})
	b.Run("backward/32x64x32x32", func(b *testing.B) {
		b.SetBytes(int64(4*len(x) + 8*ny))
		for b.Loop() {
			MaxPool2dBackward(g, dx, y, arg, false)
		}
	})
}
