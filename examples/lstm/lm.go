package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"iter"
	"math"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
	"github.com/spargo-dl/spargo/safetensors"
	"github.com/spargo-dl/spargo/train"
)

// LMConfig is a word-level language-model run on PTB (examples/lstm): the LSTM language
// model trained with truncated back-propagation through time over bptt windows, each rank
// on its own contiguous slice of the training stream laid out in Batch columns, the
// gradients clipped to -clip after synchronisation, validation perplexity every epoch. It is
// the "config" of the -metrics summary.
type LMConfig struct {
	// Task is "lm" (PTB language model) or "imdb" (the LSTM-IMDB classifier on the aclImdb
	// folders: RunIMDB with its own IMDBConfig, see imdb.go).
	Task    string `json:"task"`
	Data    string `json:"data"`
	Model   string `json:"model"`
	Workers int    `json:"workers"`
	Hook    string `json:"hook"`
	// Batch is the number of columns (parallel streams) per worker; Bptt the window length.
	Batch  int `json:"batch"`
	Bptt   int `json:"bptt"`
	Epochs int `json:"epochs"`
	Steps  int `json:"steps"`
	// Flags are the shared training flags (-lr -momentum -wd -optim -schedule -warmup
	// -metrics -log-every -plot).
	train.Flags
	// Dropout overrides the model's dropout probability when ≥ 0.
	Dropout float64 `json:"dropout"`
	// Clip is the maximum total gradient norm (0: no clipping).
	Clip float64 `json:"clip"`
	// EvalBatch is the number of columns of the validation and test streams per rank.
	EvalBatch int `json:"eval_batch"`
	// SaveInit, when set, is a safetensors file rank 0 writes the initial weights to
	// (PyTorch's names), so that scripts/torch_lstm_ptb.py --init starts from the same model.
	SaveInit string `json:"save_init,omitempty"`
	// NoEval skips the per-epoch validation and the final test (throughput runs).
	NoEval bool `json:"no_eval,omitempty"`
	// MaxLen is the -task imdb review length (longer reviews cut, shorter padded).
	MaxLen int `json:"max_len,omitempty"`
	// EvalEvery > 0 also computes the validation perplexity every EvalEvery steps within an
	// epoch (-task lm), written to -metrics as step records (val_loss, val_ppl), so that
	// short runs have several points on their curves.
	EvalEvery int `json:"eval_every,omitempty"`
	// EvalLimit > 0 computes every validation perplexity (mid-epoch and at epoch ends, -task
	// lm) on the first EvalLimit tokens of the validation stream only; the test perplexity
	// stays on the whole test stream.
	EvalLimit int     `json:"eval_limit,omitempty"`
	Seed      uint64  `json:"seed"`
	BucketMB  float64 `json:"bucket_mb"`
	// Profile is the file a hook that plans from measured costs (omgs) reuses its profile
	// from, or saves it to (as examples/internal/cifar.Config.Profile).
	Profile  string `json:"profile,omitempty"`
	Progress bool   `json:"-"`
	// Checkpoint is the checkpoint directory; CheckpointEvery saves every N steps besides
	// each epoch's end; Keep keeps the newest Keep; Resume continues from the latest.
	Checkpoint      string `json:"checkpoint,omitempty"`
	CheckpointEvery int    `json:"checkpoint_every,omitempty"`
	Keep            int    `json:"keep,omitempty"`
	Resume          bool   `json:"resume,omitempty"`
	LogLevel        string `json:"-"`
	LogFormat       string `json:"-"`

	hook hooks.Config // -hook, parsed once by check
}

