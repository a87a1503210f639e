package comm

import (
	"context"
	"fmt"
)

// SmallAllReduceBytes is the largest vector (in bytes) for which Auto all-reduces by recursive
// doubling. Below it the cost is latency: recursive doubling takes log2 P rounds against 2·log2 P
// (Rabenseifner) or 2(P-1) (ring), and its extra volume (n·log2 P words instead of 2n(P-1)/P) is
// a few KiB. 2 KiB is MPICH's MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE, measured on real networks.
const SmallAllReduceBytes = 2048

// AllReduceAlgorithm is the algorithm AllReduce runs for n float32 on p ranks when asked for
// alg: alg itself, or for Auto the one Auto picks (see the package doc).
func AllReduceAlgorithm(n, p int, alg Algorithm) Algorithm {
	if alg == Auto {
		return autoAllReduce(n, p)
	}
	return alg
}

// AllReduceAlgorithmOn is the algorithm AllReduce runs for n float32 on g with alg: SharedMemory
// for Auto on a shared-memory group (OnSharedMemory), else AllReduceAlgorithm(n, g.Size(), alg).
func AllReduceAlgorithmOn(g Group, n int, alg Algorithm) Algorithm {
	if alg == Auto && isSharedMemory(g) {
		return SharedMemory
	}
	return AllReduceAlgorithm(n, g.Size(), alg)
}

// OnSharedMemory reports whether g's ranks talk through one shared-memory segment: a group of
// NewShm or NewShmLocal, or a view of one (Underlier), such as a job's group whose ranks all run
// on one host (cluster.Init).
func OnSharedMemory(g Group) bool { return isSharedMemory(g) }

// autoAllReduce is the algorithm Auto picks for n float32 on p ranks.
func autoAllReduce(n, p int) Algorithm { return autoAllReduceBytes(4*n, p) }

// autoAllReduceBytes is the algorithm Auto picks for a vector of the given size on p ranks.
func autoAllReduceBytes(bytes, p int) Algorithm {
	switch {
	case bytes <= SmallAllReduceBytes:
		return RecursiveDoubling
	case isPow2(p):
		return Rabenseifner
	default:
		// Folding the extra ranks costs Rabenseifner n more words on 2·(P-P') ranks; the ring
		// stays at 2n(P-1)/P words everywhere.
		return Ring
	}
}

// Element is the constraint on AllReduceOf's element types: fixed-size numbers, which travel
// as their host-order (little-endian) bytes.
type Element interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~float32 | ~float64
}

// AllReduce sums buf elementwise over all ranks, in place: afterwards every rank holds the same
// bit-identical sum (each element is reduced in exactly one place, or in the same operand order
// everywhere, and then copied). Every rank must pass the same len(buf), tag and alg.
//
// Costs per rank for n elements (words = 4 bytes received; P' = 2^floor(log2 P), rem = P-P'):
//   - Ring: 2(P-1) rounds, 2n(P-1)/P words when P | n. Otherwise the blocks differ: the
//     first n mod P hold ceil(n/P) elements, the rest floor(n/P), and rank r receives every
//     block but block r in the reduce-scatter and every block but block r+1 in the
//     all-gather, 2n - |block r| - |block r+1| words: at most 2(n - floor(n/P)), which ranks
//     reach when n mod P <= P-2 (e.g. n = 10, P = 4: 16 words, not 15).
//   - Rabenseifner, power-of-two P: 2·log2 P rounds, 2n(P-1)/P words when P | n; otherwise,
//     from the same unequal blocks, at most 2(n - floor(n/P)).
//     Other P fold first (MPICH): ranks r < 2·rem pair up, the even one sends its vector to the
//     odd one, which adds; the P' survivors run the power-of-two algorithm; the odd ones send
//     the result back. Even r < 2·rem: 2 rounds, n words. Odd r < 2·rem: 2·log2 P' + 2 rounds,
//     n + 2n(P'-1)/P' words. r >= 2·rem: 2·log2 P' rounds, 2n(P'-1)/P' words.
//   - RecursiveDoubling, power-of-two P: log2 P rounds, n·log2 P words. Other P fold the same way:
//     even r < 2·rem: 2 rounds, n words; odd r < 2·rem: log2 P' + 2 rounds, n(log2 P' + 1)
//     words; r >= 2·rem: log2 P' rounds, n·log2 P' words.
//
// An empty buf or P = 1 returns at once without messages.
func AllReduce(ctx context.Context, g Group, tag uint32, buf []float32, alg Algorithm) error {
	return allReduce(ctx, g, tag, buf, addInto, alg, "AllReduce", "floats")
}

