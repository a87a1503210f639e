package hooks

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"sync"

	"github.com/spargo-dl/spargo/comm"
)

// The communicators of SparDL (Zhao et al., ICDE 2024, docs/ALGORITHMS.md §2): Spar-Reduce-Scatter inside a team,
// R-SAG and B-SAG across teams, and the sparse Bruck all-gather that ends both. They work on
// any comm.Group, in practice comm.Sub views of the world group. Every message is one COO
// vector in wire form with no header (8 bytes an entry), so the words received are exactly two
// per entry; a message that carries several blocks encodes block p of the message at indices
// p·span + (index inside the block), which both sides can split because they know the blocks.

// blockBounds returns the range of block i when n elements are cut into blocks of c (the last
// block may be short or, for tiny n, empty).
func blockBounds(i, c, n int) (lo, hi int) {
	lo = min(i*c, n)
	return lo, min(lo+c, n)
}

// srsSchedule returns Spar-Reduce-Scatter's bag sizes and gaps for a team of N ranks, in round
// order: sizes [E, 2^(L-2), …, 2, 1] with L = ceil(log2 N) and E = N - 2^(L-1); the gap
// starts at N - E = 2^(L-1) and halves each round. In round t rank r sends the run of sizes[t]
// blocks starting at block r+gaps[t] to rank r+gaps[t] (mod N), and after the round holds the
// gaps[t] blocks starting at its own: so what it receives, the run starting at r, is always
// among what it holds (the paper's Theorem 1), and after L rounds it holds block r alone.
func srsSchedule(n int) (sizes, gaps []int) {
	if n <= 1 {
		return nil, nil
	}
	l := bits.Len(uint(n - 1)) // ceil(log2 n)
	gap := 1 << (l - 1)
	sizes = append(sizes, n-gap)
	gaps = append(gaps, gap)
	for gap > 1 {
		gap /= 2
		sizes = append(sizes, gap)
		gaps = append(gaps, gap)
	}
	return sizes, gaps
}

// checkSpan refuses messages whose multi-block indices p·span + j would not fit int32.
func checkSpan(blocks, span int) error {
	if int64(blocks)*int64(span) > math.MaxInt32 {
		return fmt.Errorf("a message of %d blocks of %d elements does not fit int32 indices: use smaller buckets or fewer teams", blocks, span)
	}
	return nil
}

// wireBuf returns b resized to n bytes (reusing its storage when large enough).
// wireScratch is the per-call working storage of the sparse exchanges (the bag being
// sent, the received entries and their wire forms). It is pooled so that a training step
// does not regrow megabytes of slices on every call; nothing in it outlives the call.
type wireScratch struct {
	sel, bag, in COO
	msg, buf     []byte
}

var wireScratchPool = sync.Pool{New: func() any { return new(wireScratch) }}

func getWireScratch() *wireScratch { return wireScratchPool.Get().(*wireScratch) }

func putWireScratch(w *wireScratch) {
	w.sel.Reset()
	w.bag.Reset()
	w.in.Reset()
	w.msg, w.buf = w.msg[:0], w.buf[:0]
	wireScratchPool.Put(w)
}

