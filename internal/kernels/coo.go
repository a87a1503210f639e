package kernels

import (
	"math"
	"slices"
)

// ScatterAdd computes dst[idx[i]] += val[i] for every i, in order of i
// (repeated indices accumulate in that order). It panics if the lengths of
// idx and val differ or an index is out of range for dst. It does not
// allocate and runs on the calling goroutine.
func ScatterAdd(dst []float32, idx []int32, val []float32) {
	checkLen("ScatterAdd", len(idx), len(val))
	val = val[:len(idx)]
	for i, j := range idx {
		dst[j] += val[i]
	}
}

// Gather computes dst[i] = src[idx[i]] for every i. It panics if the
// lengths of dst and idx differ or an index is out of range for src. It
// does not allocate and runs on the calling goroutine.
func Gather(dst []float32, src []float32, idx []int32) {
	checkLen("Gather", len(dst), len(idx))
	dst = dst[:len(idx)]
	for i, j := range idx {
		dst[i] = src[j]
	}
}

// MergeCOO merges two sparse vectors whose indices are strictly increasing,
// summing the values at equal indices (av+bv), and appends the result
// (indices strictly increasing) to (oi, ov). Values at indices present in
// only one input are copied bit for bit. The inputs are not checked for
// order. It is linear, runs on the calling goroutine and grows oi and ov at
// most once each (not at all if both have room for len(ai)+len(bi) more).
//
// The merge is branchless (its speed does not depend on how the indices
// interleave) and runs two independent halves in one loop: ai is split at
// its middle index v, bi at the first index >= v.
func MergeCOO(oi []int32, ov []float32, ai []int32, av []float32, bi []int32, bv []float32) ([]int32, []float32) {
	checkLen("MergeCOO", len(ai), len(av))
	checkLen("MergeCOO", len(bi), len(bv))
	need := len(ai) + len(bi)
	ni, nv := len(oi), len(ov)
	oi, ov = slices.Grow(oi, need)[:ni+need], slices.Grow(ov, need)[:nv+need]
	o := oi[ni:]
	w := ov[nv:]
	w = w[:len(o)]
	h := len(ai) / 2
	if h == 0 || len(bi) == 0 || ai[len(ai)-1] < bi[0] || bi[len(bi)-1] < ai[0] {
		p := mergeRun(o, w, 0, ai, av, bi, bv)
		return oi[:ni+p], ov[:nv+p]
	}
	// Halves: (ai[:h], bi[:jb]) holds the indices < v = ai[h], the rest >= v.
	jb, _ := slices.BinarySearch(bi, ai[h])
	a1, a1v, b1, b1v := ai[:h], av[:h], bi[:jb], bv[:jb]
	a2, a2v, b2, b2v := ai[h:], av[h:len(ai)], bi[jb:], bv[jb:len(bi)]
	off2 := h + jb // the second half is written from here, then moved down
	i1, j1, p1 := 0, 0, 0
	i2, j2, p2 := 0, 0, off2
	for i1 < len(a1) && j1 < len(b1) && i2 < len(a2) && j2 < len(b2) {
		x, y := a1[i1], b1[j1]
		o[p1] = min(x, y)
		w[p1] = mergeVal(x, y, a1v[i1], b1v[j1])
		i1 += b2i(x <= y)
		j1 += b2i(x >= y)
		p1++

		x, y = a2[i2], b2[j2]
		o[p2] = min(x, y)
		w[p2] = mergeVal(x, y, a2v[i2], b2v[j2])
		i2 += b2i(x <= y)
		j2 += b2i(x >= y)
		p2++
	}
	p1 = mergeRun(o, w, p1, a1[i1:], a1v[i1:], b1[j1:], b1v[j1:])
	p2 = mergeRun(o, w, p2, a2[i2:], a2v[i2:], b2[j2:], b2v[j2:])
	if p1 < off2 {
		copy(o[p1:], o[off2:p2])
		copy(w[p1:], w[off2:p2])
	}
	p := p1 + (p2 - off2)
	return oi[:ni+p], ov[:nv+p]
}

// mergeVal is the merged value at min(x, y): a, b or (x == y) a+b, chosen
// without branches.
func mergeVal(x, y int32, a, b float32) float32 {
	ua, ub := math.Float32bits(a), math.Float32bits(b)
	lt := -uint32(b2i(x < y)) // all ones if x < y
	r := ub ^ (ua^ub)&lt
	if x == y { // rare for independent selections, always for equal ones
		r = math.Float32bits(a + b)
	}
	return math.Float32frombits(r)
}

// mergeRun merges (ai, av) and (bi, bv) into o, w from position p
// (branchless) and returns the position after the last output.
func mergeRun(o []int32, w []float32, p int, ai []int32, av []float32, bi []int32, bv []float32) int {
	av = av[:len(ai)]
	bv = bv[:len(bi)]
	i, j := 0, 0
	for i < len(ai) && j < len(bi) {
		x, y := ai[i], bi[j]
		o[p] = min(x, y)
		w[p] = mergeVal(x, y, av[i], bv[j])
		i += b2i(x <= y)
		j += b2i(x >= y)
		p++
	}
	copy(o[p:], ai[i:])
	copy(w[p:], av[i:])
	p += len(ai) - i
	copy(o[p:], bi[j:])
	copy(w[p:], bv[j:])
	return p + len(bi) - j
}
