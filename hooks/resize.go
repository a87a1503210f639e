package hooks

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Redistribute replaces the Memory, for rank rank of world, by the merge of sources: the
// State() outputs of the old ranks (of oldWorld) that map to this rank (checkpoint's
// Redistributor; checkpoint.Load calls it when a run resumes on another number of ranks).
//
// Each bucket's residual becomes the sum of the sources' residuals, added in float64 and
// rounded to float32 once, so the sum of the residuals over the new ranks equals the old sum
// up to that one rounding per new rank (at most half an ulp of each new value, relative
// 2^-24). A rank with no source starts with zero residuals. Everything else depends on the
// world size or on the call history and is reset: the call counters (a dense warm-up runs
// again) and the named scalars (Ok-Topk's thresholds and boundaries, SparDL's team count and
// B-SAG's h). It returns what it reset, for the caller's one warning.
func (m *Memory) Redistribute(sources []map[string][]float32, oldWorld, rank, world int) (string, error) {
	if rank < 0 || rank >= world {
		return "", fmt.Errorf("hooks: %s: Redistribute: rank %d of %d", m.hook, rank, world)
	}
	sum := map[int][]float64{}
	var vars []string
	for i, src := range sources {
		old := NewMemory(m.hook)
		if err := old.LoadState(src); err != nil {
			return "", fmt.Errorf("source %d of %d: %w", i+1, len(sources), err)
		}
		for _, idx := range slices.Sorted(maps.Keys(old.loaded)) {
			s := old.loaded[idx]
			if s.size != oldWorld || s.rank%world != rank {
				return "", fmt.Errorf("hooks: %s: Redistribute: bucket %d was saved by rank %d of %d, which does not map to rank %d of %d (from %d ranks)", m.hook, idx, s.rank, s.size, rank, world, oldWorld)
			}
			acc, ok := sum[idx]
			if !ok {
				acc = make([]float64, len(s.Residual))
				sum[idx] = acc
			} else if len(acc) != len(s.Residual) {
				return "", fmt.Errorf("hooks: %s: Redistribute: bucket %d has %d elements on one old rank, %d on old rank %d", m.hook, idx, len(acc), len(s.Residual), s.rank)
			}
			for j, x := range s.Residual {
				acc[j] += float64(x)
			}
			for name := range s.vars {
				if !slices.Contains(vars, name) {
					vars = append(vars, name)
				}
			}
		}
	}
	loaded := make(map[int]*BucketState, len(sum))
	for idx, acc := range sum {
		xi := make(Residual, len(acc))
		for j, x := range acc {
			xi[j] = float32(x)
		}
		loaded[idx] = &BucketState{Index: idx, Residual: xi, rank: rank, size: world}
	}
	m.mu.Lock()
	m.bound = false
	m.buckets = map[int]*BucketState{}
	m.loaded = loaded
	m.mu.Unlock()
	reset := []string{"call counters (a dense warm-up runs again)"}
	if len(vars) > 0 {
		slices.Sort(vars)
		reset = append(reset, "per-bucket "+strings.Join(vars, ", "))
	}
	return fmt.Sprintf("%s; kept the sum of the residuals (%d old ranks merged into %d)", strings.Join(reset, " and "), oldWorld, world), nil
}

// Redistribute carries the hook's residuals to another world size (Memory.Redistribute).
func (h *sparseHook) Redistribute(sources []map[string][]float32, oldWorld, rank, world int) (string, error) {
	return h.memory().Redistribute(sources, oldWorld, rank, world)
}

// Redistribute carries the hook's residuals to another world size (Memory.Redistribute).
func (h *SparDL) Redistribute(sources []map[string][]float32, oldWorld, rank, world int) (string, error) {
	return h.memory().Redistribute(sources, oldWorld, rank, world)
}
