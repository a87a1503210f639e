package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// ---------------------------------------------------------------------------
// Deliberately plain oracles.

// magLess reports whether |a| < |b| in the selection order: NaN above every
// number, NaNs among themselves by payload bits, -0 == +0.
func magLess(a, b float32) bool {
	an, bn := a != a, b != b
	switch {
	case an && bn:
		return math.Float32bits(a)&0x7fffffff < math.Float32bits(b)&0x7fffffff
	case an:
		return false
	case bn:
		return true
	}
	return math.Abs(float64(a)) < math.Abs(float64(b))
}

func magEqual(a, b float32) bool { return !magLess(a, b) && !magLess(b, a) }

// oracleOrder returns all indices sorted by decreasing magnitude, ties by
// increasing index.
func oracleOrder(x []float32) []int {
	ord := make([]int, len(x))
	for i := range ord {
		ord[i] = i
	}
	slices.SortFunc(ord, func(p, q int) int {
		switch {
		case magLess(x[q], x[p]): // larger magnitude first
			return -1
		case magLess(x[p], x[q]):
			return 1
		}
		return p - q // ties: lower index first
	})
	return ord
}

// oracleTopK takes the first k of ord and returns them in increasing order.
func oracleTopK(ord []int, k int) []int32 {
	k = max(0, min(k, len(ord)))
	sel := make([]bool, len(ord))
	for _, i := range ord[:k] {
		sel[i] = true
	}
	var out []int32
	for i, s := range sel {
		if s {
			out = append(out, int32(i))
		}
	}
	return out
}

// filterPasses is the FilterAbs predicate, written plainly.
func filterPasses(v, t float32) bool {
	return v != v || math.Abs(float64(v)) >= float64(t)
}

// ---------------------------------------------------------------------------
// Inputs.

var (
	nanA = math.Float32frombits(0x7fc00000)
	nanB = math.Float32frombits(0xffc00001) // negative, other payload
	inf  = float32(math.Inf(1))
	den  = float32(math.SmallestNonzeroFloat32)
)

type selGen struct {
	name string
	f    func(r *rand.Rand, n int) []float32
}

func fill(n int, f func(i int) float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = f(i)
	}
	return x
}

func heavy(r *rand.Rand) float32 {
	return float32(r.NormFloat64() * math.Exp(r.NormFloat64()))
}

var selGens = []selGen{
	{"normal", func(r *rand.Rand, n int) []float32 {
		return fill(n, func(int) float32 { return float32(r.NormFloat64()) })
	}},
	{"heavy", func(r *rand.Rand, n int) []float32 { return fill(n, func(int) float32 { return heavy(r) }) }},
	{"smallset", func(r *rand.Rand, n int) []float32 {
		set := []float32{0, float32(math.Copysign(0, -1)), 0.5, -0.5, 1, -1, 2, -2}
		return fill(n, func(int) float32 { return set[r.IntN(len(set))] })
	}},
	{"special", func(r *rand.Rand, n int) []float32 {
		set := []float32{0, float32(math.Copysign(0, -1)), inf, -inf, nanA, nanB, den, -den, 3 * den,
			-0x1p-127, math.MaxFloat32, -math.MaxFloat32, 1, -1}
		return fill(n, func(int) float32 {
			if r.IntN(2) == 0 {
				return set[r.IntN(len(set))]
			}
			return heavy(r)
		})
	}},
	{"allequal", func(r *rand.Rand, n int) []float32 {
		return fill(n, func(int) float32 {
			if r.IntN(2) == 0 {
				return -1.5
			}
			return 1.5
		})
	}},
	{"zeros", func(r *rand.Rand, n int) []float32 {
		return fill(n, func(int) float32 { return float32(math.Copysign(0, float64(r.IntN(2)*2-1))) })
	}},
	{"nans", func(r *rand.Rand, n int) []float32 {
		return fill(n, func(i int) float32 { return []float32{nanA, nanB, nanA, -nanA}[i&3] })
	}},
	{"cluster", func(r *rand.Rand, n int) []float32 { // one top-level bin
		return fill(n, func(int) float32 { return 1 + float32(r.IntN(8000))*0x1p-23 })
	}},
	{"bits", func(r *rand.Rand, n int) []float32 { // every bit pattern, NaNs included
		return fill(n, func(int) float32 { return math.Float32frombits(r.Uint32()) })
	}},
	{"denormal", func(r *rand.Rand, n int) []float32 {
		return fill(n, func(int) float32 { return math.Float32frombits(r.Uint32() & 0x807fffff) })
	}},
	{"fewdistinct", func(r *rand.Rand, n int) []float32 { // many exact ties per bin
		return fill(n, func(int) float32 { return float32(r.IntN(5)-2) * (1 + float32(r.IntN(3))*0x1p-23) })
	}},
}

var selSizes = []int{0, 1, 2, 7, 31, 32, 33, 1000, 100003}

