// Package checkpoint saves and restores the whole state of a (data-parallel) training run,
// so that a resumed run continues bit for bit where the saved one stopped.
//
// A checkpoint is a directory under the run's checkpoint directory, one per save, named
// after the iteration ("ckpt-0000001234"); the file "latest" names the newest one, and a
// Saver keeps the newest Keep of them:
//
//	ckpt-0000001234/
//	    meta.json            Meta (model, hook spec, world size, flags, spargo version) and Position
//	    model.safetensors    parameters and buffers (BatchNorm running statistics) by dotted name, F32;
//	                         PyTorch loads it (scripts/read_safetensors.py)
//	    optimizer.safetensors  the optimizer's State() (momentum buffers, …)
//	    rank-0.safetensors   per-rank state: the comm hook's (residuals, thresholds, counters),
//	    rank-1.safetensors   DDP's (iteration, pending late results), the random generators',
//	    …                    the loop's own arrays (State.Arrays: an LSTM's carried hidden
//	                         state) and whatever model or optimizer entries differ from rank 0's
//	latest                   "ckpt-0000001234\n"
//
// With DDP every rank calls Saver.Save at the same step (it is a collective over the DDP's
// group): rank 0 writes the replicated state once, each rank writes its own rank file, and
// entries of the model or optimizer state that differ between ranks (BatchNorm statistics
// under -dist-bn reduce, LGP's corrections) are found by comparing digests and go to the rank
// files. The ranks must share the checkpoint directory (one machine, or a shared file
// system). Files are written to a temporary directory that is renamed into place once every
// rank has written, and "latest" is replaced atomically, so a crash never leaves a partial
// checkpoint as the latest one.
//
// Load restores every rank's state from a checkpoint after checking that it was saved by the
// same model, hook and world size (and flags, Meta.Config); the error says what differs.
// The data position (Position) is the caller's to act on: datasets.Loader.EpochFrom resumes
// an epoch at a step.
//
// Diff and Compare tell whether two checkpoints hold the same state, tensor by tensor, and
// where they differ (`spargo diff A B` on the command line): the check of an exact resume.
package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

// Optimizer is what a checkpoint needs of an optimizer: its state by name (optim.SGD has
// it, and so do the other optimizers of package optim).
type Optimizer interface {
	State() map[string][]float32
	LoadState(map[string][]float32) error
}

// RandState is a random generator whose state can be saved: *rand.PCG and *rand.ChaCha8
// of math/rand/v2 are.
type RandState interface {
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// Meta describes the run a checkpoint belongs to. Load refuses a checkpoint whose Model,
// Hook, World or Config differs from the resuming run's.
type Meta struct {
	// Model names the architecture ("vgg11").
	Model string `json:"model"`
	// Hook is the comm hook's spec ("spardl:density=0.01"), empty without DDP.
	Hook string `json:"hook"`
	// World is the number of ranks.
	World int `json:"world_size"`
	// Config holds the flags that must match on resume (batch size, learning rate, seed…),
	// as the program formats them.
	Config map[string]string `json:"config,omitempty"`
	// Version is spargo's version (module version or VCS revision); Save fills it in.
	// It is informative: Load does not compare it.
	Version string `json:"spargo_version"`
}

// Position is where training stands when a checkpoint is taken.
type Position struct {
	// Epoch is the epoch in progress (from 0) and Step the steps of it done: a checkpoint at
	// the end of epoch e has Epoch e+1, Step 0.
	Epoch int `json:"epoch"`
	Step  int `json:"step"`
	// Samples counts the training samples seen by all ranks, Iteration the optimizer steps.
	Samples   int64 `json:"samples"`
	Iteration int64 `json:"iteration"`
	// Totals are the training loop's running sums within the epoch (loss, correct…), so that
	// a resumed epoch reports the same statistics. They are per rank: each rank's are saved in
	// its rank file and Load returns this rank's (meta.json shows rank 0's).
	Totals map[string]float64 `json:"totals,omitempty"`
}

// State is one rank's training state: what Save writes and Load fills in. Only Model is
// required.
type State struct {
	Model nn.Module
	// DDP, when set, provides the group, DDP's own state and the comm hook's (when the hook
	// is ddp.Stateful).
	DDP       *ddp.DDP
	Optimizer Optimizer
	// RNG are named generators of the training loop (the layers' own generators, such as
	// Dropout's, are found in Model and saved under "model/<path>").
	RNG map[string]RandState
	// Arrays are the training loop's own per-rank arrays by name, such as the hidden state a
	// language model carries from one bptt window to the next: Save writes each rank's into
	// its rank file with its shape, Load copies them back in place and refuses an entry whose
	// shape differs, one missing from the checkpoint and one the run does not have.
	Arrays map[string]Array
}

// Array is a float32 array of State.Arrays: Data holds the values of Shape, row-major; Axes,
// when set, names Shape's axes in errors ("layers", "batch", "hidden").
type Array struct {
	Data  []float32
	Shape []int
	Axes  []string
}

func (a Array) describe(shape []int) string {
	if len(a.Axes) == 0 {
		return fmt.Sprint(shape)
	}
	return fmt.Sprintf("%v (%s)", shape, strings.Join(a.Axes, ", "))
}

func (st State) group() comm.Group {
	if st.DDP != nil {
		return st.DDP.Group()
	}
	return nil
}

// Version returns spargo's version as the build records it: the module version, or
// "devel" with the VCS revision.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if bi.Main.Path != "github.com/spargo-dl/spargo" {
		for _, d := range bi.Deps {
			if d.Path == "github.com/spargo-dl/spargo" {
				v = d.Version
			}
		}
	}
	if v == "" || v == "(devel)" {
		v = "devel"
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value
			}
		}
	}
	return v
}

