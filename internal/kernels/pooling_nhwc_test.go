package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// toNHWC transposes x, [n, c, hw], to [n, hw, c].
func toNHWC[T any](x []T, n, c, hw int) []T {
	out := make([]T, len(x))
	for i := range n {
		for ch := range c {
			for p := range hw {
				out[(i*hw+p)*c+ch] = x[(i*c+ch)*hw+p]
			}
		}
	}
	return out
}

// poolInputNHWC is poolInput with ±Inf and signed zeros besides the ties and NaNs.
func poolInputNHWC(r *rand.Rand, n int, special bool) []float32 {
	x := poolInput(r, n, special)
	if special {
		for i := range x {
			switch r.IntN(40) {
			case 0:
				x[i] = float32(math.Inf(1))
			case 1:
				x[i] = float32(math.Inf(-1))
			case 2:
				x[i] = float32(math.Copysign(0, -1))
			case 3:
				x[i] = 0
			}
		}
	}
	return x
}

// nhwcPoolGeoms are per-image geometries (Planes = images): the VGG 2×2/2 window,
// the ResNet stem's 3×3/2 pad 1, 3×3/1 pad 1, and others, with odd sizes.
var nhwcPoolGeoms = []PoolGeom{
	{2, 8, 8, 2, 2, 0}, {3, 7, 9, 2, 2, 0}, {1, 1, 2, 1, 1, 0}, {1, 2, 2, 2, 2, 0},
	{2, 8, 8, 3, 2, 1}, {3, 7, 5, 3, 2, 1}, {1, 9, 9, 3, 2, 1},
	{2, 6, 6, 3, 1, 1}, {3, 5, 7, 3, 1, 1}, {1, 4, 4, 4, 1, 2}, {2, 6, 9, 3, 3, 0},
	{1, 11, 13, 5, 2, 2}, {1, 8, 8, 2, 1, 0}, {1, 2, 3, 2, 2, 1}, {2, 10, 11, 9, 1, 4},
}

// sameFloats reports whether a and b are bit for bit equal, NaNs with any payload
// counting as equal when anyNaN is set.
func sameFloats(a, b []float32, anyNaN bool) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool {
		return math.Float32bits(x) == math.Float32bits(y) || anyNaN && x != x && y != y
	})
}

// TestPoolNHWCMatchesNCHW runs the NHWC kernels on transposed data and compares
// them with the NCHW kernels bit for bit, on 1 and 3 goroutines.
func TestPoolNHWCMatchesNCHW(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(31, 32))
		for _, g := range nhwcPoolGeoms {
			for _, c := range []int{1, 3, 9, 16, 64, 100} {
				for _, special := range []bool{false, true} {
					testPoolNHWCCase(t, r, g, c, special)
				}
			}
		}
	})
}

func testPoolNHWCCase(t *testing.T, r *rand.Rand, g PoolGeom, c int, special bool) {
	t.Helper()
	name := fmt.Sprintf("%+v c=%d special=%v", g, c, special)
	n, hw, ohw := g.Planes, g.H*g.W, g.OutH()*g.OutW()
	gp := g
	gp.Planes = n * c
	x := poolInputNHWC(r, n*c*hw, special)
	xt := toNHWC(x, n, c, hw)
	dy := poolInputNHWC(r, n*c*ohw, special)
	dyt := toNHWC(dy, n, c, ohw)
	dx0 := poolInputNHWC(r, len(x), special)
	dx0t := toNHWC(dx0, n, c, hw)

	// The NCHW results, transposed.
	wy, warg := make([]float32, len(dy)), make([]int32, len(dy))
	MaxPool2dForward(gp, wy, warg, x)
	wy, warg = toNHWC(wy, n, c, ohw), toNHWC(warg, n, c, ohw)
	wavg := make([]float32, len(dy))
	AvgPool2dForward(gp, wavg, x)
	wavg = toNHWC(wavg, n, c, ohw)
	var wmdx, wadx [2][]float32
	for k, acc := range []bool{false, true} {
		wmdx[k], wadx[k] = clone(dx0), clone(dx0)
		MaxPool2dBackward(gp, wmdx[k], dy, toNCHWArg(warg, n, c, ohw), acc)
		AvgPool2dBackward(gp, wadx[k], dy, acc)
		wmdx[k], wadx[k] = toNHWC(wmdx[k], n, c, hw), toNHWC(wadx[k], n, c, hw)
	}

	for _, procs := range []int{1, 3} {
		y, arg := make([]float32, len(dy)), make([]int32, len(dy))
		avg := make([]float32, len(dy))
		var mdx, adx [2][]float32
		withProcs(procs, func() {
			MaxPool2dForwardNHWC(g, c, y, arg, xt)
			AvgPool2dForwardNHWC(g, c, avg, xt)
			for k, acc := range []bool{false, true} {
				mdx[k], adx[k] = clone(dx0t), clone(dx0t)
				MaxPool2dBackwardNHWC(g, c, mdx[k], dyt, arg, acc)
				AvgPool2dBackwardNHWC(g, c, adx[k], dyt, acc)
			}
		})
		if !sameFloats(y, wy, false) || !slices.Equal(arg, warg) {
			t.Fatalf("%s procs=%d: max forward differs\n got %v %v\nwant %v %v", name, procs, y, arg, wy, warg)
		}
		if !sameFloats(avg, wavg, false) {
			t.Fatalf("%s procs=%d: avg forward differs\n got %v\nwant %v", name, procs, avg, wavg)
		}
		for k := range 2 {
			if !sameFloats(mdx[k], wmdx[k], false) {
				t.Fatalf("%s procs=%d acc=%v: max backward differs\n got %v\nwant %v", name, procs, k == 1, mdx[k], wmdx[k])
			}
			if !sameFloats(adx[k], wadx[k], false) {
				t.Fatalf("%s procs=%d acc=%v: avg backward differs\n got %v\nwant %v", name, procs, k == 1, adx[k], wadx[k])
			}
		}
	}
}

