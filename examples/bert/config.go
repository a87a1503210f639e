package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/optim"
	"github.com/spargo-dl/spargo/train"
)

// MLMConfig is a BERT masked-LM pre-training run: the flags of examples/bert. It is the
// "config" of the -metrics summary.
type MLMConfig struct {
	// Data is a text file or a directory of .txt files (one sentence per line, blank lines
	// between documents; see datasets.ReadDocuments). In a directory, files whose name
	// contains "valid" are the held-out text and files whose name contains "test" are left
	// out; without a validation file the last HoldOut of the sentences are held out.
	Data    string  `json:"data"`
	HoldOut float64 `json:"hold_out"`
	// Vocab is a vocab.txt to load; empty builds a WordPiece vocabulary of VocabSize tokens
	// from the training text. SaveVocab, when set, is where rank 0 writes the vocabulary in
	// use (vocab.txt format).
	Vocab     string `json:"vocab,omitempty"`
	VocabSize int    `json:"vocab_size"`
	SaveVocab string `json:"save_vocab,omitempty"`
	// Model is a BERT preset (models.BertPresets); its vocabulary size becomes the
	// tokenizer's.
	Model   string `json:"model"`
	Workers int    `json:"workers"`
	Hook    string `json:"hook"`
	Batch   int    `json:"batch"`
	// Steps is the run's length in optimizer steps; 0 runs Epochs passes over the training
	// sequences.
	Steps  int `json:"steps"`
	Epochs int `json:"epochs"`
	// Seq is the length of every sequence ([CLS] A [SEP] B [SEP] and padding);
	// MaxPredictions caps the masked positions per sequence (0: round(0.15 × Seq), 19 at 128).
	Seq            int `json:"seq"`
	MaxPredictions int `json:"max_predictions"`
	// Dropout is the model's hidden and attention-probability dropout (BERT's 0.1).
	Dropout float64 `json:"dropout"`
	// Flags are the shared training flags (-lr -optim -schedule -warmup -metrics -log-every
	// -plot; -momentum and -wd for -optim sgd).
	train.Flags
	Seed uint64 `json:"seed"`
	// EvalEvery evaluates on the held-out text every EvalEvery steps (it must divide the
	// run's steps); 0 evaluates at the end only. EvalLimit evaluates on the first EvalLimit
	// held-out sequences (0: all).
	EvalEvery int     `json:"eval_every"`
	EvalLimit int     `json:"eval_limit"`
	BucketMB  float64 `json:"bucket_mb"`
	Profile   string  `json:"profile,omitempty"`
	Progress  bool    `json:"-"`
	// Checkpoint, CheckpointEvery, Keep and Resume are as in examples/internal/cifar.Config.
	Checkpoint      string `json:"checkpoint,omitempty"`
	CheckpointEvery int    `json:"checkpoint_every,omitempty"`
	Keep            int    `json:"keep,omitempty"`
	Resume          bool   `json:"resume,omitempty"`
	LogLevel        string `json:"-"`
	LogFormat       string `json:"-"`
	// DumpBatches, when set, is a directory where rank 0 writes the initial parameters
	// (init.safetensors) and every rank r its first DumpSteps training batches (rank<r>.bin),
	// so that scripts/torch_bert_lockstep.py can train PyTorch on exactly the same inputs
	// from the same weights. A batch is little-endian int32s: input ids, token type ids,
	// attention mask and MLM labels (Batch × Seq each), then the Batch NSP labels.
	DumpBatches string `json:"dump_batches,omitempty"`
	DumpSteps   int    `json:"dump_steps,omitempty"`

	hook hooks.Config // -hook, parsed once by check
}