// Register defines the run's flags on fs; the struct's current values are the defaults.
func (c *LMConfig) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.Task, "task", cmp.Or(c.Task, "lm"), "lm: the PTB language model; imdb: SparDL's LSTM-IMDB classifier on the aclImdb folders (its defaults: -model lstm-imdb -optim adam -lr 0.001 -batch 32 -clip 0 -schedule constant, unless given)")
	fs.IntVar(&c.MaxLen, "max-len", c.MaxLen, "-task imdb: tokens per review (longer cut, shorter padded; 0: 500)")
	fs.StringVar(&c.Data, "data", c.Data, "the data set's directory: PTB's ptb.train.txt, ptb.valid.txt, ptb.test.txt (-task lm) or the aclImdb folders (-task imdb) (default: $SPARGO_DATA/ptb or $SPARGO_DATA/aclImdb, then the user cache; downloaded if neither has it; see docs/data.md)")
	fs.StringVar(&c.Model, "model", c.Model, "small|medium|ptb: Zaremba et al.'s 200- and 650-unit 2-layer LSTMs, or SparDL's 1500-unit one (catalogue names lstm-ptb-small… work too)")
	fs.IntVar(&c.Workers, "workers", c.Workers, "data-parallel workers (in-process ranks); under a launcher leave it out, or give 1 or the world size")
	fs.StringVar(&c.Hook, "hook", c.Hook, "comm hook spec, e.g. allreduce:algorithm=ring (see `spargo hooks`)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "columns (parallel streams) per worker: a step trains on batch × bptt words per worker")
	fs.IntVar(&c.Bptt, "bptt", c.Bptt, "bptt window length (time steps per step; the hidden state carries over, detached)")
	fs.IntVar(&c.Epochs, "epochs", c.Epochs, "epochs")
	fs.IntVar(&c.Steps, "steps", c.Steps, "stop each epoch after this many steps (0: whole epoch)")
	c.Flags.Register(fs)
	fs.Float64Var(&c.Dropout, "dropout", c.Dropout, "dropout probability on the embeddings, between the LSTM layers and on its output; negative: the -model's (small 0, medium 0.5, ptb 0.65)")
	fs.Float64Var(&c.Clip, "clip", c.Clip, "clip the total gradient norm to this after synchronisation (0: no clipping)")
	fs.IntVar(&c.EvalBatch, "eval-batch", c.EvalBatch, "columns per rank of the validation and test streams")
	fs.StringVar(&c.SaveInit, "save-init", c.SaveInit, "-task lm: write the initial weights to this safetensors file (PyTorch names; scripts/torch_lstm_ptb.py --init starts from them)")
	fs.BoolVar(&c.NoEval, "no-eval", c.NoEval, "-task lm: skip the validation and test perplexities (throughput runs)")
	fs.IntVar(&c.EvalEvery, "eval-every", c.EvalEvery, "-task lm: also compute the validation perplexity every N steps within an epoch (metrics step records with val_ppl; 0: only at epoch ends)")
	fs.IntVar(&c.EvalLimit, "eval-limit", c.EvalLimit, "-task lm: compute the validation perplexities on the first N tokens of the validation stream only (0: all of it; the test perplexity uses all)")
	fs.StringVar(&c.Profile, "profile", c.Profile, "for hooks that plan from measured costs (omgs): reuse the profile saved in this file when it fits the model and -workers, else measure it and save it here")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed for initialisation and dropout")
	fs.Float64Var(&c.BucketMB, "bucket-mb", c.BucketMB, "DDP bucket cap in MiB (0: ddp's defaults)")
	fs.StringVar(&c.Checkpoint, "checkpoint", c.Checkpoint, "save checkpoints into this directory at the end of every epoch (and every -checkpoint-every steps)")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "also save a checkpoint every N steps (0: only at epoch ends); each rank's carried hidden state is saved with it, so a resume mid-epoch is exact")
	fs.IntVar(&c.Keep, "keep", c.Keep, "keep the newest N checkpoints (0: all)")
	fs.BoolVar(&c.Resume, "resume", c.Resume, "continue from the latest checkpoint in -checkpoint DIR (the same flags are required; -epochs may grow)")
	fs.BoolVar(&c.Progress, "progress", c.Progress, "show a progress bar per epoch (launched: on rank 0, when its stderr is a terminal)")
	fs.StringVar(&c.LogLevel, "log-level", cmp.Or(c.LogLevel, "info"), "log level of the hooks' messages on stderr: debug|info|warn|error")
	fs.StringVar(&c.LogFormat, "log-format", cmp.Or(c.LogFormat, "text"), "text|json")
}

