package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// bnShapes are (n, c, plane) triples: odd sizes, single channels and samples,
// planes below and above the vector width, and a few realistic ones.
var bnShapes = [][3]int{
	{1, 1, 2}, {2, 1, 1}, {2, 3, 1}, {1, 3, 9}, {1, 5, 25}, {3, 5, 15}, {2, 3, 17},
	{4, 2, 33}, {1, 3, 49}, {5, 1, 63}, {2, 4, 64}, {3, 3, 65}, {7, 5, 4}, {32, 4, 16},
	{6, 3, 121}, {2, 6, 1024}, {32, 16, 4},
	{2, 1100, 1}, {3, 40, 15}, {2, 300, 4}, // several blocks of small-plane channels
	{40, 2, 256}, {9, 3, 1024}, {33, 2, 24}, // several groups of planes per reduction (bnPlanesOps)
}

func clone(x []float32) []float32 { return append([]float32(nil), x...) }

// refBNStats returns the float64 batch mean and biased variance per channel.
func refBNStats(x []float32, n, c, plane int) (mean, vr []float64) {
	mean, vr = make([]float64, c), make([]float64, c)
	m := float64(n * plane)
	for ch := 0; ch < c; ch++ {
		var s float64
		for i := 0; i < n; i++ {
			for _, v := range x[(i*c+ch)*plane : (i*c+ch+1)*plane] {
				s += float64(v)
			}
		}
		mu := s / m
		var ss float64
		for i := 0; i < n; i++ {
			for _, v := range x[(i*c+ch)*plane : (i*c+ch+1)*plane] {
				ss += (float64(v) - mu) * (float64(v) - mu)
			}
		}
		mean[ch], vr[ch] = mu, ss/m
	}
	return mean, vr
}

func closeTo(got float32, want, atol, rtol float64) bool {
	return math.Abs(float64(got)-want) <= atol+rtol*math.Abs(want)
}

// bnInput returns random data per channel with channel-specific offsets and scales
// (offset large relative to the spread for some channels, to exercise the
// centred variance).
func bnInput(r *rand.Rand, n, c, plane int) []float32 {
	x := make([]float32, n*c*plane)
	for ch := 0; ch < c; ch++ {
		off := float64(ch%3) * 10 * (r.Float64() - 0.3)
		sc := 0.1 + 3*r.Float64()
		for i := 0; i < n; i++ {
			for j := 0; j < plane; j++ {
				x[(i*c+ch)*plane+j] = float32(off + sc*r.NormFloat64())
			}
		}
	}
	return x
}

func TestBatchNormForwardTrain(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, s := range bnShapes {
			n, c, plane := s[0], s[1], s[2]
			x := bnInput(r, n, c, plane)
			gamma, beta := randSlice(r, c), randSlice(r, c)
			y := make([]float32, len(x))
			mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
			const eps = 1e-5
			BatchNormForwardTrain(y, x, n, c, plane, gamma, beta, eps, mean, vr, is)
			wm, wv := refBNStats(x, n, c, plane)
			for ch := 0; ch < c; ch++ {
				wis := 1 / math.Sqrt(wv[ch]+eps)
				if !closeTo(mean[ch], wm[ch], 1e-6, 1e-6) || !closeTo(vr[ch], wv[ch], 1e-7, 1e-5) || !closeTo(is[ch], wis, 0, 1e-5) {
					t.Fatalf("%v ch %d: mean %v var %v invstd %v, want %v %v %v", s, ch, mean[ch], vr[ch], is[ch], wm[ch], wv[ch], wis)
				}
				for i := 0; i < n; i++ {
					for j := 0; j < plane; j++ {
						k := (i*c+ch)*plane + j
						want := (float64(x[k])-wm[ch])*wis*float64(gamma[ch]) + float64(beta[ch])
						// The mean is held in float32 (as in PyTorch): allow its rounding,
						// scaled by γ·invstd (large for nearly constant channels).
						tol := 1e-5 + math.Abs(float64(gamma[ch]))*wis*math.Abs(wm[ch])*0x1p-22
						if !closeTo(y[k], want, tol, 1e-4) {
							t.Fatalf("%v y[%d] = %v, want %v", s, k, y[k], want)
						}
					}
				}
			}
			// In place.
			xi := clone(x)
			BatchNormForwardTrain(xi, xi, n, c, plane, gamma, beta, eps, mean, vr, is)
			if !slices.Equal(xi, y) {
				t.Fatalf("%v: in-place result differs", s)
			}
		}
	})
}

