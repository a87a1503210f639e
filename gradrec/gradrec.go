// Package gradrec records the local gradients that DDP hands its comm hook — each rank's
// buckets before any communication — and reads them back, so that comm hooks can be
// measured on real gradients (`spargo bench comm -grads DIR`) instead of synthetic ones.
// The volumes of SparDL, Ok-Topk and the other top-k hooks depend on how much the ranks'
// top-k sets overlap, which synthetic gradients only imitate.
//
// A Recorder is a ddp.BucketObserver: install one per rank with ddp.WithBucketObserver. At
// the iterations its Schedule selects it writes one safetensors file per rank,
// DIR/iter-00000050-rank-0.safetensors, holding one F32 tensor per parameter under its
// dotted name (features.0.weight) with the parameter's shape, and metadata: the model, the
// hook, the world size P, the rank, the iteration, the parameters in declaration order and
// the bucket layout of the run (keys MetaModel, MetaHook, …). Recording only reads the
// buckets, so training computes the same numbers with and without it.
//
//	rec, err := gradrec.NewRecorder(gradrec.Config{Dir: "/tmp/grads", Schedule: gradrec.Schedule{Every: 50, Steps: 3},
//		Model: "vgg11", Hook: "allreduce", Params: nn.Parameters(model)})
//	dp, err := ddp.New(ctx, model, group, ddp.WithBucketObserver(rec))
//
// Open reads a recording's layout from its file names and first file; Load reads one rank's
// gradients of one iteration and checks that the file belongs to the same recording.
package gradrec

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

// Metadata keys of a recorded file.
const (
	MetaFormat    = "spargo.gradrec" // FormatVersion
	MetaModel     = "model"
	MetaHook      = "hook"
	MetaWorld     = "world"     // P, decimal
	MetaRank      = "rank"      // decimal
	MetaIteration = "iteration" // DDP's synchronised-iteration counter, decimal
	MetaParams    = "params"    // JSON array of the parameter names in declaration order
	MetaShapes    = "shapes"    // JSON array of their shapes
	MetaBuckets   = "buckets"   // JSON array of buckets, each an array of declaration indices, in communication order
)

// FormatVersion is the MetaFormat value this package writes and reads.
const FormatVersion = "1"

// fileName matches the files a Recorder writes.
var fileName = regexp.MustCompile(`^iter-(\d+)-rank-(\d+)\.safetensors$`)

// FileName is the name of rank's file of iteration iter inside a recording's directory.
func FileName(iter int64, rank int) string {
	return fmt.Sprintf("iter-%08d-rank-%d.safetensors", iter, rank)
}

// Layout describes what a recording holds, the same in all of its files.
type Layout struct {
	Model string
	Hook  string
	World int
	// Names and Shapes are the parameters in declaration order (nn.Parameters).
	Names  []string
	Shapes [][]int
	// Buckets is the run's bucket plan: declaration indices per bucket, in communication order.
	Buckets [][]int
}

// Params returns zero-valued parameters with the recording's names and shapes, in
// declaration order: enough for planners and for hooks that read shapes.
func (l *Layout) Params() []*nn.Param {
	ps := make([]*nn.Param, len(l.Names))
	for i, name := range l.Names {
		ps[i] = nn.NewParam(name, l.Shapes[i]...)
		ps[i].Name = name
	}
	return ps
}

// Elements is the total number of gradient elements per rank and iteration.
func (l *Layout) Elements() int {
	n := 0
	for _, s := range l.Shapes {
		n += elements(s)
	}
	return n
}

func elements(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// WriteIteration writes rank's gradients of iteration iter (one slice per parameter of l, in
// declaration order) to dir/FileName(iter, rank), atomically. A Recorder calls it; tests and
// converters may too.
func WriteIteration(dir string, l *Layout, rank int, iter int64, grads [][]float32) error {
	if len(grads) != len(l.Names) {
		return fmt.Errorf("gradrec: %d gradients for %d parameters", len(grads), len(l.Names))
	}
	f := safetensors.New()
	for i, g := range grads {
		if len(g) != elements(l.Shapes[i]) {
			return fmt.Errorf("gradrec: parameter %s has %d elements, its gradient %d", l.Names[i], elements(l.Shapes[i]), len(g))
		}
		f.Tensors[l.Names[i]] = safetensors.FromFloat32(g, l.Shapes[i]...)
	}
	names, _ := json.Marshal(l.Names)
	shapes, _ := json.Marshal(l.Shapes)
	buckets, _ := json.Marshal(l.Buckets)
	f.Metadata = map[string]string{
		MetaFormat: FormatVersion, MetaModel: l.Model, MetaHook: l.Hook, MetaWorld: strconv.Itoa(l.World),
		MetaRank: strconv.Itoa(rank), MetaIteration: strconv.FormatInt(iter, 10),
		MetaParams: string(names), MetaShapes: string(shapes), MetaBuckets: string(buckets),
	}
	path := filepath.Join(dir, FileName(iter, rank))
	if err := f.WriteFile(path); err != nil {
		return fmt.Errorf("gradrec: write %s: %w", path, err)
	}
	return nil
}

// Recording is a directory of recorded gradients: every iteration has a file per rank.
type Recording struct {
	Dir string
	Layout
	// Iterations are the recorded iterations, ascending.
	Iterations []int64
}

// Open reads the recording in dir: it lists the files, checks that every recorded iteration
// has one per rank 0..P-1, and reads the layout from the first file.
func Open(dir string) (*Recording, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("gradrec: %w", err)
	}
	ranks := map[int64][]int{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil || e.IsDir() {
			continue
		}
		it, err1 := strconv.ParseInt(m[1], 10, 64)
		r, err2 := strconv.Atoi(m[2])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("gradrec: %s: %w", filepath.Join(dir, e.Name()), err)
		}
		ranks[it] = append(ranks[it], r)
	}
	if len(ranks) == 0 {
		return nil, fmt.Errorf("gradrec: %s holds no recorded gradients (iter-*-rank-*.safetensors)", dir)
	}
	rec := &Recording{Dir: dir}
	for it := range ranks {
		rec.Iterations = append(rec.Iterations, it)
	}
	slices.Sort(rec.Iterations)
	first := filepath.Join(dir, FileName(rec.Iterations[0], ranks[rec.Iterations[0]][0]))
	f, err := safetensors.ReadFile(first)
	if err != nil {
		return nil, fmt.Errorf("gradrec: %w", err)
	}
	if rec.Layout, err = parseLayout(f.Metadata); err != nil {
		return nil, fmt.Errorf("gradrec: %s: %w", first, err)
	}
	for _, it := range rec.Iterations {
		rs := ranks[it]
		slices.Sort(rs)
		if len(rs) != rec.World || rs[0] != 0 || rs[len(rs)-1] != rec.World-1 {
			return nil, fmt.Errorf("gradrec: %s: iteration %d has files of ranks %v, want one for each of ranks 0..%d (P=%d)", dir, it, rs, rec.World-1, rec.World)
		}
	}
	return rec, nil
}