// LMMain is the main function of the lstm program: it registers c's flags on
// flag.CommandLine (c holds the defaults), parses the command line and trains -task lm (the
// PTB language model, RunLM) or -task imdb (the IMDB classifier, RunIMDB), in-process with
// -workers ranks or one rank per process under a launcher (train.Main).
func LMMain(name string, c LMConfig) {
	c.Register(flag.CommandLine)
	train.Main(train.Program{Name: name, Flags: &c.Flags, LogLevel: &c.LogLevel, LogFormat: &c.LogFormat, Workers: &c.Workers,
		AfterParse: c.imdbDefaults,
		InProcess: func(ctx context.Context, stdout, stderr io.Writer) error {
			return run(ctx, c, nil, stdout, stderr)
		},
		Process: func(ctx context.Context, env cluster.Env, stdout, stderr io.Writer) error {
			return run(ctx, c, &env, stdout, stderr)
		}})
}

// run trains the -task c names: in-process, or this process's rank of a launched job (env).
func run(ctx context.Context, c LMConfig, env *cluster.Env, stdout, stderr io.Writer) error {
	if c.Task == "imdb" {
		ic, err := c.imdb()
		if err != nil {
			return err
		}
		if env != nil {
			_, err = RunIMDBProcess(ctx, ic, *env, stdout, stderr)
		} else {
			_, err = RunIMDB(ctx, ic, stdout, stderr)
		}
		return err
	}
	var err error
	if env != nil {
		_, err = RunLMProcess(ctx, c, *env, stdout, stderr)
	} else {
		_, err = RunLM(ctx, c, stdout, stderr)
	}
	return err
}

// LMEpoch is an epoch record of -metrics.
type LMEpoch struct {
	Epoch     int     `json:"epoch"`
	Steps     int     `json:"steps"`
	TrainLoss float64 `json:"train_loss"`
	TrainPPL  float64 `json:"train_ppl"`
	ValLoss   float64 `json:"val_loss"`
	ValPPL    float64 `json:"val_ppl"`
	TestPPL   float64 `json:"test_ppl,omitempty"` // after the last epoch
	// -task imdb: accuracies (train_loss and val_loss are then the train and test losses).
	TrainAcc float64 `json:"train_acc,omitempty"`
	TestAcc  float64 `json:"test_acc,omitempty"`
	WordsSec float64 `json:"words_s"` // training words per second, all ranks
	TrainSec float64 `json:"train_s"`
	TotalSec float64 `json:"total_s"`
	LR       float64 `json:"lr"`
}

// LMEvalRecord is a -metrics step record of a validation perplexity (-eval-every): written
// every EvalEvery steps and, with -eval-every, at each epoch's end too, so that the step
// records alone draw the whole validation curve (package plot takes a value from the step
// records when they have it).
type LMEvalRecord struct {
	Step          int64   `json:"step"` // optimizer steps done in the run
	ValLoss       float64 `json:"val_loss"`
	ValPPL        float64 `json:"val_ppl"`
	TotalSec      float64 `json:"total_s"`
	StepsPerEpoch int     `json:"steps_per_epoch"`
}

// LMSummary is a run's result, and the last line of -metrics.
type LMSummary struct {
	Config    LMConfig       `json:"config"`
	Dataset   string         `json:"dataset"`
	Kernels   string         `json:"kernels"`
	Params    int            `json:"params"`
	Epochs    []LMEpoch      `json:"epochs"`
	FinalPPL  float64        `json:"final_val_ppl,omitempty"`
	TestPPL   float64        `json:"test_ppl"`
	TotalSec  float64        `json:"total_s"`
	Summary   bool           `json:"summary"`
	CommStats comm.Stats     `json:"comm_rank0"`
	Launcher  cluster.Source `json:"launcher,omitempty"`
}

// LMModelConfig returns the language model -model names for a vocabulary of vocab words:
// small, medium or ptb (SparDL's), or a catalogue name (lstm-ptb-small, …).
func LMModelConfig(name string, vocab int) (models.LSTMLMConfig, error) {
	key := strings.ToLower(name)
	switch key {
	case "small", "medium":
		key = "ptb-" + key
	case "seeds", "large":
		key = "ptb"
	}
	cfg, err := models.LSTMLMPreset(key)
	if err != nil {
		return cfg, fmt.Errorf("-model %q: want small, medium or ptb (%w)", name, err)
	}
	cfg.Vocab = vocab
	return cfg, nil
}

