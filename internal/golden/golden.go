// Package golden loads the PyTorch reference files in testdata/goldens for tests.
//
// The files are written by scripts/gen_goldens.py; regenerate them with
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_goldens.py testdata/goldens
//
// Inputs and parameters are float32 values; references (outputs, grads,
// buffers_after, SGD trajectories) were computed in float64 from them and are
// rounded to float32 on load. For layer cases the loss is sum(output * Upstream),
// so Grads holds d(loss)/d(input) under "x" and d(loss)/d(param) under the
// parameter's name.
package golden

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Array is a dense float32 tensor in row-major order. A scalar has an empty Shape
// and one element.
type Array struct {
	Shape []int     `json:"shape"`
	Data  []float32 `json:"data"`
}

// Numel is the number of elements the shape describes (1 for a scalar).
func (a Array) Numel() int {
	n := 1
	for _, d := range a.Shape {
		n *= d
	}
	return n
}

// Ints returns the data converted to ints (labels, counters). It panics if a
// value is not integral.
func (a Array) Ints() []int {
	out := make([]int, len(a.Data))
	for i, v := range a.Data {
		if float32(int(v)) != v {
			panic(fmt.Sprintf("golden: Array.Ints: element %d = %v is not an integer", i, v))
		}
		out[i] = int(v)
	}
	return out
}

// Case is one golden test case. Fields that do not apply to an op are nil.
type Case struct {
	Name         string           `json:"name"`
	Op           string           `json:"op"`
	Config       map[string]any   `json:"config"`
	Inputs       map[string]Array `json:"inputs"`
	Params       map[string]Array `json:"params"`
	Buffers      map[string]Array `json:"buffers"`
	Outputs      map[string]Array `json:"outputs"`
	Grads        map[string]Array `json:"grads"`
	BuffersAfter map[string]Array `json:"buffers_after"`
	Upstream     *Array           `json:"upstream"`

	// Optimizer (SGD, Adam) cases: per parameter, one row (flattened, shape as in Params) per step.
	// GradsPerStep[k][t] is the gradient used at step t; ParamsPerStep[k][t] is
	// the parameter after step t.
	GradsPerStep  map[string][][]float32 `json:"grads_per_step"`
	ParamsPerStep map[string][][]float32 `json:"params_per_step"`
	// NoisePerStep is set for grad_rule "0.5p+noise": the gradient at step t is
	// 0.5*p_t + NoisePerStep[k][t], p_t being the parameter before step t.
	NoisePerStep map[string][][]float32 `json:"noise_per_step"`
}

// File is one golden file (one layer family).
type File struct {
	TorchVersion string `json:"torch_version"`
	ComputeDType string `json:"compute_dtype"`
	Cases        []Case `json:"cases"`

	path string
}

