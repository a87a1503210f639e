package kernels

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Selection kernels for sparse gradient communication. Indices are int32
// (COO vectors in spargo use int32 indices), so x may hold at most
// math.MaxInt32 elements. Ordering by magnitude treats NaN as larger than
// any number (so a NaN gradient is never silently dropped) and breaks ties
// by the lower index, which makes every selection deterministic: replicas
// holding equal data select equal index sets.
//
// # Design
//
// Magnitudes are compared through absKey, the IEEE-754 bit pattern with the
// sign cleared: a 31-bit unsigned key whose order is the order of |x|, with
// +0 == -0, denormals in place and every NaN above +Inf (NaNs with different
// payloads are ordered by their payload bits, which only matters for
// hand-made NaNs: arithmetic produces one canonical quiet NaN).
//
// Streaming passes test two keys per 64-bit word (SWAR): with c = 2^31 - t
// in both 32-bit lanes, (w &^ signs) + c has bit 31 of a lane set exactly
// when that lane's key is >= t, and no lane carries into the other. Sixteen
// elements (eight words) are tested with one branch; a block with a hit
// writes all 16 indices at the output's end, advancing the end only past
// the passing ones (no data-dependent branches). FilterAbs is one such pass.
//
// TopKAbs and KthLargestAbs are exact radix selects on the key, most
// significant digit first, with digits of 12, 10 and 9 bits (31 bits):
//
//  1. a histogram pass over x on the top 12 bits (4096 bins, an eighth of
//     an octave each; four interleaved sub-histograms keep runs of equal
//     bins from serialising on one counter) locates the bin [lo, lo+2^19)
//     holding the k-th largest key;
//  2. a second, SWAR-filtered pass over x copies the candidates, in index
//     order, into a pooled scratch: for TopKAbs the keys and indices of
//     every element with key >= lo, for KthLargestAbs the keys in the bin;
//  3. the remaining 10- and 9-bit digits are resolved by histograms over
//     the scratch only, giving the k-th key and how many of the elements
//     equal to it are kept (the lowest-indexed ones);
//  4. TopKAbs emits, from the scratch and without branches, every candidate
//     above the k-th key and the first kept ties: increasing index order.
//
// On heavy-tailed gradients the scratch holds about 1.2k-1.5k entries and
// steps 3-4 are cheap: both functions read x twice. When the candidates
// would exceed n/8 + 4096 (large k, or few distinct magnitudes) further
// histogram passes over x narrow the bin first (digits 10 and 9 bits, with
// an overflow bin for keys outside the current range), and TopKAbs ends
// with one pass over x that emits the indices above the k-th key and the
// first ties. If the whole bin of the k-th key is selected, TopKAbs stops
// early: it is a single FilterAbs at the bin's lower bound.
//
// For n >= 2^17 and GOMAXPROCS > 1 every pass over x is split into up to
// 4*GOMAXPROCS contiguous chunks of at least 2^16 elements, claimed
// dynamically by the calling goroutine and pool workers (dispatch; the job
// lives in the pooled scratch, so this does not allocate). Each chunk has
// its own histogram (the exact counts are summed afterwards) and writes its
// candidates at an offset computed from its histogram, or, for FilterAbs,
// into its own buffer that is appended in chunk order; results are
// therefore identical for any GOMAXPROCS. The pass that resolves ties over
// all of x is sequential (it only occurs in the fallback above). Scratch
// (histograms, candidate arrays, chunk buffers) comes from sync.Pools, so
// steady-state calls do not allocate beyond growing the caller's output
// slice once.

// Everything is portable Go (the same code runs for every SPARGO_KERNELS
// setting): on the target (Zen 5) the passes run at several G elements/s per
// core, well above what they need, so there is no assembly.

func checkIndexable(fn string, n int) {
	if n > math.MaxInt32 {
		panic(fmt.Sprintf("kernels.%s: %d elements do not fit int32 indices", fn, n))
	}
}

const (
	signBit   = 1 << 31
	keyMask   = signBit - 1
	nanKeyMin = 0x7f800001 // smallest NaN key: absKey(+Inf) + 1
	lanes2    = 0x1_0000_0001

	topBits   = 12 // first radix digit (key bits 30..19)
	topShift  = 31 - topBits
	topBins   = 1 << topBits
	subBits   = 10 // later digits: bits 18..9, then 8..0 (w - shift <= subBits)
	subBins   = 1 << subBits
	histSlots = 4096 // sub-histogram size (>= topBins, > subBins)
)