// check refuses bad flags before any data is looked for: the model's name first, then the
// numbers and the specs (-hook parsed once into c.hook, -optim and -schedule into c.Flags).
func (c *LMConfig) check() error {
	switch c.Task {
	case "", "lm":
		c.Task = "lm"
	default:
		return fmt.Errorf("-task %q: RunLM trains -task lm (want lm, or imdb through RunIMDB)", c.Task)
	}
	if _, err := LMModelConfig(c.Model, 1); err != nil {
		return err
	}
	if err := train.AtLeast(1, train.Int("-workers", c.Workers), train.Int("-batch", c.Batch), train.Int("-bptt", c.Bptt), train.Int("-epochs", c.Epochs),
		train.Int("-eval-batch", c.EvalBatch)); err != nil {
		return err
	}
	if err := train.AtLeast(0, train.Int("-steps", c.Steps), train.Int("-eval-limit", c.EvalLimit), train.Int("-eval-every", c.EvalEvery),
		train.Int("-checkpoint-every", c.CheckpointEvery), train.Int("-keep", c.Keep)); err != nil {
		return err
	}
	if !(c.Clip >= 0) || c.BucketMB < 0 {
		return fmt.Errorf("-clip %v, -bucket-mb %v: want 0 or more", c.Clip, c.BucketMB)
	}
	if (c.Resume || c.CheckpointEvery > 0) && c.Checkpoint == "" {
		return fmt.Errorf("-resume and -checkpoint-every need -checkpoint DIR")
	}
	if !(c.Dropout < 1) {
		return fmt.Errorf("-dropout %v: want a probability below 1 (negative: the model's)", c.Dropout)
	}
	var err error
	c.hook, err = c.Flags.CheckWithHook(c.Hook, c.Workers)
	return err
}

// loadPTB finds (datasets.Find) and reads the corpus and describes it on stdout. A rank's
// share of the training stream must fill -batch columns of at least two tokens (an input
// and its target).
func (c *LMConfig) loadPTB(ctx context.Context, stdout, stderr io.Writer) (*datasets.PTB, error) {
	dir, err := datasets.Find(ctx, datasets.PTBSet, c.Data, stderr)
	if err != nil {
		return nil, err
	}
	p, err := datasets.LoadPTB(dir)
	if err != nil {
		return nil, err
	}
	if share := len(p.Train) / c.Workers; share/c.Batch < 2 {
		return nil, fmt.Errorf("-batch %d is larger than a rank's share of the training data allows: %d of %s's %d training tokens on each of %d workers, "+
			"and each of the -batch columns needs at least 2 tokens", c.Batch, share, dir, len(p.Train), c.Workers)
	}
	fmt.Fprintln(stdout, "data:", p.Summary())
	return p, nil
}

// RunLM trains with c.Workers in-process ranks, each on its own goroutine.
func RunLM(ctx context.Context, c LMConfig, stdout, stderr io.Writer) (*LMSummary, error) {
	return c.startup().InProcess(ctx, stdout, stderr)
}

// RunLMProcess trains this process's rank of a multi-process job (env from cluster.DetectEnv,
// c.Workers its world size), like one of RunLM's workers; rank 0 prints and writes -metrics.
func RunLMProcess(ctx context.Context, c LMConfig, env cluster.Env, stdout, stderr io.Writer) (*LMSummary, error) {
	return c.startup().Process(ctx, env, stdout, stderr)
}

// startup is RunLM's and RunLMProcess's start-up on c (train.Startup): the flag check,
// loadPTB and trainLMRanks.
func (c *LMConfig) startup() train.Startup[LMConfig, *datasets.PTB, *LMSummary] {
	return train.Startup[LMConfig, *datasets.PTB, *LMSummary]{Config: c, Workers: &c.Workers, Progress: &c.Progress, Resume: &c.Resume,
		Checkpoint: &c.Checkpoint, Check: c.check, Load: c.loadPTB, Train: trainLMRanks}
}

