package checkpoint

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

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

// info is meta.json.
type info struct {
	Meta     Meta     `json:"meta"`
	Position Position `json:"position"`
	// Files records every safetensors file's digests (absent before spargo recorded them).
	Files map[string]FileDigest `json:"files,omitempty"`
}

// shaped returns an F32 tensor of v with shape (a scalar's is []).
func shaped(v []float32, shape []int) safetensors.Tensor {
	t := safetensors.FromFloat32(v)
	t.Shape = append([]int{}, shape...)
	return t
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
	in, err := readInfo(path)
	return in.Meta, in.Position, err
}

// readInfo parses path's meta.json.
func readInfo(path string) (info, error) {
	b, err := os.ReadFile(filepath.Join(path, metaFile))
	if err != nil {
		return info{}, fmt.Errorf("checkpoint: %w", err)
	}
	in, err := parseInfo(b)
	if err != nil {
		return info{}, fmt.Errorf("checkpoint: %s: not a spargo checkpoint description: %w", filepath.Join(path, metaFile), err)
	}
	return in, nil
}

// parseInfo decodes meta.json's bytes: one JSON object with no unknown fields and nothing after it.
func parseInfo(b []byte) (info, error) {
	var in info
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&in); err != nil {
		return info{}, err
	}
	if _, err := d.Token(); err != io.EOF {
		return info{}, errors.New("data after the description")
	}
	for name, f := range in.Files {
		if name != filepath.Base(name) || !strings.HasSuffix(name, ".safetensors") {
			return info{}, fmt.Errorf("files: %q is not a checkpoint file name", name)
		}
		if _, err := hex.DecodeString(f.SHA256); err != nil || f.Size < 0 || len(f.SHA256) != 64 {
			return info{}, fmt.Errorf("files: %s: malformed digest", name)
		}
	}
	return in, nil
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
