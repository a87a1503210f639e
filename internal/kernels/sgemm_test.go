package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.Float64()*2 - 1)
	}
	return s
}

// naiveSgemm computes the reference result in float64 and an error bound.
func naiveSgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) (want, tol []float64) {
	want = make([]float64, m*n)
	tol = make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s, sa float64
			for p := range k {
				var av, bv float32
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += float64(av) * float64(bv)
				sa += math.Abs(float64(av) * float64(bv))
			}
			v := float64(alpha) * s
			mag := math.Abs(float64(alpha)) * sa
			if beta != 0 {
				cv := float64(c[i*ldc+j])
				v += float64(beta) * cv
				mag += math.Abs(float64(beta) * cv)
			}
			want[i*n+j] = v
			tol[i*n+j] = 1e-5*float64(k+2)*mag + 1e-30
		}
	}
	return
}

// forEachImpl runs f with every implementation this machine runs, then, where it
// cannot run avx512, with avx512-shaped (that path's structure in kernels this
// machine runs).
func forEachImpl(t *testing.T, f func(t *testing.T)) {
	for _, name := range availableImpls() {
		t.Run(name, func(t *testing.T) {
			defer setImpl(name)()
			f(t)
		})
	}
	if implSupported(shapedName) && !implSupported("avx512") {
		t.Run(shapedName, func(t *testing.T) {
			defer setImpl(shapedName)()
			f(t)
		})
	}
}

type gemmCase struct {
	ta, tb      bool
	m, n, k     int
	padA, padB  int
	padC        int
	alpha, beta float32
}

func runGemmCase(t *testing.T, r *rand.Rand, tc gemmCase) {
	t.Helper()
	aRows, aCols := tc.m, tc.k
	if tc.ta {
		aRows, aCols = tc.k, tc.m
	}
	bRows, bCols := tc.k, tc.n
	if tc.tb {
		bRows, bCols = tc.n, tc.k
	}
	lda, ldb, ldc := aCols+tc.padA, bCols+tc.padB, tc.n+tc.padC
	a := randSlice(r, aRows*lda)
	b := randSlice(r, bRows*ldb)
	c := randSlice(r, tc.m*ldc)
	if tc.beta == 0 {
		for i := range c {
			c[i] = float32(math.NaN())
		}
	}
	c0 := append([]float32(nil), c...)
	want, tol := naiveSgemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
	Sgemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
	for i := range tc.m {
		for j := range ldc {
			got := c[i*ldc+j]
			if j >= tc.n {
				if math.Float32bits(got) != math.Float32bits(c0[i*ldc+j]) {
					t.Fatalf("%+v: padding C[%d,%d] modified", tc, i, j)
				}
				continue
			}
			w := want[i*tc.n+j]
			if math.IsNaN(float64(got)) || math.Abs(float64(got)-w) > tol[i*tc.n+j] {
				t.Fatalf("%+v: C[%d,%d] = %g, want %g (tol %g)", tc, i, j, got, w, tol[i*tc.n+j])
			}
		}
	}
}

func TestSgemmCorrectness(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		dims := [][3]int{
			{1, 1, 1}, {1, 1, 7}, {2, 3, 5}, {7, 13, 11}, {17, 31, 3}, {3, 67, 129},
			{37, 41, 257}, {64, 64, 64}, {65, 33, 300}, {97, 101, 513}, {4, 32, 1},
			{8, 32, 16}, {6, 16, 9}, {130, 70, 20}, {300, 17, 40}, {5, 600, 19},
		}
		for _, d := range dims {
			for v := range 4 {
				ta, tb := v&1 != 0, v&2 != 0
				for _, ab := range [][2]float32{{1, 0}, {1, 1}, {-0.5, -0.5}, {0, -0.5}, {1, -0.5}, {-0.5, 0}} {
					pad := r.IntN(3) * 3
					runGemmCase(t, r, gemmCase{ta, tb, d[0], d[1], d[2], pad, pad + 1, pad, ab[0], ab[1]})
				}
			}
		}
	})
}

// Larger shapes exercising multiple MC/KC/NC blocks and the parallel split.
func TestSgemmLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, d := range [][3]int{{301, 257, 531}, {64, 2100, 27}, {259, 67, 700}} {
			for v := range 4 {
				runGemmCase(t, r, gemmCase{v&1 != 0, v&2 != 0, d[0], d[1], d[2], 1, 0, 3, 1, -0.5})
			}
		}
	})
}

