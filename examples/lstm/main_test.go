package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/plot"
	"github.com/spargo-dl/spargo/safetensors"
)

// runAsLSTMVar makes this test binary run the lstm program (see TestMain), so that a test
// can start it as processes under cluster.Launch.
const runAsLSTMVar = "SPARGO_TEST_RUN_AS_LSTM"

func TestMain(m *testing.M) {
	if os.Getenv(runAsLSTMVar) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Two processes under the launcher, one rank each, print on rank 0 the perplexities that 2
// in-process workers print with the same flags.
func TestMultiProcessMatchesInProcess(t *testing.T) {
	flags := []string{"-data", writeCorpus(t), "-batch", "4", "-bptt", "6", "-eval-batch", "2", "-epochs", "1", "-steps", "4",
		"-hook", "topka:density=0.05", "-progress=false"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SPARGO_") {
			env = append(env, kv)
		}
	}
	env = append(env, runAsLSTMVar+"=1")
	ref := exec.CommandContext(ctx, os.Args[0], append(flags, "-workers", "2")...)
	ref.Env = env
	refOut, err := ref.CombinedOutput()
	if err != nil {
		t.Fatalf("in-process run: %v\n%s", err, refOut)
	}
	var out, errb bytes.Buffer // Launch serialises the ranks' writes
	if err := cluster.Launch(ctx, cluster.LaunchConfig{NProc: 2, Program: os.Args[0], Args: flags, Env: env, Stdout: &out, Stderr: &errb, Grace: 5 * time.Second}); err != nil {
		t.Fatalf("2 processes: %v\n%s\n%s", err, out.String(), errb.String())
	}
	timing := regexp.MustCompile(` (words_s|train_s|total_s) [0-9.]+|, [0-9.]+ words/s, [0-9]+s total`)
	epochLine := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimPrefix(l, "[rank 0] "); strings.HasPrefix(l, "epoch 1 ") {
				return timing.ReplaceAllString(l, "")
			}
		}
		return ""
	}
	if want, got := epochLine(string(refOut)), epochLine(out.String()); want == "" || got != want {
		t.Fatalf("rank 0 of 2 processes: %q\n2 in-process workers: %q\n%s", got, want, out.String())
	}
}

