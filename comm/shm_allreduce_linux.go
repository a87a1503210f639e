//go:build linux

package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// The shared all-reduce: every rank's vector goes, half a reduce slot at a time, through the
// segment. In each pass rank r copies its chunk into its slot (all blocks but block r), waits at
// a barrier, sums block r of every rank's chunk (its own from its buffer) pairwise in rank order
// (treeReduce) into block r of its slot, waits at a second barrier and copies every block j from
// rank j's slot into its buffer. Each element is summed in one place, in one order, then copied:
// every rank gets the same bits, whatever the timing. Passes alternate between the two halves of
// the slots, so a pass's copies in never meet the previous pass's copies out, and two barriers
// per pass suffice.
//
// The area is one per group; concurrent calls (under different tags) take turns: the owner
// word in the header names the tag of the call in progress and its generation, a rank joins the
// call of its own tag it has not yet taken part in, and the last rank at the call's final
// barrier frees the area.

// shmReduceState is a rank's view of the shared all-reduce's progress. Its fields change only
// inside a call, and calls on a group run one at a time (the owner word), so the goroutine
// running a call owns them; they are atomic because other goroutines of the rank read lastGen
// while they wait for their turn.
type shmReduceState struct {
	// mu is held by the goroutine of this rank that takes part in a call, from joining to
	// its last copy out, so that the rank's next call cannot start before.
	mu       sync.Mutex
	lastGen  atomic.Uint64 // the generation of the last call this rank took part in
	barriers atomic.Uint64 // barriers this rank has passed, ever
	passes   atomic.Uint64 // passes this rank has made, ever (their parity picks the half)
	inPlace  atomic.Uint64 // calls that read the peers' vectors in place (shared buffers), ever
}

const (
	ownerBusy = 1 << 32
	ownerGen  = 33
)

// sharedAllReduce runs the shared all-reduce when g is a shared-memory group, or a view whose
// ranks are one for one those of one (Underlier: a Route of one node, a WithTopology view), and
// reports whether it did. The traffic is counted on g's Counters. anyDst says that add may write
// a third slice (float32 addition does; the contract of AllReduceOf's add only lets dst be an
// operand).
func sharedAllReduce[T Element](ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T), anyDst bool) (bool, error) {
	sg := shmUnder(g)
	if sg == nil {
		return false, nil
	}
	if sg.Counters() == g.Counters() {
		return true, shmAllReduce(ctx, sg, tag, buf, add, anyDst)
	}
	before := sg.Counters().Snapshot()
	err := shmAllReduce(ctx, sg, tag, buf, add, anyDst)
	g.Counters().add(sg.Counters().Snapshot().Sub(before))
	return true, err
}

// shmUnder returns the shared-memory group under g (g itself, or what its Underlying views), or nil.
func shmUnder(g Group) *shmGroup {
	for {
		switch v := g.(type) {
		case *shmGroup:
			return v
		case Underlier:
			if g = v.Underlying(); g == nil {
				return nil
			}
		default:
			return nil
		}
	}
}

// treeReduce reduces ops (at least two) pairwise: at distance 1, 2, 4, … ops[i] += ops[i+d]
// for i a multiple of 2d, the lower index first, and the last addition into dst (ops[0] when
// dst is nil). For a power-of-two count these are the additions of recursive doubling, in its
// order; the error grows with log2 of the count, not the count.
func treeReduce[T Element](ops [][]T, dst []T, add func(dst, a, b []T)) {
	if dst == nil {
		dst = ops[0]
	}
	for d := 1; d < len(ops); d *= 2 {
		for i := 0; i+d < len(ops); i += 2 * d {
			out := ops[i]
			if 2*d >= len(ops) {
				out = dst // the last level has one addition
			}
			add(out, ops[i], ops[i+d])
		}
	}
}

// isSharedMemory reports whether g is a group whose all-reduce can go through shared memory.
func isSharedMemory(g Group) bool { return shmUnder(g) != nil }