func selKs(r *rand.Rand, n int) []int {
	ks := []int{0, 1, 2, n / 100, n / 2, n - 1, n, n + 1, n + 100}
	if n > 0 {
		ks = append(ks, 1+r.IntN(n))
	}
	return ks
}

// ---------------------------------------------------------------------------
// Checks.

func checkTopK(t *testing.T, tag string, x []float32, ord []int, k int) {
	t.Helper()
	prefix := []int32{-7, 42}
	got := TopKAbs(slices.Clone(prefix), x, k)
	if !slices.Equal(got[:2], prefix) {
		t.Fatalf("%s k=%d: prefix clobbered: %v", tag, k, got[:2])
	}
	got = got[2:]
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("%s k=%d: indices not strictly increasing at %d: %d, %d", tag, k, i, got[i-1], got[i])
		}
	}
	want := oracleTopK(ord, k)
	if !slices.Equal(got, want) {
		t.Fatalf("%s k=%d: got %d indices, want %d; first diff %s", tag, k, len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(a, b []int32) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("at %d: %d vs %d", i, a[i], b[i])
		}
	}
	return "(length)"
}

func checkKth(t *testing.T, tag string, x []float32, ord []int, k int) {
	t.Helper()
	got := KthLargestAbs(x, k)
	w := x[ord[k-1]]
	wb := math.Float32bits(w) &^ (1 << 31)
	if math.Float32bits(got) != wb {
		t.Fatalf("%s k=%d: KthLargestAbs = %v (%#x), want %v (%#x)", tag, k, got, math.Float32bits(got), w, wb)
	}
	if n := len(FilterAbs(nil, x, got)); n < k {
		t.Fatalf("%s k=%d: FilterAbs at the k-th magnitude keeps %d < k", tag, k, n)
	}
}

func checkFilter(t *testing.T, tag string, x []float32, thr float32) {
	t.Helper()
	got := FilterAbs([]int32{99}, x, thr)
	if got[0] != 99 {
		t.Fatalf("%s: prefix clobbered", tag)
	}
	got = got[1:]
	j := 0
	for i, v := range x {
		if !filterPasses(v, thr) {
			continue
		}
		if j >= len(got) || got[j] != int32(i) {
			t.Fatalf("%s thr=%v (%#x): output %d should be index %d (x=%v), got %v", tag, thr, math.Float32bits(thr), j, i, v, got[j:min(j+3, len(got))])
		}
		j++
	}
	if j != len(got) {
		t.Fatalf("%s thr=%v: %d extra indices, first %d", tag, thr, len(got)-j, got[j])
	}
}

func thresholds(r *rand.Rand, x []float32) []float32 {
	ts := []float32{0, float32(math.Copysign(0, -1)), -1, nanA, inf, -inf, den, 2 * den, 0x1p-126,
		math.MaxFloat32, 1, 1.5, 0.5}
	nr := 6
	if len(x) > 1000 {
		nr = 3
	}
	for range min(nr, len(x)) {
		v := x[r.IntN(len(x))]
		a := float32(math.Abs(float64(v)))
		ts = append(ts, v, -v, a, math.Nextafter32(a, 0), math.Nextafter32(a, inf))
	}
	return ts
}

// runSelect checks every selection function on every generator and size.
func runSelect(t *testing.T, sizes []int, gens []selGen) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, g := range gens {
		for _, n := range sizes {
			x0 := g.f(r, n+1)
			// Unaligned view (x0[1:]) as well as the aligned one.
			for _, off := range []int{0, 1} {
				if off == 1 && n > 1000 && g.name != "heavy" {
					continue // keep the test fast
				}
				x := x0[off : off+n]
				tag := fmt.Sprintf("%s/n=%d/off=%d", g.name, n, off)
				ord := oracleOrder(x)
				for _, k := range selKs(r, n) {
					checkTopK(t, tag, x, ord, k)
					if k >= 1 && k <= n {
						checkKth(t, tag, x, ord, k)
					}
				}
				for _, thr := range thresholds(r, x) {
					checkFilter(t, tag, x, thr)
				}
			}
		}
	}
}

func TestSelect(t *testing.T) {
	t.Logf("impl %s, GOMAXPROCS %d", Impl(), runtime.GOMAXPROCS(0))
	runSelect(t, selSizes, selGens)
}

// TestSelectChunked forces the parallel code paths (chunked histograms,
// candidate offsets, per-chunk filter buffers) and the refining passes onto
// small inputs.
func TestSelectChunked(t *testing.T) {
	defer func(a, b, c int) { parMinN, parChunkN, candSlack = a, b, c }(parMinN, parChunkN, candSlack)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	parMinN, parChunkN, candSlack = 64, 16, 0
	runSelect(t, []int{63, 64, 65, 1000, 5003}, selGens)
	// Chunk count must not change results: compare with one goroutine.
	r := rand.New(rand.NewPCG(3, 4))
	for _, g := range selGens {
		x := g.f(r, 20011)
		a := TopKAbs(nil, x, 200)
		f := FilterAbs(nil, x, 1)
		runtime.GOMAXPROCS(1)
		b := TopKAbs(nil, x, 200)
		h := FilterAbs(nil, x, 1)
		runtime.GOMAXPROCS(4)
		if !slices.Equal(a, b) || !slices.Equal(f, h) {
			t.Fatalf("%s: result depends on GOMAXPROCS", g.name)
		}
	}
}

