package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/datasets"
)

// A few steps of the real program on the shared CIFAR copy: data, DDP with 2 workers,
// the hook, evaluation and metrics all run.
func TestRunFewSteps(t *testing.T) {
	dir, err := datasets.FindCIFAR10("")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI has ../shared/data beside the clone: %v", err)
		}
		t.Skipf("no CIFAR-10 copy on this machine: %v", err)
	}
	metrics := filepath.Join(t.TempDir(), "m.jsonl")
	var out, errb bytes.Buffer
	sum, err := run(context.Background(), config{Data: dir, Model: "vgg11", Workers: 2, Hook: "allreduce:algorithm=ring",
		Batch: 4, Epochs: 1, Steps: 2, LR: 0.01, Momentum: 0.9, WD: 5e-4, EvalLimit: 16, Metrics: metrics}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Epochs) != 1 || sum.Epochs[0].Steps != 2 {
		t.Fatalf("summary %+v", sum)
	}
	if !strings.Contains(out.String(), "epoch 1 train_loss") || !strings.Contains(out.String(), "done: vgg11") {
		t.Fatalf("output:\n%s", out.String())
	}
	b, err := os.ReadFile(metrics)
	if err != nil || strings.Count(string(b), "\n") != 2 {
		t.Fatalf("metrics file: %v\n%s", err, b)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	var out bytes.Buffer
	if _, err := run(context.Background(), config{Workers: 0, Batch: 1, Epochs: 1, Hook: "allreduce"}, &out, &out); err == nil {
		t.Fatal("workers=0 accepted")
	}
	if _, err := run(context.Background(), config{Workers: 1, Batch: 1, Epochs: 1, Hook: "nosuch"}, &out, &out); err == nil || !strings.Contains(err.Error(), "unknown hook") {
		t.Fatalf("bad hook: %v", err)
	}
}