func shmAllReduce[T Element](ctx context.Context, g *shmGroup, tag uint32, buf []T, add func(dst, a, b []T), anyDst bool) error {
	if !g.enter() {
		return ErrClosed
	}
	defer g.leave()
	if err := g.termErr(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, g.ringReduce)
	defer stop()
	gen, err := g.claimReduce(ctx, tag)
	if err != nil {
		return err
	}
	defer g.ar.mu.Unlock()
	p, r := g.size, g.rank
	esz := elementSize[T]()
	half := g.seg.layout.reduceBytes / 2
	chunk := half / esz / p * p
	if chunk == 0 {
		return g.abandon(tag, fmt.Errorf("a reduce slot of %d bytes cannot hold %d elements of %d bytes", half*2, p, esz))
	}
	passes := (len(buf) + chunk - 1) / chunk
	slotView := func(rank, h, lo, hi int) []T {
		off := g.seg.reduceOff(rank) + h*half
		return unsafe.Slice((*T)(unsafe.Pointer(&g.mem[off])), chunk)[lo:hi]
	}
	// A vector in a shared buffer (AllocShared) needs no copying in; each rank says in its slot
	// where its vector lies before the first barrier, and after it every rank reads the same
	// descriptions and goes the same way (zeroCopyWay).
	k, off, shared := g.arenaOf(unsafe.Pointer(unsafe.SliceData(buf)), len(buf)*esz)
	shared = shared && len(buf)*esz >= zeroCopyMin // the same on every rank: the lengths are
	g.describeVector(gen, k, off, len(buf)*esz, shared)
	for i := range passes {
		c := buf[i*chunk : min((i+1)*chunk, len(buf))]
		_, offs := blockCounts(len(c), p)
		h := int(g.ar.passes.Load() % 2)
		// Copy in every block but this rank's own, which it reduces from its buffer.
		copyIn := func() {
			for j := range p {
				if j != r {
					copy(slotView(r, h, offs[j], offs[j+1]), c[offs[j]:offs[j+1]])
				}
			}
		}
		if i > 0 || !shared {
			copyIn()
		}
		if err := g.reduceBarrier(ctx, tag, gen, false); err != nil {
			return err
		}
		if i == 0 {
			switch g.zeroCopyWay(gen) {
			case zeroCopyAll:
				return shmZeroCopyAllReduce(ctx, g, tag, gen, buf, k, off, add, anyDst)
			case zeroCopySome: // the ranks in shared buffers copy in now, as the others did
				if shared {
					copyIn()
				}
				if err := g.reduceBarrier(ctx, tag, gen, false); err != nil {
					return err
				}
			}
		}
		// Reduce block r: a tree over the ranks' blocks in rank order. Nobody else reads block
		// r of the peers' slots in this pass, so the partial sums overwrite them.
		lo, hi := offs[r], offs[r+1]
		if hi > lo {
			ops := make([][]T, p)
			for k := range p {
				if k == r {
					ops[k] = c[lo:hi]
				} else {
					ops[k] = slotView(k, h, lo, hi)
				}
			}
			if mine := slotView(r, h, lo, hi); anyDst {
				treeReduce(ops, mine, add)
			} else {
				treeReduce(ops, nil, add)
				copy(mine, ops[0])
			}
		}
		if err := g.reduceBarrier(ctx, tag, gen, i == passes-1); err != nil {
			return err
		}
		for j := range p {
			copy(c[offs[j]:offs[j+1]], slotView(j, h, offs[j], offs[j+1]))
		}
		g.ar.passes.Add(1)
		g.countReduce(offs, esz)
	}
	g.ar.lastGen.Store(gen)
	return nil
}

// countReduce counts one pass over blocks offs on the Counters: the words this rank read from
// its peers (block r of each, then every other block's sum) and the words its peers read from it.
func (g *shmGroup) countReduce(offs []int, esz int) {
	r := g.rank
	mine := (offs[r+1] - offs[r]) * esz
	for j := range g.size {
		if j == r {
			continue
		}
		g.counters.AddRecv(mine)
		g.counters.AddRecv((offs[j+1] - offs[j]) * esz)
		g.counters.AddSent((offs[j+1] - offs[j]) * esz)
		g.counters.AddSent(mine)
	}
	g.counters.AddRound(2)
}

// zeroCopyChunk is the bytes of the vector one step of the in-place all-reduce covers: the
// blocks a rank sums in one step are still in the caches when the others copy them out in the
// next.
const zeroCopyChunk = 1 << 20

// zeroCopyMin is the smallest vector (bytes) read in place: below it the copies cost less than
// the in-place way's extra barrier.
var zeroCopyMin = 64 << 10

// How the ranks' vectors of a shared all-reduce lie (zeroCopyWay).
const (
	zeroCopyNone = iota // no rank's vector is in a shared buffer
	zeroCopyAll         // every rank's is, in the same buffer at the same offset
	zeroCopySome        // anything else
)

// describeVector writes where this rank's vector of call gen lies into its slot.
func (g *shmGroup) describeVector(gen uint64, k, off, bytes int, shared bool) {
	slot := g.slot(g.rank)
	arena := uint64(0)
	if shared {
		arena = uint64(k) + 1
	}
	atomic.StoreUint64(g.mem.u64(slot+sZCArena), arena)
	atomic.StoreUint64(g.mem.u64(slot+sZCOff), uint64(off))
	atomic.StoreUint64(g.mem.u64(slot+sZCLen), uint64(bytes))
	atomic.StoreUint64(g.mem.u64(slot+sZCGen), gen)
}

