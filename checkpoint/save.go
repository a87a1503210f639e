package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

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
	ownDigest, err := writeDigested(filepath.Join(tmp, rankFile(rank)), own)
	var shared map[string]FileDigest
	if err == nil && rank == 0 {
		shared, err = writeShared(tmp, meta, model, shapes, optState, st.Optimizer != nil)
	}
	if err = agree(ctx, g, tagWritten, err); err != nil {
		if rank == 0 {
			os.RemoveAll(tmp)
		}
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	files, err := gatherDigests(ctx, g, rank, ownDigest)
	if err != nil {
		if rank == 0 {
			os.RemoveAll(tmp)
		}
		return "", fmt.Errorf("checkpoint: gathering the files' digests: %w", err)
	}
	if rank == 0 {
		maps.Copy(files, shared)
		err = s.publish(tmp, final, name, info{Meta: meta, Position: pos, Files: files})
	}
	if err = agree(ctx, g, tagDone, err); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	return final, nil
}

// writeShared writes rank 0's model and optimizer files and returns their digests.
func writeShared(dir string, meta Meta, model map[string][]float32, shapes map[string][]int, opt map[string][]float32, hasOpt bool) (map[string]FileDigest, error) {
	mf := safetensors.New()
	mf.Metadata["format"] = "pt" // what Hugging Face tools expect of a PyTorch state dict
	mf.Metadata["spargo.model"] = meta.Model
	for k, v := range model {
		mf.Tensors[k] = shaped(v, shapes[k])
	}
	files := map[string]FileDigest{}
	d, err := writeDigested(filepath.Join(dir, modelFile), mf)
	if err != nil {
		return nil, err
	}
	files[modelFile] = d
	if !hasOpt {
		return files, nil
	}
	of := safetensors.New()
	for k, v := range opt {
		of.Tensors[k] = safetensors.FromFloat32(v)
	}
	if files[optimizerFile], err = writeDigested(filepath.Join(dir, optimizerFile), of); err != nil {
		return nil, err
	}
	return files, nil
}

// publish writes meta.json (with the files' digests), renames the temporary directory into place, points latest at it
// and removes old checkpoints (rank 0).
func (s Saver) publish(tmp, final, name string, in info) error {
	b, err := json.MarshalIndent(in, "", "  ")
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