func parseLayout(md map[string]string) (Layout, error) {
	if v := md[MetaFormat]; v != FormatVersion {
		return Layout{}, fmt.Errorf("not a gradient recording of format %s (metadata %s=%q)", FormatVersion, MetaFormat, v)
	}
	l := Layout{Model: md[MetaModel], Hook: md[MetaHook]}
	var err error
	if l.World, err = strconv.Atoi(md[MetaWorld]); err != nil || l.World < 1 {
		return Layout{}, fmt.Errorf("metadata %s=%q: want a positive world size", MetaWorld, md[MetaWorld])
	}
	for key, dst := range map[string]any{MetaParams: &l.Names, MetaShapes: &l.Shapes, MetaBuckets: &l.Buckets} {
		if err := json.Unmarshal([]byte(md[key]), dst); err != nil {
			return Layout{}, fmt.Errorf("metadata %s: %w", key, err)
		}
	}
	if len(l.Names) == 0 || len(l.Names) != len(l.Shapes) {
		return Layout{}, fmt.Errorf("metadata: %d parameter names and %d shapes", len(l.Names), len(l.Shapes))
	}
	seen := make([]bool, len(l.Names))
	for _, b := range l.Buckets {
		for _, i := range b {
			if i < 0 || i >= len(seen) || seen[i] {
				return Layout{}, fmt.Errorf("metadata %s: parameter index %d is out of range or repeated", MetaBuckets, i)
			}
			seen[i] = true
		}
	}
	if i := slices.Index(seen, false); i >= 0 {
		return Layout{}, fmt.Errorf("metadata %s: parameter %s is in no bucket", MetaBuckets, l.Names[i])
	}
	return l, nil
}

// Path is the file of rank's gradients at iteration iter.
func (r *Recording) Path(iter int64, rank int) string {
	return filepath.Join(r.Dir, FileName(iter, rank))
}

// Load reads rank's gradients of iteration iter, one slice per parameter in declaration
// order, and checks that the file's metadata is this recording's.
func (r *Recording) Load(iter int64, rank int) ([][]float32, error) {
	path := r.Path(iter, rank)
	f, err := safetensors.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gradrec: %w", err)
	}
	l, err := parseLayout(f.Metadata)
	if err != nil {
		return nil, fmt.Errorf("gradrec: %s: %w", path, err)
	}
	if l.Model != r.Model || l.World != r.World || !slices.Equal(l.Names, r.Names) ||
		!slices.EqualFunc(l.Shapes, r.Shapes, slices.Equal) || !slices.EqualFunc(l.Buckets, r.Buckets, slices.Equal) {
		return nil, fmt.Errorf("gradrec: %s belongs to another recording (model %q, P=%d, %d parameters; %s has model %q, P=%d, %d parameters)",
			path, l.Model, l.World, len(l.Names), r.Dir, r.Model, r.World, len(r.Names))
	}
	if f.Metadata[MetaRank] != strconv.Itoa(rank) || f.Metadata[MetaIteration] != strconv.FormatInt(iter, 10) {
		return nil, fmt.Errorf("gradrec: %s: metadata says rank %s, iteration %s", path, f.Metadata[MetaRank], f.Metadata[MetaIteration])
	}
	grads := make([][]float32, len(r.Names))
	for i, name := range r.Names {
		if grads[i], err = f.Float32(name); err != nil {
			return nil, fmt.Errorf("gradrec: %s: %w", path, err)
		}
		if len(grads[i]) != elements(r.Shapes[i]) {
			return nil, fmt.Errorf("gradrec: %s: tensor %s has %d elements, want %d", path, name, len(grads[i]), elements(r.Shapes[i]))
		}
	}
	return grads, nil
}