// Parallel split of the selection passes (variables so that tests can
// exercise the chunked code paths on small inputs).
var (
	parMinN   = 1 << 17 // smallest n split over the worker pool
	parChunkN = 1 << 16 // smallest chunk
)

// absKey maps |v| to a uint32 whose unsigned order is the magnitude order,
// with every NaN above +Inf.
func absKey(v float32) uint32 { return math.Float32bits(v) &^ signBit }

// keysOf reinterprets x as its bit patterns (no copy).
func keysOf(x []float32) []uint32 {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}

// alignedWords returns keys as 64-bit words starting at the first 8-byte
// aligned element, and that element's index.
func alignedWords(keys []uint32) (head int, w []uint64) {
	for head < len(keys) && uintptr(unsafe.Pointer(&keys[head]))&7 != 0 {
		head++
	}
	if len(keys)-head < 2 {
		return head, nil
	}
	return head, unsafe.Slice((*uint64)(unsafe.Pointer(&keys[head])), (len(keys)-head)/2)
}

// numChunks is how many contiguous chunks a pass over n elements uses.
func numChunks(n int) int {
	nw := runtime.GOMAXPROCS(0)
	if nw <= 1 || n < parMinN {
		return 1
	}
	return max(1, min(4*nw, n/parChunkN))
}

// chunkRange is chunk c of nc over [0, n).
func chunkRange(n, nc, c int) (lo, hi int) {
	return int(int64(n) * int64(c) / int64(nc)), int(int64(n) * int64(c+1) / int64(nc))
}

// ---------------------------------------------------------------------------
// Radix select

// selScratch is the pooled working memory of the selection kernels.
type selScratch struct {
	nc    int      // chunks of the last histogram pass
	nb    int      // bins per chunk of the last histogram pass
	chunk []uint32 // nc × histSlots per-chunk histograms of the last pass
	total [histSlots]uint32
	ckey  []uint32 // candidate keys
	cidx  []int32  // candidate indices (TopKAbs)
	offs  []int
	bufs  [][]int32
	job   selJob // the chunked pass in progress

	lastBin int // bin found by the last findBin on s.total
}

var selPool = sync.Pool{New: func() any { return new(selScratch) }}

func getScratch() *selScratch  { return selPool.Get().(*selScratch) }
func putScratch(s *selScratch) { selPool.Put(s) }

func (s *selScratch) chunkBufs(nc int) [][]int32 {
	for len(s.bufs) < nc {
		s.bufs = append(s.bufs, nil)
	}
	return s.bufs[:nc]
}

func (s *selScratch) candidates(m int, withIdx bool) {
	if cap(s.ckey) < m {
		s.ckey = make([]uint32, m+m/8)
	}
	s.ckey = s.ckey[:m]
	if withIdx {
		if cap(s.cidx) < m {
			s.cidx = make([]int32, m+m/8)
		}
		s.cidx = s.cidx[:m]
	}
}

// subHist is four interleaved histograms (consecutive elements go to
// different copies, so a run of equal bins does not serialise on one
// counter).
type subHist [4][histSlots]uint32

var subHistPool = sync.Pool{New: func() any { return new(subHist) }}

// histTop counts the top digit, (key&keyMask) >> topShift, of keys into
// dst[:topBins].
func histTop(dst []uint32, keys []uint32) {
	h := subHistPool.Get().(*subHist)
	for q := range h {
		clear(h[q][:topBins])
	}
	h0, h1, h2, h3 := &h[0], &h[1], &h[2], &h[3]
	i := 0
	for ; i+4 <= len(keys); i += 4 {
		k := keys[i : i+4 : i+4]
		h0[(k[0]>>topShift)&(topBins-1)]++
		h1[(k[1]>>topShift)&(topBins-1)]++
		h2[(k[2]>>topShift)&(topBins-1)]++
		h3[(k[3]>>topShift)&(topBins-1)]++
	}
	for ; i < len(keys); i++ {
		h0[(keys[i]>>topShift)&(topBins-1)]++
	}
	dst = dst[:topBins]
	for b := range dst {
		dst[b] = h0[b] + h1[b] + h2[b] + h3[b]
	}
	subHistPool.Put(h)
}

