package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// runAsResNetVar makes this test binary run the resnet program (see TestMain), so that the
// tests run it with real command lines.
const runAsResNetVar = "SPARGO_TEST_RUN_AS_RESNET"

func TestMain(m *testing.M) {
	if os.Getenv(runAsResNetVar) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// program runs the resnet program with args and returns its output and error.
func program(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runAsResNetVar+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// cifarMini is the committed CIFAR-10 fixture: 16 training and 8 test records.
const cifarMini = "../../testdata/cifar10-mini"

// Two steps of the program on the CIFAR fixture: 2 workers, the default cosine schedule,
// step records every step and the -plot PNG, with the default model, ResNet-20.
func TestRunTwoSteps(t *testing.T) {
	tmp := t.TempDir()
	metrics, img := filepath.Join(tmp, "run.jsonl"), filepath.Join(tmp, "run.png")
	out, err := program(t, "-data", cifarMini, "-model", "resnet20", "-batch", "4", "-epochs", "1", "-steps", "2", "-eval-limit", "16",
		"-progress=false", "-metrics", metrics, "-log-every", "1", "-plot", img)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "epoch 1 train_loss") || !strings.Contains(out, "done: resnet20 allreduce, 2 workers × batch 4") {
		t.Fatalf("output:\n%s", out)
	}
	b, err := os.ReadFile(metrics)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 4 {
		t.Fatalf("metrics: %d lines, want 2 step records, an epoch and the summary:\n%s", len(lines), b)
	}
	var steps []map[string]any
	for _, l := range lines[:2] {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, m)
	}
	// cosine over 2 steps from lr 0.1: 0.1 at step 1, 0.05 at step 2.
	if steps[0]["step"] != 1.0 || steps[1]["step"] != 2.0 || steps[0]["lr"] != 0.1 || math.Abs(steps[1]["lr"].(float64)-0.05) > 1e-12 || steps[0]["loss"] == nil {
		t.Errorf("step records %v", steps)
	}
	var sum struct {
		Config map[string]any `json:"config"`
	}
	if err := json.Unmarshal([]byte(lines[3]), &sum); err != nil || sum.Config["schedule"] != "cosine" || sum.Config["lr"] != 0.1 || sum.Config["wd"] != 1e-4 {
		t.Errorf("summary config %v (%v)", sum.Config, err)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatalf("-plot: %v", err)
	}
	defer f.Close()
	if _, err := png.DecodeConfig(f); err != nil {
		t.Errorf("-plot wrote no PNG: %v", err)
	}
}

// Flag errors name the flag and exit 2; -optim help lists the optimizers and schedules.
func TestFlagErrors(t *testing.T) {
	out, err := program(t, "-plot", "x.png")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(out, "resnet: -plot x.png needs -metrics") {
		t.Errorf("-plot without -metrics: %v\n%s", err, out)
	}
	out, err = program(t, "-optim", "help")
	if err != nil || !strings.Contains(out, "adamw") || !strings.Contains(out, "multistep") {
		t.Errorf("-optim help: %v\n%s", err, out)
	}
	if _, err := newModel("nosuch", models.CIFAR10, nn.NewRand(0)); err == nil || !strings.Contains(err.Error(), `unknown model "nosuch"`) {
		t.Errorf("unknown model: %v", err)
	}
	// Bad values are errors naming the flag, before the data is looked for (noData does not
	// exist, and nothing is downloaded); -batch is checked once the data is loaded.
	noData := filepath.Join(t.TempDir(), "no-data-here")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-model", "vgg99", "-data", noData}, `resnet: -model "vgg99": models: unknown model "vgg99"`},
		{[]string{"-model", "resnet18", "-data", noData}, `resnet: -model "resnet18"`},
		{[]string{"-steps", "-1", "-data", noData}, "resnet: -steps -1: want 0 or more"},
		{[]string{"-eval-limit", "-5", "-data", noData}, "resnet: -eval-limit -5: want 0 or more"},
		{[]string{"-epochs", "0", "-data", noData}, "resnet: -epochs 0: want at least 1"},
		{[]string{"-batch", "100000", "-data", cifarMini}, "resnet: -batch 100000 is larger than a rank's share of the training data: 8 of"},
	} {
		out, err := program(t, tc.args...)
		if err == nil || !strings.Contains(out, tc.want) || strings.Contains(out, "epoch 1") || strings.Contains(out, "NaN") {
			t.Errorf("%v: %v, want an error containing %q:\n%s", tc.args, err, tc.want, out)
		}
	}
}

// The program builds its models through the catalogue: every CIFAR ResNet (and the VGGs)
// for CIFAR-10, the CIFAR-100 variant for CIFAR-100, and a clear error for ImageNet models.
func TestNewModelFromCatalogue(t *testing.T) {
	for _, name := range append(models.CIFARResNetNames()[:2], "vgg11") {
		m, err := newModel(name, models.CIFAR10, nn.NewRand(0))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, _ := models.New(name, nn.NewRand(0))
		if got, w := nn.NumParams(nn.Parameters(m)), nn.NumParams(nn.Parameters(want)); got != w {
			t.Errorf("%s: %d parameters, the catalogue's has %d", name, got, w)
		}
	}
	m, err := newModel("resnet20", models.CIFAR100, nn.NewRand(0))
	if err != nil || nn.NumParams(nn.Parameters(m)) != 275572 {
		t.Errorf("resnet20 for CIFAR-100: %v", err)
	}
	if _, err := newModel("resnet18", models.CIFAR10, nn.NewRand(0)); err == nil || !strings.Contains(err.Error(), "imagenet") {
		t.Errorf("resnet18 on CIFAR-10: %v", err)
	}
	if d := defaults(); d.Model != "resnet20" || d.NewModel == nil {
		t.Errorf("defaults: %+v", d)
	}
}

// -channels-last trains the same network: the two runs' step losses agree to
// float32 rounding (amplified by one SGD step), and the summary records the layout.
func TestChannelsLastRun(t *testing.T) {
	losses := func(extra ...string) ([]float64, map[string]any) {
		metrics := filepath.Join(t.TempDir(), "run.jsonl")
		args := append([]string{"-data", cifarMini, "-model", "resnet20", "-workers", "1", "-batch", "8", "-epochs", "1", "-steps", "2",
			"-eval-limit", "8", "-progress=false", "-metrics", metrics, "-log-every", "1"}, extra...)
		if out, err := program(t, args...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		b, err := os.ReadFile(metrics)
		if err != nil {
			t.Fatal(err)
		}
		var ls []float64
		var config map[string]any
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatal(err)
			}
			if loss, ok := m["loss"].(float64); ok && m["step"] != nil {
				ls = append(ls, loss)
			}
			if c, ok := m["config"].(map[string]any); ok {
				config = c
			}
		}
		return ls, config
	}
	want, _ := losses()
	got, config := losses("-channels-last")
	if len(got) != 2 || len(want) != 2 {
		t.Fatalf("step losses %v and %v, want two each", got, want)
	}
	// Step 1's loss is the same forward pass; step 2's follows an SGD step
	// (lr 0.1) from gradients that differ by the BatchNorm sums' rounding.
	for i, tol := range []float64{1e-5, 2e-3} {
		if math.Abs(got[i]-want[i]) > tol*math.Abs(want[i]) {
			t.Errorf("step %d: loss %v channels-last, %v NCHW", i+1, got[i], want[i])
		}
	}
	if config["channels_last"] != true {
		t.Errorf("summary config %v: no channels_last", config)
	}
}