// writeCorpus writes a small PTB-layout corpus: lines of a repeating word pattern (so a
// model can learn it), with a few rarer words.
func writeCorpus(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	words := []string{"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"}
	line := func(i int) string {
		var b strings.Builder
		for k := 0; k < 6+i%3; k++ {
			fmt.Fprintf(&b, " %s", words[(i+k)%len(words)])
		}
		return b.String() + " \n"
	}
	for f, lines := range map[string]int{"ptb.train.txt": 300, "ptb.valid.txt": 60, "ptb.test.txt": 60} {
		var b strings.Builder
		for i := 0; i < lines; i++ {
			b.WriteString(line(i))
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func smallConfig(dir string) LMConfig {
	c := defaults()
	c.Data, c.Batch, c.Bptt, c.EvalBatch, c.Epochs, c.Progress = dir, 4, 6, 2, 2, false
	c.LR, c.Clip = 10, 0.5
	return c
}

// Two epochs of the real program on a generated corpus with 2 in-process workers, dense and
// sparse: the validation perplexity falls, metrics and the summary are written.
func TestRunHooks(t *testing.T) {
	dir := writeCorpus(t)
	for _, hook := range []string{"allreduce", "topka:density=0.05"} {
		t.Run(hook, func(t *testing.T) {
			c := smallConfig(dir)
			c.Hook, c.Steps, c.Metrics, c.LogEvery = hook, 8, filepath.Join(t.TempDir(), "m.jsonl"), 4
			var out, errb bytes.Buffer
			sum, err := RunLM(context.Background(), c, &out, &errb)
			if err != nil {
				t.Fatalf("%v\n%s", err, errb.String())
			}
			if len(sum.Epochs) != 2 || sum.Epochs[0].Steps != 8 {
				t.Fatalf("summary %+v", sum)
			}
			e1, e2 := sum.Epochs[0], sum.Epochs[1]
			if !(e2.ValPPL < e1.ValPPL) || !(e2.ValPPL < 11) || sum.TestPPL <= 1 {
				t.Fatalf("validation perplexity %.3f then %.3f (vocabulary 11), test %.3f:\n%s", e1.ValPPL, e2.ValPPL, sum.TestPPL, out.String())
			}
			if !strings.Contains(out.String(), "epoch 2 train_loss") || !strings.Contains(out.String(), "done: small "+hook) {
				t.Fatalf("output:\n%s", out.String())
			}
			b, err := os.ReadFile(c.Metrics)
			if err != nil || strings.Count(string(b), "\n") != 7 || strings.Count(string(b), "\n{\"epoch\":") != 2 || strings.Count(string(b), "{\"step\":") != 4 || !strings.Contains(string(b), "\"summary\":true") {
				t.Fatalf("metrics file: %v\n%s", err, b)
			}
		})
	}
}

// -hook omgs plans its buckets from a profile measured on training windows before DDP
// starts, saved to -profile; a second run reuses it, and its buckets are the plan omgs makes
// from that profile for the model's parameters.
func TestOMGSMeasuresAndReusesProfile(t *testing.T) {
	dir := writeCorpus(t)
	c := smallConfig(dir)
	c.Hook, c.Epochs, c.Steps, c.Profile = "omgs:density=0.05", 1, 2, filepath.Join(t.TempDir(), "lstm.profile.json")
	var outs []string
	for i, want := range []string{"saved the profile to " + c.Profile, "using the profile in " + c.Profile} {
		var out, errb bytes.Buffer
		if _, err := RunLM(context.Background(), c, &out, &errb); err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, errb.String())
		}
		if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "profile: 11 parameters") {
			t.Fatalf("run %d: output lacks %q:\n%s", i+1, want, out.String())
		}
		outs = append(outs, out.String())
	}
	prof, err := profile.Load(c.Profile)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LMModelConfig(c.Model, 11)
	if err != nil {
		t.Fatal(err)
	}
	model, err := models.NewLSTMLM(cfg, nn.NewRand(c.Seed))
	if err != nil {
		t.Fatal(err)
	}
	if err := prof.Check(nn.Parameters(model)); err != nil || prof.P != c.Workers {
		t.Fatalf("saved profile (P=%d) does not fit the model: %v", prof.P, err)
	}
	h, err := hooks.Parse(c.Hook)
	if err != nil {
		t.Fatal(err)
	}
	h.(hooks.ProfiledPlanner).SetProfile(prof)
	plan, err := h.(ddp.Planner).Plan(nn.Parameters(model))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("in 11 tensors, %d buckets; hook %s", len(plan), c.Hook); !strings.Contains(outs[1], want) {
		t.Fatalf("the run with the saved profile does not train on its plan (%q):\n%s", want, outs[1])
	}

	// -task imdb measures its profile on review batches the same way.
	ic := imdbConfig(t)
	ic.Hook, ic.Epochs, ic.Steps, ic.Profile = "omgs:density=0.05", 1, 2, filepath.Join(t.TempDir(), "imdb.profile.json")
	var out, errb bytes.Buffer
	if _, err := RunIMDB(context.Background(), ic, &out, &errb); err != nil {
		t.Fatalf("-task imdb: %v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), "saved the profile to "+ic.Profile) || !strings.Contains(out.String(), "hook "+ic.Hook) {
		t.Fatalf("-task imdb output:\n%s", out.String())
	}
}

// -eval-every N validates every N steps (and at each epoch's end) on the first -eval-limit
// tokens, as step records that package plot reads as the validation perplexity curve; the
// epoch records carry the same epoch-end values.
func TestEvalEvery(t *testing.T) {
	c := smallConfig(writeCorpus(t))
	c.Steps, c.EvalEvery, c.EvalLimit, c.LogEvery, c.Metrics = 4, 2, 200, 4, filepath.Join(t.TempDir(), "m.jsonl")
	var out, errb bytes.Buffer
	sum, err := RunLM(context.Background(), c, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	run, err := plot.Read(c.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	var steps []float64
	val := map[float64]float64{}
	for _, p := range run.Steps {
		if v, ok := p.Values[plot.TestPPL]; ok {
			steps = append(steps, p.Step)
			val[p.Step] = v
		}
	}
	if !slices.Equal(steps, []float64{2, 4, 6, 8}) {
		t.Fatalf("validation step records at steps %v, want 2 4 6 8:\n%s", steps, out.String())
	}
	for i, e := range sum.Epochs {
		if at := float64(4 * (i + 1)); val[at] != e.ValPPL || !(e.ValPPL > 1) {
			t.Errorf("epoch %d: val_ppl %v, step record at step %v: %v", i+1, e.ValPPL, at, val[at])
		}
	}
	if !(val[8] < val[2]) {
		t.Errorf("validation perplexity %v at step 2, %v at step 8: no progress", val[2], val[8])
	}
	// The limit changes what is validated: a run without it has other values.
	c.EvalLimit, c.Metrics, c.LogEvery = 0, "", 0
	full, err := RunLM(context.Background(), c, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if full.Epochs[1].ValPPL == sum.Epochs[1].ValPPL || full.Epochs[1].TrainLoss != sum.Epochs[1].TrainLoss {
		t.Errorf("-eval-limit 200: val ppl %v, train loss %v; without: %v, %v", sum.Epochs[1].ValPPL, sum.Epochs[1].TrainLoss, full.Epochs[1].ValPPL, full.Epochs[1].TrainLoss)
	}
}

// A run stopped and resumed, at an epoch end or mid-epoch, ends with bit for bit the state of
// an uninterrupted run: parameters, optimizer, the hook's residuals, the dropout generators
// and each rank's carried LSTM hidden state are in the checkpoint (2 workers, topka, dropout).
func TestResumeIsExact(t *testing.T) {
	dir := writeCorpus(t)
	c := smallConfig(dir)
	c.Hook, c.Dropout, c.Steps, c.Keep = "topka:density=0.05", 0.3, 5, 0
	c.Checkpoint = t.TempDir()
	whole, err := RunLM(t.Context(), c, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	wholeEnd := latest(t, c.Checkpoint)

	// Epoch 1 with a checkpoint after step 3 (mid-epoch, the hidden state not zero) and at its
	// end (step 5); each is resumed in a directory of its own.
	c.Checkpoint, c.Epochs, c.CheckpointEvery = t.TempDir(), 1, 3
	if _, err := RunLM(t.Context(), c, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, ckpt string }{{"epoch end", "ckpt-0000000005"}, {"mid-epoch", "ckpt-0000000003"}} {
		t.Run(tc.name, func(t *testing.T) {
			rc := c
			rc.Checkpoint, rc.Epochs, rc.Resume = t.TempDir(), 2, true
			if err := os.CopyFS(filepath.Join(rc.Checkpoint, tc.ckpt), os.DirFS(filepath.Join(c.Checkpoint, tc.ckpt))); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(rc.Checkpoint, "latest"), []byte(tc.ckpt+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			resumed, err := RunLM(t.Context(), rc, &bytes.Buffer{}, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			sameCheckpoint(t, wholeEnd, latest(t, rc.Checkpoint))
			last := resumed.Epochs[len(resumed.Epochs)-1]
			if last.ValPPL != whole.Epochs[1].ValPPL || resumed.TestPPL != whole.TestPPL {
				t.Fatalf("resumed: %+v, uninterrupted: %+v", resumed.Epochs, whole.Epochs)
			}
			if tc.name == "mid-epoch" && resumed.Epochs[0].TrainLoss != whole.Epochs[0].TrainLoss {
				t.Fatalf("resumed epoch 1 train loss %v, uninterrupted %v", resumed.Epochs[0].TrainLoss, whole.Epochs[0].TrainLoss)
			}
		})
	}

	// A checkpoint of another batch size is refused, naming what differs. (Another world size
	// is accepted from an epoch's end: examples/internal/cifar's TestResumeOnFewerRanks…)
	for _, tc := range []struct {
		change func(*LMConfig)
		want   string
	}{
		{func(c *LMConfig) { c.Batch = 3 }, `batch "4", this run "3"`},
	} {
		rc := c
		rc.Resume = true
		tc.change(&rc)
		if _, err := RunLM(t.Context(), rc, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resume: %v, want an error mentioning %q", err, tc.want)
		}
	}
}

func latest(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "latest"))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, strings.TrimSpace(string(b)))
}

// sameCheckpoint compares two checkpoints tensor by tensor, bit for bit: the model (every
// parameter), the optimizer and every rank's file (hook residuals, DDP, generators, hidden
// state, totals).
func sameCheckpoint(t *testing.T, want, got string) {
	t.Helper()
	f, err := safetensors.ReadFile(filepath.Join(want, "rank-0.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(f.Names(), func(n string) bool { return strings.HasPrefix(n, "array/lstm_state.") }) {
		t.Fatalf("rank 0's file has no hidden state: %v", f.Names())
	}
	if err := checkpoint.Compare(want, got); err != nil {
		t.Fatal(err)
	}
}

// Each bad flag is an error naming it; those that need no data come before the data is looked
// for (noData does not exist: a search would say so, and nothing is downloaded), and -batch
// is checked against a rank's share once the data is loaded, before the first step.
func TestRunRejectsBadFlags(t *testing.T) {
	dir, imdb := writeCorpus(t), writeIMDB(t)
	noData := filepath.Join(t.TempDir(), "no-data-here")
	for _, tc := range []struct {
		change func(*LMConfig)
		want   string
	}{
		{func(c *LMConfig) { c.Bptt = 0 }, "-bptt 0: want at least 1"},
		{func(c *LMConfig) { c.Model = "huge" }, `-model "huge"`},
		{func(c *LMConfig) { c.Model, c.Data = "vgg99", noData }, `-model "vgg99"`},
		{func(c *LMConfig) { c.Clip = -1 }, "-clip -1"},
		{func(c *LMConfig) { c.Hook = "nosuch" }, `-hook "nosuch": hooks: unknown hook`},
		{func(c *LMConfig) { c.Data = t.TempDir() }, "ptb.train.txt"},
		{func(c *LMConfig) { c.Batch = 1000 }, "-batch 1000 is larger than a rank's share of the training data allows"},
		{func(c *LMConfig) { c.Batch = 100000 }, "-batch 100000 is larger than a rank's share"},
		{func(c *LMConfig) { c.Steps, c.Data = -1, noData }, "-steps -1: want 0 or more"},
		{func(c *LMConfig) { c.EvalLimit, c.Data = -5, noData }, "-eval-limit -5: want 0 or more"},
		{func(c *LMConfig) { c.Epochs, c.Data = 0, noData }, "-epochs 0: want at least 1"},
		{func(c *LMConfig) { c.Epochs, c.Data = -3, noData }, "-epochs -3: want at least 1"},
		{func(c *LMConfig) { c.EvalEvery = -1 }, "-eval-every -1"},
		{func(c *LMConfig) { c.Task, c.Model, c.Data = "imdb", "vgg99", noData }, `-task imdb: -model "vgg99": want lstm-imdb`},
		{func(c *LMConfig) { c.Task, c.Model, c.Steps, c.Data = "imdb", "lstm-imdb", -1, noData }, "-steps -1: want 0 or more"},
		{func(c *LMConfig) { c.Task, c.Model, c.Epochs, c.Data = "imdb", "lstm-imdb", 0, noData }, "-epochs 0: want at least 1"},
		{func(c *LMConfig) { c.Task, c.Model, c.Data, c.Batch = "imdb", "lstm-imdb", imdb, 25 },
			"-batch 25 is larger than a rank's share of the training data: 24 of"},
		{func(c *LMConfig) { c.Task, c.Model, c.Data, c.Batch = "imdb", "lstm-imdb", imdb, 100000 }, "-batch 100000 is larger than a rank's share"},
		{func(c *LMConfig) { c.Task, c.Model, c.EvalLimit = "imdb", "lstm-imdb", 100 }, "-eval-limit are -task lm's"},
		{func(c *LMConfig) { c.Task, c.Model = "imdb", "small" }, `-task imdb: -model "small": want lstm-imdb`},
		{func(c *LMConfig) { c.Task = "cls" }, `-task "cls"`},
	} {
		c := smallConfig(dir)
		tc.change(&c)
		err := run(context.Background(), c, nil, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want it to mention %q", err, tc.want)
		}
	}
}

// writeIMDB writes a small aclImdb layout whose positive reviews use other words than the
// negative ones.
func writeIMDB(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	pos := []string{"good", "great", "fine", "superb"}
	neg := []string{"bad", "awful", "poor", "dull"}
	for _, split := range []string{"train", "test"} {
		for label, words := range map[string][]string{"pos": pos, "neg": neg} {
			d := filepath.Join(dir, split, label)
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			rating := 9
			if label == "neg" {
				rating = 2
			}
			for i := 0; i < 24; i++ {
				text := fmt.Sprintf("the movie was %s and %s , it felt %s", words[i%4], words[(i+1)%4], words[(i+2)%4])
				if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("%d_%d.txt", i, rating)), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return dir
}

// imdbConfig is a -task imdb run on writeIMDB's reviews: 2 workers, 3 epochs, from the
// program's flags as -task imdb takes them.
func imdbConfig(t *testing.T) IMDBConfig {
	c := defaults()
	c.Task, c.Data, c.Epochs, c.MaxLen, c.Progress = "imdb", writeIMDB(t), 3, 12, false
	c.Model, c.Optim, c.Clip, c.Schedule = "lstm-imdb", "adam", 0, ""
	c.LR, c.Batch = 0.02, 8
	ic, err := c.imdb()
	if err != nil {
		t.Fatal(err)
	}
	return ic
}

// -task imdb: the LSTM-IMDB classifier learns a separable generated set with 2 workers.
func TestIMDBTask(t *testing.T) {
	c := imdbConfig(t)
	var out bytes.Buffer
	sum, err := RunIMDB(context.Background(), c, &out, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	last := sum.Epochs[len(sum.Epochs)-1]
	if last.TestAcc < 0.9 || !strings.Contains(out.String(), "test_acc") {
		t.Fatalf("test accuracy %.3f after %d epochs:\n%s", last.TestAcc, c.Epochs, out.String())
	}
}

// Without -data both tasks find their data with datasets.Find: $SPARGO_DATA/ptb and
// $SPARGO_DATA/aclImdb here (the committed fixtures, linked into a data root).
func TestRunFindsDataInSPARGODATA(t *testing.T) {
	root := t.TempDir()
	for name, fixture := range map[string]string{"ptb": "ptb-mini", "aclImdb": "aclImdb-mini"} {
		abs, err := filepath.Abs(filepath.Join("..", "..", "testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("SPARGO_DATA", root)
	c := smallConfig("")
	c.Epochs, c.Steps, c.NoEval = 1, 1, true
	var out bytes.Buffer
	if _, err := RunLM(context.Background(), c, &out, &out); err != nil || !strings.Contains(out.String(), filepath.Join(root, "ptb")) {
		t.Fatalf("-task lm: %v\n%s", err, out.String())
	}
	c.Task, c.Model, c.Optim, c.Schedule, c.Batch, c.MaxLen = "imdb", "lstm-imdb", "adam", "", 2, 12
	ic, err := c.imdb()
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if _, err := RunIMDB(context.Background(), ic, &out, &out); err != nil || !strings.Contains(out.String(), "data: "+filepath.Join(root, "aclImdb")) {
		t.Fatalf("-task imdb: %v\n%s", err, out.String())
	}
}