// AllReduceOf is AllReduce for any element type and reduction: the same algorithms, rounds,
// messages and Auto choice (by the vector's size in bytes), each element travelling as its
// unsafe.Sizeof(T) bytes, so AllReduce's costs hold with a word of that many bytes.
// Every reduction step calls add(dst, a, b), which must set dst[i] to the reduction of a[i]
// and b[i] for every i: the three have the same length, and dst is a or b. The algorithms fix
// the operands and their order (the lower rank's partial is a wherever two ranks reduce the
// same elements), so every rank gets the same bits as long as add depends on its operands
// only; the order in which partials meet differs between algorithms, so add should be
// associative and commutative up to the rounding the caller accepts.
//
// AllReduce is AllReduceOf with float32 addition. Other uses: 16-bit floats whose every step
// widens, adds and rounds back (hooks.AllReduce16), exact integer sums.
func AllReduceOf[T Element](ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T), alg Algorithm) error {
	return allReduce(ctx, g, tag, buf, add, alg, "AllReduceOf", "elements")
}

// allReduce is AllReduce and AllReduceOf; op and unit name the call and its elements in errors.
func allReduce[T Element](ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T), alg Algorithm, op, unit string) error {
	if err := checkGroup(op, g); err != nil {
		return err
	}
	p, n := g.Size(), len(buf)
	switch {
	case alg == Auto && isSharedMemory(g):
		alg = SharedMemory
	case alg == Auto:
		alg = autoAllReduceBytes(n*elementSize[T](), p)
	}
	var err error
	switch alg {
	case Ring, Rabenseifner, RecursiveDoubling:
	case SharedMemory:
		if !isSharedMemory(g) {
			return fmt.Errorf("comm: %s: rank %d: algorithm %v needs a group made by NewShm or NewShmLocal (this one is %T)", op, g.Rank(), alg, g)
		}
	default:
		return fmt.Errorf("comm: %s: rank %d: algorithm %v is not an all-reduce algorithm (use Auto, Ring, Rabenseifner, RecursiveDoubling or SharedMemory)", op, g.Rank(), alg)
	}
	if p == 1 || n == 0 {
		return nil
	}
	switch alg {
	case SharedMemory:
		_, err = sharedAllReduce(ctx, g, tag, buf, add, op == "AllReduce") // AllReduce's addInto writes any dst
	case Ring:
		err = ringAllReduce(ctx, g, tag, buf, add)
	case Rabenseifner:
		err = foldedAllReduce(ctx, g, tag, buf, add, rabenseifnerCore)
	case RecursiveDoubling:
		err = foldedAllReduce(ctx, g, tag, buf, add, recursiveDoublingCore)
	}
	if err != nil {
		return fmt.Errorf("comm: %s(%v) of %d %s, rank %d of %d, tag %d: %w", op, alg, n, unit, g.Rank(), p, tag, err)
	}
	return nil
}

func ringAllReduce[T Element](ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T)) error {
	p, r := g.Size(), g.Rank()
	counts, offs := blockCounts(len(buf), p)
	scratch := getScratchOf[T](counts[0])
	defer putScratchOf(scratch)
	right, left := (r+1)%p, (r-1+p)%p
	block := func(i int) []T { return buf[offs[i]:offs[i+1]] }
	mod := func(i int) int { return ((i % p) + p) % p }

	// Reduce-scatter: in step s rank r passes on its partial of block r-s and adds the left
	// neighbour's partial of block r-s-1; after P-1 steps it owns the full sum of block r+1.
	for s := range p - 1 {
		sb, rb := mod(r-s), mod(r-s-1)
		in := scratch[:counts[rb]]
		if err := exchange(ctx, g, tag, right, bytesOf(block(sb)), left, bytesOf(in)); err != nil {
			return fmt.Errorf("reduce-scatter step %d: %w", s, err)
		}
		add(block(rb), block(rb), in)
	}
	// All-gather: pass the finished blocks around, received straight into place.
	for s := range p - 1 {
		sb, rb := mod(r+1-s), mod(r-s)
		if err := exchange(ctx, g, tag, right, bytesOf(block(sb)), left, bytesOf(block(rb))); err != nil {
			return fmt.Errorf("all-gather step %d: %w", s, err)
		}
	}
	return nil
}

// powerOfTwoCore all-reduces buf among pp (a power of two) ranks, the survivors of a fold of
// rem ranks; this rank is number nr of them, and foldedRank(i, rem) is the Group rank of number i.
type powerOfTwoCore[T Element] func(ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T), nr, pp, rem int) error

