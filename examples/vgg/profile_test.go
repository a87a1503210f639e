package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/ddp"
)

// -hook omgs measures a profile on real batches before DDP starts and saves it to -profile; a
// second run reuses it; a run with another number of workers measures again.
func TestRunOMGSMeasuresAndReusesProfile(t *testing.T) {
	dir := cifarOrSkip(t)
	path := filepath.Join(t.TempDir(), "vgg11.profile.json")
	cfg := config{Data: dir, Model: "vgg11", Workers: 2, Hook: "omgs:density=0.01", Batch: 2, Epochs: 1, Steps: 1,
		LR: 0.01, Momentum: 0.9, WD: 5e-4, EvalLimit: 8, Profile: path}
	for i, want := range []string{"saved the profile to " + path, "using the profile in " + path} {
		var out, errb bytes.Buffer
		if _, err := run(context.Background(), cfg, &out, &errb); err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, errb.String())
		}
		if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "profile: 34 parameters") {
			t.Fatalf("run %d: output lacks %q:\n%s", i+1, want, out.String())
		}
	}
	prof, err := ddp.LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if prof.P != 2 || prof.Iterations != profileIterations || prof.Warmup != profileWarmup || prof.TopK.Gamma <= 0 || prof.AllGather.Beta <= 0 {
		t.Errorf("saved profile: P %d, %d+%d steps, γ %v, β %v", prof.P, prof.Warmup, prof.Iterations, prof.TopK.Gamma, prof.AllGather.Beta)
	}
	cfg.Workers = 3
	var out bytes.Buffer
	if _, err := run(context.Background(), cfg, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "measured on another model or number of workers: measuring again") {
		t.Errorf("3 workers with a 2-worker profile:\n%s", out.String())
	}
}
