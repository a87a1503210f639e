package datasets

import (
	"fmt"
	"math/rand/v2"
)

// samplerStream is the PCG stream constant of the sampler's shuffle (any
// fixed value; all ranks must agree on it).
const samplerStream = 0x5ca1ab1e_d15717b0

// DistributedSampler decides which dataset indices rank Rank of World sees
// in an epoch, with the semantics of PyTorch's
// torch.utils.data.DistributedSampler (though not its random numbers):
//
//   - with Shuffle, every rank draws the same permutation of 0..N-1 from a
//     PCG generator seeded by Seed+epoch, so shards are disjoint and the
//     order changes every epoch; without it the order is 0..N-1;
//   - without DropLast the list is padded by repeating it from the start
//     until its length is a multiple of World; with DropLast its tail is
//     dropped down to a multiple of World;
//   - rank r takes elements r, r+World, r+2*World, …
//
// Every rank therefore gets NumSamples indices, and with padding the only
// index seen by two ranks in an epoch is a repeated one.
type DistributedSampler struct {
	N, Rank, World int
	Seed           uint64
	Shuffle        bool
	DropLast       bool
}

// Validate reports a bad field.
func (s DistributedSampler) Validate() error {
	switch {
	case s.N < 0:
		return fmt.Errorf("datasets: DistributedSampler.N = %d, must be >= 0", s.N)
	case s.World < 1:
		return fmt.Errorf("datasets: DistributedSampler.World = %d, must be >= 1", s.World)
	case s.Rank < 0 || s.Rank >= s.World:
		return fmt.Errorf("datasets: DistributedSampler.Rank = %d, must be in [0, World=%d)", s.Rank, s.World)
	}
	return nil
}

// NumSamples is how many indices each rank gets per epoch: ceil(N/World),
// or floor(N/World) with DropLast.
func (s DistributedSampler) NumSamples() int {
	if s.World < 1 {
		return 0
	}
	if s.DropLast {
		return s.N / s.World
	}
	return (s.N + s.World - 1) / s.World
}

// Indices returns this rank's dataset indices for epoch. It panics if
// Validate fails.
func (s DistributedSampler) Indices(epoch int) []int {
	return s.AppendIndices(nil, nil, epoch)
}

// AppendIndices is Indices appending to dst, with scratch (may be nil)
// reused for the length-N permutation; both grow as needed. It lets a
// Loader draw every epoch's indices without allocating.
func (s DistributedSampler) AppendIndices(dst, scratch []int, epoch int) []int {
	if err := s.Validate(); err != nil {
		panic(err)
	}
	if s.N == 0 {
		return dst
	}
	perm := scratch[:0]
	for i := range s.N {
		perm = append(perm, i)
	}
	if s.Shuffle {
		var pcg rand.PCG
		pcg.Seed(s.Seed+uint64(epoch), samplerStream)
		r := rand.New(&pcg)
		r.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	}
	total := s.NumSamples() * s.World
	// Position k of the padded (or truncated) list is perm[k mod N].
	for k := s.Rank; k < total; k += s.World {
		dst = append(dst, perm[k%s.N])
	}
	return dst
}