// File names inside a checkpoint directory.
const (
	metaFile      = "meta.json"
	modelFile     = "model.safetensors"
	optimizerFile = "optimizer.safetensors"
	latestFile    = "latest"
	namePrefix    = "ckpt-"
	tmpPrefix     = ".tmp-"
)

func rankFile(r int) string { return fmt.Sprintf("rank-%d.safetensors", r) }

// Key prefixes inside a rank file.
const (
	pfxModel = "model/"
	pfxOptim = "optim/"
	pfxHook  = "hook/"
	pfxDDP   = "ddp/"
	pfxRNG   = "rng/"
	pfxArray = "array/"
	// dropped lists, in the rank file's metadata, the shared entries this rank does not have.
	mdDropModel = "spargo.drop.model"
	mdDropOptim = "spargo.drop.optim"
	// mdTotals holds, in the rank file's metadata, the rank's Position.Totals (JSON).
	mdTotals = "spargo.totals"
)

// Tags of Save's collectives (below DDP's bucket tags; the examples use 99-102, DDP 1-33).
const (
	tagDigests uint32 = 120
	tagReady   uint32 = 130
	tagWritten uint32 = 140
	tagDone    uint32 = 150
)

// info is meta.json.
type info struct {
	Meta     Meta     `json:"meta"`
	Position Position `json:"position"`
}

// modelState returns the model's parameters and buffers by name, and their shapes.
func modelState(m nn.Module) (map[string][]float32, map[string][]int) {
	vals, shapes := map[string][]float32{}, map[string][]int{}
	for _, p := range nn.Parameters(m) {
		vals[p.Name], shapes[p.Name] = p.Value.Data, p.Value.Shape
	}
	for _, b := range nn.Buffers(m) {
		vals[b.Name], shapes[b.Name] = b.Value.Data, b.Value.Shape
	}
	return vals, shapes
}

// Saver writes checkpoints into Dir.
type Saver struct {
	// Dir holds the checkpoints and the "latest" pointer; Save creates it.
	Dir string
	// Keep is how many checkpoints to keep (the newest); 0 keeps all.
	Keep int
}