// histSub counts, for the keys in [lo, lo + subBins<<shift), the digit
// ((key&keyMask) - lo) >> shift into dst[:subBins]; dst[subBins] counts the
// keys outside that range. (For a digit narrower than subBits, keys above
// the current bin land in the unused upper bins, which callers ignore.)
func histSub(dst []uint32, keys []uint32, lo uint32, shift uint) {
	h := subHistPool.Get().(*subHist)
	for q := range h {
		clear(h[q][:subBins+1])
	}
	h0, h1, h2, h3 := &h[0], &h[1], &h[2], &h[3]
	shift &= 31
	i := 0
	for ; i+4 <= len(keys); i += 4 {
		k := keys[i : i+4 : i+4]
		h0[min((k[0]&keyMask-lo)>>shift, subBins)&(histSlots-1)]++
		h1[min((k[1]&keyMask-lo)>>shift, subBins)&(histSlots-1)]++
		h2[min((k[2]&keyMask-lo)>>shift, subBins)&(histSlots-1)]++
		h3[min((k[3]&keyMask-lo)>>shift, subBins)&(histSlots-1)]++
	}
	for ; i < len(keys); i++ {
		h0[min((keys[i]&keyMask-lo)>>shift, subBins)&(histSlots-1)]++
	}
	dst = dst[:subBins+1]
	for b := range dst {
		dst[b] = h0[b] + h1[b] + h2[b] + h3[b]
	}
	subHistPool.Put(h)
}

// hist runs one histogram pass over keys in nc chunks: sub == false counts
// the top digit (histTop), sub == true the digit at shift for keys >= lo
// (histSub). Per-chunk counts stay in s.chunk (nc > 1), sums in s.total.
func (s *selScratch) hist(keys []uint32, nc int, sub bool, lo uint32, shift uint) {
	nb := topBins
	if sub {
		nb = subBins + 1
	}
	s.nc, s.nb = nc, nb
	if nc == 1 {
		if sub {
			histSub(s.total[:], keys, lo, shift)
		} else {
			histTop(s.total[:], keys)
		}
		return
	}
	if len(s.chunk) < nc*histSlots {
		s.chunk = make([]uint32, nc*histSlots)
	}
	kind := jobHistTop
	if sub {
		kind = jobHistSub
	}
	s.job = selJob{kind: kind, s: s, keys: keys, nc: nc, lo: lo, shift: shift}
	s.job.start()
	chunk := s.chunk
	tot := s.total[:nb]
	copy(tot, chunk[:nb])
	for c := 1; c < nc; c++ {
		h := chunk[c*histSlots : c*histSlots+nb]
		for b := range tot {
			tot[b] += h[b]
		}
	}
}

// chunkCount is the number of keys of chunk c in bins [b0, b1) of the last pass.
func (s *selScratch) chunkCount(c, b0, b1 int) int {
	var h []uint32
	if s.nc == 1 {
		h = s.total[:s.nb]
	} else {
		h = s.chunk[c*histSlots : c*histSlots+s.nb]
	}
	n := 0
	for _, v := range h[b0:b1] {
		n += int(v)
	}
	return n
}

// findBin scans h from the top bin down for the bin holding the need-th
// largest key: it returns the bin, the count strictly above it (< need) and
// the bin's count (above+cnt >= need).
func findBin(h []uint32, need int) (bin, above, cnt int) {
	for b := len(h) - 1; b >= 0; b-- {
		c := int(h[b])
		if above+c >= need {
			return b, above, c
		}
		above += c
	}
	panic("kernels: radix select lost track of its count")
}

// selState is the bin [lo, lo+2^w) holding the wanted key: cnt keys lie in
// it, of which the need largest are wanted (1 <= need <= cnt).
type selState struct {
	lo        uint32
	w         uint
	need, cnt int
}

// refine narrows st by digits of at most subBits bits (10, then 9) using
// histogram passes over keys (in nc chunks) until the bin is a single key
// (w == 0), or, if stopWhole, until the whole bin is wanted, or until
// cnt <= limit. s.lastBin is the bin chosen by the last pass.
func (s *selScratch) refine(keys []uint32, nc int, st selState, stopWhole bool, limit int) selState {
	for st.w > 0 && st.cnt > limit && !(stopWhole && st.need == st.cnt) {
		shift := st.w - min(st.w, subBits)
		s.hist(keys, nc, true, st.lo, shift)
		b, above, cnt := findBin(s.total[:1<<(st.w-shift)], st.need)
		st.lo += uint32(b) << shift
		st.w = shift
		st.need -= above
		st.cnt = cnt
		s.lastBin = b
	}
	return st
}

