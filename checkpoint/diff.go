package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spargo-dl/spargo/safetensors"
)

// A Difference is one way in which two checkpoints differ.
type Difference struct {
	// File is the checkpoint file ("model.safetensors", "rank-1.safetensors", "meta.json").
	File string
	// Tensor is the tensor's name, or "" for a difference of the whole file or its metadata.
	Tensor string
	// What says how they differ, with a's side first.
	What string
}

func (d Difference) String() string {
	if d.Tensor == "" {
		return d.File + ": " + d.What
	}
	return d.File + ": " + d.Tensor + ": " + d.What
}

// Diff compares the checkpoints in directories a ("the first") and b ("the second") bit for
// bit: meta.json's Meta (as Meta.Check compares them, a as saved and b as this run; Version is
// not compared) and Position, and every safetensors file (the model, the optimizer, every
// rank's file with the hook's and DDP's state, the generators and the loop's arrays) tensor
// by tensor, with their metadata. It returns every difference found, nil when the two hold
// the same state: the test of an exact resume, or of two runs that must agree. Each side is
// also checked against the digests its meta.json records: a file or tensor that does not
// match is a difference too (see Verify). A directory
// that holds a "latest" file (a run's -checkpoint directory) stands for its latest checkpoint.
// The error is for what could not be read.
func Diff(a, b string) ([]Difference, error) {
	var err error
	if a, err = resolve(a); err != nil {
		return nil, err
	}
	if b, err = resolve(b); err != nil {
		return nil, err
	}
	var diffs []Difference
	inA, err := readInfo(a)
	if err != nil {
		return nil, err
	}
	inB, err := readInfo(b)
	if err != nil {
		return nil, err
	}
	metaA, posA, metaB, posB := inA.Meta, inA.Position, inB.Meta, inB.Position
	diffs = append(diffs, corruptions(a, inA.Files, "first")...)
	diffs = append(diffs, corruptions(b, inB.Files, "second")...)
	if err := metaA.Check(metaB); err != nil { // worded as Load words it: a as saved, b as this run
		diffs = append(diffs, Difference{File: metaFile, What: err.Error()})
	}
	for _, d := range comparePositions(posA, posB) {
		diffs = append(diffs, Difference{File: metaFile, What: d})
	}
	filesA, err := stFiles(a)
	if err != nil {
		return nil, err
	}
	filesB, err := stFiles(b)
	if err != nil {
		return nil, err
	}
	for _, name := range onlyIn(filesA, filesB) {
		diffs = append(diffs, Difference{File: name, What: "only in the first"})
	}
	for _, name := range onlyIn(filesB, filesA) {
		diffs = append(diffs, Difference{File: name, What: "only in the second"})
	}
	for _, name := range filesA {
		if !slices.Contains(filesB, name) {
			continue
		}
		fa, err := safetensors.ReadFile(filepath.Join(a, name))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		fb, err := safetensors.ReadFile(filepath.Join(b, name))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		diffs = append(diffs, compareFiles(name, fa, fb)...)
	}
	return diffs, nil
}

// Compare is Diff as an error: nil when a and b hold the same state, otherwise an error
// that lists the differences (the first ten, and how many there are).
func Compare(a, b string) error {
	d, err := Diff(a, b)
	if err != nil || len(d) == 0 {
		return err
	}
	lines := make([]string, 0, 11)
	for i, x := range d {
		if i == 10 {
			lines = append(lines, fmt.Sprintf("… and %d more", len(d)-10))
			break
		}
		lines = append(lines, x.String())
	}
	return fmt.Errorf("checkpoint: %s and %s differ (%d):\n\t%s", a, b, len(d), strings.Join(lines, "\n\t"))
}

// resolve turns a run's checkpoint directory into its latest checkpoint.
func resolve(dir string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, latestFile)); err == nil {
		return Latest(dir)
	}
	for _, f := range []string{metaFile, modelFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", fmt.Errorf("checkpoint: %s is not a checkpoint (no %s) nor a checkpoint directory (no %s)", dir, f, latestFile)
			}
			return "", fmt.Errorf("checkpoint: %w", err)
		}
	}
	return dir, nil
}

func stFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var names []string
	for _, e := range ents {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".safetensors") {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// onlyIn lists the names of x that y lacks.
func onlyIn(x, y []string) []string {
	var out []string
	for _, n := range x {
		if !slices.Contains(y, n) {
			out = append(out, n)
		}
	}
	return out
}

func comparePositions(a, b Position) []string {
	var d []string
	if a.Epoch != b.Epoch || a.Step != b.Step {
		d = append(d, fmt.Sprintf("epoch %d step %d vs epoch %d step %d", a.Epoch, a.Step, b.Epoch, b.Step))
	}
	if a.Samples != b.Samples || a.Iteration != b.Iteration {
		d = append(d, fmt.Sprintf("iteration %d (%d samples) vs %d (%d samples)", a.Iteration, a.Samples, b.Iteration, b.Samples))
	}
	for _, k := range slices.Sorted(maps.Keys(a.Totals)) {
		if v, ok := b.Totals[k]; !ok || math.Float64bits(v) != math.Float64bits(a.Totals[k]) {
			d = append(d, fmt.Sprintf("total %s %v vs %v", k, a.Totals[k], b.Totals[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b.Totals)) {
		if _, ok := a.Totals[k]; !ok {
			d = append(d, fmt.Sprintf("total %s only in the second", k))
		}
	}
	return d
}

func compareFiles(name string, a, b *safetensors.File) []Difference {
	var diffs []Difference
	for _, k := range slices.Sorted(maps.Keys(a.Metadata)) {
		if v, ok := b.Metadata[k]; !ok || v != a.Metadata[k] {
			diffs = append(diffs, Difference{File: name, What: fmt.Sprintf("metadata %s %q vs %q", k, a.Metadata[k], b.Metadata[k])})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b.Metadata)) {
		if _, ok := a.Metadata[k]; !ok {
			diffs = append(diffs, Difference{File: name, What: fmt.Sprintf("metadata %s only in the second", k)})
		}
	}
	for _, t := range onlyIn(a.Names(), b.Names()) {
		diffs = append(diffs, Difference{File: name, Tensor: t, What: "only in the first"})
	}
	for _, t := range onlyIn(b.Names(), a.Names()) {
		diffs = append(diffs, Difference{File: name, Tensor: t, What: "only in the second"})
	}
	for _, t := range a.Names() {
		y, ok := b.Tensors[t]
		if !ok {
			continue
		}
		if d := compareTensors(a.Tensors[t], y); d != "" {
			diffs = append(diffs, Difference{File: name, Tensor: t, What: d})
		}
	}
	return diffs
}

// compareTensors describes how x and y differ, "" when they are bit-identical: for F32
// tensors how many elements differ and by how much at most.
func compareTensors(x, y safetensors.Tensor) string {
	switch {
	case x.DType != y.DType:
		return fmt.Sprintf("dtype %s vs %s", x.DType, y.DType)
	case !slices.Equal(x.Shape, y.Shape):
		return fmt.Sprintf("shape %v vs %v", x.Shape, y.Shape)
	case bytes.Equal(x.Data, y.Data):
		return ""
	case x.DType != safetensors.F32 || len(x.Data) != len(y.Data) || len(x.Data)%4 != 0:
		return "bytes differ"
	}
	n, worst, at := 0, 0.0, 0
	for i := 0; i < len(x.Data); i += 4 {
		u, v := binary.LittleEndian.Uint32(x.Data[i:]), binary.LittleEndian.Uint32(y.Data[i:])
		if u == v {
			continue
		}
		n++
		d := math.Abs(float64(math.Float32frombits(u)) - float64(math.Float32frombits(v)))
		if math.IsNaN(d) {
			d = math.Inf(1) // a NaN on one side (or NaNs with other payloads)
		}
		if n == 1 || d > worst {
			worst, at = d, i/4
		}
	}
	return fmt.Sprintf("%d of %d elements differ (largest |a−b| %.3g, at element %d)", n, len(x.Data)/4, worst, at)
}
