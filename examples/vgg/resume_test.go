package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/examples/internal/cifar"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// tinyVGG is a VGG-shaped network small enough for several runs per test: two conv-BN-ReLU-
// pool stages (BatchNorm, so buffers take part) and a linear classifier.
func tinyVGG(_ string, _ models.Dataset, rng *rand.Rand) (nn.Module, error) {
	m := nn.NewSequential(
		nn.NewConv2d(3, 8, 3, 1, 1, true, rng), nn.NewBatchNorm2d(8), nn.ReLU{}, nn.MaxPool2d{Kernel: 2},
		nn.NewConv2d(8, 16, 3, 1, 1, true, rng), nn.NewBatchNorm2d(16), nn.ReLU{}, nn.MaxPool2d{Kernel: 4},
		nn.AvgPool2d{Kernel: 4}, nn.Flatten{}, nn.NewLinear(16, 10, true, rng))
	nn.Parameters(m)
	return m, nil
}

// resumeConfig is a small run of the program with the tiny model: 2 in-process workers,
// batch 2 (4 batches in a rank's share of the fixture's 16 images), 3 steps per epoch,
// checkpoints into dir.
func resumeConfig(t *testing.T, hook, dir string) cifar.Config {
	return cifar.Config{Data: cifarMini, Model: "tiny", Workers: 2, Hook: hook, Batch: 2, Epochs: 2, Steps: 3,
		Flags: train.Flags{LR: 0.05, Momentum: 0.9, WD: 5e-4}, Seed: 3, EvalLimit: 16, DistBN: "broadcast", Checkpoint: dir, NewModel: tinyVGG}
}

func runQuiet(t *testing.T, c cifar.Config) *cifar.Summary {
	t.Helper()
	var out bytes.Buffer
	sum, err := cifar.Run(context.Background(), c, &out, &out)
	if err != nil {
		t.Fatalf("%s: %v\n%s", c.Hook, err, out.String())
	}
	return sum
}

