package main

import (
	"context"
	"fmt"
	"io"
	"iter"
	"runtime"
	"strconv"
	"time"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
	"github.com/spargo-dl/spargo/train"
)

// -task imdb: SparDL's LSTM-IMDB classifier (models.LSTMIMDB: embedding 50, one LSTM
// layer of 100, Linear 2) on the aclImdb folders (datasets.LoadIMDB: a train-only
// vocabulary of the 50,000 most frequent words, reviews cut or padded to -max-len tokens),
// classified from the LSTM's output at each review's last real token. The training reviews
// are split across ranks by a DistributedSampler (reshuffled every epoch); the test split is
// evaluated every epoch, shared across ranks. The recipe (Adam, lr 1e-3, batch 32 per
// worker, no clipping) is this program's choice: SparDL's IMDB script is not in their
// repositories.

// IMDBConfig is a -task imdb run: the LSTM-IMDB classifier's own flags (the lstm program's
// flags that apply to it, taken from LMConfig by LMConfig.imdb). It is the "config" of the
// -metrics summary.
type IMDBConfig struct {
	Data    string `json:"data"` // the aclImdb folders (empty: datasets.Find's search)
	Model   string `json:"model"`
	Workers int    `json:"workers"`
	Hook    string `json:"hook"`
	Batch   int    `json:"batch"` // reviews per worker per step
	Epochs  int    `json:"epochs"`
	Steps   int    `json:"steps"`
	// Flags are the shared training flags (-lr -momentum -wd -optim -schedule -warmup
	// -metrics -log-every -plot).
	train.Flags
	// Clip is the maximum total gradient norm (0: no clipping).
	Clip float64 `json:"clip"`
	// MaxLen is the review length in tokens (longer reviews cut, shorter padded; 0: 500).
	MaxLen   int     `json:"max_len,omitempty"`
	Seed     uint64  `json:"seed"`
	BucketMB float64 `json:"bucket_mb"`
	// Profile is as LMConfig.Profile.
	Profile  string `json:"profile,omitempty"`
	Progress bool   `json:"-"`
	// Checkpoint, CheckpointEvery, Keep and Resume are as in LMConfig.
	Checkpoint      string `json:"checkpoint,omitempty"`
	CheckpointEvery int    `json:"checkpoint_every,omitempty"`
	Keep            int    `json:"keep,omitempty"`
	Resume          bool   `json:"resume,omitempty"`

	hook hooks.Config // -hook, parsed once by check
}

// imdb is -task imdb's configuration from the lstm program's flags; it refuses the flags
// that only -task lm has.
func (c LMConfig) imdb() (IMDBConfig, error) {
	if c.EvalEvery > 0 || c.EvalLimit > 0 {
		return IMDBConfig{}, fmt.Errorf("-eval-every and -eval-limit are -task lm's: -task imdb evaluates the whole test split every epoch")
	}
	return IMDBConfig{Data: c.Data, Model: c.Model, Workers: c.Workers, Hook: c.Hook, Batch: c.Batch, Epochs: c.Epochs, Steps: c.Steps,
		Flags: c.Flags, Clip: c.Clip, MaxLen: c.MaxLen, Seed: c.Seed, BucketMB: c.BucketMB, Profile: c.Profile, Progress: c.Progress,
		Checkpoint: c.Checkpoint, CheckpointEvery: c.CheckpointEvery, Keep: c.Keep, Resume: c.Resume}, nil
}

// check refuses bad flags before any data is looked for: the model's name first, then the
// numbers and the specs (-hook parsed once into c.hook).
func (c *IMDBConfig) check() error {
	if c.Model != "lstm-imdb" && c.Model != "imdb" {
		return fmt.Errorf("-task imdb: -model %q: want lstm-imdb", c.Model)
	}
	if err := train.AtLeast(1, train.Int("-workers", c.Workers), train.Int("-batch", c.Batch), train.Int("-epochs", c.Epochs)); err != nil {
		return err
	}
	if err := train.AtLeast(0, train.Int("-steps", c.Steps), train.Int("-max-len", c.MaxLen), train.Int("-checkpoint-every", c.CheckpointEvery),
		train.Int("-keep", c.Keep)); err != nil {
		return err
	}
	if !(c.Clip >= 0) || c.BucketMB < 0 {
		return fmt.Errorf("-clip %v, -bucket-mb %v: want 0 or more", c.Clip, c.BucketMB)
	}
	if (c.Resume || c.CheckpointEvery > 0) && c.Checkpoint == "" {
		return fmt.Errorf("-resume and -checkpoint-every need -checkpoint DIR")
	}
	var err error
	c.hook, err = c.Flags.CheckWithHook(c.Hook, c.Workers)
	return err
}