// candLimit is the most candidates kept in scratch for an input of n
// elements; beyond it, more histogram passes over x narrow the bin first.
func candLimit(n int) int { return n/8 + candSlack }

var candSlack = 4096 // variable for tests

// collect copies, in index order, the keys (and if withIdx the indices) of
// every element with key >= lo (and, if hi > lo, key < hi) into s.ckey /
// s.cidx. Chunk c's count is s.chunkCount(c, b0, b1) of the last pass,
// which must match the predicate; the total is m.
func (s *selScratch) collect(keys []uint32, nc int, lo, hi uint32, b0, b1, m int, withIdx bool) {
	s.candidates(m, withIdx)
	if nc == 1 {
		var ci []int32
		if withIdx {
			ci = s.cidx
		}
		collectKeys(s.ckey, ci, keys, 0, lo, hi)
		return
	}
	if cap(s.offs) < nc+1 {
		s.offs = make([]int, nc+1)
	}
	offs := s.offs[:nc+1]
	offs[0] = 0
	for c := range nc {
		offs[c+1] = offs[c] + s.chunkCount(c, b0, b1)
	}
	s.job = selJob{kind: jobCollect, s: s, keys: keys, nc: nc, lo: lo, hi: hi, withIdx: withIdx}
	s.job.start()
}

// Chunked passes run as a selJob on the worker pool (dispatch): the job
// lives in the pooled scratch, so starting one does not allocate. Chunks
// are claimed dynamically; every chunk writes only its own outputs.
const (
	jobFilter  = iota + 1 // s.bufs[c] = indices in chunk c with key >= lo
	jobHistTop            // s.chunk[c] = histTop of chunk c
	jobHistSub            // s.chunk[c] = histSub(lo, shift) of chunk c
	jobCollect            // candidates of chunk c at s.offs[c]
)

type selJob struct {
	kind    int
	s       *selScratch
	keys    []uint32
	nc      int
	lo, hi  uint32
	shift   uint
	withIdx bool

	next atomic.Int64
	wg   joiner
}

// start runs the job on the calling goroutine and up to GOMAXPROCS-1 pool
// workers, and returns when every chunk is done.
func (j *selJob) start() {
	dispatch(j, &j.wg, min(runtime.GOMAXPROCS(0), j.nc))
	j.keys = nil // do not keep the caller's data alive in the pool
}

func (j *selJob) done() { j.wg.Done() }

func (j *selJob) run() {
	s, n := j.s, len(j.keys)
	for {
		c := int(j.next.Add(1)) - 1
		if c >= j.nc {
			return
		}
		a, b := chunkRange(n, j.nc, c)
		keys := j.keys[a:b]
		switch j.kind {
		case jobFilter:
			s.bufs[c] = filterKeys(s.bufs[c][:0], keys, a, j.lo)
		case jobHistTop:
			histTop(s.chunk[c*histSlots:(c+1)*histSlots], keys)
		case jobHistSub:
			histSub(s.chunk[c*histSlots:(c+1)*histSlots], keys, j.lo, j.shift)
		case jobCollect:
			o0, o1 := s.offs[c], s.offs[c+1]
			var ci []int32
			if j.withIdx {
				ci = s.cidx[o0:o1]
			}
			collectKeys(s.ckey[o0:o1], ci, keys, a, j.lo, j.hi)
		}
	}
}

// collectKeys writes the keys (and, if ci != nil, the indices base+i) of
// the elements with lo <= key (and key < hi if hi > lo) into ck (and ci),
// which have exactly the right length.
func collectKeys(ck []uint32, ci []int32, keys []uint32, base int, lo, hi uint32) {
	var j int
	if ci != nil {
		j = collectGE(ck, ci, keys, base, lo)
	} else {
		j = collectRange(ck, keys, lo, hi)
	}
	if j != len(ck) {
		panic("kernels: radix select candidate count mismatch")
	}
}

