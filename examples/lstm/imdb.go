package train

import (
	"context"
	"fmt"
	"iter"
	"runtime"
	"time"

	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// -task imdb: the seeds' LSTM-IMDB classifier (models.LSTMIMDB: embedding 50, one LSTM
// layer of 100, Linear 2) on the aclImdb folders (datasets.LoadIMDB: a train-only
// vocabulary of the 50,000 most frequent words, reviews cut or padded to -max-len tokens),
// classified from the LSTM's output at each review's last real token. The training reviews
// are split across ranks by a DistributedSampler (reshuffled every epoch); the test split is
// evaluated every epoch, shared across ranks. The recipe (Adam, lr 1e-3, batch 32 per
// worker, no clipping) is this program's choice: the seeds' IMDB script is not in their
// repositories.

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
	*lmWorker
	data *datasets.IMDB
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
	hook, err := hooks.Parse(c.Hook)
	if err != nil {
		return err
	}
	loader, err := datasets.NewTextLoader(w.data.Train, datasets.TextLoaderOptions{Batch: c.Batch, Rank: rank, World: world, Seed: c.Seed, Shuffle: true, DropLast: true})
	if err != nil {
		return err
	}
	tape := nn.NewTape()
	opts := []ddp.Option{ddp.WithCommHook(hook)}
	opts = append(opts, bucketCap(c.BucketMB)...)
	opts, err = withProfile(ctx, g, model, hook, c.Profile, w.stdout, opts, func() (ddp.ProfileStep, func(), error) {
		next, stop := epochCycle(ctx, loader.Epoch)
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
	})
	if err != nil {
		return err
	}
	traffic := g.Counters().Snapshot() // the summary counts training's traffic, not the set-up's (omgs's profile)
	dp, err := ddp.New(ctx, model, g, opts...)
	if err != nil {
		return err
	}
	opt, err := c.NewOptimizer(dp, hook)
	if err != nil {
		return err
	}
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
	loop := &Loop[datasets.TextBatch]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Schedule: sched, Epochs: c.Epochs, StepsPerEpoch: steps,
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
		Step: func(ctx context.Context, b datasets.TextBatch) (StepResult, error) {
			logits, loss, err := forward(b, true)
			if err != nil {
				return StepResult{}, err
			}
			if err := dp.Backward(ctx, loss); err != nil {
				return StepResult{}, err
			}
			return StepResult{Loss: float64(loss.Item()), Correct: float64(nn.Accuracy(logits.Value, b.Y)), N: b.N}, nil
		},
		EndEpoch: func(ctx context.Context, es EpochStats) error {
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
			w.sum.CommStats = g.Counters().Snapshot().Sub(traffic)
			fmt.Fprintf(w.stdout, "epoch %d train_loss %.4f train_acc %.4f test_loss %.4f test_acc %.4f words_s %.0f train_s %.1f total_s %.1f\n",
				res.Epoch, res.TrainLoss, res.TrainAcc, res.ValLoss, res.TestAcc, res.WordsSec, res.TrainSec, res.TotalSec)
			return w.metrics.Write(res)
		},
		Clip: optim.ClipGradNorm, MaxNorm: c.Clip, LogEvery: c.LogEvery, Start: w.start,
	}
	if c.Checkpoint != "" {
		loop.Checkpoints = &Checkpointer{Dir: c.Checkpoint, Every: c.CheckpointEvery, Keep: c.Keep, Resume: c.Resume, Meta: c.checkpointMeta(world)}
	}
	loop.report(rank, w.metrics, c.Progress, w.stdout, w.stderr, describeLMPosition)
	return loop.Run(ctx)
}
