package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
)

// AllGather concatenates every rank's send, in rank order, into recv on every rank; all ranks pass
// the same len(send), and len(recv) = P·len(send). Each rank receives (P-1)·n words for n = len(send).
//   - RecursiveDoubling (power-of-two P only): the gathered window doubles each round, log2 P rounds.
//   - Bruck (any P): ceil(log2 P) rounds; the blocks arrive rotated and are copied into rank order.
//   - Ring (any P): P-1 rounds of one block each.
//   - Auto: RecursiveDoubling for power-of-two P, Bruck otherwise.
func AllGather(ctx context.Context, g Group, tag uint32, send []float32, recv []float32, alg Algorithm) error {
	if err := checkGroup("AllGather", g); err != nil {
		return err
	}
	p, r, n := g.Size(), g.Rank(), len(send)
	if len(recv) != p*n {
		return fmt.Errorf("comm: AllGather: rank %d: len(recv) = %d, want P·len(send) = %d·%d = %d", r, len(recv), p, n, p*n)
	}
	if alg == Auto {
		alg = Bruck
		if isPow2(p) {
			alg = RecursiveDoubling
		}
	}
	switch alg {
	case Bruck, Ring:
	case RecursiveDoubling:
		if !isPow2(p) {
			return fmt.Errorf("comm: AllGather: rank %d: RecursiveDoubling needs a power-of-two group size, have %d (use Bruck or Auto)", r, p)
		}
	default:
		return fmt.Errorf("comm: AllGather: rank %d: algorithm %v is not an all-gather algorithm (use Auto, RecursiveDoubling, Bruck or Ring)", r, alg)
	}
	copy(recv[r*n:(r+1)*n], send)
	if p == 1 || n == 0 {
		return nil
	}
	var err error
	switch alg {
	case RecursiveDoubling:
		err = recursiveDoublingAllGather(ctx, g, tag, recv, n)
	case Ring:
		err = ringAllGather(ctx, g, tag, recv, n)
	case Bruck:
		sizes := make([]int, p)
		for i := range sizes {
			sizes[i] = 4 * n
		}
		tmp := make([]float32, p*n)
		copy(tmp, send)
		if err = bruck(ctx, g, tag, F32Bytes(tmp), sizes); err == nil {
			// tmp holds rank (r+i) mod P's block at position i.
			copy(recv[r*n:], tmp[:(p-r)*n])
			copy(recv[:r*n], tmp[(p-r)*n:])
		}
	}
	if err != nil {
		return fmt.Errorf("comm: AllGather(%v) of %d floats, rank %d of %d, tag %d: %w", alg, n, r, p, tag, err)
	}
	return nil
}

func recursiveDoublingAllGather(ctx context.Context, g Group, tag uint32, recv []float32, n int) error {
	r := g.Rank()
	for d := 1; d < g.Size(); d *= 2 {
		partner := r ^ d
		mine, theirs := r&^(d-1), partner&^(d-1) // first block of each d-block window
		if err := exchange(ctx, g, tag, partner, F32Bytes(recv[mine*n:(mine+d)*n]), partner, F32Bytes(recv[theirs*n:(theirs+d)*n])); err != nil {
			return fmt.Errorf("distance %d: %w", d, err)
		}
	}
	return nil
}

func ringAllGather(ctx context.Context, g Group, tag uint32, recv []float32, n int) error {
	p, r := g.Size(), g.Rank()
	right, left := (r+1)%p, (r-1+p)%p
	for s := range p - 1 {
		sb, rb := (r-s+p)%p, (r-s-1+p)%p
		if err := exchange(ctx, g, tag, right, F32Bytes(recv[sb*n:(sb+1)*n]), left, F32Bytes(recv[rb*n:(rb+1)*n])); err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
	}
	return nil
}