// toNCHWArg transposes an NHWC argmax array [n, ohw, c] back to [n, c, ohw].
func toNCHWArg(a []int32, n, c, ohw int) []int32 {
	out := make([]int32, len(a))
	for i := range n {
		for p := range ohw {
			for ch := range c {
				out[(i*c+ch)*ohw+p] = a[(i*ohw+p)*c+ch]
			}
		}
	}
	return out
}

// TestPoolNHWCLarge checks a size that runs in parallel at any GOMAXPROCS > 1
// against the serial result, for overlapping windows too.
func TestPoolNHWCLarge(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(33, 34))
		for _, g := range []PoolGeom{{4, 16, 16, 2, 2, 0}, {3, 15, 17, 3, 2, 1}, {2, 9, 9, 3, 1, 1}} {
			testPoolNHWCCase(t, r, g, 64, true)
		}
	})
}

func TestPoolNHWCPanics(t *testing.T) {
	g := PoolGeom{2, 4, 4, 2, 2, 0}
	x, y, a := make([]float32, 2*16*3), make([]float32, 2*4*3), make([]int32, 2*4*3)
	for _, tc := range []struct {
		name, want string
		f          func()
	}{
		{"c=0", "channel count", func() { MaxPool2dForwardNHWC(g, 0, y[:0], a[:0], x[:0]) }},
		{"c<0", "channel count", func() { AvgPool2dForwardNHWC(g, -3, y, x) }},
		{"short x", "input has", func() { MaxPool2dForwardNHWC(g, 3, y, a, x[1:]) }},
		{"short y", "output has", func() { AvgPool2dForwardNHWC(g, 3, y[1:], x) }},
		{"short arg", "arg has", func() { MaxPool2dBackwardNHWC(g, 3, x, y, a[1:], false) }},
		{"geometry", "invalid geometry", func() { AvgPool2dBackwardNHWC(PoolGeom{2, 4, 4, 2, 0, 0}, 3, x, y, false) }},
		{"pad", "invalid geometry", func() { MaxPool2dForwardNHWC(PoolGeom{2, 4, 4, 2, 2, 2}, 3, y, a, x) }},
	} {
		func() {
			defer func() {
				e := recover()
				if s, ok := e.(string); !ok || !strings.Contains(s, tc.want) {
					t.Errorf("%s: panic %v, want one mentioning %q", tc.name, e, tc.want)
				}
			}()
			tc.f()
		}()
	}
}

// BenchmarkPoolNHWC times max pooling forward and backward over channels-last
// images at VGG's 2×2/2 shapes (batch 32) and ResNet's 3×3/2 pad 1 after the stem,
// beside the NCHW kernels at the same sizes.
func BenchmarkPoolNHWC(b *testing.B) {
	for _, s := range []struct {
		n, c, h, k, stride, pad int
	}{
		{32, 64, 32, 2, 2, 0}, {32, 128, 16, 2, 2, 0}, {32, 512, 4, 2, 2, 0}, {32, 64, 32, 3, 2, 1},
	} {
		g := PoolGeom{s.n, s.h, s.h, s.k, s.stride, s.pad}
		gp := g
		gp.Planes = s.n * s.c
		r := rand.New(rand.NewPCG(1, 1))
		x := randSlice(r, s.n*s.c*s.h*s.h)
		ny := s.n * s.c * g.OutH() * g.OutW()
		y, arg, dx := make([]float32, ny), make([]int32, ny), make([]float32, len(x))
		shape := fmt.Sprintf("%dx%dx%dx%d/k%ds%dp%d", s.n, s.c, s.h, s.h, s.k, s.stride, s.pad)
		b.Run("nhwc/forward/"+shape, func(b *testing.B) {
			for b.Loop() {
				MaxPool2dForwardNHWC(g, s.c, y, arg, x)
			}
		})
		b.Run("nhwc/backward/"+shape, func(b *testing.B) {
			MaxPool2dForwardNHWC(g, s.c, y, arg, x)
			for b.Loop() {
				MaxPool2dBackwardNHWC(g, s.c, dx, y, arg, false)
			}
		})
		b.Run("nchw/forward/"+shape, func(b *testing.B) {
			for b.Loop() {
				MaxPool2dForward(gp, y, arg, x)
			}
		})
		b.Run("nchw/backward/"+shape, func(b *testing.B) {
			MaxPool2dForward(gp, y, arg, x)
			for b.Loop() {
				MaxPool2dBackward(gp, dx, y, arg, false)
			}
		})
	}
}
