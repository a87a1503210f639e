package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestElementwise(t *testing.T) { forEachImpl(t, testElementwise) }

func testElementwise(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{0, 1, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257, 1000, 4099} {
		x, y, z := randSlice(r, n), randSlice(r, n), randSlice(r, n)
		for i := 0; i < n; i += 5 {
			x[i] = 0
		}
		dst := make([]float32, n)

		got := append([]float32(nil), y...)
		Axpy(-0.5, x, got)
		for i := range n {
			if got[i] != y[i]+(-0.5)*x[i] && math.Abs(float64(got[i]-(y[i]-0.5*x[i]))) > 1e-6 {
				t.Fatalf("Axpy n=%d i=%d", n, i)
			}
		}
		got = append(got[:0], x...)
		Scale(3, got)
		for i := range n {
			if got[i] != 3*x[i] {
				t.Fatalf("Scale n=%d", n)
			}
		}
		Add(dst, x, y)
		for i := range n {
			if dst[i] != x[i]+y[i] {
				t.Fatalf("Add n=%d", n)
			}
		}
		Mul(dst, x, y)
		for i := range n {
			if dst[i] != x[i]*y[i] {
				t.Fatalf("Mul n=%d", n)
			}
		}
		var d, s, mag, smag float64
		for i := range n {
			d += float64(x[i]) * float64(y[i])
			mag += math.Abs(float64(x[i]) * float64(y[i]))
			s += float64(x[i])
			smag += math.Abs(float64(x[i]))
		}
		if g := Dot(x, y); math.Abs(float64(g)-d) > 1e-6*mag*float64(n+1)+1e-7 {
			t.Fatalf("Dot n=%d: %g vs %g", n, g, d)
		}
		if g := Sum(x); math.Abs(float64(g)-s) > 1e-6*smag*float64(n+1)+1e-7 {
			t.Fatalf("Sum n=%d: %g vs %g", n, g, s)
		}
		Fill(dst, 2.5)
		for i := range n {
			if dst[i] != 2.5 {
				t.Fatalf("Fill")
			}
		}
		ReluForward(dst, x)
		for i := range n {
			if dst[i] != max(x[i], 0) {
				t.Fatalf("ReluForward n=%d i=%d", n, i)
			}
		}
		got = append(got[:0], z...)
		ReluBackward(got, dst, y)
		for i := range n {
			want := z[i]
			if dst[i] > 0 {
				want += y[i]
			}
			if got[i] != want {
				t.Fatalf("ReluBackward n=%d i=%d", n, i)
			}
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("expected length panic")
		}
	}()
	Add(make([]float32, 3), make([]float32, 3), make([]float32, 2))
}

func TestReluNaN(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		nan := float32(math.NaN())
		x := []float32{nan, -1, 2, float32(math.Copysign(0, -1)), nan, 3, -2, 5, 1, 1, 1, 1, 1, 1, 1, 1, nan, 4}
		dst := make([]float32, len(x))
		ReluForward(dst, x)
		for i, v := range x {
			want := float32(0)
			if v > 0 {
				want = v
			}
			if math.Float32bits(dst[i]) != math.Float32bits(want) {
				t.Fatalf("ReluForward(%v) = %v, want %v", v, dst[i], want)
			}
		}
		dx := make([]float32, len(x))
		dy := make([]float32, len(x))
		Fill(dy, 1)
		ReluBackward(dx, x, dy)
		for i, v := range x {
			if want := float32(0); v > 0 && dx[i] != 1 || !(v > 0) && dx[i] != want {
				t.Fatalf("ReluBackward y=%v: dx=%v", v, dx[i])
			}
		}
	})
}

func BenchmarkElementwise(b *testing.B) {
	const n = 1 << 16
	x, y, z := make([]float32, n), make([]float32, n), make([]float32, n)
	for _, name := range availableImpls() {
		b.Run(name+"/Axpy", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(8 * n)
			for b.Loop() {
				Axpy(0.5, x, y)
			}
		})
		b.Run(name+"/Dot", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(8 * n)
			for b.Loop() {
				Dot(x, y)
			}
		})
		b.Run(name+"/ReluBackward", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(12 * n)
			for b.Loop() {
				ReluBackward(z, x, y)
			}
		})
	}
}