func wireBuf(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// sparReduceScatter runs Spar-Reduce-Scatter on the team g over acc, the rank's dense
// accumulated vector cut into g.Size() blocks of c elements. Before each round it selects the
// top-kb (by magnitude, exact zeros dropped) of each block it is about to send — sparsifying
// only what is sent next, the paper's optimisation — sends that bag as one message and adds the
// received bag into its own copies of those blocks. Finally it cuts its own block (block
// g.Rank()) to its top-finalK. Every selected entry is zeroed in acc, so on return acc holds
// exactly what this rank discarded: for every block, its accumulated copy minus what it sent
// (the local residual of docs/ALGORITHMS.md §2 step 3). It returns the own block's final entries,
// with indices relative to the block. ceil(log2 N) rounds; N-1 blocks of at most kb entries
// received.
func sparReduceScatter(ctx context.Context, g comm.Group, tag uint32, acc []float32, c, kb, finalK int) (COO, error) {
	nt, r, n := g.Size(), g.Rank(), len(acc)
	blockLen := func(i int) int { lo, hi := blockBounds(i, c, n); return hi - lo }
	if err := checkSpan(nt, c); err != nil {
		return COO{}, err
	}
	ws := getWireScratch()
	defer putWireScratch(ws)
	sel, bag, in := &ws.sel, &ws.bag, &ws.in
	sizes, gaps := srsSchedule(nt)
	for t, size := range sizes {
		gap := gaps[t]
		bag.Reset()
		for p := range size {
			lo, hi := blockBounds((r+gap+p)%nt, c, n)
			*sel = TopKNonZero(*sel, acc[lo:hi], kb)
			off := int32(p * c)
			for e, j := range sel.Idx {
				bag.Append(off+j, sel.Val[e])
				acc[lo+int(j)] = 0
			}
		}
		ws.msg = bag.AppendWire(ws.msg[:0])
		maxIn := 0
		for p := range size {
			maxIn += min(kb, blockLen((r+p)%nt))
		}
		ws.buf = wireBuf(ws.buf, maxIn*wireEntryBytes)
		from := (r - gap + nt) % nt
		m, err := comm.SendRecv(ctx, g, tag, (r+gap)%nt, ws.msg, from, ws.buf)
		if err == nil {
			err = in.SetWire(ws.buf[:m], size*c)
		}
		if err != nil {
			return COO{}, fmt.Errorf("Spar-Reduce-Scatter round %d of %d (team rank %d, bag of %d blocks from team rank %d): %w", t+1, len(sizes), r, size, from, err)
		}
		for e, j := range in.Idx {
			p, loc := int(j)/c, int(j)%c
			lo, hi := blockBounds((r+p)%nt, c, n)
			if lo+loc >= hi {
				return COO{}, fmt.Errorf("Spar-Reduce-Scatter round %d: team rank %d sent index %d past the end of block %d (%d elements)", t+1, from, loc, (r+p)%nt, hi-lo)
			}
			acc[lo+loc] += in.Val[e]
		}
	}
	lo, hi := blockBounds(r, c, n)
	own := TopKNonZero(COO{}, acc[lo:hi], finalK)
	for _, j := range own.Idx {
		acc[lo+int(j)] = 0
	}
	return own, nil
}

// bruckSparse all-gathers one sparse block per rank of g with Bruck's algorithm (any size,
// ceil(log2 N) rounds, every other rank's block received once): in the round at distance d a
// rank sends the blocks it holds at relative positions 0..min(d, N-d)-1 to rank r-d and
// receives as many from rank r+d. Block indices are relative to a block of span elements;
// lens(i) is the length of member i's block (indices past it are refused) and caps(i) the
// most entries member i may send. out[i] is member i's block.
func bruckSparse(ctx context.Context, g comm.Group, tag uint32, mine COO, span int, lens, caps func(member int) int) ([]COO, error) {
	nt, r := g.Size(), g.Rank()
	held := make([]COO, nt) // held[i]: the block of member (r+i) mod N
	held[0] = mine
	ws := getWireScratch()
	defer putWireScratch(ws)
	bag, in := &ws.bag, &ws.in
	for dist := 1; dist < nt; dist *= 2 {
		cnt := min(dist, nt-dist)
		if err := checkSpan(cnt, span); err != nil {
			return nil, err
		}
		bag.Reset()
		for p := range cnt {
			off := int32(p * span)
			for e, j := range held[p].Idx {
				bag.Append(off+j, held[p].Val[e])
			}
		}
		ws.msg = bag.AppendWire(ws.msg[:0])
		maxIn := 0
		for p := range cnt {
			maxIn += caps((r + dist + p) % nt)
		}
		ws.buf = wireBuf(ws.buf, maxIn*wireEntryBytes)
		from := (r + dist) % nt
		m, err := comm.SendRecv(ctx, g, tag, (r-dist+nt)%nt, ws.msg, from, ws.buf)
		if err == nil {
			err = in.SetWire(ws.buf[:m], cnt*span)
		}
		if err != nil {
			return nil, fmt.Errorf("sparse Bruck all-gather distance %d (rank %d of %d, from rank %d): %w", dist, r, nt, from, err)
		}
		for e, j := range in.Idx {
			p, loc := int(j)/span, int32(int(j)%span)
			member := (r + dist + p) % nt
			if int(loc) >= lens(member) {
				return nil, fmt.Errorf("sparse Bruck all-gather distance %d: rank %d sent index %d past the end of rank %d's block (%d elements)", dist, from, loc, member, lens(member))
			}
			held[dist+p].Append(loc, in.Val[e])
		}
	}
	out := make([]COO, nt)
	for i := range nt {
		out[(r+i)%nt] = held[i]
	}
	return out, nil
}

// rsag is R-SAG (d = g.Size() a power of two): log2 d recursive-doubling steps between the
// ranks that hold the same block in different teams. Both partners add what they received to
// what they hold (the same sum on both sides: float addition commutes), keep the top-l and
// record the discarded entries as residual shares. After step s the 2^(s+1) ranks of a group
// hold the same discarded values, so each keeps 1/2^(s+1) of them — the paper's "half" for its
// single step; a plain half at every step would count a value dropped at step s 2^s times. The
// shares of one index over all steps are summed. Exact zero sums are not kept.
func rsag(ctx context.Context, g comm.Group, tag uint32, own COO, l, blockLen int) (final, shares COO, err error) {
	d, x := g.Size(), g.Rank()
	cur := own
	var in, merged COO
	var msg, buf []byte
	for s := 0; 1<<s < d; s++ {
		partner := x ^ (1 << s)
		msg = cur.AppendWire(msg[:0])
		buf = wireBuf(buf, min(l, blockLen)*wireEntryBytes)
		m, err := comm.SendRecv(ctx, g, tag, partner, msg, partner, buf)
		if err == nil {
			err = in.SetWire(buf[:m], blockLen)
		}
		if err != nil {
			return COO{}, COO{}, fmt.Errorf("R-SAG step %d (team %d with team %d): %w", s+1, x, partner, err)
		}
		if x < partner {
			merged = Merge(merged, cur, in)
		} else {
			merged = Merge(merged, in, cur)
		}
		kept, dropped := TopKOf(COO{}, COO{}, dropZeros(merged), l)
		share := 1 / float32(int(2)<<s)
		for e := range dropped.Val {
			dropped.Val[e] *= share
		}
		shares = Merge(COO{}, shares, dropped)
		cur = kept
	}
	return cur, shares, nil
}

// bsag is B-SAG (any d = g.Size()): a sparse Bruck all-gather of every team's top-h block among
// the ranks holding the same block, the union of the d blocks summed in team order (the same
// operations on every rank), and the top-l of the union. The d ranks hold the same discarded
// entries, so each keeps 1/d of them as residual share. union is the number of entries in the
// union before the cut (Algorithm 2's N_t).
func bsag(ctx context.Context, g comm.Group, tag uint32, own COO, l, h, blockLen int) (final, shares COO, union int, err error) {
	d := g.Size()
	blocks, err := bruckSparse(ctx, g, tag, own, blockLen,
		func(int) int { return blockLen },
		func(int) int { return min(h, blockLen) })
	if err != nil {
		return COO{}, COO{}, 0, fmt.Errorf("B-SAG: %w", err)
	}
	var u, tmp COO
	u = blocks[0].Clone()
	for x := 1; x < d; x++ {
		tmp = Merge(tmp, u, blocks[x])
		u, tmp = tmp, u
	}
	union = u.Len()
	kept, dropped := TopKOf(COO{}, COO{}, dropZeros(u), l)
	share := 1 / float32(d)
	for e := range dropped.Val {
		dropped.Val[e] *= share
	}
	return kept, dropped, union, nil
}
