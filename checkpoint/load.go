package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

// Load restores st from the checkpoint directory path (Latest gives the newest) and returns
// the position to resume from. meta is the resuming run's (Version ignored; World 0 means
// the DDP group's size): a checkpoint of another model, hook or configuration is refused
// with an error naming the differences. A checkpoint saved by another number of ranks
// resumes from an epoch's end only (see Redistributor and resize.go). With DDP, call it after ddp.New on every
// rank (it reads this rank's file; it communicates nothing). Errors name the file and the
// entry at fault; the state may be partly restored after an error. Every file read is checked
// against the digests meta.json records (see FileDigest): a corrupt file is refused, naming
// it and its damaged tensors; a checkpoint saved before digests were recorded loads with a
// warning (slog).
func Load(path string, st State, meta Meta) (Position, error) {
	if st.Model == nil {
		return Position{}, errors.New("checkpoint: Load: State.Model is nil")
	}
	in, err := readInfo(path)
	if err != nil {
		return Position{}, err
	}
	saved, pos := in.Meta, in.Position
	rank, world := 0, 1
	if g := st.group(); g != nil {
		rank, world = g.Rank(), g.Size()
	}
	if meta.World == 0 {
		meta.World = world
	}
	resize := saved.World != meta.World && meta.World == world
	check := meta
	if resize { // another world size resumes at an epoch's end (resize.go)
		check.World = saved.World
	}
	if err := saved.Check(check); err != nil {
		return Position{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if resize {
		return loadResized(path, in, st, rank, world)
	}
	if saved.World != world {
		return Position{}, fmt.Errorf("checkpoint %s: saved by %d ranks, this run has %d", path, saved.World, world)
	}
	rf := filepath.Join(path, rankFile(rank))
	own, err := readVerified(path, rankFile(rank), in.Files)
	if err != nil {
		return Position{}, err
	}
	sections, err := split(own, rf)
	if err != nil {
		return Position{}, err
	}
	if err := loadModel(path, in.Files, st.Model, sections[pfxModel], dropList(own, mdDropModel)); err != nil {
		return Position{}, err
	}
	if err := loadOptimizer(path, in.Files, st.Optimizer, sections[pfxOptim], dropList(own, mdDropOptim)); err != nil {
		return Position{}, err
	}
	if st.DDP != nil {
		if err := st.DDP.LoadState(sections[pfxDDP]); err != nil {
			return Position{}, fmt.Errorf("checkpoint %s: %w", rf, err)
		}
		hs := sections[pfxHook]
		h := st.DDP.Hook()
		if sh, ok := h.(ddp.Stateful); ok {
			if err := sh.LoadState(hs); err != nil {
				return Position{}, fmt.Errorf("checkpoint %s: hook %s: %w", rf, h.Name(), err)
			}
		} else if len(hs) > 0 {
			return Position{}, fmt.Errorf("checkpoint %s: holds %d entries of hook state, but hook %s keeps none", rf, len(hs), h.Name())
		}
	} else if len(sections[pfxDDP]) > 0 || len(sections[pfxHook]) > 0 {
		return Position{}, fmt.Errorf("checkpoint %s: saved with DDP, restoring without (State.DDP is nil)", rf)
	}
	if err := loadRNG(own, rf, st); err != nil {
		return Position{}, err
	}
	if err := loadArrays(own, rf, st); err != nil {
		return Position{}, err
	}
	pos.Totals = nil
	if t, ok := own.Metadata[mdTotals]; ok {
		if err := json.Unmarshal([]byte(t), &pos.Totals); err != nil {
			return Position{}, fmt.Errorf("checkpoint: %s: metadata %s: %w", rf, mdTotals, err)
		}
	}
	return pos, nil
}

// loadOptimizer loads optimizer.safetensors (rank 0's state) less drop, with this rank's
// override entries, into opt (nothing when opt is nil).
func loadOptimizer(path string, files map[string]FileDigest, opt Optimizer, override map[string][]float32, drop []string) error {
	if opt == nil {
		return nil
	}
	of := filepath.Join(path, optimizerFile)
	if _, err := os.Stat(of); err != nil {
		return fmt.Errorf("checkpoint: %w (was the run saved without an optimizer?)", err)
	}
	f, err := readVerified(path, optimizerFile, files)
	if err != nil {
		return err
	}
	optState, err := floats(f, of, "")
	if err != nil {
		return err
	}
	for _, k := range drop {
		delete(optState, k)
	}
	maps.Copy(optState, override)
	if err := opt.LoadState(optState); err != nil {
		return fmt.Errorf("checkpoint %s: optimizer: %w", path, err)
	}
	return nil
}

// loadModel copies model.safetensors (rank 0's) and this rank's overrides into m; every
// parameter and buffer must be there with its shape, and nothing else.
func loadModel(path string, files map[string]FileDigest, m nn.Module, override map[string][]float32, drop []string) error {
	mf := filepath.Join(path, modelFile)
	f, err := readVerified(path, modelFile, files)
	if err != nil {
		return err
	}
	vals, shapes := modelState(m)
	dropped := map[string]bool{}
	for _, k := range drop {
		dropped[k] = true
	}
	for _, name := range f.Names() {
		if _, ok := vals[name]; !ok {
			return fmt.Errorf("checkpoint: %s: tensor %q is no parameter or buffer of the model (a checkpoint of another model?)", mf, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(vals)) {
		dst := vals[name]
		if v, ok := override[name]; ok {
			if len(v) != len(dst) {
				return fmt.Errorf("checkpoint %s: rank entry %q has %d values, the model's %v has %d", path, name, len(v), shapes[name], len(dst))
			}
			copy(dst, v)
			continue
		}
		t, ok := f.Tensors[name]
		if !ok || dropped[name] {
			return fmt.Errorf("checkpoint: %s: no tensor %q: the model has it (shape %v); a checkpoint of another model?", mf, name, shapes[name])
		}
		if !slices.Equal(t.Shape, shapes[name]) {
			return fmt.Errorf("checkpoint: %s: tensor %q has shape %v, the model's is %v", mf, name, t.Shape, shapes[name])
		}
		v, err := t.Float32()
		if err != nil {
			return fmt.Errorf("checkpoint: %s: tensor %q: %w", mf, name, err)
		}
		copy(dst, v)
	}
	return nil
}

func loadRNG(f *safetensors.File, path string, st State) error {
	want := rngs(st)
	for _, name := range f.Names() {
		if strings.HasPrefix(name, pfxRNG) && want[name] == nil {
			return fmt.Errorf("checkpoint: %s: random generator %q has no counterpart in this run", path, strings.TrimPrefix(name, pfxRNG))
		}
	}
	for key, r := range want {
		t, ok := f.Tensors[key]
		if !ok {
			return fmt.Errorf("checkpoint: %s: no state for random generator %q", path, strings.TrimPrefix(key, pfxRNG))
		}
		b, err := t.Bytes()
		if err == nil {
			err = r.UnmarshalBinary(b)
		}
		if err != nil {
			return fmt.Errorf("checkpoint: %s: random generator %q: %w", path, strings.TrimPrefix(key, pfxRNG), err)
		}
	}
	return nil
}

// loadArrays copies the rank file's array/ entries into st.Arrays: the same names, each
// with the run's shape.
func loadArrays(f *safetensors.File, path string, st State) error {
	for _, name := range f.Names() {
		if k, ok := strings.CutPrefix(name, pfxArray); ok {
			if _, want := st.Arrays[k]; !want {
				return fmt.Errorf("checkpoint: %s: array %q (shape %v) has no counterpart in this run", path, k, f.Tensors[name].Shape)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(st.Arrays)) {
		a := st.Arrays[k]
		t, ok := f.Tensors[pfxArray+k]
		if !ok {
			return fmt.Errorf("checkpoint: %s: no array %q: the run has one of shape %s (a checkpoint saved without it?)", path, k, a.describe(a.Shape))
		}
		if !slices.Equal(t.Shape, a.Shape) {
			return fmt.Errorf("checkpoint: %s: array %q has shape %s, this run's is %s", path, k, a.describe(t.Shape), a.describe(a.Shape))
		}
		v, err := t.Float32()
		if err == nil && len(v) != len(a.Data) {
			err = fmt.Errorf("%d values, this run's array has %d", len(v), len(a.Data))
		}
		if err != nil {
			return fmt.Errorf("checkpoint: %s: array %q: %w", path, k, err)
		}
		copy(a.Data, v)
	}
	return nil
}
