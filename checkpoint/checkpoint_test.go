package checkpoint

import (
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

func net(seed uint64, hidden int) nn.Module {
	rng := nn.NewRand(seed)
	m := nn.NewSequential(nn.NewLinear(4, hidden, true, rng), nn.NewBatchNorm2d(hidden), nn.NewDropout(0.5, rng), nn.NewLinear(hidden, 2, true, rng))
	nn.Parameters(m)
	return m
}

// filled returns a model whose parameters, buffers and optimizer state are not the
// initial ones, and an optimizer with momentum buffers.
func filled(t *testing.T, seed uint64) (nn.Module, *optim.SGD) {
	t.Helper()
	m := net(seed, 3)
	opt, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range nn.Parameters(m) {
		for i := range p.Grad.Data {
			p.Grad.Data[i] = float32(i+1) * 0.01
		}
	}
	opt.Step()
	for _, b := range nn.Buffers(m) {
		for i := range b.Value.Data {
			b.Value.Data[i] = float32(seed) + float32(i)
		}
	}
	nn.RandSources(m)["2"].Uint64() // advance the dropout generator
	return m, opt
}

func save(t *testing.T, dir string, keep int, m nn.Module, opt Optimizer, rng RandState, it int64) string {
	t.Helper()
	st := State{Model: m, Optimizer: opt, RNG: map[string]RandState{"loop": rng}}
	path, err := Saver{Dir: dir, Keep: keep}.Save(t.Context(), st, Meta{Model: "net", Config: map[string]string{"lr": "0.1"}},
		Position{Epoch: 1, Step: 2, Iteration: it, Totals: map[string]float64{"loss": 0.1 + 0.2}})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Save then Load into a fresh model and optimizer restores parameters, buffers, momentum,
// the layers' and the loop's generators and the position, bit for bit.
func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	m, opt := filled(t, 7)
	loopRNG := rand.NewPCG(1, 2)
	loopRNG.Uint64()
	path := save(t, dir, 0, m, opt, loopRNG, 12)
	if latest, err := Latest(dir); err != nil || latest != path {
		t.Fatalf("Latest %q %v, saved %q", latest, err, path)
	}

	m2 := net(99, 3)
	opt2, _ := optim.NewSGD(nn.Parameters(m2), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	rng2 := rand.NewPCG(5, 5)
	pos, err := Load(path, State{Model: m2, Optimizer: opt2, RNG: map[string]RandState{"loop": rng2}}, Meta{Model: "net", Config: map[string]string{"lr": "0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if pos.Epoch != 1 || pos.Step != 2 || pos.Iteration != 12 || pos.Totals["loss"] != 0.1+0.2 {
		t.Fatalf("position %+v", pos)
	}
	for i, p := range nn.Parameters(m) {
		if !slices.Equal(p.Value.Data, nn.Parameters(m2)[i].Value.Data) {
			t.Fatalf("parameter %s differs", p.Name)
		}
	}
	for i, b := range nn.Buffers(m) {
		if !slices.Equal(b.Value.Data, nn.Buffers(m2)[i].Value.Data) {
			t.Fatalf("buffer %s differs", b.Name)
		}
	}
	for k, v := range opt.State() {
		if !slices.Equal(v, opt2.State()[k]) {
			t.Fatalf("optimizer state %s differs", k)
		}
	}
	if loopRNG.Uint64() != rng2.Uint64() || nn.RandSources(m)["2"].Uint64() != nn.RandSources(m2)["2"].Uint64() {
		t.Fatal("generators not restored")
	}
	meta, _, err := ReadInfo(path)
	if err != nil || meta.Version == "" || meta.World != 1 {
		t.Fatalf("meta %+v %v", meta, err)
	}
}

// Keep keeps the newest checkpoints; nothing temporary is left behind.
func TestKeepAndNoLeftovers(t *testing.T) {
	dir := t.TempDir()
	m, opt := filled(t, 1)
	for it := int64(1); it <= 4; it++ {
		save(t, dir, 2, m, opt, rand.NewPCG(1, 1), it)
	}
	names, err := List(dir)
	if err != nil || !slices.Equal(names, []string{"ckpt-0000000003", "ckpt-0000000004"}) {
		t.Fatalf("kept %v (%v)", names, err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("left over: %s", e.Name())
		}
	}
	// Saving the same iteration again replaces it.
	save(t, dir, 2, m, opt, rand.NewPCG(1, 1), 4)
	if names, _ := List(dir); len(names) != 2 {
		t.Fatalf("after re-saving: %v", names)
	}
	if _, err := Latest(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("empty directory: %v", err)
	}
}

// Bad checkpoints give errors that name the file and what is wrong, never a panic.
func TestLoadRejects(t *testing.T) {
	m, opt := filled(t, 3)
	for _, tc := range []struct {
		name   string
		damage func(path string)
		model  nn.Module
		meta   Meta
		want   string
	}{
		{"other model meta", nil, nil, Meta{Model: "other", Config: map[string]string{"lr": "0.1"}}, `model "net", this run "other"`},
		{"other flags", nil, nil, Meta{Model: "net", Config: map[string]string{"lr": "0.2"}}, `lr "0.1", this run "0.2"`},
		{"other world", nil, nil, Meta{Model: "net", World: 4, Config: map[string]string{"lr": "0.1"}}, "world size 1, this run 4"},
		{"other shapes", nil, net(1, 5), Meta{Model: "net", Config: map[string]string{"lr": "0.1"}}, `tensor "0.bias" has shape [3], the model's is [5]`},
		{"truncated model", func(p string) { truncate(t, filepath.Join(p, modelFile)) }, nil, Meta{Model: "net", Config: map[string]string{"lr": "0.1"}}, "model.safetensors: truncated"},
		{"foreign rank file", func(p string) { os.WriteFile(filepath.Join(p, rankFile(0)), []byte("PK\x03\x04 zip"), 0o644) }, nil, Meta{Model: "net", Config: map[string]string{"lr": "0.1"}}, "rank-0.safetensors"},
		{"no meta", func(p string) { os.Remove(filepath.Join(p, metaFile)) }, nil, Meta{Model: "net"}, "meta.json"},
		{"foreign meta", func(p string) { os.WriteFile(filepath.Join(p, metaFile), []byte(`{"x":1}`), 0o644) }, nil, Meta{Model: "net"}, "not a spargo checkpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := save(t, dir, 0, m, opt, rand.NewPCG(1, 1), 1)
			if tc.damage != nil {
				tc.damage(path)
			}
			model := tc.model
			if model == nil {
				model = net(2, 3)
			}
			o2, _ := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
			_, err := Load(path, State{Model: model, Optimizer: o2, RNG: map[string]RandState{"loop": rand.NewPCG(0, 0)}}, tc.meta)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	// A generator missing from the run is named.
	path := save(t, t.TempDir(), 0, m, opt, rand.NewPCG(1, 1), 1)
	o2, _ := optim.NewSGD(nn.Parameters(net(2, 3)), optim.SGDConfig{})
	if _, err := Load(path, State{Model: net(2, 3), Optimizer: o2}, Meta{Model: "net", Config: map[string]string{"lr": "0.1"}}); err == nil || !strings.Contains(err.Error(), `"loop" has no counterpart`) {
		t.Fatalf("missing generator: %v", err)
	}
}

func truncate(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b[:5], 0o644); err != nil {
		t.Fatal(err)
	}
}

// State.Arrays are saved per rank with their shape and restored in place; another shape, a
// missing array or one the run lacks is refused with an error naming it.
func TestArrays(t *testing.T) {
	m, opt := filled(t, 4)
	arr := func(v []float32, shape ...int) map[string]Array {
		return map[string]Array{"state.h": {Data: v, Shape: shape, Axes: []string{"layers", "batch", "hidden"}}}
	}
	meta := Meta{Model: "net"}
	saved := []float32{1, -2, 3.5, 4, 5, 6}
	path, err := Saver{Dir: t.TempDir()}.Save(t.Context(), State{Model: m, Optimizer: opt, Arrays: arr(saved, 1, 2, 3)}, meta, Position{Iteration: 1})
	if err != nil {
		t.Fatal(err)
	}
	load := func(a map[string]Array) error {
		o2, _ := optim.NewSGD(nn.Parameters(net(2, 3)), optim.SGDConfig{})
		_, err := Load(path, State{Model: net(2, 3), Optimizer: o2, Arrays: a}, meta)
		return err
	}
	got := make([]float32, 6)
	if err := load(arr(got, 1, 2, 3)); err != nil || !slices.Equal(got, saved) {
		t.Fatalf("restored %v (%v), saved %v", got, err, saved)
	}
	for _, tc := range []struct {
		arrays map[string]Array
		want   string
	}{
		{arr(make([]float32, 6), 1, 3, 2), `array "state.h" has shape [1 2 3] (layers, batch, hidden), this run's is [1 3 2] (layers, batch, hidden)`},
		{nil, `array "state.h" (shape [1 2 3]) has no counterpart`},
		{map[string]Array{"state.h": {Data: got, Shape: []int{1, 2, 3}}, "state.c": {Data: got, Shape: []int{1, 2, 3}}}, `no array "state.c"`},
	} {
		if err := load(tc.arrays); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "rank-0.safetensors") {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
	if _, err := (Saver{Dir: t.TempDir()}).Save(t.Context(), State{Model: m, Arrays: arr(saved, 2, 2)}, meta, Position{}); err == nil || !strings.Contains(err.Error(), "6 values, its shape [2 2] (layers, batch, hidden) has 4") {
		t.Errorf("saving a misshapen array: %v", err)
	}
}