func trainLMRanks(ctx context.Context, c LMConfig, groups []comm.Group, data *datasets.PTB, stdout, stderr io.Writer, launcher cluster.Source) (*LMSummary, error) {
	sum := &LMSummary{Config: c, Dataset: data.Summary(), Kernels: kernels.Impl(), Summary: true, Launcher: launcher}
	start := time.Now()
	err := train.Job{Groups: groups, Flags: &c.Flags, Resume: c.Resume, Stdout: stdout, Start: start}.Run(ctx,
		func(ctx context.Context, g comm.Group, metrics *train.MetricsLog) error {
			w := &lmWorker{cfg: c, group: g, corpus: data, stdout: stdout, stderr: stderr, metrics: metrics, sum: sum, start: start}
			return w.run(ctx)
		},
		func(totalSec float64) any {
			sum.TotalSec = totalSec
			if len(sum.Epochs) == 0 {
				fmt.Fprintf(stdout, "done: nothing left to train: the checkpoint in %s is at the end of epoch %d\n", c.Checkpoint, c.Epochs)
				return nil
			}
			last := sum.Epochs[len(sum.Epochs)-1]
			sum.FinalPPL = last.ValPPL
			ppl := fmt.Sprintf("valid ppl %.2f, test ppl %.2f", last.ValPPL, sum.TestPPL)
			if c.NoEval {
				ppl = "not evaluated (-no-eval)"
			}
			_ = train.Print(stdout, "done", sum, fmt.Sprintf("done: %s %s, %d workers × batch %d × bptt %d, %d epochs: %s, %.0f words/s, %.0fs total",
				c.Model, c.Hook, c.Workers, c.Batch, c.Bptt, c.Epochs, ppl, last.WordsSec, sum.TotalSec))
			return sum
		})
	if err != nil {
		return nil, err
	}
	return sum, nil
}

// lmWindow is one training step's batch: a bptt window of this rank's columns.
type lmWindow struct {
	x, y  []int32 // [steps, cols] row-major
	steps int
}

// lmWorker is one rank of a language-model run.
type lmWorker struct {
	cfg     LMConfig
	group   comm.Group
	corpus  *datasets.PTB
	stdout  io.Writer
	stderr  io.Writer
	metrics *train.MetricsLog // rank 0's, with -metrics
	sum     *LMSummary
	start   time.Time

	model *models.LSTMLM
	dp    *ddp.DDP
	tape  *nn.Tape
	xs    []float32 // ids as the model's float input, reused
	ys    []int     // targets, reused
}

// tagLMEval is the all-reduce tag of the perplexity sums.
const tagLMEval = 104