// IMDBSummary is a -task imdb run's result, and the last line of -metrics.
type IMDBSummary struct {
	Config    IMDBConfig     `json:"config"`
	Dataset   string         `json:"dataset"`
	Kernels   string         `json:"kernels"`
	Params    int            `json:"params"`
	Epochs    []LMEpoch      `json:"epochs"` // with train_acc and test_acc; val_loss is the test loss
	FinalAcc  float64        `json:"final_test_acc,omitempty"`
	TotalSec  float64        `json:"total_s"`
	Summary   bool           `json:"summary"`
	CommStats comm.Stats     `json:"comm_rank0"`
	Launcher  cluster.Source `json:"launcher,omitempty"`
}

// load finds (datasets.Find) and reads the aclImdb folders and describes them on stdout. A
// rank's share of the training reviews must hold at least one -batch (the last short batch
// is dropped).
func (c *IMDBConfig) load(ctx context.Context, stdout, stderr io.Writer) (*datasets.IMDB, error) {
	dir, err := datasets.Find(ctx, datasets.IMDBSet, c.Data, stderr)
	if err != nil {
		return nil, err
	}
	d, err := datasets.LoadIMDB(ctx, dir, datasets.IMDBOptions{MaxLen: c.MaxLen})
	if err != nil {
		return nil, err
	}
	if share := d.Train.N / c.Workers; c.Batch > share {
		return nil, fmt.Errorf("-batch %d is larger than a rank's share of the training data: %d of %s's %d reviews on each of %d workers",
			c.Batch, share, dir, d.Train.N, c.Workers)
	}
	fmt.Fprintf(stdout, "data: %s: %s\n", dir, imdbSummary(d))
	return d, nil
}

// imdbSummary describes the loaded aclImdb folders (the summary's "dataset").
func imdbSummary(d *datasets.IMDB) string {
	return fmt.Sprintf("%s (%d reviews), %s (%d reviews), vocabulary %d", d.Train.Name, d.Train.N, d.Test.Name, d.Test.N, d.Vocab.Size())
}

// RunIMDB trains -task imdb with c.Workers in-process ranks, each on its own goroutine.
func RunIMDB(ctx context.Context, c IMDBConfig, stdout, stderr io.Writer) (*IMDBSummary, error) {
	return c.startup().InProcess(ctx, stdout, stderr)
}

// RunIMDBProcess trains this process's rank of a launched -task imdb job (env from
// cluster.DetectEnv, c.Workers its world size), like one of RunIMDB's workers.
func RunIMDBProcess(ctx context.Context, c IMDBConfig, env cluster.Env, stdout, stderr io.Writer) (*IMDBSummary, error) {
	return c.startup().Process(ctx, env, stdout, stderr)
}

// startup is RunIMDB's and RunIMDBProcess's start-up on c (train.Startup): the flag check,
// load and trainIMDBRanks.
func (c *IMDBConfig) startup() train.Startup[IMDBConfig, *datasets.IMDB, *IMDBSummary] {
	return train.Startup[IMDBConfig, *datasets.IMDB, *IMDBSummary]{Config: c, Workers: &c.Workers, Progress: &c.Progress, Resume: &c.Resume,
		Checkpoint: &c.Checkpoint, Check: c.check, Load: c.load, Train: trainIMDBRanks}
}

func trainIMDBRanks(ctx context.Context, c IMDBConfig, groups []comm.Group, data *datasets.IMDB, stdout, stderr io.Writer, launcher cluster.Source) (*IMDBSummary, error) {
	sum := &IMDBSummary{Config: c, Dataset: imdbSummary(data), Kernels: kernels.Impl(), Summary: true, Launcher: launcher}
	start := time.Now()
	err := train.Job{Groups: groups, Flags: &c.Flags, Resume: c.Resume, Stdout: stdout, Start: start}.Run(ctx,
		func(ctx context.Context, g comm.Group, metrics *train.MetricsLog) error {
			w := &imdbWorker{cfg: c, group: g, data: data, stdout: stdout, stderr: stderr, metrics: metrics, sum: sum, start: start}
			return w.run(ctx)
		},
		func(totalSec float64) any {
			sum.TotalSec = totalSec
			if len(sum.Epochs) == 0 {
				fmt.Fprintf(stdout, "done: nothing left to train: the checkpoint in %s is at the end of epoch %d\n", c.Checkpoint, c.Epochs)
				return nil
			}
			last := sum.Epochs[len(sum.Epochs)-1]
			sum.FinalAcc = last.TestAcc
			_ = train.Print(stdout, "done", sum, fmt.Sprintf("done: %s %s, %d workers × batch %d, %d epochs: test acc %.2f%%, train loss %.4f, %.0f words/s, %.0fs total",
				c.Model, c.Hook, c.Workers, c.Batch, c.Epochs, 100*last.TestAcc, last.TrainLoss, last.WordsSec, sum.TotalSec))
			return sum
		})
	if err != nil {
		return nil, err
	}
	return sum, nil
}

