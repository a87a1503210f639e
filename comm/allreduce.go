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

// autoAllReduce is the algorithm Auto picks for n float32 on p ranks.
func autoAllReduce(n, p int) Algorithm {
	switch {
	case 4*n <= SmallAllReduceBytes:
		return RecursiveDoubling
	case isPow2(p):
		return Rabenseifner
	default:
		// Folding the extra ranks costs Rabenseifner n more words on 2·(P-P') ranks; the ring
		// stays at 2n(P-1)/P words everywhere.
		return Ring
	}
}

// AllReduce sums buf elementwise over all ranks, in place: afterwards every rank holds the same
// bit-identical sum (each element is reduced in exactly one place, or in the same operand order
// everywhere, and then copied). Every rank must pass the same len(buf), tag and alg.
//
// Costs per rank for n elements (words = 4 bytes received; P' = 2^floor(log2 P), rem = P-P'):
//   - Ring: 2(P-1) rounds, 2n(P-1)/P words (exact when P | n; blocks differ by at most one
//     element otherwise).
//   - Rabenseifner, power-of-two P: 2·log2 P rounds, 2n(P-1)/P words (exact when P | n).
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
	if err := checkGroup("AllReduce", g); err != nil {
		return err
	}
	p, n := g.Size(), len(buf)
	if alg == Auto {
		alg = autoAllReduce(n, p)
	}
	var err error
	switch alg {
	case Ring, Rabenseifner, RecursiveDoubling:
	default:
		return fmt.Errorf("comm: AllReduce: rank %d: algorithm %v is not an all-reduce algorithm (use Auto, Ring, Rabenseifner or RecursiveDoubling)", g.Rank(), alg)
	}
	if p == 1 || n == 0 {
		return nil
	}
	switch alg {
	case Ring:
		err = ringAllReduce(ctx, g, tag, buf)
	case Rabenseifner:
		err = foldedAllReduce(ctx, g, tag, buf, rabenseifnerCore)
	case RecursiveDoubling:
		err = foldedAllReduce(ctx, g, tag, buf, recursiveDoublingCore)
	}
	if err != nil {
		return fmt.Errorf("comm: AllReduce(%v) of %d floats, rank %d of %d, tag %d: %w", alg, n, g.Rank(), p, tag, err)
	}
	return nil
}

func ringAllReduce(ctx context.Context, g Group, tag uint32, buf []float32) error {
	p, r := g.Size(), g.Rank()
	counts, offs := blockCounts(len(buf), p)
	scratch := getScratch(counts[0])
	defer putScratch(scratch)
	right, left := (r+1)%p, (r-1+p)%p
	block := func(i int) []float32 { return buf[offs[i]:offs[i+1]] }
	mod := func(i int) int { return ((i % p) + p) % p }

	// Reduce-scatter: in step s rank r passes on its partial of block r-s and adds the left
	// neighbour's partial of block r-s-1; after P-1 steps it owns the full sum of block r+1.
	for s := range p - 1 {
		sb, rb := mod(r-s), mod(r-s-1)
		in := scratch[:counts[rb]]
		if err := exchange(ctx, g, tag, right, F32Bytes(block(sb)), left, F32Bytes(in)); err != nil {
			return fmt.Errorf("reduce-scatter step %d: %w", s, err)
		}
		addInto(block(rb), block(rb), in)
	}
	// All-gather: pass the finished blocks around, received straight into place.
	for s := range p - 1 {
		sb, rb := mod(r+1-s), mod(r-s)
		if err := exchange(ctx, g, tag, right, F32Bytes(block(sb)), left, F32Bytes(block(rb))); err != nil {
			return fmt.Errorf("all-gather step %d: %w", s, err)
		}
	}
	return nil
}

// powerOfTwoCore all-reduces buf among pp (a power of two) ranks; this rank is number nr of them
// and real(i) is the Group rank of number i.
type powerOfTwoCore func(ctx context.Context, g Group, tag uint32, buf []float32, nr, pp int, real func(int) int) error