func (w *lmWorker) run(ctx context.Context) error {
	c, g := w.cfg, w.group
	rank, world := g.Rank(), g.Size()
	mcfg, err := LMModelConfig(c.Model, w.corpus.Vocab.Size())
	if err != nil {
		return err
	}
	if c.Dropout >= 0 {
		mcfg.Dropout = c.Dropout
	}
	model, err := models.NewLSTMLM(mcfg, nn.NewRand(c.Seed))
	if err != nil {
		return err
	}
	shard, err := datasets.ShardTokens(w.corpus.Train, rank, world)
	if err != nil {
		return fmt.Errorf("training data: %w", err)
	}
	data, err := datasets.Batchify(shard, c.Batch)
	if err != nil {
		return fmt.Errorf("training data (rank %d of %d, %d tokens): %w", rank, world, len(shard), err)
	}
	rep, err := train.Setup{Hook: c.hook, Flags: &c.Flags, BucketMB: c.BucketMB, Profile: c.Profile, Stdout: w.stdout,
		ProfileStep: func() (profile.Step, func(), error) { return w.profileStep(model, data), func() {}, nil },
		Agree:       c.agreement(world, w.corpus)}.New(ctx, g, model)
	if err != nil {
		return err
	}
	dp, opt := rep.DDP, rep.Optimizer
	steps := data.Windows(c.Bptt)
	if c.Steps > 0 && c.Steps < steps {
		steps = c.Steps
	}
	sched, err := c.NewSchedule(c.Epochs, steps, world)
	if err != nil {
		return err
	}
	if c.SaveInit != "" && rank == 0 {
		f := safetensors.New()
		f.Metadata["format"] = "pt"
		for _, p := range dp.Parameters() {
			f.Tensors[p.Name] = safetensors.FromFloat32(p.Value.Data, p.Value.Shape...)
		}
		if err := f.WriteFile(c.SaveInit); err != nil {
			return fmt.Errorf("-save-init: %w", err)
		}
	}
	w.model, w.dp, w.tape = model, dp, nn.NewTape()
	w.xs, w.ys = make([]float32, c.Bptt*max(c.Batch, c.EvalBatch)), make([]int, c.Bptt*max(c.Batch, c.EvalBatch))
	trainState := model.NewState(c.Batch)
	if rank == 0 {
		w.sum.Params = nn.NumParams(dp.Parameters())
		fmt.Fprintf(w.stdout, "model %s: %d parameters in %d tensors, %d buckets; hook %s; %d workers × batch %d × bptt %d (%d steps per epoch); kernels %s, GOMAXPROCS %d\n",
			c.Model, w.sum.Params, len(dp.Parameters()), len(dp.Plan()), c.Hook, world, c.Batch, c.Bptt, steps, kernels.Impl(), runtime.GOMAXPROCS(0))
	}
	loop := &train.Loop[lmWindow]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Schedule: sched, Epochs: c.Epochs, StepsPerEpoch: steps,
		Batches: func(ctx context.Context, epoch, first int) iter.Seq2[lmWindow, error] {
			return func(yield func(lmWindow, error) bool) {
				// Each epoch starts from the zero state; a mid-epoch resume continues from
				// the state the checkpoint holds (restored into trainState by Resume).
				if first == 0 {
					trainState.Zero()
				}
				for i := first; i < data.Windows(c.Bptt); i++ {
					if err := ctx.Err(); err != nil {
						yield(lmWindow{}, err)
						return
					}
					x, y, n := data.Window(i, c.Bptt)
					if !yield(lmWindow{x: x, y: y, steps: n}, nil) {
						return
					}
				}
			}
		},
		Step: func(ctx context.Context, b lmWindow) (train.StepResult, error) {
			model.State = trainState
			loss, err := w.forward(b, c.Batch, true)
			if err != nil {
				return train.StepResult{}, err
			}
			if err := dp.Backward(ctx, loss); err != nil {
				return train.StepResult{}, err
			}
			return train.StepResult{Loss: float64(loss.Item()), N: b.steps * c.Batch}, nil
		},
		EndEpoch: func(ctx context.Context, es train.EpochStats) error {
			res := LMEpoch{Epoch: es.Epoch, Steps: es.Steps, TrainLoss: es.Loss, TrainPPL: math.Exp(es.Loss),
				WordsSec: es.Samples / es.TrainSec, TrainSec: es.TrainSec, LR: opt.LR()}
			if !c.NoEval {
				valLoss, err := w.validate(ctx, int64(es.Epoch)*int64(steps), steps, c.EvalEvery > 0)
				if err != nil {
					return err
				}
				res.ValLoss, res.ValPPL = valLoss, math.Exp(valLoss)
			}
			if es.Epoch == c.Epochs && !c.NoEval {
				testLoss, err := w.evaluate(ctx, w.corpus.Test)
				if err != nil {
					return fmt.Errorf("test: %w", err)
				}
				res.TestPPL = math.Exp(testLoss)
			}
			if rank != 0 {
				return nil
			}
			res.TotalSec = time.Since(w.start).Seconds()
			w.sum.Epochs = append(w.sum.Epochs, res)
			w.sum.TestPPL = res.TestPPL
			w.sum.CommStats = rep.Traffic()
			text := fmt.Sprintf("epoch %d train_loss %.4f train_ppl %.2f", res.Epoch, res.TrainLoss, res.TrainPPL)
			if !c.NoEval {
				text += fmt.Sprintf(" val_loss %.4f val_ppl %.2f", res.ValLoss, res.ValPPL)
			}
			if res.TestPPL > 0 {
				text += fmt.Sprintf(" test_ppl %.2f", res.TestPPL)
			}
			text += fmt.Sprintf(" words_s %.0f lr %g train_s %.1f total_s %.1f", res.WordsSec, res.LR, res.TrainSec, res.TotalSec)
			_ = train.Print(w.stdout, "epoch", res, text)
			return w.metrics.Write(res)
		},
		Clip:      optim.ClipGradNorm,
		MaxNorm:   c.Clip,
		LogEvery:  c.LogEvery,
		Start:     w.start,
		EvalEvery: c.EvalEvery,
		Eval: func(ctx context.Context, iteration int64) error {
			if c.NoEval {
				return nil
			}
			_, err := w.validate(ctx, iteration, steps, true)
			return err
		},
		Unit: "words", // a step's N is its window's words
		Describe: func(epoch int, loss, _, perSec float64) string {
			return fmt.Sprintf("epoch %d/%d loss %.3f ppl %.1f %.0f words/s", epoch+1, c.Epochs, loss, math.Exp(loss), perSec)
		},
	}
	if c.Checkpoint != "" {
		loop.Checkpoints = &train.Checkpointer{Dir: c.Checkpoint, Every: c.CheckpointEvery, Keep: c.Keep, Resume: c.Resume, Meta: c.checkpointMeta(world),
			Arrays: lmStateArrays(trainState)}
	}
	loop.Report(rank, w.metrics, c.Progress, w.stdout, w.stderr, describeLMPosition)
	return loop.Run(ctx)
}