// collectGE writes key and base+i of every element with key >= lo to ck and
// ci (len(ci) >= len(ck) >= the count) and returns the count.
func collectGE(ck []uint32, ci []int32, keys []uint32, base int, lo uint32) int {
	ci = ci[:len(ck)]
	j := 0
	scalar := func(i int) {
		if k := keys[i] & keyMask; k >= lo {
			ck[j], ci[j] = k, int32(base+i)
			j++
		}
	}
	head, words := alignedWords(keys)
	for i := range head {
		scalar(i)
	}
	c := uint64(signBit-lo) * lanes2
	w := 0
	for ; ; w += 8 {
		w = nextGE(words, w, c)
		if w+8 > len(words) {
			break
		}
		i0 := head + 2*w
		if len(ck)-j < 16 { // near the end of this region: no stray writes
			for i := i0; i < i0+16; i++ {
				scalar(i)
			}
			continue
		}
		ws := words[w : w+8 : w+8]
		o := (*[16]int32)(ci[j : j+16])
		b := int32(base + i0)
		p := emit2(o, 0, ws[0]&swarMask+c, b)
		p = emit2(o, p, ws[1]&swarMask+c, b+2)
		p = emit2(o, p, ws[2]&swarMask+c, b+4)
		p = emit2(o, p, ws[3]&swarMask+c, b+6)
		p = emit2(o, p, ws[4]&swarMask+c, b+8)
		p = emit2(o, p, ws[5]&swarMask+c, b+10)
		p = emit2(o, p, ws[6]&swarMask+c, b+12)
		p = emit2(o, p, ws[7]&swarMask+c, b+14)
		kb := keys[i0 : i0+16 : i0+16]
		for q, i := range o[:p] {
			ck[j+q] = kb[(i-b)&15] & keyMask
		}
		j += p
	}
	for i := head + 2*w; i < len(keys); i++ {
		scalar(i)
	}
	return j
}

// collectRange writes every key with lo <= key < hi (lo < hi <= 2^31) to
// ck and returns the count.
func collectRange(ck []uint32, keys []uint32, lo, hi uint32) int {
	j := 0
	scalar := func(i int) {
		if k := keys[i] & keyMask; k >= lo && k < hi {
			ck[j] = k
			j++
		}
	}
	head, words := alignedWords(keys)
	for i := range head {
		scalar(i)
	}
	c0, c1 := uint64(signBit-lo)*lanes2, uint64(signBit-hi)*lanes2
	in := func(v uint64) uint64 { v &= swarMask; return (v + c0) &^ (v + c1) }
	var o [16]int32
	w := 0
	for ; ; w += 8 {
		w = nextIn(words, w, c0, c1)
		if w+8 > len(words) {
			break
		}
		i0 := head + 2*w
		if len(ck)-j < 16 {
			for i := i0; i < i0+16; i++ {
				scalar(i)
			}
			continue
		}
		ws := words[w : w+8 : w+8]
		p := emit2(&o, 0, in(ws[0]), 0)
		p = emit2(&o, p, in(ws[1]), 2)
		p = emit2(&o, p, in(ws[2]), 4)
		p = emit2(&o, p, in(ws[3]), 6)
		p = emit2(&o, p, in(ws[4]), 8)
		p = emit2(&o, p, in(ws[5]), 10)
		p = emit2(&o, p, in(ws[6]), 12)
		p = emit2(&o, p, in(ws[7]), 14)
		kb := keys[i0 : i0+16 : i0+16]
		for q, i := range o[:p] {
			ck[j+q] = kb[i&15] & keyMask
		}
		j += p
	}
	for i := head + 2*w; i < len(keys); i++ {
		scalar(i)
	}
	return j
}

// ---------------------------------------------------------------------------
// KthLargestAbs, TopKAbs

// KthLargestAbs returns the k-th largest |x[i]| (k counts from 1, k must be
// in [1, len(x)], otherwise it panics), the threshold that FilterAbs needs
// to keep at least k elements (exactly k when the k-th magnitude is unique).
// The result is never negative; it is NaN when x holds at least k NaNs.
//
// It is an exact radix select (no sort): two passes over x for typical
// data, more when many elements share a magnitude range; x is not modified.
// Scratch memory is pooled (steady-state calls make no O(len(x))
// allocation), and for len(x) >= 2^17 passes are split over GOMAXPROCS
// goroutines with a result independent of the parallelism.
func KthLargestAbs(x []float32, k int) float32 {
	checkIndexable("KthLargestAbs", len(x))
	if k < 1 || k > len(x) {
		panic(fmt.Sprintf("kernels.KthLargestAbs: k=%d outside [1, %d]", k, len(x)))
	}
	keys := keysOf(x)
	s := getScratch()
	defer putScratch(s)
	nc := numChunks(len(x))
	st := s.top(keys, nc, k)
	limit := candLimit(len(x))
	st = s.refine(keys, nc, st, false, limit)
	if st.w > 0 {
		b := s.lastBin
		s.collect(keys, nc, st.lo, st.lo+1<<st.w, b, b+1, st.cnt, false)
		st = s.refine(s.ckey, 1, st, false, 0)
	}
	return math.Float32frombits(st.lo)
}

