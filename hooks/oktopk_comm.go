package hooks

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/spargo-dl/spargo/comm"
)

// The communicators of Ok-Topk (Li and Hoefler, PPoPP 2022, docs/ALGORITHMS.md §3): the exact integer all-reduce
// behind the boundary consensus and the global threshold, the split-and-reduce with
// destination rotation and bucketing, and balance-and-all-gather-v. Sparse messages are COO
// wire forms without header (8 bytes an entry).

// allReduceInts sums vals (each in [0, 2^31)) over the ranks of g, exactly and in place. The
// transport sums float32, exact only below 2^24, so every value travels as limbs of w bits
// with P·(2^w - 1) < 2^24: no partial sum of a limb is ever rounded, whatever the order.
// ceil(31/w) floats a value (2 for P <= 128), comm.Auto's all-reduce (recursive doubling for
// up to 2 KiB).
func allReduceInts(ctx context.Context, g comm.Group, tag uint32, vals []int64) error {
	p := g.Size()
	if p == 1 || len(vals) == 0 {
		return nil
	}
	w := 24 - bits.Len(uint(p-1)) // P <= 2^(24-w)
	if w < 1 {
		return fmt.Errorf("exact integer all-reduce: %d ranks is more than it supports (2^23)", p)
	}
	limbs := (31 + w - 1) / w
	mask := int64(1)<<w - 1
	buf := make([]float32, len(vals)*limbs)
	for v, x := range vals {
		if x < 0 || x > math.MaxInt32 {
			return fmt.Errorf("exact integer all-reduce: value %d outside [0, 2^31)", x)
		}
		for l := range limbs {
			buf[v*limbs+l] = float32(x >> (w * l) & mask)
		}
	}
	if err := comm.AllReduce(ctx, g, tag, buf, comm.Auto); err != nil {
		return err
	}
	for v := range vals {
		var s int64
		for l := range limbs {
			s += int64(buf[v*limbs+l]) << (w * l)
		}
		vals[v] = s
	}
	return nil
}

// proposeBoundaries returns this rank's P-1 proposed region boundaries: the positions that cut
// its sorted selection sel into P equal parts, sel[j·|sel|/P] for j = 1…P-1. With fewer than P
// selected positions (the reference crashes on an empty selection) a rank has no quantiles to
// offer and proposes the equal split j·n/P.
func proposeBoundaries(sel []int32, p, n int) []int64 {
	prop := make([]int64, p-1)
	m := int64(len(sel))
	for j := 1; j < p; j++ {
		if m >= int64(p) {
			prop[j-1] = int64(sel[int64(j)*m/int64(p)])
		} else {
			prop[j-1] = int64(j) * int64(n) / int64(p)
		}
	}
	return prop
}

// agreeBoundaries returns the region boundaries b (len P+1, b[0] = 0, b[P] = n) every rank
// agrees on: the proposals summed exactly and divided by P. The proposals of every rank are
// non-decreasing in j and below n, so are their averages: the regions partition [0, n),
// possibly with empty ones.
func agreeBoundaries(ctx context.Context, g comm.Group, tag uint32, sel []int32, n int) ([]int, error) {
	p := g.Size()
	prop := proposeBoundaries(sel, p, n)
	if err := allReduceInts(ctx, g, tag, prop); err != nil {
		return nil, err
	}
	b := make([]int, p+1)
	b[p] = n
	for j := 1; j < p; j++ {
		b[j] = int(prop[j-1] / int64(p))
	}
	return b, nil
}