// checkpointMeta describes a -task imdb run for checkpoints: resuming requires the same
// model, hook, world size and the flags that change the trajectory.
func (c IMDBConfig) checkpointMeta(world int) checkpoint.Meta {
	cfg := c.Flags.MetaConfig()
	cfg["task"] = "imdb"
	cfg["batch"] = strconv.Itoa(c.Batch)
	cfg["steps"] = strconv.Itoa(c.Steps)
	cfg["seed"] = strconv.FormatUint(c.Seed, 10)
	cfg["clip"] = strconv.FormatFloat(c.Clip, 'g', -1, 64)
	cfg["max_len"] = strconv.Itoa(c.MaxLen)
	cfg["bucket_mb"] = strconv.FormatFloat(c.BucketMB, 'g', -1, 64)
	return checkpoint.Meta{Model: c.Model, Hook: c.hook.String(), World: world, Config: cfg, Canonical: c.Flags.CanonicalSpec}
}

// imdbDefaults applies -task imdb's defaults to the flags the command line left out.
func (c *LMConfig) imdbDefaults(set func(string) bool) {
	if c.Task != "imdb" {
		return
	}
	for _, d := range []struct {
		flag  string
		apply func()
	}{
		{"model", func() { c.Model = "lstm-imdb" }},
		{"optim", func() { c.Optim = "adam" }},
		{"lr", func() { c.LR = 1e-3 }},
		{"batch", func() { c.Batch = 32 }},
		{"clip", func() { c.Clip = 0 }},
		{"schedule", func() { c.Schedule = "" }},
	} {
		if !set(d.flag) {
			d.apply()
		}
	}
}

// imdbWorker is one rank of a -task imdb run.
type imdbWorker struct {
	cfg     IMDBConfig
	group   comm.Group
	data    *datasets.IMDB
	stdout  io.Writer
	stderr  io.Writer
	metrics *train.MetricsLog // rank 0's, with -metrics
	sum     *IMDBSummary
	start   time.Time
}