func TestSgemmZeroSizes(t *testing.T) {
	c := []float32{float32(math.NaN()), 2, 3, 4}
	Sgemm(false, false, 2, 2, 0, 1, nil, 0, nil, 2, 0, c, 2)
	for _, v := range c {
		if v != 0 {
			t.Fatalf("k=0 beta=0 should zero C, got %v", c)
		}
	}
	c = []float32{1, 2, 3, 4}
	Sgemm(false, false, 2, 2, 0, 1, nil, 0, nil, 2, 2, c, 2)
	if c[3] != 8 {
		t.Fatalf("k=0 beta=2: %v", c)
	}
	Sgemm(false, false, 0, 0, 0, 1, nil, 0, nil, 0, 0, nil, 0)
}

// mustPanicT reports an error if f does not panic.
func mustPanicT(t *testing.T, name string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", name)
		}
	}()
	f()
}

func TestSgemmPanics(t *testing.T) {
	mustPanic := func(name string, f func()) { t.Helper(); mustPanicT(t, name, f) }
	a := make([]float32, 6)
	mustPanic("short C", func() { Sgemm(false, false, 2, 3, 3, 1, a, 3, make([]float32, 9), 3, 0, make([]float32, 5), 3) })
	mustPanic("small lda", func() { Sgemm(false, false, 2, 3, 3, 1, a, 2, make([]float32, 9), 3, 0, make([]float32, 6), 3) })
	mustPanic("short B", func() { Sgemm(false, true, 2, 3, 3, 1, a, 3, make([]float32, 8), 3, 0, make([]float32, 6), 3) })
	mustPanic("negative", func() { Sgemm(false, false, -1, 3, 3, 1, a, 3, nil, 3, 0, nil, 3) })
}

func TestSgemmDeterministic(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, d := range [][3]int{{64, 3000, 27}, {200, 300, 700}, {67, 130, 1100}, {16, 27, 5000}} {
			for v := range 4 {
				ta, tb := v&1 != 0, v&2 != 0
				m, n, k := d[0], d[1], d[2]
				a, b := randSlice(r, m*k), randSlice(r, k*n)
				c0 := randSlice(r, m*n)
				lda, ldb := k, n
				if ta {
					lda = m
				}
				if tb {
					ldb = k
				}
				var outs [][]float32
				for _, procs := range []int{1, 2, 3} {
					old := runtime.GOMAXPROCS(procs)
					c := append([]float32(nil), c0...)
					Sgemm(ta, tb, m, n, k, 0.7, a, lda, b, ldb, 0.3, c, n)
					runtime.GOMAXPROCS(old)
					outs = append(outs, c)
				}
				for o := 1; o < len(outs); o++ {
					for i := range outs[0] {
						if math.Float32bits(outs[0][i]) != math.Float32bits(outs[o][i]) {
							t.Fatalf("%v ta=%v tb=%v: result differs between GOMAXPROCS settings at %d", d, ta, tb, i)
						}
					}
				}
			}
		}
	})
}

// TestPlanLongReduction: a small C with a long K (a convolution's weight gradient)
// is split into enough units to keep every worker busy, down to single micro-tiles
// (AVX-512's 8×32 tile leaves the first layer's 16×27 two); other shapes keep the
// wide chunks.
func TestPlanLongReduction(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		for _, tc := range []struct {
			m, n, k  int
			minUnits int
		}{
			{16, 27, 32768, 4},  // ResNet-20's first layer, 2 workers: was 1 unit
			{16, 144, 32768, 8}, // its 16-channel 3×3 layers: was 2 units of 128 and 16 columns
			{64, 576, 2048, 8},
		} {
			j := gemmJob{p: impl, m: tc.m, n: tc.n, k: tc.k}
			j.plan(2)
			want := min(tc.minUnits, ceilDiv(tc.m, impl.mr)*ceilDiv(tc.n, impl.nr))
			if j.units < want {
				t.Errorf("%d×%d, K %d: %d units, want ≥ %d", tc.m, tc.n, tc.k, j.units, want)
			}
		}
		j := gemmJob{p: impl, m: 1024, n: 1024, k: 1024}
		j.plan(2)
		if j.colChunk < min(128, impl.nc) {
			t.Errorf("1024³: column chunks of %d, want the wide ones", j.colChunk)
		}
	})
}

