package datasets

import (
	"slices"
	"testing"
)

func TestSamplerCoverage(t *testing.T) {
	for _, c := range []struct {
		n, world int
		dropLast bool
		perRank  int
	}{
		{10, 1, false, 10},
		{10, 2, false, 5},
		{10, 3, false, 4}, // 12 = 10 + 2 padded
		{10, 3, true, 3},  // 9: one dropped
		{10, 4, false, 3},
		{3, 8, false, 1}, // padding longer than the dataset repeats it
		{3, 8, true, 0},
	} {
		for _, shuffle := range []bool{false, true} {
			counts := make([]int, c.n)
			var all []int
			for rank := range c.world {
				s := DistributedSampler{N: c.n, Rank: rank, World: c.world, Seed: 7, Shuffle: shuffle, DropLast: c.dropLast}
				idx := s.Indices(3)
				if len(idx) != c.perRank || s.NumSamples() != c.perRank {
					t.Fatalf("%+v: rank %d got %d indices (NumSamples %d), want %d", c, rank, len(idx), s.NumSamples(), c.perRank)
				}
				for _, i := range idx {
					counts[i]++
				}
				all = append(all, idx...)
			}
			total := c.perRank * c.world
			switch {
			case c.dropLast:
				// Disjoint: no index twice, total-many distinct indices.
				for i, k := range counts {
					if k > 1 {
						t.Errorf("%+v shuffle=%v: index %d seen %d times", c, shuffle, i, k)
					}
				}
			case total >= c.n:
				// Every index at least once; the only repeats are padding.
				extra := 0
				for i, k := range counts {
					if k == 0 {
						t.Errorf("%+v shuffle=%v: index %d never seen", c, shuffle, i)
					}
					extra += k - 1
				}
				if extra != total-c.n {
					t.Errorf("%+v shuffle=%v: %d repeats, want %d of padding", c, shuffle, extra, total-c.n)
				}
			}
			if !shuffle && !c.dropLast && c.world == 3 {
				// PyTorch layout: list 0..9 padded with 0,1, then strided.
				want := []int{0, 3, 6, 9, 1, 4, 7, 0, 2, 5, 8, 1}
				if !slices.Equal(all, want) {
					t.Errorf("unshuffled shards = %v, want %v", all, want)
				}
			}
		}
	}
}

func TestSamplerShuffle(t *testing.T) {
	s := DistributedSampler{N: 1000, Rank: 1, World: 4, Seed: 42, Shuffle: true}
	e0, e0again, e1 := s.Indices(0), s.Indices(0), s.Indices(1)
	if !slices.Equal(e0, e0again) {
		t.Error("same seed and epoch gave different indices")
	}
	if slices.Equal(e0, e1) {
		t.Error("epoch 1 has the same order as epoch 0")
	}
	other := s
	other.Seed = 43
	if slices.Equal(e0, other.Indices(0)) {
		t.Error("seed 43 has the same order as seed 42")
	}
	// The shuffle is the same on every rank: rank r's k-th index is
	// element r+k*World of one permutation, so ranks never overlap here.
	seen := map[int]bool{}
	for rank := range 4 {
		s.Rank = rank
		for _, i := range s.Indices(5) {
			if seen[i] {
				t.Fatalf("index %d on two ranks", i)
			}
			seen[i] = true
		}
	}
	if len(seen) != 1000 {
		t.Errorf("%d distinct indices across ranks, want 1000", len(seen))
	}
}

func TestSamplerValidate(t *testing.T) {
	for _, s := range []DistributedSampler{
		{N: 10, Rank: 2, World: 2},
		{N: 10, Rank: -1, World: 2},
		{N: 10, World: 0},
		{N: -1, World: 1},
	} {
		if s.Validate() == nil {
			t.Errorf("%+v: no error", s)
		}
	}
	if (DistributedSampler{N: 0, World: 2, Rank: 1}).Indices(0) != nil {
		t.Error("empty dataset gave indices")
	}
}
