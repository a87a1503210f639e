package cifar

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/train"
)

// resumeRun is a run of the tiny model on the fixture, 2 workers × batch 4, 2 steps per
// epoch, saving into dir.
func resumeRun(hook, dir string, epochs int, resume bool) Config {
	return Config{Data: cifarMini, Model: "tiny", Workers: 2, Hook: hook, Batch: 4, Epochs: epochs, Steps: 2,
		Flags: train.Flags{LR: 0.05, Momentum: 0.9, WD: 5e-4, Optim: "sgd:nesterov=true"}, Seed: 3, EvalLimit: 8,
		Checkpoint: dir, Resume: resume, NewModel: tinyNet}
}

func runOrFatal(t *testing.T, c Config) {
	t.Helper()
	var out bytes.Buffer
	if _, err := Run(context.Background(), c, &out, &out); err != nil {
		t.Fatalf("-hook %s: %v\n%s", c.Hook, err, out.String())
	}
}

// Checkpoints store the hook's canonical spec, and -resume compares canonical forms: a run
// saved with one spelling of a hook resumes with another (defaults left out or written, keys
// in another order) and ends bit-identical to a run that never stopped; a checkpoint written
// before checkpoints were canonical (the raw spec in meta.json) resumes too; another hook is
// refused with an error naming both canonical specs.
func TestResumeComparesCanonicalSpecs(t *testing.T) {
	for _, tc := range []struct{ saved, resumed string }{
		{"spardl", "spardl:density=0.01"},
		{"spardl:teams=2,density=0.01", "spardl:density=0.01,teams=2"},
	} {
		t.Run(tc.saved, func(t *testing.T) {
			tmp := t.TempDir()
			straight := filepath.Join(tmp, "straight")
			runOrFatal(t, resumeRun(tc.saved, straight, 2, false))
			want, err := checkpoint.Latest(straight)
			if err != nil {
				t.Fatal(err)
			}
			stopped := filepath.Join(tmp, "stopped")
			runOrFatal(t, resumeRun(tc.saved, stopped, 1, false))
			first, err := checkpoint.Latest(stopped)
			if err != nil {
				t.Fatal(err)
			}
			meta, _, err := checkpoint.ReadInfo(first)
			if err != nil {
				t.Fatal(err)
			}
			if canon := (&train.Flags{}).CanonicalSpec("hook", tc.saved); meta.Hook != canon || canon == tc.saved {
				t.Fatalf("meta.json holds hook %q, want the canonical %q", meta.Hook, canon)
			}
			runOrFatal(t, resumeRun(tc.resumed, stopped, 2, true))
			got, err := checkpoint.Latest(stopped)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkpoint.Compare(want, got); err != nil {
				t.Fatalf("saved with -hook %s, resumed with -hook %s: %v", tc.saved, tc.resumed, err)
			}
		})
	}

	// A checkpoint of an older run holds the specs as they were typed.
	tmp := t.TempDir()
	old := filepath.Join(tmp, "old")
	runOrFatal(t, resumeRun("spardl:density=0.01", old, 1, false))
	path, err := checkpoint.Latest(old)
	if err != nil {
		t.Fatal(err)
	}
	rewriteMeta(t, path, func(m map[string]any) {
		m["hook"] = "spardl"
		m["config"].(map[string]any)["optim"] = "sgd:nesterov=true"
	})
	runOrFatal(t, resumeRun("spardl:density=0.01", old, 2, true))

	// Another hook is refused, naming both canonical specs.
	other := filepath.Join(tmp, "other")
	runOrFatal(t, resumeRun("spardl", other, 1, false))
	var out bytes.Buffer
	_, err = Run(context.Background(), resumeRun("spardl:density=0.02", other, 2, true), &out, &out)
	saved, run := (&train.Flags{}).CanonicalSpec("hook", "spardl"), (&train.Flags{}).CanonicalSpec("hook", "spardl:density=0.02")
	if err == nil || !strings.Contains(err.Error(), `hook "`+saved+`", this run "`+run+`"`) {
		t.Fatalf("resumed spardl with spardl:density=0.02: %v, want an error naming %q and %q", err, saved, run)
	}
}

// rewriteMeta edits the meta of the checkpoint at path.
func rewriteMeta(t *testing.T, path string, edit func(meta map[string]any)) {
	t.Helper()
	rewriteInfo(t, path, func(info map[string]any) { edit(info["meta"].(map[string]any)) })
}

// rewriteInfo edits the meta.json of the checkpoint at path.
func rewriteInfo(t *testing.T, path string, edit func(info map[string]any)) {
	t.Helper()
	file := filepath.Join(path, "meta.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	edit(info)
	if b, err = json.Marshal(info); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