// Register defines the run's flags on fs; the struct's current values are the defaults.
func (c *MLMConfig) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.Data, "data", c.Data, "a text file or a directory of .txt files, one sentence per line, blank lines between documents "+
		"(a directory's *valid*.txt is the held-out text, *test*.txt is left out); default: PTB, found in $SPARGO_DATA/ptb or the user cache, or downloaded (see docs/data.md)")
	fs.Float64Var(&c.HoldOut, "hold-out", c.HoldOut, "without a *valid*.txt file, hold out this fraction of the sentences (the last ones) for evaluation")
	fs.StringVar(&c.Vocab, "vocab", c.Vocab, "WordPiece vocabulary to load (vocab.txt, one token a line); empty: build one from the training text")
	fs.IntVar(&c.VocabSize, "vocab-size", c.VocabSize, "tokens of the vocabulary built from the training text (without -vocab)")
	fs.StringVar(&c.SaveVocab, "save-vocab", c.SaveVocab, "write the vocabulary in use to this file (vocab.txt format), e.g. for scripts/torch_bert_mlm.py")
	fs.StringVar(&c.Model, "model", c.Model, "BERT size: "+strings.Join(models.BertPresets(), "|"))
	fs.IntVar(&c.Workers, "workers", c.Workers, "data-parallel workers (in-process ranks); under a launcher leave it out, or give 1 or the world size")
	fs.StringVar(&c.Hook, "hook", c.Hook, "comm hook spec, e.g. allreduce, spardl:density=0.01 (see `spargo hooks`)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "sequences per worker per step")
	fs.IntVar(&c.Steps, "steps", c.Steps, "optimizer steps to train (0: -epochs passes over the training sequences)")
	fs.IntVar(&c.Epochs, "epochs", c.Epochs, "passes over the training sequences, when -steps is 0")
	fs.IntVar(&c.Seq, "seq", c.Seq, "sequence length in tokens ([CLS] A [SEP] B [SEP] and padding)")
	fs.IntVar(&c.MaxPredictions, "max-predictions", c.MaxPredictions, "most masked positions per sequence (0: round(0.15 × seq), 19 at 128; BERT's recipe has 20)")
	fs.Float64Var(&c.Dropout, "dropout", c.Dropout, "hidden and attention-probability dropout of the model (BERT's 0.1)")
	c.Flags.Register(fs)
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed for initialisation, sequence pairs, masking, shuffling and dropout")
	fs.IntVar(&c.EvalEvery, "eval-every", c.EvalEvery, "evaluate on the held-out text every N steps (N must divide the run's steps; 0: at the end only)")
	fs.IntVar(&c.EvalLimit, "eval-limit", c.EvalLimit, "evaluate on the first N held-out sequences (0: all)")
	fs.Float64Var(&c.BucketMB, "bucket-mb", c.BucketMB, "DDP bucket cap in MiB (0: ddp's defaults)")
	fs.StringVar(&c.Profile, "profile", c.Profile, "for hooks that plan from measured costs (omgs): reuse the profile in this file when it fits, else measure and save it here")
	fs.StringVar(&c.Checkpoint, "checkpoint", c.Checkpoint, "save checkpoints into this directory after every evaluation round (and every -checkpoint-every steps)")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "also save a checkpoint every N steps")
	fs.IntVar(&c.Keep, "keep", c.Keep, "keep the newest N checkpoints (0: all)")
	fs.BoolVar(&c.Resume, "resume", c.Resume, "continue from the latest checkpoint in -checkpoint DIR exactly where it stopped (the same flags are required)")
	fs.BoolVar(&c.Progress, "progress", c.Progress, "show a progress bar (launched: on rank 0, when its stderr is a terminal)")
	fs.StringVar(&c.LogLevel, "log-level", cmp.Or(c.LogLevel, "info"), "log level of the hooks' messages on stderr: debug|info|warn|error")
	fs.StringVar(&c.LogFormat, "log-format", cmp.Or(c.LogFormat, "text"), "text|json")
	fs.StringVar(&c.DumpBatches, "dump-batches", c.DumpBatches, "write the initial parameters and the first -dump-steps training batches of every rank into this directory "+
		"(for scripts/torch_bert_lockstep.py)")
	fs.IntVar(&c.DumpSteps, "dump-steps", c.DumpSteps, "steps whose batches -dump-batches writes")
}

// MLMMain is the main function of examples/bert (see Main): it registers c's flags (c holds
// the defaults), parses the command line and trains.
func MLMMain(name string, c MLMConfig) {
	c.Register(flag.CommandLine)
	train.Main(train.Program{Name: name, Flags: &c.Flags, LogLevel: &c.LogLevel, LogFormat: &c.LogFormat, Workers: &c.Workers,
		InProcess: func(ctx context.Context, stdout, stderr io.Writer) error {
			_, err := RunMLM(ctx, c, stdout, stderr)
			return err
		},
		Process: func(ctx context.Context, env cluster.Env, stdout, stderr io.Writer) error {
			_, err := RunMLMProcess(ctx, c, env, stdout, stderr)
			return err
		}})
}