func (w *imdbWorker) run(ctx context.Context) error {
	c, g := w.cfg, w.group
	rank, world := g.Rank(), g.Size()
	cfg := models.LSTMIMDB
	cfg.Vocab = w.data.Vocab.Size()
	model, err := models.NewLSTMClassifier(cfg, nn.NewRand(c.Seed))
	if err != nil {
		return err
	}
	loader, err := datasets.NewTextLoader(w.data.Train, datasets.TextLoaderOptions{Batch: c.Batch, Rank: rank, World: world, Seed: c.Seed, Shuffle: true, DropLast: true})
	if err != nil {
		return err
	}
	tape := nn.NewTape()
	rep, err := train.Setup{Hook: c.hook, Flags: &c.Flags, BucketMB: c.BucketMB, Profile: c.Profile, Stdout: w.stdout,
		ProfileStep: func() (profile.Step, func(), error) {
			next, stop := train.EpochCycle(ctx, loader.Epoch)
			nn.SetTraining(model, true)
			return func(backward func(*nn.Var) error) error {
				b, err := next()
				if err != nil {
					return err
				}
				tape.Reset()
				x, err := models.SequenceFirst(tape, b.X, b.N, b.MaxLen)
				if err != nil {
					return err
				}
				model.Lengths = b.Lengths
				return backward(nn.CrossEntropy(model.Forward(tape.Const(x)), b.Y))
			}, stop, nil
		},
		Agree: train.MetaFields(c.checkpointMeta(world), train.CheckpointFields(c.Checkpoint, c.CheckpointEvery, c.Resume,
			map[string]string{"epochs": strconv.Itoa(c.Epochs), "data": w.sum.Dataset}))}.New(ctx, g, model)
	if err != nil {
		return err
	}
	dp, opt := rep.DDP, rep.Optimizer
	evalLoader, err := datasets.NewTextLoader(w.data.Test, datasets.TextLoaderOptions{Batch: c.Batch, Rank: rank, World: world})
	if err != nil {
		return err
	}
	steps := loader.NumBatches()
	if c.Steps > 0 && c.Steps < steps {
		steps = c.Steps
	}
	if steps == 0 {
		return fmt.Errorf("-task imdb: %d training reviews give no batch of %d per rank on %d ranks", w.data.Train.N, c.Batch, world)
	}
	sched, err := c.NewSchedule(c.Epochs, steps, world)
	if err != nil {
		return err
	}
	if rank == 0 {
		w.sum.Params = nn.NumParams(dp.Parameters())
		fmt.Fprintf(w.stdout, "model %s: %d parameters in %d tensors, %d buckets; hook %s; %d workers × batch %d (%d steps per epoch); kernels %s, GOMAXPROCS %d\n",
			c.Model, w.sum.Params, len(dp.Parameters()), len(dp.Plan()), c.Hook, world, c.Batch, steps, kernels.Impl(), runtime.GOMAXPROCS(0))
	}
	forward := func(b datasets.TextBatch, train bool) (*nn.Var, *nn.Var, error) {
		tape.Reset()
		tape.SetGradEnabled(train)
		x, err := models.SequenceFirst(tape, b.X, b.N, b.MaxLen)
		if err != nil {
			return nil, nil, err
		}
		model.Lengths = b.Lengths
		logits := dp.Forward(tape.Const(x))
		loss := nn.CrossEntropy(logits, b.Y)
		return logits, loss, tape.Err()
	}
	loop := &train.Loop[datasets.TextBatch]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Schedule: sched, Epochs: c.Epochs, StepsPerEpoch: steps, Unit: "reviews",
		Batches: func(ctx context.Context, epoch, first int) iter.Seq2[datasets.TextBatch, error] {
			return func(yield func(datasets.TextBatch, error) bool) {
				i := 0
				for b, err := range loader.Epoch(ctx, epoch) {
					if i++; i <= first && err == nil {
						continue // resumed mid-epoch: skip the batches already trained on
					}
					if !yield(b, err) || err != nil {
						return
					}
				}
			}
		},
		Step: func(ctx context.Context, b datasets.TextBatch) (train.StepResult, error) {
			logits, loss, err := forward(b, true)
			if err != nil {
				return train.StepResult{}, err
			}
			if err := dp.Backward(ctx, loss); err != nil {
				return train.StepResult{}, err
			}
			return train.StepResult{Loss: float64(loss.Item()), Correct: float64(nn.Accuracy(logits.Value, b.Y)), N: b.N}, nil
		},
		EndEpoch: func(ctx context.Context, es train.EpochStats) error {
			nn.SetTraining(model, false)
			defer tape.SetGradEnabled(true)
			sums := make([]float32, 3)
			for b, err := range evalLoader.Epoch(ctx, 0) {
				if err != nil {
					return err
				}
				logits, loss, err := forward(b, false)
				if err != nil {
					return err
				}
				sums[0] += loss.Item() * float32(b.N)
				sums[1] += float32(nn.Accuracy(logits.Value, b.Y))
				sums[2] += float32(b.N)
			}
			if err := allReduceSums(ctx, g, sums); err != nil {
				return err
			}
			if rank != 0 {
				return nil
			}
			res := LMEpoch{Epoch: es.Epoch, Steps: es.Steps, TrainLoss: es.Loss, TrainAcc: es.Acc, ValLoss: float64(sums[0] / sums[2]), TestAcc: float64(sums[1] / sums[2]),
				WordsSec: es.Samples * float64(w.data.Train.MaxLen) / es.TrainSec, TrainSec: es.TrainSec, TotalSec: time.Since(w.start).Seconds(), LR: opt.LR()}
			w.sum.Epochs = append(w.sum.Epochs, res)
			w.sum.CommStats = rep.Traffic()
			_ = train.Print(w.stdout, "epoch", res, fmt.Sprintf("epoch %d train_loss %.4f train_acc %.4f test_loss %.4f test_acc %.4f words_s %.0f train_s %.1f total_s %.1f",
				res.Epoch, res.TrainLoss, res.TrainAcc, res.ValLoss, res.TestAcc, res.WordsSec, res.TrainSec, res.TotalSec))
			return w.metrics.Write(res)
		},
		Clip: optim.ClipGradNorm, MaxNorm: c.Clip, LogEvery: c.LogEvery, Start: w.start,
	}
	if c.Checkpoint != "" {
		loop.Checkpoints = &train.Checkpointer{Dir: c.Checkpoint, Every: c.CheckpointEvery, Keep: c.Keep, Resume: c.Resume, Meta: c.checkpointMeta(world)}
	}
	loop.Report(rank, w.metrics, c.Progress, w.stdout, w.stderr, describeLMPosition)
	return loop.Run(ctx)
}