// zeroCopyWay reads every rank's description of its vector of call gen (after the call's first
// barrier, so all are written; no rank rewrites its own before the call's final barrier).
func (g *shmGroup) zeroCopyWay(gen uint64) int {
	var first [3]uint64
	all, any := true, false
	for r := range g.size {
		slot := g.slot(r)
		d := [3]uint64{g.mem.load64(slot + sZCArena), g.mem.load64(slot + sZCOff), g.mem.load64(slot + sZCLen)}
		if g.mem.load64(slot+sZCGen) != gen {
			d[0] = 0 // cannot happen: every rank describes its vector before it arrives
		}
		if r == 0 {
			first = d
		}
		any = any || d[0] != 0
		all = all && d[0] != 0 && d == first
	}
	switch {
	case all:
		return zeroCopyAll
	case any:
		return zeroCopySome
	}
	return zeroCopyNone
}

// shmZeroCopyAllReduce is the shared all-reduce of vectors that lie in shared buffer k at byte
// offset off on every rank, after the call's first barrier: rank r sums block r of every rank's
// vector where it lies, in the same tree as the copying way (so the same bits), into its own
// vector; after a barrier it copies every other block j from rank j's vector; a final barrier
// keeps its vector unchanged until every rank has copied its block. The peers' blocks r may
// hold partial sums meanwhile: their owners overwrite them with the sum in their copies.
func shmZeroCopyAllReduce[T Element](ctx context.Context, g *shmGroup, tag uint32, gen uint64, buf []T, k, off int, add func(dst, a, b []T), anyDst bool) error {
	p, r := g.size, g.rank
	esz := elementSize[T]()
	chunk := max(zeroCopyChunk/esz/p*p, p)
	passes := (len(buf) + chunk - 1) / chunk
	peers := make([][]T, p)
	for q, m := range g.arenaMaps(k) {
		if q == r {
			peers[q] = buf
		} else {
			peers[q] = unsafe.Slice((*T)(unsafe.Pointer(&m[off])), len(buf))
		}
	}
	// step is step i's first element and the bounds of its P blocks.
	step := func(i int) (int, []int) {
		base := i * chunk
		_, offs := blockCounts(min(chunk, len(buf)-base), p)
		return base, offs
	}
	ops := make([][]T, p)
	reduce := func(i int) {
		base, offs := step(i)
		lo, hi := base+offs[r], base+offs[r+1]
		if hi == lo {
			return
		}
		for q := range p {
			ops[q] = peers[q][lo:hi]
		}
		if anyDst {
			treeReduce(ops, buf[lo:hi], add)
		} else {
			treeReduce(ops, nil, add)
			copy(buf[lo:hi], ops[0])
		}
	}
	gather := func(i int) {
		base, offs := step(i)
		for j := range p {
			if j != r {
				lo, hi := base+offs[j], base+offs[j+1]
				copy(buf[lo:hi], peers[j][lo:hi])
			}
		}
		g.countReduce(offs, esz)
	}
	reduce(0)
	for i := 1; i <= passes; i++ {
		if err := g.reduceBarrier(ctx, tag, gen, false); err != nil {
			return err
		}
		gather(i - 1)
		if i < passes {
			reduce(i)
		}
	}
	if err := g.reduceBarrier(ctx, tag, gen, true); err != nil {
		return err
	}
	g.ar.inPlace.Add(1)
	g.ar.lastGen.Store(gen)
	return nil
}

// shmCancelHook, when set (tests), runs first in ringReduce.
var shmCancelHook func()

// ringReduce wakes the ranks waiting in the shared all-reduce when a call's context ends. It
// runs on its own goroutine (context.AfterFunc), possibly after the call returned and Close
// unmapped the segment, so it touches the segment only while the group holds it. A Close in
// progress (its write lock pending, so TryRLock fails) wakes every waiter itself (wakeAll).
func (g *shmGroup) ringReduce() {
	if h := shmCancelHook; h != nil {
		h()
	}
	if !g.live.TryRLock() {
		return
	}
	defer g.live.RUnlock()
	if !g.unmapped {
		ring(g.mem.u32(hRBell), g.mem.u32(hRSleepers))
	}
}

