package hooks

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/spargo-dl/spargo/comm"
)

// Region partitioning of Ok-Topk (Li and Hoefler, PPoPP 2022, Sec. 3.1.1): where the P regions of the split
// and reduce begin. The reference averages the ranks' own quantiles, which balances the union
// of the selections only when every rank's selected positions are spread alike (the paper's
// observation); when they are not — each rank's entries in a different part of the bucket, or
// a hot region that moves between calls — one owner receives several times its share. The
// union partition balances the selections of all ranks together, and repartitions at the
// next call when a call found its regions out of balance.

// Partition policies of Ok-Topk (option partition).
const (
	// PartitionUnion cuts the regions at the quantiles of the union (the multiset sum) of
	// all ranks' selections, estimated from a sketch every rank contributes, every τ calls
	// and at the call after one whose regions were out of balance (okTopkRepartitionFactor).
	PartitionUnion = "union"
	// PartitionReference is the reference's: every τ calls, the average of the ranks'
	// proposals sel[j·|sel|/P].
	PartitionReference = "reference"
)

// okTopkSketchPoints is how many quantile intervals a rank's sketch has per rank of the group:
// a sketch of q = 4P intervals locates each rank's count below any position within m/q, so
// the estimated union count below a boundary is off by at most Σ m_r/q = M/(4P), a quarter of
// the balanced share M/P, in the worst case that every rank's uncertainty falls on the same
// boundary (interpolation inside the intervals makes it far smaller on real data).
const okTopkSketchPoints = 4

// sketchIntervals is q for p ranks and k-entry selections: 4P, but never so many that the
// all-gather of the sketches, (P-1)(q+2) words, exceeds the bound 6k(P-1)/P itself (q <=
// 6k/P - 2, at least 4): per-rank sketches cost O(P²) words, which only at hundreds of ranks
// approaches k.
func sketchIntervals(p, k int) int {
	return max(4, min(okTopkSketchPoints*p, 6*k/p-2))
}

// okTopkRepartitionFactor: a call in which some rank receives more than this factor times the
// balanced share k(P-1)/P of the split and reduce repartitions at the next call. At 1.5 a
// call within the trigger keeps 2·1.5k(P-1)/P + 2k·(1+guard band) words under 6k(P-1)/P from
// P = 5 on (the split's share plus the second phase's 2T words at T ≤ 1.25k).
const okTopkRepartitionFactor = 1.5

// sketchSelection writes the sketch of a sorted selection (distinct positions) of m entries
// into dst (len q+2): dst[0] = m, dst[1+i] = sel[i·(m-1)/q] for i = 0…q (the first and the
// last position included). An empty selection is all zeros.
func sketchSelection(dst []uint32, sel []int32, q int) {
	clear(dst)
	m := int64(len(sel))
	if m == 0 {
		return
	}
	dst[0] = uint32(m)
	for i := range q + 1 {
		dst[1+i] = uint32(sel[int64(i)*(m-1)/int64(q)])
	}
}

// sketchBelow estimates from a sketch (sketchSelection, q intervals) how many of the rank's
// positions are below x. Exact at the sketch's points and outside them; between points i and
// i+1 it interpolates linearly in integers (the same result on every machine) and is off by
// less than m/q. Non-decreasing in x, by at most 1 per position.
func sketchBelow(sk []uint32, q int, x int64) int64 {
	m := int64(sk[0])
	if m == 0 {
		return 0
	}
	pts := sk[1 : q+2]
	if x <= int64(pts[0]) {
		return 0
	}
	if x > int64(pts[q]) {
		return m
	}
	// The largest i with pts[i] < x; pts[i+1] >= x.
	i := sort.Search(q+1, func(i int) bool { return int64(pts[i]) >= x }) - 1
	ei, ej := int64(i)*(m-1)/int64(q), int64(i+1)*(m-1)/int64(q)
	lo, hi := ei+1, ej // positions pts[i] < x <= pts[i+1]: between ei+1 and ej of them are below x
	gap := int64(pts[i+1]) - int64(pts[i]) - 1
	if gap <= 0 {
		return hi
	}
	return lo + (hi-lo)*(x-int64(pts[i])-1)/gap
}

// unionBelow is the estimated count of all ranks' positions below x.
func unionBelow(sketches [][]uint32, q int, x int64) int64 {
	var s int64
	for _, sk := range sketches {
		s += sketchBelow(sk, q, x)
	}
	return s
}

