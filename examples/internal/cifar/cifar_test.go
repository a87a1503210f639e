package cifar

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/examples/internal/jsonlines"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// cifarMini is the committed CIFAR-10 fixture: 16 training and 8 test records in the
// official layout.
const cifarMini = "../../../testdata/cifar10-mini"

// tinyNet is a CIFAR classifier small enough for several runs per test: one conv-BN-ReLU
// stage (BatchNorm, so buffers take part), pooling and a linear classifier; 6 parameter
// tensors.
func tinyNet(_ string, ds models.Dataset, rng *rand.Rand) (nn.Module, error) {
	m := nn.NewSequential(
		nn.NewConv2d(ds.Channels, 8, 3, 1, 1, true, rng), nn.NewBatchNorm2d(8), nn.ReLU{}, nn.MaxPool2d{Kernel: 4},
		nn.AvgPool2d{Kernel: 8}, nn.Flatten{}, nn.NewLinear(8, ds.Classes, true, rng))
	nn.Parameters(m)
	return m, nil
}

func tinyConfig(t *testing.T) Config {
	return Config{Data: cifarMini, Model: "tiny", Workers: 2, Hook: "allreduce", Batch: 2, Epochs: 1, Steps: 1,
		Flags: train.Flags{LR: 0.01, Momentum: 0.9, WD: 5e-4}, EvalLimit: 8, NewModel: tinyNet}
}

// -hook omgs measures a profile on real batches before DDP starts and saves it to -profile; a
// second run reuses it; a run with another number of workers measures again.
func TestOMGSMeasuresAndReusesProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny.profile.json")
	cfg := tinyConfig(t)
	cfg.Hook, cfg.Profile = "omgs:density=0.01", path
	for i, want := range []string{"saved the profile to " + path, "using the profile in " + path} {
		var out, errb bytes.Buffer
		if _, err := Run(context.Background(), cfg, &out, &errb); err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, errb.String())
		}
		if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "profile: 6 parameters") {
			t.Fatalf("run %d: output lacks %q:\n%s", i+1, want, out.String())
		}
	}
	prof, err := profile.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	// The cost fits' values are ddp's tests' concern: on this tiny model's messages timing
	// noise can fit a zero slope.
	if prof.P != 2 || prof.Iterations != train.ProfileIterations || prof.Warmup != train.ProfileWarmup {
		t.Errorf("saved profile: P %d, %d+%d steps", prof.P, prof.Warmup, prof.Iterations)
	}
	cfg.Workers = 3
	var out bytes.Buffer
	if _, err := Run(context.Background(), cfg, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "measured on another model or number of workers: measuring again") {
		t.Errorf("3 workers with a 2-worker profile:\n%s", out.String())
	}
}

// OSP's LGP needs an optimizer that predicts its own step: -optim adam with -hook osp is
// refused with an error naming both flags and the ways out; with lgp=false it trains.
func TestOSPNeedsSGD(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Hook, cfg.Optim = "osp", "adam"
	var out bytes.Buffer
	_, err := Run(context.Background(), cfg, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "-optim adam with -hook osp") || !strings.Contains(err.Error(), "osp:lgp=false") {
		t.Fatalf("adam with osp: %v", err)
	}
	cfg.Hook = "osp:lgp=false"
	if _, err := Run(context.Background(), cfg, &out, &out); err != nil {
		t.Fatalf("adam with osp:lgp=false: %v\n%s", err, out.String())
	}
}

// dataRoot makes a $SPARGO_DATA root whose entry name links to the fixture dir, and sets
// $SPARGO_DATA to it for the test.
func dataRoot(t *testing.T, name, dir string) string {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.Symlink(abs, filepath.Join(root, name)); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SPARGO_DATA", root)
	return filepath.Join(root, name)
}

// Without -data the program finds CIFAR-10 with datasets.Find: $SPARGO_DATA/cifar10 here.
func TestRunFindsDataInSPARGODATA(t *testing.T) {
	want := dataRoot(t, "cifar10", cifarMini)
	cfg := tinyConfig(t)
	cfg.Data = ""
	var out bytes.Buffer
	if _, err := Run(context.Background(), cfg, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "data: "+want+"\n") {
		t.Fatalf("output does not name %s:\n%s", want, out.String())
	}
}

// Under -log-format json (the Printers Main hands a program) every line on stdout and stderr
// is a JSON object: the epoch and done lines carry their fields, progress (training and the
// evaluation's) comes as records, and the other lines as msg records.
func TestJSONLogFormat(t *testing.T) {
	c := tinyConfig(t)
	c.Steps, c.Progress = 2, true
	recs, err := jsonlines.Capture(func(stdout, stderr io.Writer) error {
		_, err := Run(context.Background(), c, stdout, stderr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	epochs := recs.Find("epoch")
	if len(epochs) != 1 {
		t.Fatalf("%d epoch records, want 1: %v", len(epochs), recs)
	}
	if miss := epochs[0].Missing("epoch", "steps", "train_loss", "train_acc", "test_loss", "test_acc", "img_s", "train_s", "total_s", "lr"); len(miss) > 0 || epochs[0]["steps"] != 2.0 {
		t.Errorf("epoch record lacks %v or has the wrong steps: %v", miss, epochs[0])
	}
	done := recs.Find("done")
	if len(done) != 1 || len(done[0].Missing("final_test_acc", "epochs", "config", "total_s")) > 0 {
		t.Errorf("done records %v", done)
	}
	if phases := recs.Phases(); !phases["train img"] || !phases["eval img"] {
		t.Errorf("progress records of phases %v, want train and eval in img", phases)
	}
	if recs.Completed("train") != 1 || recs.Completed("eval") != 1 {
		t.Errorf("progress of %d epochs and %d evaluations reached its total, want 1 and 1: %v", recs.Completed("train"), recs.Completed("eval"), recs.Find("progress"))
	}
}
