package checkpoint

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/spargo-dl/spargo/ddp"
)

// Resuming on a different number of ranks (an elastic restart: a 4-rank checkpoint resumed
// by 2 ranks, or by 8). Load accepts it without being asked, but only from a checkpoint taken
// at an epoch's end (Position.Step 0): the data sampler splits an epoch by the world size, so
// a mid-epoch position means nothing to another world size and is refused, naming both
// sizes. Every new rank then loads
//
//   - the model and the optimizer state from model.safetensors and optimizer.safetensors
//     (old rank 0's). They are the same on every old rank under DDP; a checkpoint whose rank
//     files hold per-rank model or optimizer entries (-dist-bn reduce, LGP) is refused;
//   - DDP's counters (iteration, epochs) from its own old rank file, or old rank 0's for a
//     rank the old run did not have; pending late results are refused (there are none at an
//     epoch's end after a flush);
//   - its random generators and State.Arrays from its own old rank file; a rank the old run
//     did not have keeps the ones the program seeded;
//   - the comm hook's state: a hook that is a Redistributor gets the hook state of the old
//     ranks r with r mod newWorld == rank (shrinking: several; growing: its own, or none) and
//     merges it; any other Stateful hook starts afresh. Rank 0 logs one warning naming the
//     hook and what was reset.

// Redistributor is a comm hook (ddp.Stateful) whose state can be carried to another world
// size. The error-feedback hooks of package hooks implement it: the residuals are summed, so
// that their sum over the ranks is kept, and the state that depends on the world size
// (thresholds, boundaries, team layouts, call counters) is reset.
type Redistributor interface {
	// Redistribute replaces the hook's state, for rank rank of world, by the merge of
	// sources: State() outputs of the old ranks (oldWorld of them) that map to this rank. It
	// returns what it reset, for the warning ("" when nothing).
	Redistribute(sources []map[string][]float32, oldWorld, rank, world int) (reset string, err error)
}

// loadResized is Load for a checkpoint saved by another number of ranks (see above).
func loadResized(path string, in info, st State, rank, world int) (Position, error) {
	saved, pos := in.Meta, in.Position
	if pos.Step != 0 {
		return Position{}, fmt.Errorf("checkpoint %s: saved by %d ranks at step %d of epoch %d; resuming on %d ranks works only from a checkpoint at an epoch's end",
			path, saved.World, pos.Step, pos.Epoch+1, world)
	}
	if st.DDP == nil {
		return Position{}, fmt.Errorf("checkpoint %s: saved by %d ranks, restoring %d without DDP (State.DDP is nil)", path, saved.World, world)
	}
	old := make([]map[string]map[string][]float32, saved.World) // old rank → sections
	files := make([]string, saved.World)
	var read []int
	for r := range saved.World {
		if r == 0 || r == rank || r%world == rank {
			read = append(read, r)
		}
	}
	for _, r := range read {
		files[r] = rankFile(r)
		f, err := readVerified(path, files[r], in.Files)
		if err != nil {
			return Position{}, err
		}
		for _, key := range []string{mdDropModel, mdDropOptim} {
			if l := dropList(f, key); len(l) > 0 {
				return Position{}, fmt.Errorf("checkpoint %s: old rank %d's state differs from rank 0's (%s: %s): cannot resume on %d ranks from %d",
					path, r, files[r], strings.Join(l, ", "), world, saved.World)
			}
		}
		secs, err := split(f, files[r])
		if err != nil {
			return Position{}, err
		}
		for _, pfx := range []string{pfxModel, pfxOptim} {
			if len(secs[pfx]) > 0 {
				names := slices.Sorted(maps.Keys(secs[pfx]))
				return Position{}, fmt.Errorf("checkpoint %s: old rank %d's model or optimizer state differs from rank 0's (%s holds %s%s): cannot resume on %d ranks from %d",
					path, r, files[r], pfx, names[0], world, saved.World)
			}
		}
		old[r] = secs
		if r == rank { // a rank the old run did not have keeps the generators and arrays it has
			if err := loadRNG(f, files[r], st); err != nil {
				return Position{}, err
			}
			if err := loadArrays(f, files[r], st); err != nil {
				return Position{}, err
			}
		}
	}
	if err := loadModel(path, in.Files, st.Model, nil, nil); err != nil {
		return Position{}, err
	}
	if err := loadOptimizer(path, in.Files, st.Optimizer, nil, nil); err != nil {
		return Position{}, err
	}
	mine := 0
	if rank < saved.World {
		mine = rank
	}
	ds, err := resizedDDPState(old[mine][pfxDDP], rank, world)
	if err != nil {
		return Position{}, fmt.Errorf("checkpoint %s: %s: %w", path, files[mine], err)
	}
	if err := st.DDP.LoadState(ds); err != nil {
		return Position{}, fmt.Errorf("checkpoint %s: %s: %w", path, files[mine], err)
	}
	h := st.DDP.Hook()
	var sources []map[string][]float32
	for r := rank; r < saved.World; r += world {
		sources = append(sources, old[r][pfxHook])
	}
	var reset string
	switch rh := h.(type) {
	case Redistributor:
		if reset, err = rh.Redistribute(sources, saved.World, rank, world); err != nil {
			return Position{}, fmt.Errorf("checkpoint %s: hook %s: redistributing the state of %d ranks over %d: %w", path, h.Name(), saved.World, world, err)
		}
	case ddp.Stateful:
		reset = "all its state (it cannot be redistributed)"
	}
	if reset != "" && rank == 0 {
		slog.Warn(fmt.Sprintf("checkpoint: resuming %d ranks from %d: hook %s: reset %s", world, saved.World, h.Name(), reset))
	}
	pos.Totals = nil
	return pos, nil
}

// resizedDDPState returns an old rank's DDP state rewritten for rank of world: the counters
// carry over; pending late results and LGP estimates cannot and are refused.
func resizedDDPState(st map[string][]float32, rank, world int) (map[string][]float32, error) {
	const metaKey, rankWord, sizeWord, words = "ddp.meta", 5, 6, 7 // ddp/state.go's layout
	out := map[string][]float32{}
	for k, v := range st {
		if k != metaKey {
			return nil, fmt.Errorf("DDP state %q (a pending late result or LGP estimate) cannot move to another world size", k)
		}
		if len(v) != 2*words {
			return nil, fmt.Errorf("DDP state %q has %d values, want %d", k, len(v), 2*words)
		}
		m := slices.Clone(v)
		copy(m[2*rankWord:], packU64(uint64(rank)))
		copy(m[2*sizeWord:], packU64(uint64(world)))
		out[k] = m
	}
	return out, nil
}

func packU64(v uint64) []float32 {
	return []float32{math.Float32frombits(uint32(v)), math.Float32frombits(uint32(v >> 32))}
}
