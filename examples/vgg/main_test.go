package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/examples/internal/cifar"
)

// runAsVGGVar makes this test binary run the vgg program (see TestMain), so that tests can
// start it as processes, alone or under cluster.Launch.
const runAsVGGVar = "SPARGO_TEST_RUN_AS_VGG"

func TestMain(m *testing.M) {
	if os.Getenv(runAsVGGVar) == "1" {
		runAsProgram() // main, with restart_test.go's test switches
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// cifarMini is the committed CIFAR-10 fixture: 16 training and 8 test records in the
// official layout, enough for a few steps of every test here.
const cifarMini = "../../testdata/cifar10-mini"

// A few steps of the real program on the CIFAR fixture: data, DDP with 2 workers,
// the hook, evaluation and metrics all run.
func TestRunFewSteps(t *testing.T) {
	dir := cifarMini
	metrics := filepath.Join(t.TempDir(), "m.jsonl")
	var out, errb bytes.Buffer
	c := defaults()
	c.Data, c.Hook, c.Batch, c.Epochs, c.Steps, c.EvalLimit, c.Metrics, c.Progress = dir, "allreduce:algorithm=ring", 4, 1, 2, 16, metrics, false
	sum, err := cifar.Run(context.Background(), c, &out, &errb)
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
	for _, tc := range []struct {
		change func(*cifar.Config)
		want   string
	}{
		{func(c *cifar.Config) { c.Workers = 0 }, "-workers 0: want at least 1"},
		{func(c *cifar.Config) { c.Epochs = 0 }, "-epochs 0: want at least 1"},
		{func(c *cifar.Config) { c.Epochs = -2 }, "-epochs -2: want at least 1"},
		{func(c *cifar.Config) { c.Batch = 0 }, "-batch 0: want at least 1"},
		{func(c *cifar.Config) { c.Steps = -1 }, "-steps -1: want 0"},
		{func(c *cifar.Config) { c.EvalLimit = -5 }, "-eval-limit -5: want 0"},
		{func(c *cifar.Config) { c.Model = "vgg99" }, `-model "vgg99": unknown VGG (have vgg11, vgg13, vgg16, vgg19)`},
		{func(c *cifar.Config) { c.Model = "resnet20" }, `-model "resnet20": unknown VGG`},
		{func(c *cifar.Config) { c.Hook = "nosuch" }, `-hook "nosuch": hooks: unknown hook`},
		{func(c *cifar.Config) { c.Hook = "gtopk"; c.Workers = 3 }, "-hook gtopk"},
		{func(c *cifar.Config) { c.Optim = "rmsprop" }, `-optim: optim: unknown optimizer "rmsprop"`},
		{func(c *cifar.Config) { c.Schedule = "multistep" }, "-schedule: optim: schedule multistep: option milestones: required"},
		{func(c *cifar.Config) { c.Plot = "run.png" }, "-plot run.png needs -metrics"},
	} {
		c := defaults()
		// Flag errors come before the data is looked for: no data here, and none downloaded.
		c.Data = filepath.Join(t.TempDir(), "no-data-here")
		tc.change(&c)
		if _, err := cifar.Run(context.Background(), c, &out, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
	if out.Len() != 0 {
		t.Errorf("a flag error printed (data looked for?):\n%s", out.String())
	}
}

// -batch larger than a rank's share of the training data is an error naming -batch, its
// value and the share, once the data is loaded and before the first step (it used to train
// 0 steps and print NaN); the largest batch that fits trains.
func TestRunRefusesBatchLargerThanShare(t *testing.T) {
	for _, batch := range []int{100000, 9} {
		c := defaults()
		c.Data, c.Batch, c.Epochs, c.Steps, c.EvalLimit, c.Progress = cifarMini, batch, 1, 1, 8, false
		var out bytes.Buffer
		_, err := cifar.Run(context.Background(), c, &out, &out)
		want := fmt.Sprintf("-batch %d is larger than a rank's share of the training data: 8 of", batch)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "16 images on each of 2 workers") {
			t.Errorf("-batch %d: %v, want an error containing %q", batch, err, want)
		}
		if strings.Contains(out.String(), "epoch 1") {
			t.Errorf("-batch %d trained:\n%s", batch, out.String())
		}
	}
}

// The program launched as 2 processes (one rank each, as under spargo launch or torchrun)
// trains exactly what 2 in-process workers train with the same flags: the same code runs on
// each rank and only the transport differs, so rank 0 prints the same losses and accuracies,
// and its -metrics hold the same float64 values bit for bit (and the same traffic); rank 1
// prints nothing, and both exit 0.
func TestMultiProcessMatchesInProcess(t *testing.T) {
	dir := cifarMini
	flags := []string{"-data", dir, "-model", "vgg11", "-hook", "allreduce:algorithm=ring", "-batch", "4", "-epochs", "1",
		"-steps", "2", "-eval-limit", "64", "-seed", "1", "-progress=false"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPARGO_") {
			env = append(env, kv)
		}
	}
	env = append(env, runAsVGGVar+"=1")

	tmp := t.TempDir()
	refMetrics, metrics := filepath.Join(tmp, "in-process.jsonl"), filepath.Join(tmp, "processes.jsonl")

	// In-process: the program with -workers 2.
	start := time.Now()
	ref := exec.CommandContext(ctx, os.Args[0], append(flags, "-workers", "2", "-metrics", refMetrics)...)
	ref.Env = env
	var refOut, refErr bytes.Buffer
	ref.Stdout, ref.Stderr = &refOut, &refErr
	if err := ref.Run(); err != nil {
		t.Fatalf("in-process run: %v\n%s%s", err, refOut.String(), refErr.String())
	}
	t.Logf("in-process run: %v", time.Since(start).Round(time.Millisecond))

	// Two processes, one rank each.
	start = time.Now()
	var mu sync.Mutex
	var out, errb bytes.Buffer
	err := cluster.Launch(ctx, cluster.LaunchConfig{NProc: 2, Program: os.Args[0], Args: append(flags, "-metrics", metrics), Env: env,
		Stdout: &lockedBuffer{mu: &mu, b: &out}, Stderr: &lockedBuffer{mu: &mu, b: &errb}, Grace: 5 * time.Second})
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		t.Fatalf("2 processes: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	t.Logf("2 processes: %v", time.Since(start).Round(time.Millisecond))
	if strings.Contains(out.String(), "[rank 1]") {
		t.Errorf("rank 1 printed on stdout:\n%s", out.String())
	}
	// Everything but times and speeds agrees.
	timing := regexp.MustCompile(` (img_s|train_s|total_s) [0-9.]+|, [0-9.]+ img/s, [0-9]+s total|GOMAXPROCS [0-9]+`)
	var want, got []string
	for _, l := range strings.Split(strings.TrimSpace(refOut.String()), "\n") {
		want = append(want, timing.ReplaceAllString(l, ""))
	}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		got = append(got, timing.ReplaceAllString(strings.TrimPrefix(l, "[rank 0] "), ""))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rank 0 of 2 processes printed\n%s\n\n2 in-process workers printed\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(out.String(), "[rank 0] epoch 1 train_loss") || !strings.Contains(out.String(), "[rank 0] done: vgg11") {
		t.Fatalf("stdout:\n%s", out.String())
	}
	for _, l := range got {
		if strings.HasPrefix(l, "epoch 1") {
			t.Logf("both: %s", l)
		}
	}
	wantRecs, gotRecs := readMetrics(t, refMetrics), readMetrics(t, metrics)
	if len(gotRecs) != len(wantRecs) {
		t.Fatalf("%d metrics records, in-process %d", len(gotRecs), len(wantRecs))
	}
	for i := range wantRecs {
		for _, k := range []string{"img_s", "train_s", "total_s", "launcher"} {
			delete(wantRecs[i], k)
			delete(gotRecs[i], k)
		}
		// The processes share this host, so they talk through shared memory, whose all-reduce
		// counts its messages and rounds its own way (comm's package doc); the bytes must match.
		for _, rec := range []map[string]any{gotRecs[i], wantRecs[i]} {
			if c, ok := rec["comm_rank0"].(map[string]any); ok {
				delete(c, "MsgsRecv")
				delete(c, "MsgsSent")
				delete(c, "Rounds")
			}
		}
		if !reflect.DeepEqual(gotRecs[i], wantRecs[i]) {
			t.Errorf("metrics record %d:\n2 processes %v\nin-process  %v", i, gotRecs[i], wantRecs[i])
		}
	}
}

// readMetrics reads a -metrics file; the summary's epochs and times are dropped, its
// configuration, data, kernels and traffic kept.
func readMetrics(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		d := json.NewDecoder(strings.NewReader(l))
		d.UseNumber() // exact decimal text of every float64
		if err := d.Decode(&m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		delete(m, "epochs")
		recs = append(recs, m)
	}
	return recs
}

type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