func TestBatchNormConstantChannel(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		n, c, plane := 3, 2, 20
		x := make([]float32, n*c*plane)
		for i := range x {
			x[i] = 7.25
		}
		y := make([]float32, len(x))
		mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
		BatchNormForwardTrain(y, x, n, c, plane, []float32{1, 2}, []float32{0.5, -1}, 1e-5, mean, vr, is)
		for ch := range c {
			if mean[ch] != 7.25 || vr[ch] != 0 {
				t.Fatalf("constant channel: mean %v var %v", mean[ch], vr[ch])
			}
		}
		for i, v := range y {
			want := float32(0.5)
			if (i/plane)%c == 1 {
				want = -1
			}
			if v != want {
				t.Fatalf("y[%d] = %v, want %v", i, v, want)
			}
		}
	})
}

func TestBatchNormApply(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, s := range append(bnShapes, [3]int{0, 3, 4}) {
			n, c, plane := s[0], s[1], s[2]
			x := randSlice(r, n*c*plane)
			mean, scale, shift := randSlice(r, c), randSlice(r, c), randSlice(r, c)
			y := make([]float32, len(x))
			BatchNormApply(y, x, n, c, plane, mean, scale, shift)
			for k, v := range x {
				ch := (k / plane) % c
				want := float64(v-mean[ch])*float64(scale[ch]) + float64(shift[ch])
				if !closeTo(y[k], want, 1e-6, 1e-6) {
					t.Fatalf("%v y[%d] = %v, want %v", s, k, y[k], want)
				}
			}
		}
	})
}

// refBNBackward returns dx, dgamma, dbeta in float64.
func refBNBackward(dy, x []float32, n, c, plane int, mean, invstd, gamma []float32, training bool) (dx, dg, db []float64) {
	dx, dg, db = make([]float64, len(x)), make([]float64, c), make([]float64, c)
	m := float64(n * plane)
	for ch := 0; ch < c; ch++ {
		mu, is := float64(mean[ch]), float64(invstd[ch])
		var sdy, sdyx float64
		for i := 0; i < n; i++ {
			for j := 0; j < plane; j++ {
				k := (i*c+ch)*plane + j
				sdy += float64(dy[k])
				sdyx += float64(dy[k]) * (float64(x[k]) - mu) * is
			}
		}
		dg[ch], db[ch] = sdyx, sdy
		g := float64(gamma[ch])
		for i := 0; i < n; i++ {
			for j := 0; j < plane; j++ {
				k := (i*c+ch)*plane + j
				if training {
					xh := (float64(x[k]) - mu) * is
					dx[k] = g * is / m * (m*float64(dy[k]) - sdy - xh*sdyx)
				} else {
					dx[k] = g * is * float64(dy[k])
				}
			}
		}
	}
	return dx, dg, db
}

func TestBatchNormBackward(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, s := range bnShapes {
			n, c, plane := s[0], s[1], s[2]
			x := bnInput(r, n, c, plane)
			dy := randSlice(r, len(x))
			gamma := randSlice(r, c)
			mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
			BatchNormForwardTrain(make([]float32, len(x)), x, n, c, plane, gamma, make([]float32, c), 1e-5, mean, vr, is)
			for _, training := range []bool{true, false} {
				wdx, wdg, wdb := refBNBackward(dy, x, n, c, plane, mean, is, gamma, training)
				for _, acc := range []bool{false, true} {
					name := fmt.Sprintf("%v training=%v acc=%v", s, training, acc)
					dx0 := randSlice(r, len(x))
					dx := clone(dx0)
					dg0, db0 := randSlice(r, c), randSlice(r, c)
					dg, db := clone(dg0), clone(db0)
					BatchNormBackward(dx, dy, x, n, c, plane, mean, is, gamma, training, acc, dg, db)
					for ch := range c {
						if !closeTo(dg[ch], float64(dg0[ch])+wdg[ch], 1e-5, 1e-4) || !closeTo(db[ch], float64(db0[ch])+wdb[ch], 1e-5, 1e-4) {
							t.Fatalf("%s ch %d: dgamma %v dbeta %v, want %v %v", name, ch, dg[ch], db[ch], float64(dg0[ch])+wdg[ch], float64(db0[ch])+wdb[ch])
						}
					}
					for k := range dx {
						want := wdx[k]
						if acc {
							want += float64(dx0[k])
						}
						if !closeTo(dx[k], want, 1e-5, 1e-4) {
							t.Fatalf("%s dx[%d] = %v, want %v", name, k, dx[k], want)
						}
					}
				}
				// Parameter gradients only (no dx), and dx only.
				dg, db := make([]float32, c), make([]float32, c)
				BatchNormBackward(nil, dy, x, n, c, plane, mean, is, gamma, training, false, dg, db)
				for ch := range c {
					if !closeTo(dg[ch], wdg[ch], 1e-5, 1e-4) || !closeTo(db[ch], wdb[ch], 1e-5, 1e-4) {
						t.Fatalf("%v no dx: ch %d", s, ch)
					}
				}
				dx := make([]float32, len(x))
				BatchNormBackward(dx, dy, x, n, c, plane, mean, is, gamma, training, false, nil, nil)
				for k := range dx {
					if !closeTo(dx[k], wdx[k], 1e-5, 1e-4) {
						t.Fatalf("%v no dgamma: dx[%d]", s, k)
					}
				}
			}
		}
	})
}