// Load reads and decodes a golden file and checks that every array's shape
// matches its data length.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("golden: %w", err)
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("golden: decoding %s: %w", path, err)
	}
	f.path = path
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// MustLoad loads the golden file name (for example "conv2d.json" or "conv2d")
// from the repository's testdata/goldens and fails the test on error.
func MustLoad(t testing.TB, name string) *File {
	t.Helper()
	f, err := Load(Path(name))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Validate checks that every array's data length matches its shape, and that
// per-step SGD rows match their parameter's size.
func (f *File) Validate() error {
	for i := range f.Cases {
		c := &f.Cases[i]
		if c.Name == "" || c.Op == "" {
			return fmt.Errorf("golden: %s: case %d has no name or op", f.path, i)
		}
		check := func(group, key string, a Array) error {
			if a.Numel() != len(a.Data) {
				return fmt.Errorf("golden: %s: case %q %s[%q]: shape %v has %d elements, data has %d",
					f.path, c.Name, group, key, a.Shape, a.Numel(), len(a.Data))
			}
			return nil
		}
		groups := []struct {
			name string
			m    map[string]Array
		}{{"inputs", c.Inputs}, {"params", c.Params}, {"buffers", c.Buffers}, {"outputs", c.Outputs},
			{"grads", c.Grads}, {"buffers_after", c.BuffersAfter}}
		for _, g := range groups {
			for k, a := range g.m {
				if err := check(g.name, k, a); err != nil {
					return err
				}
			}
		}
		if c.Upstream != nil {
			if err := check("upstream", "", *c.Upstream); err != nil {
				return err
			}
		}
		for _, s := range []struct {
			name string
			m    map[string][][]float32
		}{{"grads_per_step", c.GradsPerStep}, {"params_per_step", c.ParamsPerStep}, {"noise_per_step", c.NoisePerStep}} {
			for k, steps := range s.m {
				p, ok := c.Params[k]
				if !ok {
					return fmt.Errorf("golden: %s: case %q %s has %q, which is not in params", f.path, c.Name, s.name, k)
				}
				for t, row := range steps {
					if len(row) != len(p.Data) {
						return fmt.Errorf("golden: %s: case %q %s[%q][%d] has %d values, param has %d",
							f.path, c.Name, s.name, k, t, len(row), len(p.Data))
					}
				}
			}
		}
	}
	return nil
}

// Case returns the case with the given name.
func (f *File) Case(name string) (*Case, error) {
	for i := range f.Cases {
		if f.Cases[i].Name == name {
			return &f.Cases[i], nil
		}
	}
	names := make([]string, len(f.Cases))
	for i := range f.Cases {
		names[i] = f.Cases[i].Name
	}
	return nil, fmt.Errorf("golden: %s: no case %q (have %s)", f.path, name, strings.Join(names, ", "))
}

// Has reports whether the config has key.
func (c *Case) Has(key string) bool {
	_, ok := c.Config[key]
	return ok
}

func (c *Case) config(key string) any {
	v, ok := c.Config[key]
	if !ok {
		panic(fmt.Sprintf("golden: case %q (op %s): config has no key %q", c.Name, c.Op, key))
	}
	return v
}

// Int returns an integer config value; it panics with a clear message if the
// key is missing or the value is not an integral number.
func (c *Case) Int(key string) int {
	v := c.config(key)
	x, ok := v.(float64)
	if !ok || x != math.Trunc(x) {
		panic(fmt.Sprintf("golden: case %q: config %q = %v (%T) is not an integer", c.Name, key, v, v))
	}
	return int(x)
}

// Float returns a numeric config value; it panics if missing or not a number.
func (c *Case) Float(key string) float64 {
	v := c.config(key)
	x, ok := v.(float64)
	if !ok {
		panic(fmt.Sprintf("golden: case %q: config %q = %v (%T) is not a number", c.Name, key, v, v))
	}
	return x
}

// Bool returns a boolean config value; it panics if missing or not a bool.
func (c *Case) Bool(key string) bool {
	v := c.config(key)
	x, ok := v.(bool)
	if !ok {
		panic(fmt.Sprintf("golden: case %q: config %q = %v (%T) is not a bool", c.Name, key, v, v))
	}
	return x
}

// Str returns a string config value; it panics if missing or not a string.
func (c *Case) Str(key string) string {
	v := c.config(key)
	x, ok := v.(string)
	if !ok {
		panic(fmt.Sprintf("golden: case %q: config %q = %v (%T) is not a string", c.Name, key, v, v))
	}
	return x
}

// MaxAbsDiff returns max_i |a[i]-b[i]| computed in float64, +Inf if the lengths
// differ, and NaN if any element is NaN.
func MaxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	m := 0.0
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		if math.IsNaN(d) {
			return math.NaN()
		}
		if d > m {
			m = d
		}
	}
	return m
}

// AssertClose fails the test unless |got[i]-want[i]| <= atol + rtol*|want[i]|
// for every i (NaN or Inf never passes unless both are the same Inf). The report names
// the first offending index, the number of offenders, the lengths and the max diff.
func AssertClose(t testing.TB, name string, got, want []float32, atol, rtol float64) {
	t.Helper()
	if msg := closeMsg(got, want, atol, rtol); msg != "" {
		t.Errorf("%s: %s", name, msg)
	}
}

// AssertArrayClose is AssertClose plus a check that gotShape equals want.Shape.
func AssertArrayClose(t testing.TB, name string, gotShape []int, got []float32, want Array, atol, rtol float64) {
	t.Helper()
	if !sameShape(gotShape, want.Shape) {
		t.Errorf("%s: shape %v, want %v", name, gotShape, want.Shape)
		return
	}
	if msg := closeMsg(got, want.Data, atol, rtol); msg != "" {
		t.Errorf("%s (shape %v): %s", name, want.Shape, msg)
	}
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func closeMsg(got, want []float32, atol, rtol float64) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	first, bad := -1, 0
	maxDiff, maxAt := 0.0, -1
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		d := math.Abs(g - w)
		ok := d <= atol+rtol*math.Abs(w)
		if math.IsInf(g, 0) || math.IsInf(w, 0) {
			ok = g == w
			if ok {
				d = 0
			}
		}
		if math.IsNaN(d) {
			ok = false
			d = math.Inf(1)
		}
		if d > maxDiff || maxAt < 0 {
			maxDiff, maxAt = d, i
		}
		if !ok {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d elements differ (atol %g, rtol %g); first at [%d]: got %v want %v (diff %g); max diff %g at [%d]: got %v want %v",
		bad, len(got), atol, rtol, first, got[first], want[first],
		math.Abs(float64(got[first])-float64(want[first])), maxDiff, maxAt, got[maxAt], want[maxAt])
}

// RepoRoot walks up from the working directory to the directory holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("golden: no go.mod found above the working directory")
		}
		dir = parent
	}
}

// Path returns the path of testdata/goldens/name in the repository (found by
// walking up to go.mod); ".json" is appended when name has no extension.
// It panics if no go.mod is found.
func Path(name string) string {
	root, err := RepoRoot()
	if err != nil {
		panic(err)
	}
	if filepath.Ext(name) == "" {
		name += ".json"
	}
	return filepath.Join(root, "testdata", "goldens", name)
}