// foldedAllReduce runs core on P' = 2^floor(log2 P) ranks after folding the other rem = P-P'
// in, MPICH's way: ranks r < 2·rem pair up (r even, r+1); the even one sends its whole vector,
// the odd one adds it and takes part; at the end the odd one sends the result back.
func foldedAllReduce(ctx context.Context, g Group, tag uint32, buf []float32, core powerOfTwoCore) error {
	p, r := g.Size(), g.Rank()
	pp := floorPow2(p)
	rem := p - pp
	real := func(nr int) int {
		if nr < rem {
			return 2*nr + 1
		}
		return nr + rem
	}
	nr := r - rem
	if r < 2*rem {
		if r%2 == 0 {
			if err := exchange(ctx, g, tag, r+1, F32Bytes(buf), -1, nil); err != nil {
				return fmt.Errorf("fold in: %w", err)
			}
			if err := exchange(ctx, g, tag, -1, nil, r+1, F32Bytes(buf)); err != nil {
				return fmt.Errorf("fold out: %w", err)
			}
			return nil
		}
		in := getScratch(len(buf))
		defer putScratch(in)
		if err := exchange(ctx, g, tag, -1, nil, r-1, F32Bytes(in)); err != nil {
			return fmt.Errorf("fold in: %w", err)
		}
		addInto(buf, in, buf) // the lower rank's vector first
		nr = r / 2
	}
	if err := core(ctx, g, tag, buf, nr, pp, real); err != nil {
		return err
	}
	if r < 2*rem {
		if err := exchange(ctx, g, tag, r-1, F32Bytes(buf), -1, nil); err != nil {
			return fmt.Errorf("fold out: %w", err)
		}
	}
	return nil
}

// rabenseifnerCore: recursive-halving reduce-scatter, then recursive-doubling all-gather, over
// pp blocks of (nearly) equal size. Rank number nr ends the first half owning block nr.
func rabenseifnerCore(ctx context.Context, g Group, tag uint32, buf []float32, nr, pp int, real func(int) int) error {
	_, offs := blockCounts(len(buf), pp)
	span := func(lo, hi int) []float32 { return buf[offs[lo]:offs[hi]] }
	scratch := getScratch(offs[pp/2]) // the largest half: the first blocks are the largest
	defer putScratch(scratch)

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
		if err := exchange(ctx, g, tag, real(partner), F32Bytes(span(sendLo, sendHi)), real(partner), F32Bytes(in)); err != nil {
			return fmt.Errorf("reduce-scatter distance %d: %w", d, err)
		}
		if nr < partner {
			addInto(kept, kept, in)
		} else {
			addInto(kept, in, kept)
		}
		lo, hi = keepLo, keepHi
	}
	for d := 1; d < pp; d *= 2 {
		partner := nr ^ d
		plo, phi := hi, hi+d // the partner's window is the adjacent one of the same size
		if nr&d != 0 {
			plo, phi = lo-d, lo
		}
		if err := exchange(ctx, g, tag, real(partner), F32Bytes(span(lo, hi)), real(partner), F32Bytes(span(plo, phi))); err != nil {
			return fmt.Errorf("all-gather distance %d: %w", d, err)
		}
		lo, hi = min(lo, plo), max(hi, phi)
	}
	return nil
}

// recursiveDoublingCore exchanges whole vectors with the partner at distance 1, 2, 4, ... and
// adds them lower rank first, so both partners (and by induction all ranks) get the same bits.
func recursiveDoublingCore(ctx context.Context, g Group, tag uint32, buf []float32, nr, pp int, real func(int) int) error {
	in := getScratch(len(buf))
	defer putScratch(in)
	for d := 1; d < pp; d *= 2 {
		partner := nr ^ d
		if err := exchange(ctx, g, tag, real(partner), F32Bytes(buf), real(partner), F32Bytes(in)); err != nil {
			return fmt.Errorf("distance %d: %w", d, err)
		}
		if nr < partner {
			addInto(buf, buf, in)
		} else {
			addInto(buf, in, buf)
		}
	}
	return nil
}