// reduceScatterRegions is Ok-Topk's split and reduce: region j = [bounds[j], bounds[j+1]) of
// the local selection sel (sorted global indices) goes to rank j, and this rank adds the
// parts it receives into region, its own region as a dense slice (zero on entry). First one
// round exchanges the message sizes (4 bytes to and from every peer); then steps s = 1…P-1
// send to r+s and receive from r-s (destination rotation: at every step each rank is the
// target of exactly one sender), okTopkInFlight steps per round, the entries of the previous
// round added while the current one is on the wire. The own part is added first, then step 1,
// 2, …: the same order on every run. It returns the number of entries received.
func reduceScatterRegions(ctx context.Context, g comm.Group, sizeTag, tag uint32, sel COO, bounds []int, region []float32, ws *oktopkScratch) (int, error) {
	p, r := g.Size(), g.Rank()
	work := workMeter(ctx)
	lo, hi := bounds[r], bounds[r+1]
	own := regionPart(sel, lo, hi)
	for e, j := range own.Idx {
		region[int(j)-lo] += own.Val[e]
	}
	work(WorkScatterAdd, own.Len())
	if p == 1 {
		return 0, nil
	}
	parts := make([]COO, p) // parts[s]: what step s sends, to rank r+s
	sendCounts := make([]byte, 4*p)
	recvCounts := make([]byte, 4*p)
	reqs := make([]*comm.Request, 0, 2*p)
	for s := 1; s < p; s++ {
		to := (r + s) % p
		parts[s] = regionPart(sel, bounds[to], bounds[to+1])
		binary.LittleEndian.PutUint32(sendCounts[4*s:], uint32(parts[s].Len()))
		reqs = append(reqs, g.Isend(ctx, to, sizeTag, sendCounts[4*s:4*s+4]))
	}
	for s := 1; s < p; s++ {
		reqs = append(reqs, g.Irecv(ctx, (r-s+p)%p, sizeTag, recvCounts[4*s:4*s+4]))
	}
	if err := comm.WaitAll(reqs...); err != nil {
		return 0, fmt.Errorf("split and reduce: size exchange: %w", err)
	}
	g.Counters().AddRound(1)

	// Wire forms: all outgoing parts in one buffer, all incoming ones in another.
	sendOff := make([]int, p+1)
	recvOff := make([]int, p+1)
	for s := 1; s < p; s++ {
		sendOff[s+1] = sendOff[s] + parts[s].Len()*wireEntryBytes
		m := int(binary.LittleEndian.Uint32(recvCounts[4*s:]))
		if m > hi-lo {
			return 0, fmt.Errorf("split and reduce: rank %d announces %d entries for region %d of %d elements", (r-s+p)%p, m, r, hi-lo)
		}
		recvOff[s+1] = recvOff[s] + m*wireEntryBytes
	}
	ws.send = ws.send[:0]
	for s := 1; s < p; s++ {
		tlo := int32(bounds[(r+s)%p])
		for _, j := range parts[s].Idx {
			ws.send = binary.LittleEndian.AppendUint32(ws.send, uint32(j-tlo))
		}
		for _, x := range parts[s].Val {
			ws.send = binary.LittleEndian.AppendUint32(ws.send, math.Float32bits(x))
		}
	}
	work(WorkPack, sel.Len()-own.Len())
	ws.recv = wireBuf(ws.recv, recvOff[p])

	received := 0
	add := func(steps []int) error {
		for _, s := range steps {
			if err := ws.in.SetWire(ws.recv[recvOff[s]:recvOff[s+1]], hi-lo); err != nil {
				return fmt.Errorf("split and reduce: part from rank %d: %w", (r-s+p)%p, err)
			}
			ScatterAdd(region, ws.in)
			received += ws.in.Len()
			work(WorkUnpack, ws.in.Len())
			work(WorkScatterAdd, ws.in.Len())
		}
		return nil
	}
	var prev []int
	for first := 1; first < p; first += okTopkInFlight {
		last := min(p-1, first+okTopkInFlight-1)
		reqs = reqs[:0]
		type pending struct {
			s   int
			req *comm.Request
		}
		var recvs []pending
		for s := first; s <= last; s++ {
			if sendOff[s+1] > sendOff[s] {
				reqs = append(reqs, g.Isend(ctx, (r+s)%p, tag, ws.send[sendOff[s]:sendOff[s+1]]))
			}
		}
		for s := first; s <= last; s++ {
			if recvOff[s+1] > recvOff[s] {
				recvs = append(recvs, pending{s, g.Irecv(ctx, (r-s+p)%p, tag, ws.recv[recvOff[s]:recvOff[s+1]])})
			}
		}
		// Reduce the previous bucket while this one travels.
		errAdd := add(prev)
		errSend := comm.WaitAll(reqs...)
		var errRecv error
		for _, pr := range recvs {
			m, err := pr.req.Wait()
			if err == nil && m != recvOff[pr.s+1]-recvOff[pr.s] {
				err = fmt.Errorf("got %d bytes, announced %d", m, recvOff[pr.s+1]-recvOff[pr.s])
			}
			if err != nil && errRecv == nil {
				errRecv = fmt.Errorf("split and reduce step %d (from rank %d): %w", pr.s, (r-pr.s+p)%p, err)
			}
		}
		switch {
		case errAdd != nil:
			return 0, errAdd
		case errRecv != nil:
			return 0, errRecv
		case errSend != nil:
			return 0, fmt.Errorf("split and reduce steps %d-%d: %w", first, last, errSend)
		}
		if len(reqs)+len(recvs) > 0 {
			g.Counters().AddRound(1)
		}
		prev = prev[:0]
		for s := first; s <= last; s++ {
			prev = append(prev, s)
		}
	}
	if err := add(prev); err != nil {
		return 0, err
	}
	return received, nil
}

// Digits of the distributed radix select: the 31-bit magnitude key (float32 bits without the
// sign, ordered like |x|, NaN above +Inf) from the top, 8+8+8+7 bits.
var radixDigits = [...]uint{8, 8, 8, 7}