// bruck runs Bruck's all-gather over byte blocks of known sizes (sizes[i] bytes from rank i).
// tmp has room for all blocks, with this rank's own block already at its start; on return
// tmp holds the block of rank (r+i) mod P at position i, blocks packed in that order. In the
// round at distance d a rank sends its first min(d, P-d) blocks to rank r-d and receives as many
// from rank r+d: ceil(log2 P) rounds, every other rank's block received once.
func bruck(ctx context.Context, g Group, tag uint32, tmp []byte, sizes []int) error {
	p, r := g.Size(), g.Rank()
	roff := relativeOffsets(sizes, r)
	for d := 1; d < p; d *= 2 {
		cnt := min(d, p-d)
		if err := exchange(ctx, g, tag, (r-d+p)%p, tmp[:roff[cnt]], (r+d)%p, tmp[roff[d]:roff[d+cnt]]); err != nil {
			return fmt.Errorf("distance %d: %w", d, err)
		}
	}
	return nil
}

// relativeOffsets returns offsets (len P+1) of the blocks of ranks r, r+1, ... (mod P) packed in
// that order.
func relativeOffsets(sizes []int, r int) []int {
	p := len(sizes)
	roff := make([]int, p+1)
	for i := range p {
		roff[i+1] = roff[i] + sizes[(r+i)%p]
	}
	return roff
}

// gatherSizes all-gathers one uint32 per rank (Bruck, ceil(log2 P) rounds, P-1 words received).
func gatherSizes(ctx context.Context, g Group, tag uint32, mine int) ([]int, error) {
	p, r := g.Size(), g.Rank()
	if uint64(mine) > math.MaxUint32 {
		return nil, fmt.Errorf("rank %d: block of %d elements exceeds the 2^32-1 limit of the size exchange", r, mine)
	}
	tmp := make([]byte, 4*p)
	binary.LittleEndian.PutUint32(tmp, uint32(mine))
	four := make([]int, p)
	for i := range four {
		four[i] = 4
	}
	if err := bruck(ctx, g, tag, tmp, four); err != nil {
		return nil, fmt.Errorf("size exchange: %w", err)
	}
	sizes := make([]int, p)
	for i := range p {
		sizes[(r+i)%p] = int(binary.LittleEndian.Uint32(tmp[4*i:]))
	}
	return sizes, nil
}

// AllGatherV gathers every rank's send, whatever its length, on every rank: out[i] is rank i's
// vector. Two Bruck all-gathers on the same tag: first the lengths (ceil(log2 P) rounds, P-1 words
// received), then the data (ceil(log2 P) rounds, the other ranks' elements received once each).
// The returned slices share one backing array (each capped at its own length).
func AllGatherV(ctx context.Context, g Group, tag uint32, send []float32) ([][]float32, error) {
	if err := checkGroup("AllGatherV", g); err != nil {
		return nil, err
	}
	p, r := g.Size(), g.Rank()
	sizes, err := gatherSizes(ctx, g, tag, len(send))
	if err == nil {
		byteSizes := make([]int, p)
		total := 0
		for i, s := range sizes {
			byteSizes[i] = 4 * s
			total += s
		}
		tmp := make([]float32, total)
		copy(tmp, send)
		if err = bruck(ctx, g, tag, F32Bytes(tmp), byteSizes); err == nil {
			out := make([][]float32, p)
			off := 0
			for i := range p {
				src := (r + i) % p
				out[src] = tmp[off : off+sizes[src] : off+sizes[src]]
				off += sizes[src]
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("comm: AllGatherV of %d floats, rank %d of %d, tag %d: %w", len(send), r, p, tag, err)
}

// AllGatherBytes is AllGatherV for bytes, meant for small metadata (e.g. DDP's parameter-shape
// check): out[i] is rank i's send. Same algorithm and costs in bytes; the returned slices share
// one backing array.
func AllGatherBytes(ctx context.Context, g Group, tag uint32, send []byte) ([][]byte, error) {
	if err := checkGroup("AllGatherBytes", g); err != nil {
		return nil, err
	}
	p, r := g.Size(), g.Rank()
	sizes, err := gatherSizes(ctx, g, tag, len(send))
	if err == nil {
		total := 0
		for _, s := range sizes {
			total += s
		}
		tmp := make([]byte, total)
		copy(tmp, send)
		if err = bruck(ctx, g, tag, tmp, sizes); err == nil {
			out := make([][]byte, p)
			off := 0
			for i := range p {
				src := (r + i) % p
				out[src] = tmp[off : off+sizes[src] : off+sizes[src]]
				off += sizes[src]
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("comm: AllGatherBytes of %d bytes, rank %d of %d, tag %d: %w", len(send), r, p, tag, err)
}