// TestSelectPaths checks that the inputs above reach every strategy of the
// radix select (the paths are named by what TopKAbs ends with).
func TestSelectPaths(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	n := 100003
	heavyX := selGens[1].f(r, n)
	cluster := selGens[7].f(r, n)
	few := selGens[10].f(r, n)
	for _, c := range []struct {
		name string
		x    []float32
		k    int
	}{
		{"candidates", heavyX, n / 100},
		{"refine-full", heavyX, n / 2},
		{"refine-cluster", cluster, n / 100},
		{"ties-full", few, n / 3},
		{"ties-small", few, 7},
	} {
		ord := oracleOrder(c.x)
		checkTopK(t, c.name, c.x, ord, c.k)
		checkKth(t, c.name, c.x, ord, c.k)
	}
}

func TestSelectPanics(t *testing.T) {
	mustPanic := func(name string, f func()) { t.Helper(); mustPanicT(t, name, f) }
	x := []float32{1, 2, 3}
	mustPanic("KthLargestAbs k=0", func() { KthLargestAbs(x, 0) })
	mustPanic("KthLargestAbs k>n", func() { KthLargestAbs(x, 4) })
	mustPanic("KthLargestAbs empty", func() { KthLargestAbs(nil, 1) })
	mustPanic("ScatterAdd lengths", func() { ScatterAdd(x, []int32{0}, nil) })
	mustPanic("ScatterAdd range", func() { ScatterAdd(x, []int32{3}, []float32{1}) })
	mustPanic("ScatterAdd negative", func() { ScatterAdd(x, []int32{-1}, []float32{1}) })
	mustPanic("Gather lengths", func() { Gather(x, x, []int32{0}) })
	mustPanic("Gather range", func() { Gather(x[:1], x, []int32{5}) })
	mustPanic("MergeCOO lengths", func() { MergeCOO(nil, nil, []int32{1}, nil, nil, nil) })
}

// TestSelectAllocs: steady-state selections on pre-sized outputs do not
// allocate O(n) memory, on one goroutine or chunked over several (a pooled
// 64 KiB histogram may still be re-created now and then when sync.Pool
// moves between Ps or is cleared by a GC: the best of several rounds counts).
func TestSelectAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	r := rand.New(rand.NewPCG(7, 8))
	x := selGens[1].f(r, 1<<16)
	idx := make([]int32, 0, len(x))
	for _, chunked := range []bool{false, true} {
		if chunked {
			defer func(a, b int) { parMinN, parChunkN = a, b }(parMinN, parChunkN)
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
			parMinN, parChunkN = 1<<12, 1<<11
		}
		for name, f := range map[string]func(){
			"TopKAbs":       func() { idx = TopKAbs(idx[:0], x, 655) },
			"KthLargestAbs": func() { KthLargestAbs(x, 655) },
			"FilterAbs":     func() { idx = FilterAbs(idx[:0], x, 1) },
		} {
			for range 3 {
				f()
			}
			// The fewest bytes per call over several rounds: an O(n) allocation shows in every
			// round, a pool refill after a GC (or another goroutine's allocation: TotalAlloc is
			// the process's) only in some.
			const rounds, runs = 5, 20
			per := uint64(math.MaxUint64)
			for range rounds {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for range runs {
					f()
				}
				runtime.ReadMemStats(&after)
				per = min(per, (after.TotalAlloc-before.TotalAlloc)/runs)
			}
			if per > 4096 { // O(n) would be >= 256 KiB
				t.Errorf("%s (chunked %v) allocates %d bytes per call in every round of %d calls", name, chunked, per, runs)
			}
		}
	}
}

// ---------------------------------------------------------------------------

func ExampleTopKAbs() {
	grad := []float32{0.1, -3, 0.5, 2, -0.5, 0, 3, -0.2}
	// The 3 largest magnitudes are |-3|, |3| and |2|; indices come back in
	// increasing order.
	idx := TopKAbs(nil, grad, 3)
	fmt.Println(idx)
	// With k=4 the 4th magnitude (0.5) is tied between indices 2 and 4:
	// the lower index wins.
	fmt.Println(TopKAbs(nil, grad, 4))
	// Values to send, and the threshold that FilterAbs would use.
	val := make([]float32, len(idx))
	Gather(val, grad, idx)
	fmt.Println(val, KthLargestAbs(grad, 3), FilterAbs(nil, grad, 2))
	// Output:
	// [1 3 6]
	// [1 2 3 6]
	// [-3 2 3] 2 [1 3 6]
}