// check refuses bad flags before any data is looked for: the model's name first, then the
// numbers and the specs (-hook parsed once into c.hook, -optim and -schedule into c.Flags).
func (c *MLMConfig) check() error {
	if _, err := models.BertPreset(c.Model); err != nil {
		return fmt.Errorf("-model: %w", err)
	}
	if err := train.AtLeast(1, train.Int("-workers", c.Workers), train.Int("-batch", c.Batch)); err != nil {
		return err
	}
	if err := train.AtLeast(0, train.Int("-steps", c.Steps)); err != nil { // 0: train -epochs epochs
		return err
	}
	switch {
	case c.Steps == 0 && c.Epochs < 1:
		return fmt.Errorf("-epochs %d with -steps 0: want at least 1 epoch (or give -steps)", c.Epochs)
	case c.Seq < 5:
		return fmt.Errorf("-seq %d: want at least 5 tokens ([CLS] A [SEP] B [SEP])", c.Seq)
	case c.MaxPredictions < 0 || c.EvalEvery < 0 || c.EvalLimit < 0:
		return fmt.Errorf("-max-predictions %d, -eval-every %d, -eval-limit %d: want 0 or more", c.MaxPredictions, c.EvalEvery, c.EvalLimit)
	case !(c.HoldOut > 0 && c.HoldOut < 1):
		return fmt.Errorf("-hold-out %v: want a fraction in (0, 1)", c.HoldOut)
	case c.Vocab == "" && c.VocabSize < len(datasets.SpecialTokens)+1:
		return fmt.Errorf("-vocab-size %d: too small for a vocabulary", c.VocabSize)
	case c.CheckpointEvery < 0 || c.Keep < 0:
		return fmt.Errorf("-checkpoint-every %d, -keep %d: want 0 or more", c.CheckpointEvery, c.Keep)
	case (c.Resume || c.CheckpointEvery > 0) && c.Checkpoint == "":
		return errors.New("-resume and -checkpoint-every need -checkpoint DIR")
	case c.BucketMB < 0:
		return fmt.Errorf("-bucket-mb %g: want a positive size in MiB, or 0 for the defaults", c.BucketMB)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return fmt.Errorf("-dropout %v: want a probability in [0, 1)", c.Dropout)
	case c.DumpSteps < 0 || c.DumpSteps > 0 && c.DumpBatches == "":
		return fmt.Errorf("-dump-steps %d: want 0 or more, with -dump-batches DIR", c.DumpSteps)
	}
	var err error
	c.hook, err = c.Flags.CheckWithHook(c.Hook, c.Workers)
	return err
}

// runLength returns the run's steps and its evaluation rounds' length: the Loop's "epochs"
// are rounds of EvalEvery steps (one round of all the steps without -eval-every), and the
// data's epochs run on underneath them.
func (c MLMConfig) runLength(batchesPerEpoch int) (steps, round int, err error) {
	steps = c.Steps
	if steps == 0 {
		steps = c.Epochs * batchesPerEpoch
	}
	round = steps
	if c.EvalEvery > 0 && c.EvalEvery < steps {
		if steps%c.EvalEvery != 0 {
			return 0, 0, fmt.Errorf("-eval-every %d does not divide the run's %d steps", c.EvalEvery, steps)
		}
		round = c.EvalEvery
	}
	return steps, round, nil
}

// newSchedule is the run's schedule over rounds rounds of round steps on world ranks: the
// parsed -schedule (train.Flags), with BERT's warm-up over the first 10 % of the steps added
// to a plain "linear" (an explicit warmup or warmup_steps option, or -warmup, wins). It
// returns the schedule's canonical spec too.
func (c *MLMConfig) newSchedule(steps, rounds, round, world int) (optim.Schedule, string, error) {
	sc, err := c.ScheduleConfig()
	if err != nil {
		return nil, "", err
	}
	if sc.Name() != "linear" || sc.Given("warmup") || sc.Given("warmup_steps") {
		s, err := c.NewSchedule(rounds, round, world)
		return s, sc.String(), err
	}
	if sc, err = sc.With("warmup_steps", strconv.Itoa(steps/10)); err != nil {
		return nil, "", fmt.Errorf("-schedule: %w", err)
	}
	s, err := sc.New(c.LR, rounds, round)
	if err != nil {
		return nil, "", fmt.Errorf("-schedule: %w", err)
	}
	return s, sc.String(), nil
}

// checkpointMeta describes the run for checkpoints: resuming requires the same model, hook,
// world size, vocabulary size, round length and the flags that change the trajectory.
func (c MLMConfig) checkpointMeta(world, vocab, round int) checkpoint.Meta {
	cfg := c.Flags.MetaConfig()
	for k, v := range map[string]string{"batch": strconv.Itoa(c.Batch), "steps": strconv.Itoa(c.Steps), "epochs": strconv.Itoa(c.Epochs),
		"seq": strconv.Itoa(c.Seq), "dropout": strconv.FormatFloat(c.Dropout, 'g', -1, 64), "max_predictions": strconv.Itoa(c.MaxPredictions), "seed": strconv.FormatUint(c.Seed, 10),
		"bucket_mb": strconv.FormatFloat(c.BucketMB, 'g', -1, 64), "vocab": strconv.Itoa(vocab), "round": strconv.Itoa(round), "hold_out": strconv.FormatFloat(c.HoldOut, 'g', -1, 64)} {
		cfg[k] = v
	}
	return checkpoint.Meta{Model: "bert-" + c.Model, Hook: c.hook.String(), World: world, Config: cfg, Canonical: c.Flags.CanonicalSpec}
}

// findCorpus returns -data's text (checked to hold a text file or .txt files), or without
// -data PTB's files found by datasets.Find ($SPARGO_DATA/ptb, the user cache, a download).
func (c *MLMConfig) findCorpus(ctx context.Context, progress io.Writer) (string, error) {
	set := datasets.PTBSet
	if c.Data != "" {
		set = datasets.TextCorpus("corpus")
	}
	return datasets.Find(ctx, set, c.Data, progress)
}
