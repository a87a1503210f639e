package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/nn"
)

func TestDiffCommand(t *testing.T) {
	dir := t.TempDir()
	save := func(run string, w float32) {
		model := nn.NewSequential(nn.NewLinear(3, 2, true, nn.NewRand(0)))
		nn.Parameters(model)[0].Value.Data[4] = w
		if _, err := (checkpoint.Saver{Dir: filepath.Join(dir, run)}).Save(context.Background(), checkpoint.State{Model: model},
			checkpoint.Meta{Model: "linear"}, checkpoint.Position{Iteration: 7}); err != nil {
			t.Fatal(err)
		}
	}
	save("a", 1)
	save("b", 1)
	save("c", 1.5)
	at := func(run string) string { return filepath.Join(dir, run) }

	var out, errb bytes.Buffer
	if code := dispatch([]string{"diff", at("a"), at("b")}, &out, &errb); code != 0 || !strings.Contains(out.String(), "the checkpoints hold the same state") {
		t.Fatalf("same state: exit %d, %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := dispatch([]string{"diff", at("a"), at("c")}, &out, &errb); code != 1 ||
		out.String() != "model.safetensors: 0.weight: 1 of 6 elements differ (largest |a−b| 0.5, at element 4)\n" ||
		!strings.Contains(errb.String(), "the checkpoints differ in 1 place") {
		t.Fatalf("another weight: exit %d, %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := dispatch([]string{"diff", "-json", at("a"), at("c")}, &out, &errb); code != 1 {
		t.Fatalf("-json: exit %d", code)
	}
	var rows []map[string]string
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || len(rows) != 1 || rows[0]["tensor"] != "0.weight" || rows[0]["file"] != "model.safetensors" {
		t.Fatalf("-json: %v %q", err, out.String())
	}
	for _, args := range [][]string{{"diff", at("a")}, {"diff", at("a"), dir}} {
		errb.Reset()
		if code := dispatch(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), "spargo: diff: ") {
			t.Errorf("%v: exit %d, %q", args, code, errb.String())
		}
	}
}

// -digests prints each file's recorded SHA-256 on both sides; a corrupted file is reported as
// such, naming the tensor.
func TestDiffDigests(t *testing.T) {
	dir := t.TempDir()
	model := nn.NewSequential(nn.NewLinear(3, 2, true, nn.NewRand(0)))
	for _, run := range []string{"a", "b"} {
		if _, err := (checkpoint.Saver{Dir: filepath.Join(dir, run)}).Save(context.Background(), checkpoint.State{Model: model},
			checkpoint.Meta{Model: "linear"}, checkpoint.Position{Iteration: 7}); err != nil {
			t.Fatal(err)
		}
	}
	digests, err := checkpoint.Digests(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := dispatch([]string{"diff", "-digests", filepath.Join(dir, "a"), filepath.Join(dir, "b")}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %q %q", code, out.String(), errb.String())
	}
	want := "model.safetensors: sha256 " + digests["model.safetensors"].SHA256 + " " + digests["model.safetensors"].SHA256
	if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "rank-0.safetensors: sha256 ") {
		t.Fatalf("-digests printed %q, want a line %q", out.String(), want)
	}
	// Flip the last byte of the model file: the last tensor's data (0.weight, by name order).
	latest, _ := checkpoint.Latest(filepath.Join(dir, "b"))
	mf := filepath.Join(latest, "model.safetensors")
	b, _ := os.ReadFile(mf)
	b[len(b)-1] ^= 1
	os.WriteFile(mf, b, 0o644)
	out.Reset()
	if code := dispatch([]string{"diff", filepath.Join(dir, "a"), filepath.Join(dir, "b")}, &out, &errb); code != 1 ||
		!strings.Contains(out.String(), "model.safetensors: 0.weight: does not match the digest meta.json records (the second checkpoint is corrupt)") {
		t.Fatalf("corrupt second: exit %d, %q", code, out.String())
	}
}