func TestSgemmAllocs(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		for _, d := range [][3]int{{8, 8, 8}, {128, 256, 300}, {64, 4096, 27}} {
			m, n, k := d[0], d[1], d[2]
			a, b, c := randSlice(r, m*k), randSlice(r, k*n), make([]float32, m*n)
			for _, tr := range []bool{false, true} {
				call := func() {
					if tr {
						Sgemm(true, true, m, n, k, 1, a, m, b, k, 0, c, n)
					} else {
						Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
					}
				}
				call() // warm up pools
				allocs := testing.AllocsPerRun(20, call)
				if allocs > 0 {
					t.Errorf("%v trans=%v: %v allocs per Sgemm", d, tr, allocs)
				}
			}
		}
	})
}

func TestImplSelection(t *testing.T) {
	t.Logf("impl in use: %s; available: %v", Impl(), availableImpls())
	if pickImpl("generic").name != "generic" {
		t.Fatal("generic override")
	}
	if got := pickImpl(""); got.name != availableImpls()[0] {
		t.Fatalf("default impl %s, want %s", got.name, availableImpls()[0])
	}
}

type benchShape struct {
	name    string
	ta, tb  bool
	m, n, k int
}

// operands returns seeded random A and B, a zero C and the leading dimensions of A
// and B for the shape's transposition variant.
func (s benchShape) operands() (a, b, c []float32, lda, ldb int) {
	r := rand.New(rand.NewPCG(1, 1))
	a, b, c = randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), make([]float32, s.m*s.n)
	lda, ldb = s.k, s.n
	if s.ta {
		lda = s.m
	}
	if s.tb {
		ldb = s.k
	}
	return a, b, c, lda, ldb
}

var benchShapes = []benchShape{
	{"NN_conv1_m64_n32768_k27", false, false, 64, 32768, 27},
	{"NN_m256_n2048_k2304", false, false, 256, 2048, 2304},
	{"NT_dx_m2048_n2304_k256", false, true, 2048, 2304, 256},
	{"TN_wgrad_m256_n2304_k2048", true, false, 256, 2304, 2048},
	{"NN_sq1024", false, false, 1024, 1024, 1024},
}

func BenchmarkSgemm(b *testing.B) {
	for _, name := range availableImpls() {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%s", name, s.name), func(b *testing.B) {
				defer setImpl(name)()
				av, bv, cv, lda, ldb := s.operands()
				Sgemm(s.ta, s.tb, s.m, s.n, s.k, 1, av, lda, bv, ldb, 0, cv, s.n)
				b.ResetTimer()
				for b.Loop() {
					Sgemm(s.ta, s.tb, s.m, s.n, s.k, 1, av, lda, bv, ldb, 0, cv, s.n)
				}
				b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// TestSgemmAllocsParallel checks the multi-goroutine path (AllocsPerRun
// forces GOMAXPROCS=1) by counting mallocs directly.
func TestSgemmAllocsParallel(t *testing.T) {
	old := runtime.GOMAXPROCS(2)
	defer runtime.GOMAXPROCS(old)
	r := rand.New(rand.NewPCG(7, 9))
	m, n, k := 64, 4096, 27
	a, b, c := randSlice(r, m*k), randSlice(r, k*n), make([]float32, m*n)
	for range 5 {
		Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
	}
	var s0, s1 runtime.MemStats
	runtime.ReadMemStats(&s0)
	const runs = 50
	for range runs {
		Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
	}
	runtime.ReadMemStats(&s1)
	per := float64(s1.Mallocs-s0.Mallocs) / runs
	t.Logf("parallel Sgemm: %.2f allocs per call", per)
	if per >= 1 {
		t.Errorf("parallel Sgemm allocates %.2f times per call", per)
	}
}

// vecOps.pack8 writes the 8-row sliver layout packA's Go loop writes.
func TestPack8Layout(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, name := range availableImpls() {
		pack8 := implTable[name].vec.pack8
		if pack8 == nil {
			continue
		}
		const lds, blocks = 53, 3
		src := randSlice(r, 7*lds+16*blocks)
		dst := make([]float32, 128*blocks+1)
		dst[128*blocks] = 7
		pack8(dst[:128*blocks], src, lds, blocks)
		for p := range 16 * blocks {
			for row := range 8 {
				if got, want := dst[p*8+row], src[row*lds+p]; got != want {
					t.Fatalf("%s: dst[%d] = %v, want src[%d] = %v", name, p*8+row, got, row*lds+p, want)
				}
			}
		}
		if dst[128*blocks] != 7 {
			t.Fatalf("%s: wrote past 128·blocks", name)
		}
	}
}

// vecOps.pack6 writes the 6-row sliver layout packA's Go loop writes, and nothing
// past its blocks; packA with it agrees with packA without it for every length.
func TestPack6Layout(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, name := range availableImpls() {
		v := implTable[name].vec
		if v.pack6 == nil {
			continue
		}
		const lds, blocks = 53, 5
		src := randSlice(r, 5*lds+8*blocks)
		dst := make([]float32, 48*blocks+1)
		dst[48*blocks] = 7
		v.pack6(dst[:48*blocks], src, lds, blocks)
		for p := range 8 * blocks {
			for row := range 6 {
				if got, want := dst[p*6+row], src[row*lds+p]; got != want {
					t.Fatalf("%s: dst[%d] = %v, want src[%d] = %v", name, p*6+row, got, row*lds+p, want)
				}
			}
		}
		if dst[48*blocks] != 7 {
			t.Fatalf("%s: wrote past 48·blocks", name)
		}
		for _, kc := range []int{1, 7, 8, 9, 16, 61, 256} {
			const lda, mc = 300, 14 // two whole slivers and a partial one
			a := randSlice(r, mc*lda)
			want := make([]float32, 18*kc)
			got := make([]float32, 18*kc)
			packA(6, false, a, lda, 0, mc, 3, kc, want, nil)
			packA(6, false, a, lda, 0, mc, 3, kc, got, v)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s: kc %d: packed[%d] = %v, want %v", name, kc, i, got[i], want[i])
				}
			}
		}
	}
}