// unionBoundaries returns the region boundaries (len P+1, b[0] = 0, b[P] = n) that cut the
// estimated union of the sketched selections into P near-equal parts: b[j] is the position
// whose estimated count below is nearest j·M/P (M the total count), at or after b[j-1]. With
// nothing selected anywhere, the equal split j·n/P.
func unionBoundaries(sketches [][]uint32, q, n int) []int {
	p := len(sketches)
	b := make([]int, p+1)
	b[p] = n
	var total int64
	for _, sk := range sketches {
		total += int64(sk[0])
	}
	for j := 1; j < p; j++ {
		if total == 0 {
			b[j] = j * n / p
			continue
		}
		target := int64(j) * total // compared with P·count, to stay in integers
		from := b[j-1]
		x := from + sort.Search(n-from, func(d int) bool { return int64(p)*unionBelow(sketches, q, int64(from+d)) >= target })
		if x > from && target-int64(p)*unionBelow(sketches, q, int64(x-1)) < int64(p)*unionBelow(sketches, q, int64(x))-target {
			x-- // one position earlier is nearer the target
		}
		b[j] = x
	}
	return b
}

// sketchReceived returns, per rank, the estimated number of entries it would receive in the
// split and reduce with the regions bounds: the estimated union count in its region less its
// own estimated count there.
func sketchReceived(sketches [][]uint32, q int, bounds []int) []int64 {
	got := make([]int64, len(sketches))
	for j, own := range sketches {
		lo, hi := int64(bounds[j]), int64(bounds[j+1])
		load := unionBelow(sketches, q, hi) - unionBelow(sketches, q, lo)
		got[j] = load - (sketchBelow(own, q, hi) - sketchBelow(own, q, lo))
	}
	return got
}

// overShare reports whether a rank receiving received entries in the split and reduce exceeds
// okTopkRepartitionFactor times the balanced share k(P-1)/P.
func overShare(received int64, k, p int) bool {
	return float64(received) > okTopkRepartitionFactor*float64(k)*float64(p-1)/float64(p)
}

// okTopkSettleCalls: once a call finds the regions out of balance, the next okTopkSettleCalls
// calls repartition, each checking the boundaries it replaces against its own selections, and
// the count restarts whenever one finds them out of balance again. A distribution that moves
// every call is followed call by call even when a few of its moves happen to be small; a
// stable one pays the sketches this many times per change and falls back to the τ schedule.
const okTopkSettleCalls = 16

// agreeUnionBoundaries all-gathers every rank's sketch of its selection sel (sorted positions
// in [0, n)): q+2 words a rank (q = sketchIntervals(P, k), 4P unless k is small against P²),
// (P-1)(q+2) words received, ceil(log2 P) rounds (Bruck).
// Every rank computes the same boundaries from the same sketches (unionBoundaries). It also
// reports whether the previous boundaries old (nil: none) were out of balance for these
// selections: some rank would have received more than its share (overShare).
func agreeUnionBoundaries(ctx context.Context, g comm.Group, tag uint32, sel []int32, n, k int, old []int) ([]int, bool, error) {
	p := g.Size()
	q := sketchIntervals(p, k)
	words := q + 2
	mine := make([]uint32, words)
	sketchSelection(mine, sel, q)
	buf := make([]byte, 0, 4*words)
	for _, w := range mine {
		buf = binary.LittleEndian.AppendUint32(buf, w)
	}
	sizes := make([]int, p)
	for i := range sizes {
		sizes[i] = 4 * words
	}
	all, err := comm.AllGatherBytesSized(ctx, g, tag, buf, sizes)
	if err != nil {
		return nil, false, fmt.Errorf("selection sketches: %w", err)
	}
	sketches := make([][]uint32, p)
	for i, msg := range all {
		sk := make([]uint32, words)
		for w := range sk {
			sk[w] = binary.LittleEndian.Uint32(msg[4*w:])
		}
		if err := checkSketch(sk, q, n); err != nil {
			return nil, false, fmt.Errorf("selection sketch of rank %d: %w", i, err)
		}
		sketches[i] = sk
	}
	bounds := unionBoundaries(sketches, q, n)
	stale := false
	if old != nil {
		for _, got := range sketchReceived(sketches, q, old) {
			stale = stale || overShare(got, k, p)
		}
	}
	return bounds, stale, nil
}

// checkSketch rejects a sketch that no selection of [0, n) gives: more entries than
// positions, or points out of order or range.
func checkSketch(sk []uint32, q, n int) error {
	m := int64(sk[0])
	if m > int64(n) {
		return fmt.Errorf("%d selected entries in a bucket of %d", m, n)
	}
	for i := 1; i <= q+1 && m > 0; i++ {
		if int64(sk[i]) >= int64(n) || i > 1 && sk[i] < sk[i-1] {
			return fmt.Errorf("point %d = %d is out of order or outside [0, %d)", i-1, sk[i], n)
		}
	}
	return nil
}
