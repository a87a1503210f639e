package checkpoint_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// saveMLP saves a small model and its optimizer after one step with the given seed and
// returns the run's checkpoint directory.
func saveMLP(t testing.TB, seed uint64, pos checkpoint.Position) string {
	t.Helper()
	dir := t.TempDir()
	model := nn.NewSequential(nn.NewLinear(4, 3, true, nn.NewRand(seed)), nn.NewLinear(3, 2, true, nn.NewRand(seed+1)))
	opt, _ := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	for _, p := range nn.Parameters(model) {
		for i := range p.Grad.Data {
			p.Grad.Data[i] = float32(i%5) - 2
		}
	}
	opt.Step()
	meta := checkpoint.Meta{Model: "mlp", Config: map[string]string{"lr": "0.1"}}
	if _, err := (checkpoint.Saver{Dir: dir}).Save(context.Background(), checkpoint.State{Model: model, Optimizer: opt}, meta, pos); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDiff(t *testing.T) {
	pos := checkpoint.Position{Epoch: 1, Iteration: 10, Samples: 320, Totals: map[string]float64{"loss": 2.5}}
	a, same := saveMLP(t, 0, pos), saveMLP(t, 0, pos)
	if d, err := checkpoint.Diff(a, same); err != nil || d != nil {
		t.Fatalf("the same state: %v, %v", d, err)
	}

	other := saveMLP(t, 7, pos)
	d, err := checkpoint.Diff(a, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.Compare(a, same); err != nil {
		t.Errorf("Compare of the same state: %v", err)
	}
	if err := checkpoint.Compare(a, other); err == nil || !strings.Contains(err.Error(), "differ (4):\n\tmodel.safetensors: 0.bias: 3 of 3 elements differ") {
		t.Errorf("Compare of another seed: %v", err)
	}
	mustList(t, d, 4, "model.safetensors: 0.weight: 12 of 12 elements differ (largest |a−b| ", "model.safetensors: 1.bias: 2 of 2 elements")

	moved := pos
	moved.Iteration, moved.Totals = 11, map[string]float64{"loss": 2.25}
	d, err = checkpoint.Diff(a, saveMLP(t, 0, moved))
	if err != nil {
		t.Fatal(err)
	}
	mustList(t, d, 3, "meta.json: iteration 10 (320 samples) vs 11 (320 samples)", "meta.json: total loss 2.5 vs 2.25",
		`rank-0.safetensors: metadata spargo.totals "{\"loss\":2.5}" vs "{\"loss\":2.25}"`)

	// A missing file, and a path that is no checkpoint.
	latest, err := checkpoint.Latest(same)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(latest, "optimizer.safetensors")); err != nil {
		t.Fatal(err)
	}
	if d, err := checkpoint.Diff(a, latest); err != nil || len(d) != 1 || d[0].String() != "optimizer.safetensors: only in the first" {
		t.Errorf("a missing file: %v, %v", d, err)
	}
	if _, err := checkpoint.Diff(a, t.TempDir()); err == nil || !strings.Contains(err.Error(), "is not a checkpoint (no meta.json)") {
		t.Errorf("an empty directory: %v", err)
	}
}

// mustList requires n differences, among them one containing each wanted text.
func mustList(t *testing.T, d []checkpoint.Difference, n int, want ...string) {
	t.Helper()
	var got []string
	for _, x := range d {
		got = append(got, x.String())
	}
	all := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("differences:\n%s\nwant one with %q", all, w)
		}
	}
	if len(got) != n {
		t.Errorf("differences:\n%s\nwant %d", all, n)
	}
}

// Diff tells whether two checkpoints hold the same state, and where they differ: here a
// resumed run's against an uninterrupted one's, in a test of an exact resume.
func ExampleDiff() {
	dir, err := os.MkdirTemp("", "ckpt")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	save := func(run string, w float32) string {
		model := nn.NewSequential(nn.NewLinear(2, 1, false, nn.NewRand(0)))
		nn.Parameters(model)[0].Value.Data[1] = w
		path, err := checkpoint.Saver{Dir: filepath.Join(dir, run)}.Save(context.Background(),
			checkpoint.State{Model: model}, checkpoint.Meta{Model: "linear"}, checkpoint.Position{Iteration: 100})
		if err != nil {
			log.Fatal(err)
		}
		return path
	}
	straight, resumed := save("straight", 0.5), save("resumed", 0.25)
	diffs, err := checkpoint.Diff(straight, resumed)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range diffs {
		fmt.Println(d)
	}
	// Output: model.safetensors: 0.weight: 1 of 2 elements differ (largest |a−b| 0.25, at element 1)
}