// describeLMPosition says where a checkpoint of an LM run is, for its saved line.
func describeLMPosition(pos checkpoint.Position) string {
	return fmt.Sprintf("epoch %d, step %d, iteration %d", pos.Epoch+1, pos.Step, pos.Iteration)
}

// lmStateArrays names the carried training state for checkpoints: each rank saves its own
// (h, c), so that a resume mid-epoch continues from the state the interrupted run had.
func lmStateArrays(s *nn.LSTMState) map[string]checkpoint.Array {
	shape, axes := []int{s.Layers, s.Batch, s.Hidden}, []string{"layers", "batch", "hidden"}
	return map[string]checkpoint.Array{
		"lstm_state.h": {Data: s.H, Shape: shape, Axes: axes},
		"lstm_state.c": {Data: s.C, Shape: shape, Axes: axes},
	}
}

// profileStep is the profile step of -hook omgs: one forward and backward of model (before
// DDP wraps it) on this rank's next training window, from the zero state carried over the
// windows like training's.
func (w *lmWorker) profileStep(model *models.LSTMLM, data *datasets.LMBatches) profile.Step {
	c := w.cfg
	state, tape := model.NewState(c.Batch), nn.NewTape()
	xs, ys := make([]float32, c.Bptt*c.Batch), make([]int, c.Bptt*c.Batch)
	i := 0
	nn.SetTraining(model, true)
	return func(backward func(*nn.Var) error) error {
		if i == data.Windows(c.Bptt) {
			i = 0
		}
		x, y, steps := data.Window(i, c.Bptt)
		i++
		n := steps * c.Batch
		for k := range n {
			xs[k], ys[k] = float32(x[k]), int(y[k])
		}
		in, err := nn.FromSlice(xs[:n], steps, c.Batch)
		if err != nil {
			return err
		}
		model.State = state
		tape.Reset()
		return backward(nn.CrossEntropy(model.Forward(tape.Const(in)), ys[:n]))
	}
}

// forward runs one window of cols columns through DDP (recording for backward when train)
// and returns the mean cross-entropy of its next-word predictions.
func (w *lmWorker) forward(b lmWindow, cols int, train bool) (*nn.Var, error) {
	n := b.steps * cols
	xs, ys := w.xs[:n], w.ys[:n]
	for i := range n {
		xs[i], ys[i] = float32(b.x[i]), int(b.y[i])
	}
	x, err := nn.FromSlice(xs, b.steps, cols)
	if err != nil {
		return nil, err
	}
	w.tape.Reset()
	w.tape.SetGradEnabled(train)
	loss := nn.CrossEntropy(w.dp.Forward(w.tape.Const(x)), ys)
	if err := w.tape.Err(); err != nil {
		return nil, err
	}
	return loss, nil
}

// validate returns the validation loss (on the first -eval-limit tokens of the stream when
// set). With record, rank 0 also prints it and writes an LMEvalRecord at iteration.
func (w *lmWorker) validate(ctx context.Context, iteration int64, stepsPerEpoch int, record bool) (float64, error) {
	tokens := w.corpus.Valid
	if n := w.cfg.EvalLimit; n > 0 && n < len(tokens) {
		tokens = tokens[:n]
	}
	loss, err := w.evaluate(ctx, tokens)
	if err != nil {
		return 0, fmt.Errorf("validation: %w", err)
	}
	if !record || w.group.Rank() != 0 {
		return loss, nil
	}
	rec := LMEvalRecord{Step: iteration, ValLoss: loss, ValPPL: math.Exp(loss), TotalSec: time.Since(w.start).Seconds(), StepsPerEpoch: stepsPerEpoch}
	_ = train.Print(w.stdout, "eval", rec, fmt.Sprintf("step %d val_loss %.4f val_ppl %.2f total_s %.1f", rec.Step, rec.ValLoss, rec.ValPPL, rec.TotalSec))
	return loss, w.metrics.Write(rec)
}