// Save writes a checkpoint of st at pos and makes it the latest; it returns its directory.
// With DDP it is a collective: every rank calls it at the same step, and it returns once the
// checkpoint is complete (or has failed, on every rank). Call it between steps, after the
// optimizer's Step: DDP's pending late results are waited for and saved, so any step will
// do, and a checkpoint after DDP.Flush holds none.
func (s Saver) Save(ctx context.Context, st State, meta Meta, pos Position) (string, error) {
	if st.Model == nil {
		return "", errors.New("checkpoint: Save: State.Model is nil")
	}
	g := st.group()
	rank, world := 0, 1
	if g != nil {
		rank, world = g.Rank(), g.Size()
	}
	if meta.World == 0 {
		meta.World = world
	}
	if meta.World != world {
		return "", fmt.Errorf("checkpoint: Save: Meta.World is %d, the group has %d ranks", meta.World, world)
	}
	meta.Version = Version()
	name := fmt.Sprintf("%s%010d", namePrefix, pos.Iteration)
	final := filepath.Join(s.Dir, name)
	tmp := filepath.Join(s.Dir, tmpPrefix+name)

	// Everything that is read from the rank's state is collected before any file is touched.
	model, shapes := modelState(st.Model)
	var optState map[string][]float32
	if st.Optimizer != nil {
		optState = st.Optimizer.State()
	}
	own := safetensors.New()
	if st.DDP != nil {
		ds, err := st.DDP.State(ctx)
		if err != nil {
			return "", fmt.Errorf("checkpoint: %w", err)
		}
		putAll(own, pfxDDP, ds)
		if h, ok := st.DDP.Hook().(ddp.Stateful); ok {
			hs, err := h.State()
			if err != nil {
				return "", fmt.Errorf("checkpoint: hook %s: %w", st.DDP.Hook().Name(), err)
			}
			putAll(own, pfxHook, hs)
		}
	}
	if err := putRNG(own, st); err != nil {
		return "", err
	}
	for name, a := range st.Arrays {
		if n := (safetensors.Tensor{Shape: a.Shape}).Elements(); n != len(a.Data) {
			return "", fmt.Errorf("checkpoint: Save: array %q has %d values, its shape %s has %d", name, len(a.Data), a.describe(a.Shape), n)
		}
		own.Tensors[pfxArray+name] = shaped(a.Data, a.Shape)
	}
	if len(pos.Totals) > 0 {
		b, err := json.Marshal(pos.Totals) // float64 text that parses back to the same bits
		if err != nil {
			return "", fmt.Errorf("checkpoint: Position.Totals: %w", err)
		}
		own.Metadata[mdTotals] = string(b)
	}
	// Entries of the model and optimizer state that differ from rank 0's go to the rank file.
	if g != nil && world > 1 {
		diffModel, dropModel, diffOpt, dropOpt, err := compareWithRank0(ctx, g, model, optState)
		if err != nil {
			return "", fmt.Errorf("checkpoint: comparing state with rank 0: %w", err)
		}
		for _, k := range diffModel {
			own.Tensors[pfxModel+k] = shaped(model[k], shapes[k])
		}
		for _, k := range diffOpt {
			own.Tensors[pfxOptim+k] = safetensors.FromFloat32(optState[k])
		}
		setList(own.Metadata, mdDropModel, dropModel)
		setList(own.Metadata, mdDropOptim, dropOpt)
	}

	// Rank 0 prepares the temporary directory; every rank writes into it.
	var err error
	if rank == 0 {
		err = os.MkdirAll(s.Dir, 0o755)
		if err == nil {
			err = os.RemoveAll(tmp) // a crashed save's leftovers
		}
		if err == nil {
			err = os.Mkdir(tmp, 0o755)
		}
	}
	if err = agree(ctx, g, tagReady, err); err != nil {
		return "", fmt.Errorf("checkpoint: %s: %w", tmp, err)
	}
	err = own.WriteFile(filepath.Join(tmp, rankFile(rank)))
	if err == nil && rank == 0 {
		err = writeShared(tmp, meta, model, shapes, optState, st.Optimizer != nil)
	}
	if err = agree(ctx, g, tagWritten, err); err != nil {
		if rank == 0 {
			os.RemoveAll(tmp)
		}
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if rank == 0 {
		err = s.publish(tmp, final, name, meta, pos)
	}
	if err = agree(ctx, g, tagDone, err); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	return final, nil
}

// writeShared writes rank 0's model and optimizer files.
func writeShared(dir string, meta Meta, model map[string][]float32, shapes map[string][]int, opt map[string][]float32, hasOpt bool) error {
	mf := safetensors.New()
	mf.Metadata["format"] = "pt" // what Hugging Face tools expect of a PyTorch state dict
	mf.Metadata["spargo.model"] = meta.Model
	for k, v := range model {
		mf.Tensors[k] = shaped(v, shapes[k])
	}
	if err := mf.WriteFile(filepath.Join(dir, modelFile)); err != nil {
		return err
	}
	if !hasOpt {
		return nil
	}
	of := safetensors.New()
	for k, v := range opt {
		of.Tensors[k] = safetensors.FromFloat32(v)
	}
	return of.WriteFile(filepath.Join(dir, optimizerFile))
}

// shaped returns an F32 tensor of v with shape (a scalar's is []).
func shaped(v []float32, shape []int) safetensors.Tensor {
	t := safetensors.FromFloat32(v)
	t.Shape = append([]int{}, shape...)
	return t
}

// publish writes meta.json, renames the temporary directory into place, points latest at it
// and removes old checkpoints (rank 0).
func (s Saver) publish(tmp, final, name string, meta Meta, pos Position) error {
	b, err := json.MarshalIndent(info{Meta: meta, Position: pos}, "", "  ")
	if err != nil {
		return err
	}
	if err := safetensors.WriteAtomic(filepath.Join(tmp, metaFile), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	}); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	// A checkpoint of the same iteration (saved again after a resume) is replaced: moved
	// aside first, so that latest never names a missing directory for longer than a rename.
	old := ""
	if _, err := os.Stat(final); err == nil {
		old = filepath.Join(s.Dir, tmpPrefix+"old-"+name)
		os.RemoveAll(old)
		if err := os.Rename(final, old); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	if old != "" {
		os.RemoveAll(old)
	}
	if err := safetensors.WriteAtomic(filepath.Join(s.Dir, latestFile), func(w io.Writer) error {
		_, err := io.WriteString(w, name+"\n")
		return err
	}); err != nil {
		return err
	}
	if err := syncDir(s.Dir); err != nil {
		return err
	}
	return s.prune(name)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// prune removes all but the newest Keep checkpoints, never latest.
func (s Saver) prune(latest string) error {
	if s.Keep <= 0 {
		return nil
	}
	names, err := List(s.Dir)
	if err != nil {
		return err
	}
	for i := 0; i < len(names)-s.Keep; i++ {
		if names[i] != latest {
			if err := os.RemoveAll(filepath.Join(s.Dir, names[i])); err != nil {
				return err
			}
		}
	}
	return nil
}

// List returns the names of the complete checkpoints in dir, oldest first.
func List(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), namePrefix) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// Latest returns the directory of dir's latest checkpoint. With none there, the error
// wraps fs.ErrNotExist.
func Latest(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, latestFile))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("checkpoint: no checkpoint in %s (no %s file): %w", dir, latestFile, fs.ErrNotExist)
		}
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	name := strings.TrimSpace(string(b))
	if !strings.HasPrefix(name, namePrefix) || strings.ContainsAny(name, `/\`) {
		return "", fmt.Errorf("checkpoint: %s names %q, not a checkpoint", filepath.Join(dir, latestFile), name)
	}
	return filepath.Join(dir, name), nil
}

// ReadInfo returns the Meta and Position saved in the checkpoint directory path.
func ReadInfo(path string) (Meta, Position, error) {
	b, err := os.ReadFile(filepath.Join(path, metaFile))
	if err != nil {
		return Meta{}, Position{}, fmt.Errorf("checkpoint: %w", err)
	}
	var in info
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.DisallowUnknownFields()
	if err := d.Decode(&in); err != nil {
		return Meta{}, Position{}, fmt.Errorf("checkpoint: %s: not a spargo checkpoint description: %w", filepath.Join(path, metaFile), err)
	}
	return in.Meta, in.Position, nil
}

// Check compares a checkpoint's Meta (saved) with the resuming run's and lists every
// difference; nil when they match. Version is not compared.
func (saved Meta) Check(run Meta) error {
	var diffs []string
	if saved.Model != run.Model {
		diffs = append(diffs, fmt.Sprintf("model %q, this run %q", saved.Model, run.Model))
	}
	if saved.Hook != run.Hook {
		diffs = append(diffs, fmt.Sprintf("hook %q, this run %q", saved.Hook, run.Hook))
	}
	if saved.World != run.World {
		diffs = append(diffs, fmt.Sprintf("world size %d, this run %d", saved.World, run.World))
	}
	keys := map[string]bool{}
	for k := range saved.Config {
		keys[k] = true
	}
	for k := range run.Config {
		keys[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		a, inA := saved.Config[k]
		b, inB := run.Config[k]
		switch {
		case !inA:
			diffs = append(diffs, fmt.Sprintf("%s not saved, this run %q", k, b))
		case !inB:
			diffs = append(diffs, fmt.Sprintf("%s %q, this run has none", k, a))
		case a != b:
			diffs = append(diffs, fmt.Sprintf("%s %q, this run %q", k, a, b))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("saved with %s", strings.Join(diffs, "; "))
	}
	return nil
}

// Load restores st from the checkpoint directory path (Latest gives the newest) and returns
// the position to resume from. meta is the resuming run's (Version ignored; World 0 means
// the DDP group's size): a checkpoint of another model, hook, world size or configuration
// is refused with an error naming the differences. With DDP, call it after ddp.New on every
// rank (it reads this rank's file; it communicates nothing). Errors name the file and the
// entry at fault; the state may be partly restored after an error.
func Load(path string, st State, meta Meta) (Position, error) {
	if st.Model == nil {
		return Position{}, errors.New("checkpoint: Load: State.Model is nil")
	}
	saved, pos, err := ReadInfo(path)
	if err != nil {
		return Position{}, err
	}
	rank, world := 0, 1
	if g := st.group(); g != nil {
		rank, world = g.Rank(), g.Size()
	}
	if meta.World == 0 {
		meta.World = world
	}
	if err := saved.Check(meta); err != nil {
		return Position{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if saved.World != world {
		return Position{}, fmt.Errorf("checkpoint %s: saved by %d ranks, this run has %d", path, saved.World, world)
	}
	rf := filepath.Join(path, rankFile(rank))
	own, err := safetensors.ReadFile(rf)
	if err != nil {
		return Position{}, fmt.Errorf("checkpoint: %w", err)
	}
	sections, err := split(own, rf)
	if err != nil {
		return Position{}, err
	}
	if err := loadModel(path, st.Model, sections[pfxModel], dropList(own, mdDropModel)); err != nil {
		return Position{}, err
	}
	if st.Optimizer != nil {
		of := filepath.Join(path, optimizerFile)
		f, err := safetensors.ReadFile(of)
		if err != nil {
			return Position{}, fmt.Errorf("checkpoint: %w (was the run saved without an optimizer?)", err)
		}
		optState, err := floats(f, of, "")
		if err != nil {
			return Position{}, err
		}
		for _, k := range dropList(own, mdDropOptim) {
			delete(optState, k)
		}
		for k, v := range sections[pfxOptim] {
			optState[k] = v
		}
		if err := st.Optimizer.LoadState(optState); err != nil {
			return Position{}, fmt.Errorf("checkpoint %s: optimizer: %w", path, err)
		}
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

// loadModel copies model.safetensors (rank 0's) and this rank's overrides into m; every
// parameter and buffer must be there with its shape, and nothing else.
func loadModel(path string, m nn.Module, override map[string][]float32, drop []string) error {
	mf := filepath.Join(path, modelFile)
	f, err := safetensors.ReadFile(mf)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
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

// split sorts a rank file's entries by prefix into float sections (model/, optim/, hook/,
// ddp/); rng/ and array/ entries stay in the file. An unknown prefix is an error.
func split(f *safetensors.File, path string) (map[string]map[string][]float32, error) {
	secs := map[string]map[string][]float32{pfxModel: {}, pfxOptim: {}, pfxHook: {}, pfxDDP: {}}
	for _, name := range f.Names() {
		if strings.HasPrefix(name, pfxRNG) || strings.HasPrefix(name, pfxArray) {
			continue
		}
		pfx, _, _ := strings.Cut(name, "/")
		sec, ok := secs[pfx+"/"]
		if !ok {
			return nil, fmt.Errorf("checkpoint: %s: tensor %q: unknown section (want model/, optim/, hook/, ddp/, rng/ or array/)", path, name)
		}
		v, err := f.Tensors[name].Float32()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %s: tensor %q: %w", path, name, err)
		}
		sec[strings.TrimPrefix(name, pfx+"/")] = v
	}
	return secs, nil
}

// floats returns every F32 tensor of f under prefix, prefix removed.
func floats(f *safetensors.File, path, prefix string) (map[string][]float32, error) {
	m := map[string][]float32{}
	for _, name := range f.Names() {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		v, err := f.Tensors[name].Float32()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %s: tensor %q: %w", path, name, err)
		}
		m[strings.TrimPrefix(name, prefix)] = v
	}
	return m, nil
}

func putAll(f *safetensors.File, prefix string, st map[string][]float32) {
	for k, v := range st {
		f.Tensors[prefix+k] = safetensors.FromFloat32(v)
	}
}

// rngs returns the generators of st by checkpoint key: the model's layers' under
// "rng/model/<path>", State.RNG's under "rng/<name>".
func rngs(st State) map[string]RandState {
	m := map[string]RandState{}
	for path, src := range nn.RandSources(st.Model) {
		m[pfxRNG+pfxModel+path] = src
	}
	for name, r := range st.RNG {
		m[pfxRNG+name] = r
	}
	return m
}

func putRNG(f *safetensors.File, st State) error {
	for key, r := range rngs(st) {
		b, err := r.MarshalBinary()
		if err != nil {
			return fmt.Errorf("checkpoint: random generator %s: %w", strings.TrimPrefix(key, pfxRNG), err)
		}
		f.Tensors[key] = safetensors.FromBytes(b)
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

func setList(md map[string]string, key string, list []string) {
	if len(list) > 0 {
		b, _ := json.Marshal(list)
		md[key] = string(b)
	}
}

func dropList(f *safetensors.File, key string) []string {
	var l []string
	if s, ok := f.Metadata[key]; ok {
		_ = json.Unmarshal([]byte(s), &l) // a malformed list drops nothing; loadModel then checks shapes
	}
	return l
}

// digests returns "section/key" → SHA-256 of the values' bytes.
func digests(model, opt map[string][]float32) map[string][32]byte {
	d := map[string][32]byte{}
	for k, v := range model {
		d[pfxModel+k] = sha256.Sum256(comm.F32Bytes(v))
	}
	for k, v := range opt {
		d[pfxOptim+k] = sha256.Sum256(comm.F32Bytes(v))
	}
	return d
}

// compareWithRank0 finds the model and optimizer entries whose values differ from rank 0's
// (or that rank 0 lacks), and rank 0's entries this rank lacks.
func compareWithRank0(ctx context.Context, g comm.Group, model, opt map[string][]float32) (diffModel, dropModel, diffOpt, dropOpt []string, err error) {
	mine := digests(model, opt)
	var enc []byte
	for _, k := range slices.Sorted(maps.Keys(mine)) {
		d := mine[k]
		enc = strconv.AppendQuote(enc, k)
		enc = append(enc, ' ')
		enc = append(enc, d[:]...)
	}
	all, err := comm.AllGatherBytes(ctx, g, tagDigests, enc)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if g.Rank() == 0 {
		return nil, nil, nil, nil, nil
	}
	ref := map[string][32]byte{}
	rest := string(all[0])
	for rest != "" {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil || len(rest) < len(q)+1+32 {
			return nil, nil, nil, nil, fmt.Errorf("rank 0 sent a malformed digest list")
		}
		k, _ := strconv.Unquote(q)
		var d [32]byte
		copy(d[:], rest[len(q)+1:])
		ref[k] = d
		rest = rest[len(q)+1+32:]
	}
	for k, d := range mine {
		if r, ok := ref[k]; !ok || r != d {
			if s, ok := strings.CutPrefix(k, pfxModel); ok {
				diffModel = append(diffModel, s)
			} else {
				diffOpt = append(diffOpt, strings.TrimPrefix(k, pfxOptim))
			}
		}
	}
	for k := range ref {
		if _, ok := mine[k]; !ok {
			if s, ok := strings.CutPrefix(k, pfxModel); ok {
				dropModel = append(dropModel, s)
			} else {
				dropOpt = append(dropOpt, strings.TrimPrefix(k, pfxOptim))
			}
		}
	}
	slices.Sort(dropModel)
	slices.Sort(dropOpt)
	return diffModel, dropModel, diffOpt, dropOpt, nil
}

// agree tells every rank whether any rank failed (a collective when g has several ranks);
// it returns this rank's error, or one saying which rank failed.
func agree(ctx context.Context, g comm.Group, tag uint32, mine error) error {
	if g == nil || g.Size() == 1 {
		return mine
	}
	flags := make([]float32, g.Size())
	if mine != nil {
		flags[g.Rank()] = 1
	}
	if err := comm.AllReduce(ctx, g, tag, flags, comm.Auto); err != nil {
		if mine != nil {
			return errors.Join(mine, err)
		}
		return err
	}
	if mine != nil {
		return mine
	}
	for r, f := range flags {
		if f != 0 {
			return fmt.Errorf("rank %d failed to save its part", r)
		}
	}
	return nil
}