// top runs the first histogram pass and returns the bin of the k-th key.
func (s *selScratch) top(keys []uint32, nc, k int) selState {
	s.hist(keys, nc, false, 0, 0)
	b, above, cnt := findBin(s.total[:topBins], k)
	s.lastBin = b
	return selState{lo: uint32(b) << topShift, w: topShift, need: k - above, cnt: cnt}
}

// TopKAbs appends to idx the indices of the k elements of x with the largest
// magnitude, in strictly increasing index order, and returns the extended
// slice. k is clamped to [0, len(x)]. The selection is exact and
// deterministic: NaNs rank above every number (above +Inf), -0 and +0 are
// equal, and among elements whose magnitude equals the k-th largest the
// lowest indices are taken.
//
// It is an exact radix select (see the package design notes): typically
// two passes over x plus work proportional to k; x is not modified.
// Scratch memory is pooled: steady-state calls make no O(len(x)) allocation
// and grow idx at most once (not at all if cap(idx)-len(idx) >= k). For
// len(x) >= 2^17 the passes are split over GOMAXPROCS goroutines; the
// result does not depend on the parallelism.
func TopKAbs(idx []int32, x []float32, k int) []int32 {
	checkIndexable("TopKAbs", len(x))
	n := len(x)
	k = max(0, min(k, n))
	if k == 0 {
		return idx
	}
	idx = slices.Grow(idx, k)
	if k == n {
		for i := range n {
			idx = append(idx, int32(i))
		}
		return idx
	}
	keys := keysOf(x)
	s := getScratch()
	defer putScratch(s)
	nc := numChunks(n)
	st := s.top(keys, nc, k)
	limit := candLimit(n)
	if st.need == st.cnt { // the whole bin is selected: keys >= lo
		return filterPar(idx, keys, st.lo)
	}
	if above := k - st.need; above+st.cnt <= limit {
		// Candidates are all keys >= lo, in index order.
		m := above + st.cnt
		s.collect(keys, nc, st.lo, 0, s.lastBin, topBins, m, true)
		st = s.refine(s.ckey, 1, st, true, 0)
		thr, ties := emitRule(st)
		return emitCandidates(idx, s.cidx, s.ckey, thr, ties, k)
	}
	st = s.refine(keys, nc, st, true, limit)
	if st.w > 0 && st.need != st.cnt {
		b := s.lastBin
		s.collect(keys, nc, st.lo, st.lo+1<<st.w, b, b+1, st.cnt, false)
		st = s.refine(s.ckey, 1, st, true, 0)
	}
	thr, ties := emitRule(st)
	if ties == 0 {
		return filterPar(idx, keys, thr+1)
	}
	return emitTies(idx, keys, thr, ties)
}

// emitRule turns a final selection state into "every key > thr, plus the
// first ties keys == thr".
func emitRule(st selState) (thr uint32, ties int) {
	if st.need == st.cnt {
		return st.lo - 1, 0 // lo > 0 here: k < n
	}
	return st.lo, st.need // st.w == 0
}

// emitCandidates appends cidx[i] for every candidate with ckey[i] > thr and
// for the first ties candidates with ckey[i] == thr; k is the number of
// them, and out must have room for k more.
func emitCandidates(out []int32, cidx []int32, ckey []uint32, thr uint32, ties, k int) []int32 {
	cidx = cidx[:len(ckey)]
	j, end := len(out), len(out)+k
	o := out[:end]
	for i, key := range ckey {
		if j >= end {
			break
		}
		// Branchless: write at the end, advance if taken.
		o[j] = cidx[i]
		eq := b2i(key == thr)
		take := b2i(key > thr) | eq&b2i(ties > 0)
		ties -= eq & take
		j += take
	}
	return o[:j]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// emitTies appends every i with key > thr and the first ties i with
// key == thr (one sequential pass).
func emitTies(out []int32, keys []uint32, thr uint32, ties int) []int32 {
	for i, k := range keys {
		k &= keyMask
		if k > thr {
			out = append(out, int32(i))
		} else if k == thr && ties > 0 {
			out = append(out, int32(i))
			ties--
		}
	}
	return out
}