// withProcs runs f with GOMAXPROCS set to p.
func withProcs(p int, f func()) {
	old := runtime.GOMAXPROCS(p)
	defer runtime.GOMAXPROCS(old)
	f()
}

func TestBatchNormDeterministic(t *testing.T) {
	for _, s := range [][3]int{{8, 37, 64}, {16, 300, 4}} {
		t.Run(fmt.Sprint(s), func(t *testing.T) { testBNDeterministic(t, s[0], s[1], s[2]) })
	}
}

func testBNDeterministic(t *testing.T, n, c, plane int) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		x := bnInput(r, n, c, plane)
		dy := randSlice(r, len(x))
		gamma, beta := randSlice(r, c), randSlice(r, c)
		run := func() [][]float32 {
			y := make([]float32, len(x))
			mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
			BatchNormForwardTrain(y, x, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
			dx, dg, db := make([]float32, len(x)), make([]float32, c), make([]float32, c)
			BatchNormBackward(dx, dy, x, n, c, plane, mean, is, gamma, true, false, dg, db)
			return [][]float32{y, mean, vr, is, dx, dg, db}
		}
		var ref [][]float32
		withProcs(1, func() { ref = run() })
		for _, p := range []int{2, 3, 8} {
			var got [][]float32
			withProcs(p, func() { got = run() })
			for i := range ref {
				if !slices.Equal(ref[i], got[i]) {
					t.Fatalf("GOMAXPROCS=%d: output %d differs from GOMAXPROCS=1", p, i)
				}
			}
		}
	})
}

// TestLayerPrimitives compares the vector primitives of every implementation
// with float64 references on all lengths around the vector widths.
func TestLayerPrimitives(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(9, 10))
		v := impl.vec
		for n := 0; n <= 200; n++ {
			if n > 70 && n%17 != 0 {
				continue
			}
			x, dy, d0 := randSlice(r, n), randSlice(r, n), randSlice(r, n)
			mu := float32(0.3)
			var ss, sdy, sdyc, mag float64
			for i := range n {
				d := float64(x[i]) - float64(mu)
				ss += d * d
				sdy += float64(dy[i])
				sdyc += float64(dy[i]) * d
				mag += math.Abs(float64(dy[i]) * d)
			}
			if g := v.sumSqDev(x, mu); !closeTo(g, ss, 1e-6, 1e-6) {
				t.Fatalf("sumSqDev n=%d: %v want %v", n, g, ss)
			}
			if a, b := v.dyStats(dy, x, mu); !closeTo(a, sdy, 1e-5, 0) || math.Abs(float64(b)-sdyc) > 1e-6*mag+1e-6 {
				t.Fatalf("dyStats n=%d: %v %v want %v %v", n, a, b, sdy, sdyc)
			}
			dst := clone(d0)
			v.affine(dst, x, mu, 1.5, -0.25)
			for i := range n {
				if !closeTo(dst[i], 1.5*float64(x[i]-mu)-0.25, 1e-6, 1e-6) {
					t.Fatalf("affine n=%d i=%d", n, i)
				}
			}
			for _, acc := range []bool{false, true} {
				dst := clone(d0)
				v.bnBwd(dst, dy, x, mu, 0.7, -1.3, 0.2, acc)
				for i := range n {
					want := 0.7*float64(dy[i]) - 1.3*(float64(x[i])-float64(mu)) + 0.2
					if acc {
						want += float64(d0[i])
					}
					if !closeTo(dst[i], want, 1e-6, 1e-6) {
						t.Fatalf("bnBwd acc=%v n=%d i=%d: %v want %v", acc, n, i, dst[i], want)
					}
				}
			}
			dst = clone(d0)
			v.reluBwdSet(dst, x, dy)
			for i := range n {
				want := float32(0)
				if x[i] > 0 {
					want = dy[i]
				}
				if dst[i] != want {
					t.Fatalf("reluBwdSet n=%d i=%d", n, i)
				}
			}
		}
	})
}