// globalKthLargestAbs returns the exact k-th largest magnitude among the vals of all ranks
// (every rank passes its own; non-zero values), the same bits on every rank, or 0 when all
// ranks together hold at most k values (then every non-zero value is selected). It is a
// radix select whose histograms are summed over the ranks: per digit one exact integer
// all-reduce of 2^8 bins, four in all. It never stops early with a bin's lower bound: the
// result is reused as the threshold of later calls, so it must be the k-th magnitude itself.
// Selecting |x| >= the result keeps at least k values, exactly k when the k-th magnitude is
// unique.
func globalKthLargestAbs(ctx context.Context, g comm.Group, tag uint32, vals []float32, k int) (float32, error) {
	work := workMeter(ctx)
	var prefix uint32 // the key bits fixed so far
	top := uint(31)   // bits at and above top are fixed (none at first)
	need := int64(k)
	hist := make([]int64, 1<<radixDigits[0])
	for pass, width := range radixDigits {
		shift := top - width
		bins := hist[:1<<width]
		clear(bins)
		radixCount(bins, vals, prefix, top, shift, width)
		work(WorkHistogram, len(vals))
		if err := allReduceInts(ctx, g, tag, bins); err != nil {
			return 0, fmt.Errorf("radix digit %d: %w", pass, err)
		}
		if pass == 0 {
			var total int64
			for _, c := range bins {
				total += c
			}
			if total <= need {
				return 0, nil
			}
		}
		b := len(bins) - 1
		var above int64
		for ; b > 0 && above+bins[b] < need; b-- {
			above += bins[b]
		}
		need -= above
		prefix |= uint32(b) << shift
		top = shift
	}
	return math.Float32frombits(prefix), nil
}

// radixCount adds to bins (2^width of them) the digit of bits [shift, shift+width) of the
// magnitude key of every value whose key agrees with prefix at and above bit top.
func radixCount(bins []int64, vals []float32, prefix uint32, top, shift, width uint) {
	for _, v := range vals {
		key := math.Float32bits(v) &^ (1 << 31)
		if key>>top == prefix>>top {
			bins[key>>shift&(1<<width-1)]++
		}
	}
}

// countImbalanced is the bit of a count word that carries its rank's imbalance flag: counts
// are below 2^31 (a region's size), so the top bit is free and the flag costs no word.
const countImbalanced = 1 << 31

// exchangeCounts all-gathers every rank's number of globally selected entries (Bruck,
// ceil(log2 P) rounds, P-1 words) and checks each against its region's size. Each word also
// carries its rank's flag imbalanced (the split and reduce gave it more than its share); it
// reports whether any rank raised it, the same answer on every rank.
func exchangeCounts(ctx context.Context, g comm.Group, tag uint32, mine int, imbalanced bool, bounds []int) ([]int, bool, error) {
	p := g.Size()
	four := make([]int, p)
	for i := range four {
		four[i] = 4
	}
	word := uint32(mine)
	if imbalanced {
		word |= countImbalanced
	}
	cb, err := comm.AllGatherBytesSized(ctx, g, tag, binary.LittleEndian.AppendUint32(nil, word), four)
	if err != nil {
		return nil, false, fmt.Errorf("global count exchange: %w", err)
	}
	counts := make([]int, p)
	anyFlag := false
	for i, b := range cb {
		w := binary.LittleEndian.Uint32(b)
		anyFlag = anyFlag || w&countImbalanced != 0
		counts[i] = int(w &^ countImbalanced)
		if counts[i] > bounds[i+1]-bounds[i] {
			return nil, false, fmt.Errorf("rank %d reports %d globally selected entries in a region of %d elements", i, counts[i], bounds[i+1]-bounds[i])
		}
	}
	return counts, anyFlag, nil
}

