package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

// writeCorpus writes a small corpus directory in PTB's layout (train.txt and valid.txt,
// one sentence a line) from a few sentence templates, so that masked words are predictable
// from their context.
func writeCorpus(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	subjects := []string{"the cat", "a dog", "the old man", "my sister", "the bank", "a small company"}
	verbs := []string{"sees", "buys", "likes", "sells", "finds"}
	objects := []string{"the red house", "a new car", "three apples", "the stock", "some shares"}
	var train, valid strings.Builder
	for i := range 400 {
		s := fmt.Sprintf("%s %s %s .\n", subjects[i%len(subjects)], verbs[(i/2)%len(verbs)], objects[(i/3)%len(objects)])
		if i%10 == 9 {
			valid.WriteString(s)
		} else {
			train.WriteString(s)
		}
	}
	for name, text := range map[string]string{"corpus.train.txt": train.String(), "corpus.valid.txt": valid.String(), "corpus.test.txt": "never read\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// smallConfig is the program's defaults on the small corpus: BERT-tiny with a vocabulary of
// 60 tokens, 2 workers of 4 sequences of 24 tokens.
func smallConfig(data string) MLMConfig {
	c := defaults()
	c.Data, c.VocabSize, c.Batch, c.Seq, c.Steps, c.LR, c.Progress = data, 60, 4, 24, 40, 5e-3, false
	return c
}

func run(t *testing.T, c MLMConfig) (*MLMSummary, string) {
	t.Helper()
	var out bytes.Buffer
	sum, err := RunMLM(context.Background(), c, &out, &out)
	if err != nil {
		t.Fatalf("%s: %v\n%s", c.Hook, err, out.String())
	}
	return sum, out.String()
}

// The program end to end on 2 in-process workers, with the dense hook and a sparse one: the
// corpus's *valid* file is held out and its *test* file left out, the vocabulary is built
// and saved, masked-LM + NSP trains with the loss going down, and -metrics holds step
// records, the evaluation rounds and the summary.
func TestTrainFewSteps(t *testing.T) {
	data := writeCorpus(t)
	for _, hook := range []string{"allreduce", "spardl", "omgs:density=0.05"} {
		t.Run(hook, func(t *testing.T) {
			tmp := t.TempDir()
			c := smallConfig(data)
			c.Hook, c.EvalEvery, c.LogEvery = hook, 20, 5
			c.Metrics, c.SaveVocab = filepath.Join(tmp, "m.jsonl"), filepath.Join(tmp, "vocab.txt")
			sum, out := run(t, c)
			if !strings.Contains(out, "corpus.valid.txt") || strings.Contains(out, "corpus.test.txt") || !strings.Contains(out, "built from the training text") {
				t.Errorf("output does not describe the corpus as expected:\n%s", out)
			}
			vocab, err := datasets.LoadVocab(c.SaveVocab)
			if err != nil || vocab.Size() != sum.Vocab {
				t.Fatalf("saved vocabulary: %v (%d tokens, run %d)", err, vocab.Size(), sum.Vocab)
			}
			if len(sum.Rounds) != 2 || sum.Rounds[1].AtStep != 40 {
				t.Fatalf("rounds %+v, want evaluations after steps 20 and 40", sum.Rounds)
			}
			chance := math.Log(float64(sum.Vocab))
			var steps, rounds, summaries int
			var losses []float64
			f, err := os.Open(c.Metrics)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for sc := bufio.NewScanner(f); sc.Scan(); {
				var m map[string]any
				if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
					t.Fatal(err)
				}
				switch {
				case m["summary"] == true:
					summaries++
				case m["step"] != nil:
					steps++
					losses = append(losses, m["loss"].(float64))
				case m["val_loss"] != nil:
					rounds++
				}
			}
			if steps != 8 || rounds != 2 || summaries != 1 {
				t.Fatalf("metrics: %d step records, %d rounds, %d summaries; want 8, 2, 1", steps, rounds, summaries)
			}
			// BERT first learns the token frequencies (from ln V down to their entropy): the
			// training loss of the last 5 steps is well below the first 5's, and the held-out
			// loss below the untrained model's ln V.
			last := sum.Rounds[1]
			t.Logf("%s: ln V %.3f; training loss every 5 steps %.3f; held-out loss %.3f, accuracy %.3f", hook, chance, losses, last.ValLoss, last.ValAcc)
			if !(losses[len(losses)-1] < losses[0]-0.2) || !(last.ValLoss < chance-0.1) {
				t.Errorf("%s: the loss did not go down: ln V %.3f, training loss %.3f, held-out loss %.3f", hook, chance, losses, last.ValLoss)
			}
		})
	}
}

// Resume is exact: a run saved after step 2 (in the middle of the first round of 3 steps)
// and after step 3 (a round's end) and resumed from either ends with the state of the run
// that did not stop, bit for bit (model, optimizer, every rank's hook residuals and DDP
// state), with the dense hook and with a sparse hook that keeps residuals.
func TestResumeIsExact(t *testing.T) {
	data := writeCorpus(t)
	for _, hook := range []string{"allreduce", "spardl:density=0.05"} {
		t.Run(strings.SplitN(hook, ":", 2)[0], func(t *testing.T) {
			tmp := t.TempDir()
			straightDir := filepath.Join(tmp, "straight")
			c := smallConfig(data)
			c.Hook, c.Steps, c.EvalEvery, c.EvalLimit, c.Checkpoint, c.CheckpointEvery, c.Keep = hook, 6, 3, 6, straightDir, 2, 0
			straight, _ := run(t, c)
			names, err := checkpoint.List(straightDir)
			if err != nil || len(names) != 4 {
				t.Fatalf("checkpoints %v (%v), want steps 2, 3, 4 and 6", names, err)
			}
			want := filepath.Join(straightDir, names[len(names)-1])
			for _, at := range []int{1, 0} { // after step 2 (mid-round), after step 3 (round end)
				dir := filepath.Join(tmp, fmt.Sprintf("from-%d", at))
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.CopyFS(filepath.Join(dir, names[at]), os.DirFS(filepath.Join(straightDir, names[at]))); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "latest"), []byte(names[at]+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				rc := c
				rc.Checkpoint, rc.Resume = dir, true
				resumed, _ := run(t, rc)
				got, err := checkpoint.Latest(dir)
				if err != nil {
					t.Fatal(err)
				}
				if err := checkpoint.Compare(want, got); err != nil {
					t.Fatalf("resumed from %s: %v", names[at], err)
				}
				if r := resumed.Rounds[len(resumed.Rounds)-1]; r != straight.Rounds[1] && r.ValLoss != straight.Rounds[1].ValLoss {
					t.Errorf("resumed from %s: last round %+v, uninterrupted %+v", names[at], r, straight.Rounds[1])
				}
			}
		})
	}
}

// Bad flags are errors that name them; those that need no data come before the data is
// looked for (noData does not exist: a search would say so).
func TestFlagErrors(t *testing.T) {
	data := writeCorpus(t)
	noData := filepath.Join(t.TempDir(), "no-data-here")
	for _, tc := range []struct {
		change func(*MLMConfig)
		want   string
	}{
		{func(c *MLMConfig) { c.EvalEvery = 7 }, "-eval-every 7 does not divide the run's 40 steps"},
		{func(c *MLMConfig) { c.Model = "huge" }, `unknown BERT preset "huge"`},
		{func(c *MLMConfig) { c.Data = filepath.Join(data, "none") }, "-data"},
		{func(c *MLMConfig) { c.Seq = 3 }, "-seq 3"},
		{func(c *MLMConfig) { c.Vocab = filepath.Join(data, "missing.txt") }, "-vocab"},
		{func(c *MLMConfig) { c.Batch = 1000 }, "-batch 1000 × 2 workers: the training text has only"},
		{func(c *MLMConfig) { c.Batch = 100000 }, "-batch 100000 × 2 workers: the training text has only"},
		{func(c *MLMConfig) { c.Model, c.Data = "vgg99", noData }, `-model: models: unknown BERT preset "vgg99"`},
		{func(c *MLMConfig) { c.Steps, c.Data = -1, noData }, "-steps -1"},
		{func(c *MLMConfig) { c.Steps, c.Epochs, c.Data = 0, 0, noData }, "-epochs 0 with -steps 0"},
		{func(c *MLMConfig) { c.Steps, c.Epochs, c.Data = 0, -1, noData }, "-epochs -1 with -steps 0"},
		{func(c *MLMConfig) { c.EvalLimit, c.Data = -5, noData }, "-eval-limit -5"},
		{func(c *MLMConfig) { c.Hook, c.Data = "nosuch", noData }, `-hook "nosuch": hooks: unknown hook`},
		{func(c *MLMConfig) { c.Dropout = 1 }, "-dropout 1"},
		{func(c *MLMConfig) { c.DumpSteps = 5 }, "-dump-steps 5"},
	} {
		c := smallConfig(data)
		tc.change(&c)
		var out bytes.Buffer
		if _, err := RunMLM(context.Background(), c, &out, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
}

// -dump-batches writes the initial parameters (those of a fresh model from the seed) and
// each rank's first -dump-steps batches, exactly the loader's, for
// scripts/torch_bert_lockstep.py; -dropout reaches the model (0 and 0.1 train differently).
func TestDumpBatches(t *testing.T) {
	data := writeCorpus(t)
	dir := t.TempDir()
	c := smallConfig(data)
	c.Steps, c.Dropout, c.DumpBatches, c.DumpSteps, c.Seed = 4, 0, dir, 3, 7
	sum, _ := run(t, c)

	st, err := safetensors.ReadFile(filepath.Join(dir, "init.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	corpus, err := LoadMLMCorpus(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := models.BertPreset(c.Model)
	cfg.VocabSize = corpus.Tokenizer.Vocab().Size()
	fresh, err := models.NewBertForPreTraining(cfg, nn.NewRand(c.Seed))
	if err != nil {
		t.Fatal(err)
	}
	params := nn.Parameters(fresh)
	if len(st.Tensors) != len(params) || st.Metadata["batch"] != "4" || st.Metadata["seq"] != "24" {
		t.Fatalf("init.safetensors: %d tensors (model %d), metadata %v", len(st.Tensors), len(params), st.Metadata)
	}
	for _, p := range params {
		v, err := st.Float32(p.Name)
		if err != nil || !slices.Equal(v, p.Value.Data) {
			t.Fatalf("init.safetensors: %s differs from a fresh model of seed %d (%v)", p.Name, c.Seed, err)
		}
	}

	L, B := c.Seq, c.Batch
	for rank := range c.Workers {
		raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d.bin", rank)))
		if err != nil {
			t.Fatal(err)
		}
		per := 4 * (4*B*L + B)
		if len(raw) != c.DumpSteps*per {
			t.Fatalf("rank %d: %d bytes, want %d steps of %d", rank, len(raw), c.DumpSteps, per)
		}
		ld, err := datasets.NewMLMLoader(corpus.Train, datasets.MLMLoaderOptions{Batch: B, Rank: rank, World: c.Workers, Shuffle: true, DropLast: true})
		if err != nil {
			t.Fatal(err)
		}
		step := 0
		for b, err := range ld.Epoch(context.Background(), 0) {
			if err != nil {
				t.Fatal(err)
			}
			if step == c.DumpSteps {
				break
			}
			var want []byte
			for _, a := range [][]int32{b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.Labels, b.NextSentence} {
				for _, v := range a {
					want = binary.LittleEndian.AppendUint32(want, uint32(v))
				}
			}
			if !bytes.Equal(raw[step*per:(step+1)*per], want) {
				t.Fatalf("rank %d, step %d: the dumped batch is not the loader's", rank, step)
			}
			step++
		}
	}

	c.DumpBatches, c.DumpSteps, c.Dropout = "", 0, 0.1
	again, _ := run(t, c)
	if again.Rounds[0].TrainLoss == sum.Rounds[0].TrainLoss {
		t.Errorf("-dropout 0 and 0.1 trained to the same loss %v: the flag does not reach the model", sum.Rounds[0].TrainLoss)
	}
}

// Without -data the corpus is PTB, found with datasets.Find: $SPARGO_DATA/ptb here (the
// committed fixture linked into a data root).
func TestRunFindsPTBInSPARGODATA(t *testing.T) {
	abs, err := filepath.Abs(filepath.Join("..", "..", "testdata", "ptb-mini"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.Symlink(abs, filepath.Join(root, "ptb")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SPARGO_DATA", root)
	c := smallConfig("")
	c.Batch, c.Steps, c.VocabSize = 1, 1, 200
	sum, _ := run(t, c)
	if !strings.Contains(sum.Corpus, filepath.Join(root, "ptb", "ptb.train.txt")) {
		t.Fatalf("corpus %q is not $SPARGO_DATA/ptb's", sum.Corpus)
	}
}