// evaluate returns the mean cross-entropy per word of a token stream: each rank takes its
// contiguous shard, lays it out in EvalBatch columns and runs its bptt windows from the zero
// state carrying the state over; the sums are all-reduced. The model is left in evaluation
// mode (the loop switches it back at the next epoch). Rank 0 shows its progress in words
// over all ranks (the shards are equal, so every rank is as far as rank 0).
func (w *lmWorker) evaluate(ctx context.Context, tokens []int32) (float64, error) {
	c, g := w.cfg, w.group
	shard, err := datasets.ShardTokens(tokens, g.Rank(), g.Size())
	if err != nil {
		return 0, err
	}
	data, err := datasets.Batchify(shard, c.EvalBatch)
	if err != nil {
		return 0, err
	}
	nn.SetTraining(w.model, false)
	defer w.tape.SetGradEnabled(true)
	w.model.State = w.model.NewState(c.EvalBatch)
	sums := make([]float32, 2)
	var lossSum, words float64
	progress := train.StartProgress(ctx, (data.Rows-1)*data.Cols*g.Size(), "words")
	defer progress.Finish()
	for i := range data.Windows(c.Bptt) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		x, y, steps := data.Window(i, c.Bptt)
		loss, err := w.forward(lmWindow{x: x, y: y, steps: steps}, c.EvalBatch, false)
		if err != nil {
			return 0, err
		}
		n := float64(steps * c.EvalBatch)
		lossSum += float64(loss.Item()) * n
		words += n
		progress.Add(steps * c.EvalBatch * g.Size())
	}
	sums[0], sums[1] = float32(lossSum), float32(words)
	if err := allReduceSums(ctx, g, sums); err != nil {
		return 0, err
	}
	return float64(sums[0]) / float64(sums[1]), nil
}

// allReduceSums sums an evaluation's statistics over the ranks.
func allReduceSums(ctx context.Context, g comm.Group, sums []float32) error {
	return comm.AllReduce(ctx, g, tagLMEval, sums, comm.Auto)
}

// checkpointMeta describes the run for checkpoints: resuming requires the same model, hook,
// world size and the flags that change the trajectory.
func (c LMConfig) checkpointMeta(world int) checkpoint.Meta {
	cfg := c.Flags.MetaConfig()
	cfg["batch"] = strconv.Itoa(c.Batch)
	cfg["bptt"] = strconv.Itoa(c.Bptt)
	cfg["steps"] = strconv.Itoa(c.Steps)
	cfg["seed"] = strconv.FormatUint(c.Seed, 10)
	cfg["clip"] = strconv.FormatFloat(c.Clip, 'g', -1, 64)
	cfg["dropout"] = strconv.FormatFloat(c.Dropout, 'g', -1, 64)
	cfg["bucket_mb"] = strconv.FormatFloat(c.BucketMB, 'g', -1, 64)
	return checkpoint.Meta{Model: c.Model, Hook: c.hook.String(), World: world, Config: cfg, Canonical: c.Flags.CanonicalSpec}
}

// agreement is what every rank must share besides train.Setup's own fields (see
// examples/internal/cifar's): the corpus by its sizes, not by -data's path.
func (c LMConfig) agreement(world int, corpus *datasets.PTB) []comm.Field {
	return train.MetaFields(c.checkpointMeta(world), train.CheckpointFields(c.Checkpoint, c.CheckpointEvery, c.Resume, map[string]string{
		"epochs": strconv.Itoa(c.Epochs), "eval_every": strconv.Itoa(c.EvalEvery), "eval_limit": strconv.Itoa(c.EvalLimit),
		"data": fmt.Sprintf("PTB: vocabulary %d, tokens train %d, valid %d, test %d", corpus.Vocab.Size(), len(corpus.Train), len(corpus.Valid), len(corpus.Test))}))
}