func TestReluBackwardSetNaN(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		nan := float32(math.NaN())
		y := []float32{nan, -1, 2, float32(math.Copysign(0, -1)), 0, 3, nan, 5, 1, -1, 1, 1, 1, 1, 1, 1, nan, 4, 0}
		dy := make([]float32, len(y))
		for i := range dy {
			dy[i] = float32(i + 1)
		}
		dx := make([]float32, len(y))
		Fill(dx, 99)
		ReluBackwardSet(dx, y, dy)
		for i, v := range y {
			want := float32(0)
			if v > 0 {
				want = dy[i]
			}
			if dx[i] != want {
				t.Fatalf("y=%v: dx=%v want %v", v, dx[i], want)
			}
		}
	})
}

func TestReluParallelLarge(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		n := 3*elemChunk + 77
		x, dy, z := randSlice(r, n), randSlice(r, n), randSlice(r, n)
		y := make([]float32, n)
		ReluForward(y, x)
		dx := clone(z)
		ReluBackward(dx, y, dy)
		ds := make([]float32, n)
		ReluBackwardSet(ds, y, dy)
		cp := make([]float32, n)
		Copy(cp, x)
		zz := clone(x)
		Zero(zz)
		if slices.ContainsFunc(zz, func(v float32) bool { return v != 0 }) {
			t.Fatal("Zero left a non-zero")
		}
		ax := clone(z)
		AxpyParallel(2, x, ax)
		for i := range n {
			if y[i] != max(x[i], 0) {
				t.Fatalf("ReluForward i=%d", i)
			}
			g := float32(0)
			if y[i] > 0 {
				g = dy[i]
			}
			if ds[i] != g || dx[i] != z[i]+g || cp[i] != x[i] {
				t.Fatalf("relu backward / copy i=%d", i)
			}
			if want := z[i] + 2*x[i]; math.Abs(float64(ax[i]-want)) > 1e-6 {
				t.Fatalf("AxpyParallel i=%d", i)
			}
		}
	})
}

func benchBN(b *testing.B, n, c, plane int) {
	r := rand.New(rand.NewPCG(1, 1))
	x := bnInput(r, n, c, plane)
	dy := randSlice(r, len(x))
	y, dx := make([]float32, len(x)), make([]float32, len(x))
	gamma, beta := randSlice(r, c), randSlice(r, c)
	mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
	dg, db := make([]float32, c), make([]float32, c)
	name := fmt.Sprintf("%dx%dx%d", n, c, plane)
	b.Run("forward/"+name, func(b *testing.B) {
		// Reads x three times (the last two usually from cache) and writes y:
		// counted as one read and one write.
		b.SetBytes(int64(8 * len(x)))
		for b.Loop() {
			BatchNormForwardTrain(y, x, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
		}
	})
	b.Run("backward/"+name, func(b *testing.B) {
		// Reads dy and x (twice each) and writes dx: counted once each.
		b.SetBytes(int64(12 * len(x)))
		for b.Loop() {
			BatchNormBackward(dx, dy, x, n, c, plane, mean, is, gamma, true, false, dg, db)
		}
	})
}

// BenchmarkBatchNorm reports GB/s counting each array once (the minimum traffic),
// for VGG's first and last layers and ResNet-20/56's three stages at batch 32.
func BenchmarkBatchNorm(b *testing.B) {
	benchBN(b, 32, 64, 32*32)
	benchBN(b, 32, 512, 2*2)
	benchBN(b, 32, 16, 32*32)
	benchBN(b, 32, 32, 16*16)
	benchBN(b, 32, 64, 8*8)
}
