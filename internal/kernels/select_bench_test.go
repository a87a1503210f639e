package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// Selection benchmarks on heavy-tailed synthetic gradients (normal *
// exp(normal)) of 1M elements and 14.7M (VGG-16 size), at densities 1% and
// 0.1%. Melem/s counts the dense input elements per second for FilterAbs,
// TopKAbs and KthLargestAbs, and the sparse (nonzero) elements per second
// for ScatterAdd, Gather and MergeCOO (MergeCOO: both inputs together).
// Compare with scripts/torch_topk.py, e.g.
//
//	go test -run XXX -bench 'FilterAbs|TopKAbs|KthLargestAbs|ScatterAdd|Gather|MergeCOO' -benchtime 1s -count 3 -cpu 1,2 ./internal/kernels/

var benchSizes = []struct {
	name string
	n    int
}{{"1M", 1 << 20}, {"14.7M", 14_700_000}}

var benchDensities = []struct {
	name string
	d    float64
}{{"1%", 0.01}, {"0.1%", 0.001}}

var (
	benchDataMu sync.Mutex
	benchData   = map[int][]float32{}
)

// heavyData returns n heavy-tailed values (cached across benchmarks).
func heavyData(n int) []float32 {
	benchDataMu.Lock()
	defer benchDataMu.Unlock()
	if x, ok := benchData[n]; ok {
		return x
	}
	r := rand.New(rand.NewPCG(uint64(n), 17))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Exp(r.NormFloat64()))
	}
	benchData[n] = x
	return x
}

// benchCases runs f for every size and density.
func benchCases(b *testing.B, f func(b *testing.B, x []float32, k int) (elems int)) {
	for _, sz := range benchSizes {
		for _, d := range benchDensities {
			b.Run(fmt.Sprintf("n=%s/d=%s", sz.name, d.name), func(b *testing.B) {
				x := heavyData(sz.n)
				k := int(float64(sz.n) * d.d)
				b.ResetTimer()
				elems := f(b, x, k)
				b.ReportMetric(float64(elems)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Melem/s")
			})
		}
	}
}

func BenchmarkFilterAbs(b *testing.B) {
	benchCases(b, func(b *testing.B, x []float32, k int) int {
		t := KthLargestAbs(x, k)
		idx := FilterAbs(nil, x, t)
		b.ResetTimer()
		for b.Loop() {
			idx = FilterAbs(idx[:0], x, t)
		}
		return len(x)
	})
}

func BenchmarkTopKAbs(b *testing.B) {
	benchCases(b, func(b *testing.B, x []float32, k int) int {
		idx := TopKAbs(nil, x, k)
		b.ResetTimer()
		for b.Loop() {
			idx = TopKAbs(idx[:0], x, k)
		}
		return len(x)
	})
}

func BenchmarkKthLargestAbs(b *testing.B) {
	benchCases(b, func(b *testing.B, x []float32, k int) int {
		KthLargestAbs(x, k)
		b.ResetTimer()
		for b.Loop() {
			KthLargestAbs(x, k)
		}
		return len(x)
	})
}