// sameState requires two checkpoints to hold bit-identical state: the model, the optimizer
// and every rank's file (the hook's residuals, thresholds and counters, DDP's state).
func sameState(t *testing.T, what, a, b string) {
	t.Helper()
	if ranks, _ := filepath.Glob(filepath.Join(a, "rank-*.safetensors")); len(ranks) != 2 {
		t.Fatalf("%s: %s holds %d rank files, want 2", what, a, len(ranks))
	}
	if err := checkpoint.Compare(a, b); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// The Must-show: resume is exact. For allreduce and hooks with residual state
// (spardl, oktopk, covap, osp with its late results), training 2 epochs of 3 steps without
// a stop leaves exactly the state of a run stopped and resumed — at an epoch's end, and in
// the middle of an epoch (after step 2 of epoch 1, data position restored with the loader's
// EpochFrom) — down to the last bit of every parameter, buffer, momentum, hook residual and
// counter; the resumed run's metrics (appended to the same file) report the same training loss.
func TestResumeIsExact(t *testing.T) {
	for _, hook := range []string{"allreduce", "spardl:density=0.05,dense_warmup=1", "oktopk:density=0.05,tau=2,tau_prime=3",
		"covap:interval=2,init=0.5,ascend_steps=2", "osp:budget=0.5"} {
		t.Run(strings.SplitN(hook, ":", 2)[0], func(t *testing.T) {
			tmp := t.TempDir()
			straightDir := filepath.Join(tmp, "straight")
			c := resumeConfig(t, hook, straightDir)
			c.Metrics = filepath.Join(tmp, "straight.jsonl")
			straight := runQuiet(t, c)
			want, err := checkpoint.Latest(straightDir)
			if err != nil {
				t.Fatal(err)
			}

			// Stop after epoch 1, with a mid-epoch checkpoint after step 2.
			stopDir := filepath.Join(tmp, "stop")
			c = resumeConfig(t, hook, stopDir)
			c.Epochs, c.CheckpointEvery, c.Keep = 1, 2, 0
			c.Metrics = filepath.Join(tmp, "resumed.jsonl")
			runQuiet(t, c)
			names, err := checkpoint.List(stopDir)
			if err != nil || len(names) != 2 {
				t.Fatalf("checkpoints %v (%v), want one after step 2 and one after epoch 1", names, err)
			}

			// Resume at the epoch's end.
			c.Epochs, c.Resume = 2, true
			resumed := runQuiet(t, c)
			got, _ := checkpoint.Latest(stopDir)
			sameState(t, "resumed after epoch 1", want, got)
			if len(resumed.Epochs) != 1 || resumed.Epochs[0].Epoch != 2 || resumed.Epochs[0].TrainLoss != straight.Epochs[1].TrainLoss {
				t.Fatalf("resumed epochs %+v, uninterrupted %+v", resumed.Epochs, straight.Epochs)
			}
			checkMetricsAppended(t, c.Metrics)

			// Resume in the middle of epoch 1: latest as it was after step 2.
			midDir := filepath.Join(tmp, "mid")
			if err := os.MkdirAll(midDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(stopDir, names[0]), filepath.Join(midDir, names[0])); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(midDir, "latest"), []byte(names[0]+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, pos, err := checkpoint.ReadInfo(filepath.Join(midDir, names[0]))
			if err != nil || pos.Epoch != 0 || pos.Step != 2 {
				t.Fatalf("mid-epoch checkpoint at %+v (%v)", pos, err)
			}
			c = resumeConfig(t, hook, midDir)
			c.Resume = true
			mid := runQuiet(t, c)
			got, _ = checkpoint.Latest(midDir)
			sameState(t, "resumed after step 2 of epoch 1", want, got)
			if len(mid.Epochs) != 2 || mid.Epochs[0].TrainLoss != straight.Epochs[0].TrainLoss || mid.Epochs[1].TestAcc != straight.Epochs[1].TestAcc {
				t.Fatalf("resumed mid-epoch: epochs %+v, uninterrupted %+v", mid.Epochs, straight.Epochs)
			}
		})
	}
}

// checkMetricsAppended requires the -metrics file of a run resumed once to hold epoch 1, the
// first summary, epoch 2 and the second summary.
func checkMetricsAppended(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var kinds []string
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if m["summary"] == true {
			kinds = append(kinds, "summary")
		} else {
			kinds = append(kinds, "epoch "+strings.TrimSpace(string(mustJSON(m["epoch"]))))
		}
	}
	if strings.Join(kinds, ", ") != "epoch 1, summary, epoch 2, summary" {
		t.Fatalf("%s holds %v, want epoch 1, summary, epoch 2, summary", path, kinds)
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// Resuming with other flags or another hook is refused with an error naming what differs;
// -resume without a checkpoint is an error too. (Another number of workers is accepted from a
// checkpoint at an epoch's end: examples/internal/cifar's TestResumeOnFewerRanks…, and refused
// mid-epoch: TestResumeOnOtherRanksRefuses.)
func TestResumeRefusesOtherRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	c := resumeConfig(t, "topka:density=0.05", dir)
	c.Epochs = 1
	runQuiet(t, c)
	for _, tc := range []struct {
		change func(*cifar.Config)
		want   string
	}{
		{func(c *cifar.Config) { c.LR = 0.02 }, `lr "0.05", this run "0.02"`},
		{func(c *cifar.Config) { c.Hook = "spardl:density=0.05" }, fmt.Sprintf("hook %q, this run %q",
			(&train.Flags{}).CanonicalSpec("hook", "topka:density=0.05"), (&train.Flags{}).CanonicalSpec("hook", "spardl:density=0.05"))},
		{func(c *cifar.Config) { c.Checkpoint = filepath.Join(dir, "none") }, "no checkpoint in"},
	} {
		rc := resumeConfig(t, "topka:density=0.05", dir)
		rc.Resume = true
		tc.change(&rc)
		var out bytes.Buffer
		_, err := cifar.Run(context.Background(), rc, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
	// -resume or -checkpoint-every without -checkpoint is a flag error.
	bad := resumeConfig(t, "allreduce", "")
	bad.Resume = true
	if _, err := cifar.Run(context.Background(), bad, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "need -checkpoint DIR") {
		t.Errorf("-resume without -checkpoint: %v", err)
	}
}