// packA and packB write the reference sliver layout (a plain loop over op(A),
// op(B), zeros past mc or nc) and nothing past it, for both orientations, the
// AVX2 and AVX-512 sliver widths, whole and partial slivers and kc not a
// multiple of the tile, with each implementation's packers and transposes.
func TestPackReference(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(13, 14))
		v := impl.vec
		tr, ts := v.packBTranspose()
		nan := float32(math.NaN())
		for _, trans := range []bool{false, true} {
			for _, kc := range []int{1, 5, 8, 13, 16, 17, 40} {
				const i0, p0 = 3, 2
				for _, mr := range []int{impl.mr, 6, 8} {
					for _, mc := range []int{mr - 1, 2 * mr, 3*mr + 2, 2*mr + 4, mr + 3} {
						rows, cols := i0+mc, p0+kc // op(A)
						if trans {
							rows, cols = cols, rows
						}
						lda := cols + 5
						a := randSlice(r, rows*lda)
						n := roundUp(mc, mr) * kc
						got := make([]float32, n+1)
						for i := range got {
							got[i] = nan
						}
						packA(mr, trans, a, lda, i0, mc, p0, kc, got[:n], v)
						for i := range n {
							s, p, q := i/(mr*kc)*mr, i%(mr*kc)/mr, i%mr
							want := float32(0)
							if s+q < mc {
								if trans {
									want = a[(p0+p)*lda+i0+s+q]
								} else {
									want = a[(i0+s+q)*lda+p0+p]
								}
							}
							if math.Float32bits(got[i]) != math.Float32bits(want) {
								t.Fatalf("packA mr %d trans %v mc %d kc %d: [%d] = %v, want %v", mr, trans, mc, kc, i, got[i], want)
							}
						}
						if !math.IsNaN(float64(got[n])) {
							t.Fatalf("packA mr %d trans %v mc %d kc %d: wrote past the slivers", mr, trans, mc, kc)
						}
					}
				}
				for _, nr := range []int{impl.nr, 16, 32} {
					for _, nc := range []int{nr - 3, 2 * nr, 2*nr + 5} {
						const j0 = 4
						rows, cols := p0+kc, j0+nc // op(B)
						if trans {
							rows, cols = cols, rows
						}
						ldb := cols + 3
						b := randSlice(r, rows*ldb)
						n := roundUp(nc, nr) * kc
						got := make([]float32, n+1)
						for i := range got {
							got[i] = nan
						}
						packB(nr, trans, b, ldb, p0, kc, j0, nc, got[:n], tr, ts)
						for i := range n {
							s, p, q := i/(nr*kc)*nr, i%(nr*kc)/nr, i%nr
							want := float32(0)
							if s+q < nc {
								if trans {
									want = b[(j0+s+q)*ldb+p0+p]
								} else {
									want = b[(p0+p)*ldb+j0+s+q]
								}
							}
							if math.Float32bits(got[i]) != math.Float32bits(want) {
								t.Fatalf("packB nr %d trans %v nc %d kc %d: [%d] = %v, want %v", nr, trans, nc, kc, i, got[i], want)
							}
						}
						if !math.IsNaN(float64(got[n])) {
							t.Fatalf("packB nr %d trans %v nc %d kc %d: wrote past the slivers", nr, trans, nc, kc)
						}
					}
				}
			}
		}
	})
}
