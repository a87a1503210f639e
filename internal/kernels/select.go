package kernels

import (
	"fmt"
	"math"
	"slices"
)

// Selection kernels for sparse gradient communication. Indices are int32
// (COO vectors in spargo use int32 indices), so x may hold at most
// math.MaxInt32 elements. Ordering by magnitude treats NaN as larger than
// any number (so a NaN gradient is never silently dropped) and breaks ties
// by the lower index, which makes every selection deterministic: replicas
// holding equal data select equal index sets.

func checkIndexable(fn string, n int) {
	if n > math.MaxInt32 {
		panic(fmt.Sprintf("kernels.%s: %d elements do not fit int32 indices", fn, n))
	}
}

// absKey maps |v| to a uint32 whose unsigned order is the magnitude order,
// with every NaN above +Inf.
func absKey(v float32) uint32 { return math.Float32bits(v) &^ (1 << 31) }

// FilterAbs appends to idx, in increasing order, every index i with
// |x[i]| >= threshold (and every NaN), and returns the extended slice.
func FilterAbs(idx []int32, x []float32, threshold float32) []int32 {
	checkIndexable("FilterAbs", len(x))
	t := absKey(threshold)
	if threshold != threshold { // NaN threshold: only NaNs pass
		t = absKey(float32(math.Inf(1))) + 1
	}
	for i, v := range x {
		if absKey(v) >= t {
			idx = append(idx, int32(i))
		}
	}
	return idx
}

// KthLargestAbs returns the k-th largest |x[i]| (k counts from 1), the
// threshold that FilterAbs needs to keep at least k elements.
func KthLargestAbs(x []float32, k int) float32 {
	checkIndexable("KthLargestAbs", len(x))
	if k < 1 || k > len(x) {
		panic(fmt.Sprintf("kernels.KthLargestAbs: k=%d outside [1, %d]", k, len(x)))
	}
	keys := make([]uint32, len(x))
	for i, v := range x {
		keys[i] = absKey(v)
	}
	slices.Sort(keys)
	return math.Float32frombits(keys[len(keys)-k])
}

// TopKAbs appends to idx the indices of the k elements of x with the largest
// magnitude, in increasing index order, and returns the extended slice. Ties
// at the k-th magnitude go to the lower indices. k is clamped to [0, len(x)].
func TopKAbs(idx []int32, x []float32, k int) []int32 {
	checkIndexable("TopKAbs", len(x))
	k = max(0, min(k, len(x)))
	if k == 0 {
		return idx
	}
	kth := absKey(KthLargestAbs(x, k))
	above := 0 // elements strictly above the k-th magnitude
	for _, v := range x {
		if absKey(v) > kth {
			above++
		}
	}
	ties := k - above // how many elements equal to the k-th magnitude to keep
	for i, v := range x {
		a := absKey(v)
		if a > kth {
			idx = append(idx, int32(i))
		} else if a == kth && ties > 0 {
			idx = append(idx, int32(i))
			ties--
		}
	}
	return idx
}

// ScatterAdd computes dst[idx[i]] += val[i] for every i.
func ScatterAdd(dst []float32, idx []int32, val []float32) {
	checkLen("ScatterAdd", len(idx), len(val))
	for i, j := range idx {
		dst[j] += val[i]
	}
}

// Gather computes dst[i] = src[idx[i]] for every i.
func Gather(dst []float32, src []float32, idx []int32) {
	checkLen("Gather", len(dst), len(idx))
	for i, j := range idx {
		dst[i] = src[j]
	}
}

// MergeCOO merges two sparse vectors whose indices are strictly increasing,
// summing the values at equal indices, and appends the result (indices
// strictly increasing) to (oi, ov).
func MergeCOO(oi []int32, ov []float32, ai []int32, av []float32, bi []int32, bv []float32) ([]int32, []float32) {
	checkLen("MergeCOO", len(ai), len(av))
	checkLen("MergeCOO", len(bi), len(bv))
	i, j := 0, 0
	for i < len(ai) && j < len(bi) {
		switch {
		case ai[i] < bi[j]:
			oi, ov = append(oi, ai[i]), append(ov, av[i])
			i++
		case ai[i] > bi[j]:
			oi, ov = append(oi, bi[j]), append(ov, bv[j])
			j++
		default:
			oi, ov = append(oi, ai[i]), append(ov, av[i]+bv[j])
			i++
			j++
		}
	}
	oi, ov = append(oi, ai[i:]...), append(ov, av[i:]...)
	oi, ov = append(oi, bi[j:]...), append(ov, bv[j:]...)
	return oi, ov
}
