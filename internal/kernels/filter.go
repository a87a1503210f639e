package kernels

import "slices"

// FilterAbs appends to idx, in increasing order, every index i with
// |x[i]| >= threshold, and returns the extended slice. NaN elements always
// pass (a NaN threshold keeps exactly the NaNs); a threshold <= 0 keeps
// every index. Magnitudes compare exactly (denormals included; -0 == +0).
//
// It reads x once. For len(x) >= 2^17 and GOMAXPROCS > 1 the scan is split
// over the worker pool; the result does not depend on the parallelism. The
// only allocations are growing idx and a few small bookkeeping objects
// (chunk buffers are pooled).
func FilterAbs(idx []int32, x []float32, threshold float32) []int32 {
	checkIndexable("FilterAbs", len(x))
	var t uint32
	switch {
	case threshold != threshold: // NaN threshold: only NaNs pass
		t = nanKeyMin
	case threshold <= 0: // every index
		idx = slices.Grow(idx, len(x))
		for i := range x {
			idx = append(idx, int32(i))
		}
		return idx
	default:
		t = absKey(threshold)
	}
	return filterPar(idx, keysOf(x), t)
}

// SWAR block scanners. A 64-bit word holds two keys; with c = (2^31 - t)
// in both 32-bit lanes, (w & m) + c has the lane's bit 31 set exactly when
// the lane's key is >= t (t <= 2^31), and no lane carries into the other.
const (
	swarMask = keyMask * lanes2 // clears both sign bits
	swarHigh = signBit * lanes2 // both lanes' bit 31
)

// nextGE returns the first w' >= w, stepping by 8, at which words[w':w'+8]
// holds a key >= t (c = (2^31-t) * lanes2), or the first w' with fewer than
// 8 words left.
func nextGE(words []uint64, w int, c uint64) int {
	for ; w+8 <= len(words); w += 8 {
		ws := words[w : w+8 : w+8]
		a := (ws[0]&swarMask + c) | (ws[1]&swarMask + c) | (ws[2]&swarMask + c) | (ws[3]&swarMask + c) |
			(ws[4]&swarMask + c) | (ws[5]&swarMask + c) | (ws[6]&swarMask + c) | (ws[7]&swarMask + c)
		if a&swarHigh != 0 {
			return w
		}
	}
	return w
}

// nextIn is nextGE for lo <= key < hi (c0, c1 encode lo and hi).
func nextIn(words []uint64, w int, c0, c1 uint64) int {
	in := func(v uint64) uint64 { v &= swarMask; return (v + c0) &^ (v + c1) }
	for ; w+8 <= len(words); w += 8 {
		ws := words[w : w+8 : w+8]
		a := in(ws[0]) | in(ws[1]) | in(ws[2]) | in(ws[3]) |
			in(ws[4]) | in(ws[5]) | in(ws[6]) | in(ws[7])
		if a&swarHigh != 0 {
			return w
		}
	}
	return w
}

// emit2 writes i and i+1 at o[j] and o[j'] and advances j past the ones
// whose lane of a (a word (w & swarMask) + c from a scanner) has bit 31 set.
// Stray writes stay within o (len 16): the caller keeps the first j.
func emit2(o *[16]int32, j int, a uint64, i int32) int {
	o[j&15] = i
	j += int(a >> laneLo & 1)
	o[j&15] = i + 1
	return j + int(a>>laneHi&1)
}

// filterKeys appends base+i for every i with keys[i]&keyMask >= t, in
// increasing order; t <= 2^31 (2^31: nothing passes).
func filterKeys(out []int32, keys []uint32, base int, t uint32) []int32 {
	head, words := alignedWords(keys)
	for i := 0; i < head; i++ {
		if keys[i]&keyMask >= t {
			out = append(out, int32(base+i))
		}
	}
	c := uint64(signBit-t) * lanes2
	w := 0
	for ; ; w += 8 {
		w = nextGE(words, w, c)
		if w+8 > len(words) {
			break
		}
		// The block holds a hit: emit its 16 indices branchlessly, each
		// written at the current end and kept if its key passes.
		if cap(out)-len(out) < 16 {
			out = slices.Grow(out, 16)
		}
		ws := words[w : w+8 : w+8]
		a0 := ws[0]&swarMask + c
		a1 := ws[1]&swarMask + c
		a2 := ws[2]&swarMask + c
		a3 := ws[3]&swarMask + c
		a4 := ws[4]&swarMask + c
		a5 := ws[5]&swarMask + c
		a6 := ws[6]&swarMask + c
		a7 := ws[7]&swarMask + c
		o := out[len(out) : len(out)+16 : len(out)+16]
		i0 := int32(base + head + 2*w)
		j := 0
		o[j&15] = i0 + 0
		j += int(a0 >> laneLo & 1)
		o[j&15] = i0 + 1
		j += int(a0 >> laneHi & 1)
		o[j&15] = i0 + 2
		j += int(a1 >> laneLo & 1)
		o[j&15] = i0 + 3
		j += int(a1 >> laneHi & 1)
		o[j&15] = i0 + 4
		j += int(a2 >> laneLo & 1)
		o[j&15] = i0 + 5
		j += int(a2 >> laneHi & 1)
		o[j&15] = i0 + 6
		j += int(a3 >> laneLo & 1)
		o[j&15] = i0 + 7
		j += int(a3 >> laneHi & 1)
		o[j&15] = i0 + 8
		j += int(a4 >> laneLo & 1)
		o[j&15] = i0 + 9
		j += int(a4 >> laneHi & 1)
		o[j&15] = i0 + 10
		j += int(a5 >> laneLo & 1)
		o[j&15] = i0 + 11
		j += int(a5 >> laneHi & 1)
		o[j&15] = i0 + 12
		j += int(a6 >> laneLo & 1)
		o[j&15] = i0 + 13
		j += int(a6 >> laneHi & 1)
		o[j&15] = i0 + 14
		j += int(a7 >> laneLo & 1)
		o[j&15] = i0 + 15
		j += int(a7 >> laneHi & 1)
		out = out[:len(out)+j]
	}
	for i := head + 2*w; i < len(keys); i++ {
		if keys[i]&keyMask >= t {
			out = append(out, int32(base+i))
		}
	}
	return out
}

// filterPar is filterKeys over all of keys (base 0), split over the pool.
func filterPar(idx []int32, keys []uint32, t uint32) []int32 {
	n := len(keys)
	nc := numChunks(n)
	if nc == 1 {
		return filterKeys(idx, keys, 0, t)
	}
	s := getScratch()
	defer putScratch(s)
	bufs := s.chunkBufs(nc)
	s.job = selJob{kind: jobFilter, s: s, keys: keys, nc: nc, lo: t}
	s.job.start()
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	idx = slices.Grow(idx, total)
	for _, b := range bufs {
		idx = append(idx, b...)
	}
	return idx
}