// balanceAndAllGather is the second phase of Ok-Topk: mine is this rank's global selection
// (sorted global indices, inside its region) and counts every rank's size (exchangeCounts).
// If the policy asks for it (auto: the largest count exceeds okTopkImbalance times the
// average) the entries move point to point so that rank j holds the j-th of P near-equal
// slices of the concatenation in rank order (one round; rank order is index order, the
// regions being ordered); then the slices are all-gathered (Bruck, ceil(log2 P) rounds, each
// other rank's slice received once). It returns the union (sorted) and whether it balanced.
func balanceAndAllGather(ctx context.Context, g comm.Group, tag uint32, mine COO, counts, bounds []int, policy string, ws *oktopkScratch) (COO, bool, error) {
	p := g.Size()
	n := bounds[p]
	work := workMeter(ctx)
	src := make([]int, p+1) // src[i]: where rank i's entries start in the concatenation
	for i, c := range counts {
		src[i+1] = src[i] + c
	}
	total := src[p]
	balance := total > 0 && (policy == BalanceAlways || policy == BalanceAuto && p*maxInt(counts) > okTopkImbalance*total)

	held := mine
	sizes := make([]int, p)
	if balance {
		dst := make([]int, p+1) // rank j holds entries [dst[j], dst[j+1]) of the concatenation
		for j := range p {
			dst[j+1] = dst[j] + total/p
			if j < total%p {
				dst[j+1]++
			}
			sizes[j] = (dst[j+1] - dst[j]) * wireEntryBytes
		}
		var err error
		if held, err = rebalance(ctx, g, tag, mine, src, dst, n, ws); err != nil {
			return COO{}, false, err
		}
	} else {
		for j, c := range counts {
			sizes[j] = c * wireEntryBytes
		}
	}
	work(WorkPack, held.Len())
	all, err := comm.AllGatherBytesSized(ctx, g, tag+1, held.AppendWire(ws.send[:0]), sizes)
	if err != nil {
		return COO{}, false, fmt.Errorf("all-gather-v of the global selection: %w", err)
	}
	ws.final.Reset()
	for i, msg := range all {
		if err := ws.in.SetWire(msg, n); err != nil {
			return COO{}, false, fmt.Errorf("global selection from rank %d: %w", i, err)
		}
		if ws.in.Len() > 0 && ws.final.Len() > 0 && ws.in.Idx[0] <= ws.final.Idx[ws.final.Len()-1] {
			return COO{}, false, fmt.Errorf("global selection from rank %d starts at index %d, not after %d", i, ws.in.Idx[0], ws.final.Idx[ws.final.Len()-1])
		}
		ws.final.Idx = append(ws.final.Idx, ws.in.Idx...)
		ws.final.Val = append(ws.final.Val, ws.in.Val...)
		work(WorkUnpack, ws.in.Len())
		work(WorkCopy, 2*ws.in.Len())
	}
	return ws.final, balance, nil
}

// rebalance moves entries so that this rank ends with entries [dst[r], dst[r+1]) of the
// concatenation (in rank order) of every rank's selection, rank i's starting at src[i]. Every
// overlap of a source range with a target range is one message; all are posted together (one
// round; none when nothing moves). The result is in index order.
func rebalance(ctx context.Context, g comm.Group, tag uint32, mine COO, src, dst []int, n int, ws *oktopkScratch) (COO, error) {
	p, r := g.Size(), g.Rank()
	work := workMeter(ctx)
	overlap := func(i, j int) (int, int) { // entries of source i that go to j, in concatenation positions
		return max(src[i], dst[j]), min(src[i+1], dst[j+1])
	}
	var sends []*comm.Request
	var sendBufs [][]byte
	for j := range p {
		if a, b := overlap(r, j); j != r && a < b {
			part := COO{Idx: mine.Idx[a-src[r] : b-src[r]], Val: mine.Val[a-src[r] : b-src[r]]}
			sendBufs = append(sendBufs, part.AppendWire(nil))
			work(WorkPack, part.Len())
			sends = append(sends, g.Isend(ctx, j, tag, sendBufs[len(sendBufs)-1]))
		}
	}
	recvBufs := make([][]byte, p)
	recvs := make([]*comm.Request, p)
	for i := range p {
		if a, b := overlap(i, r); i != r && a < b {
			recvBufs[i] = make([]byte, (b-a)*wireEntryBytes)
			recvs[i] = g.Irecv(ctx, i, tag, recvBufs[i])
		}
	}
	err := comm.WaitAll(sends...)
	ws.held.Reset()
	posted := len(sends) > 0
	for i := range p {
		if i == r {
			if a, b := overlap(r, r); a < b {
				ws.held.Idx = append(ws.held.Idx, mine.Idx[a-src[r]:b-src[r]]...)
				ws.held.Val = append(ws.held.Val, mine.Val[a-src[r]:b-src[r]]...)
				work(WorkCopy, 2*(b-a))
			}
			continue
		}
		if recvs[i] == nil {
			continue
		}
		posted = true
		m, rerr := recvs[i].Wait()
		if rerr == nil && m != len(recvBufs[i]) {
			rerr = fmt.Errorf("got %d bytes, want %d", m, len(recvBufs[i]))
		}
		if rerr == nil {
			rerr = ws.in.SetWire(recvBufs[i], n)
		}
		if rerr != nil {
			return COO{}, fmt.Errorf("data balancing: entries from rank %d: %w", i, rerr)
		}
		ws.held.Idx = append(ws.held.Idx, ws.in.Idx...)
		ws.held.Val = append(ws.held.Val, ws.in.Val...)
		work(WorkUnpack, ws.in.Len())
		work(WorkCopy, 2*ws.in.Len())
	}
	if err != nil {
		return COO{}, fmt.Errorf("data balancing: %w", err)
	}
	if posted {
		g.Counters().AddRound(1)
	}
	return ws.held, nil
}