// claimReduce waits until the shared area is free or taken by a call under tag that this rank
// has not yet taken part in, takes part, and returns the call's generation, holding g.ar.mu.
func (g *shmGroup) claimReduce(ctx context.Context, tag uint32) (uint64, error) {
	owner := g.mem.u64(hROwner)
	sp := spinner{spinFor: g.spinFor}
	start := time.Now()
	for {
		if err := g.reduceErr(ctx, tag); err != nil {
			return 0, err
		}
		g.ar.mu.Lock()
		o := atomic.LoadUint64(owner)
		gen := o >> ownerGen
		switch {
		case o&ownerBusy == 0:
			next := (gen+1)<<ownerGen | ownerBusy | uint64(tag)
			if atomic.CompareAndSwapUint64(owner, o, next) {
				ring(g.mem.u32(hRBell), g.mem.u32(hRSleepers))
				return gen + 1, nil
			}
			g.ar.mu.Unlock()
			continue
		case uint32(o) == tag && gen != g.ar.lastGen.Load():
			return gen, nil
		}
		g.ar.mu.Unlock()
		if g.opTimeout > 0 && time.Since(start) >= g.opTimeout {
			g.reduceLate(tag, 0) // the ranks that keep the call in progress from ending
		}
		g.reduceWait(&sp, func() bool { return atomic.LoadUint64(owner) != o })
	}
}

// reduceBarrier waits for every rank at the call's next barrier; the last one to arrive at the
// final barrier of the call frees the area.
func (g *shmGroup) reduceBarrier(ctx context.Context, tag uint32, gen uint64, final bool) error {
	arrive := g.mem.u64(hRArrive)
	k := g.ar.barriers.Add(1)
	atomic.StoreUint64(g.mem.u64(g.slot(g.rank)+sRBarriers), k) // before arriving: see reduceLate
	target := k * uint64(g.size)
	if atomic.AddUint64(arrive, 1) == target {
		if final {
			atomic.StoreUint64(g.mem.u64(hROwner), gen<<ownerGen|uint64(tag))
		}
		ring(g.mem.u32(hRBell), g.mem.u32(hRSleepers))
		return nil
	}
	sp := spinner{spinFor: g.spinFor}
	start := time.Now()
	for atomic.LoadUint64(arrive) < target {
		if err := g.reduceErr(ctx, tag); err != nil {
			return g.abandon(tag, err)
		}
		if g.opTimeout > 0 && time.Since(start) >= g.opTimeout {
			g.reduceLate(tag, k) // fails the group naming the ranks not here yet
		}
		g.reduceWait(&sp, func() bool { return atomic.LoadUint64(arrive) >= target })
	}
	return nil
}

// reduceWait yields for the first spins, then sleeps on the area's doorbell until done
// reports true, the bell rings or a tick passes.
func (g *shmGroup) reduceWait(sp *spinner, done func() bool) {
	if sp.spin() {
		return
	}
	bell, sleepers := g.mem.u32(hRBell), g.mem.u32(hRSleepers)
	v := atomic.LoadUint32(bell)
	atomic.AddUint32(sleepers, 1)
	if !done() {
		futexWait(bell, v, g.waitTick)
	}
	atomic.AddUint32(sleepers, ^uint32(0))
}

// reduceErr is why a rank waiting in the shared all-reduce must stop: the group failed or
// closed, another rank abandoned a call or closed its group, or the context ended.
func (g *shmGroup) reduceErr(ctx context.Context, tag uint32) error {
	if err := g.termErr(); err != nil {
		return err
	}
	// Every rank takes part in every call: one that closed its group will not come.
	for r := range g.size {
		if r != g.rank && g.peerState(r) == shmClosed {
			return peerClosed(r)
		}
	}
	if b := g.mem.load32(hRBroken); b != 0 {
		n := min(int(g.mem.load32(hRBrokenWhy)), shmCauseMax)
		return fmt.Errorf("rank %d abandoned a shared all-reduce midway (%s); the shared area stays unusable for this group",
			b-1, g.mem[hRBrokenWhy+4:hRBrokenWhy+4+n])
	}
	return ctx.Err()
}

// abandon leaves a call midway: the other ranks, whose barrier this rank will never reach,
// learn why from the header (unless the group failed, which they learn anyway).
func (g *shmGroup) abandon(tag uint32, err error) error {
	var pe *PeerError
	// A failure or a closed peer, the others learn of themselves.
	if g.termErr() == nil && !errors.As(err, &pe) && !errors.Is(err, ErrClosed) {
		why := fmt.Sprintf("tag %d: %v", tag, err)
		if len(why) > shmCauseMax {
			why = why[:shmCauseMax]
		}
		if atomic.CompareAndSwapUint32(g.mem.u32(hRBroken), 0, uint32(g.rank+1)) {
			copy(g.mem[hRBrokenWhy+4:], why)
			atomic.StoreUint32(g.mem.u32(hRBrokenWhy), uint32(len(why)))
		}
		ring(g.mem.u32(hRBell), g.mem.u32(hRSleepers))
	}
	return err
}