// foldedRank is the Group rank of survivor number nr of a fold of rem ranks: the odd rank of
// each of the first rem pairs, then the ranks from 2·rem on. (A function, not a closure over
// rem: the closure, passed to a core, would cost an allocation per call.)
func foldedRank(nr, rem int) int {
	if nr < rem {
		return 2*nr + 1
	}
	return nr + rem
}

// foldedAllReduce runs core on P' = 2^floor(log2 P) ranks after folding the other rem = P-P'
// in, MPICH's way: ranks r < 2·rem pair up (r even, r+1); the even one sends its whole vector,
// the odd one adds it and takes part; at the end the odd one sends the result back.
func foldedAllReduce[T Element](ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T), core powerOfTwoCore[T]) error {
	p, r := g.Size(), g.Rank()
	pp := floorPow2(p)
	rem := p - pp
	nr := r - rem
	if r < 2*rem {
		if r%2 == 0 {
			if err := exchange(ctx, g, tag, r+1, bytesOf(buf), -1, nil); err != nil {
				return fmt.Errorf("fold in: %w", err)
			}
			if err := exchange(ctx, g, tag, -1, nil, r+1, bytesOf(buf)); err != nil {
				return fmt.Errorf("fold out: %w", err)
			}
			return nil
		}
		in := getScratchOf[T](len(buf))
		defer putScratchOf(in)
		if err := exchange(ctx, g, tag, -1, nil, r-1, bytesOf(in)); err != nil {
			return fmt.Errorf("fold in: %w", err)
		}
		add(buf, in, buf) // the lower rank's vector first
		nr = r / 2
	}
	if err := core(ctx, g, tag, buf, add, nr, pp, rem); err != nil {
		return err
	}
	if r < 2*rem {
		if err := exchange(ctx, g, tag, r-1, bytesOf(buf), -1, nil); err != nil {
			return fmt.Errorf("fold out: %w", err)
		}
	}
	return nil
}

// rabenseifnerCore: recursive-halving reduce-scatter, then recursive-doubling all-gather, over
// pp blocks of (nearly) equal size. Rank number nr ends the first half owning block nr.
func rabenseifnerCore[T Element](ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T), nr, pp, rem int) error {
	_, offs := blockCounts(len(buf), pp)
	span := func(lo, hi int) []T { return buf[offs[lo]:offs[hi]] }
	scratch := getScratchOf[T](offs[pp/2]) // the largest half: the first blocks are the largest
	defer putScratchOf(scratch)

	lo, hi := 0, pp // the blocks this rank is still responsible for
	for d := pp / 2; d >= 1; d /= 2 {
		partner := nr ^ d
		mid := (lo + hi) / 2
		keepLo, keepHi, sendLo, sendHi := lo, mid, mid, hi
		if nr&d != 0 {
			keepLo, keepHi, sendLo, sendHi = mid, hi, lo, mid
		}
		kept := span(keepLo, keepHi)
		in := scratch[:len(kept)]
		peer := foldedRank(partner, rem)
		if err := exchange(ctx, g, tag, peer, bytesOf(span(sendLo, sendHi)), peer, bytesOf(in)); err != nil {
			return fmt.Errorf("reduce-scatter distance %d: %w", d, err)
		}
		if nr < partner {
			add(kept, kept, in)
		} else {
			add(kept, in, kept)
		}
		lo, hi = keepLo, keepHi
	}
	for d := 1; d < pp; d *= 2 {
		partner := nr ^ d
		plo, phi := hi, hi+d // the partner's window is the adjacent one of the same size
		if nr&d != 0 {
			plo, phi = lo-d, lo
		}
		peer := foldedRank(partner, rem)
		if err := exchange(ctx, g, tag, peer, bytesOf(span(lo, hi)), peer, bytesOf(span(plo, phi))); err != nil {
			return fmt.Errorf("all-gather distance %d: %w", d, err)
		}
		lo, hi = min(lo, plo), max(hi, phi)
	}
	return nil
}

// recursiveDoublingCore exchanges whole vectors with the partner at distance 1, 2, 4, ... and
// adds them lower rank first, so both partners (and by induction all ranks) get the same bits.
func recursiveDoublingCore[T Element](ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T), nr, pp, rem int) error {
	in := getScratchOf[T](len(buf))
	defer putScratchOf(in)
	for d := 1; d < pp; d *= 2 {
		partner := nr ^ d
		peer := foldedRank(partner, rem)
		if err := exchange(ctx, g, tag, peer, bytesOf(buf), peer, bytesOf(in)); err != nil {
			return fmt.Errorf("distance %d: %w", d, err)
		}
		if nr < partner {
			add(buf, buf, in)
		} else {
			add(buf, in, buf)
		}
	}
	return nil
}
