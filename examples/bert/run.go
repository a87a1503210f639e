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
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// MLMRound is the -metrics record of an evaluation round: training statistics since the
// previous one and the held-out evaluation. It is an epoch record for package plot (one
// "epoch" per round of EvalEvery steps).
type MLMRound struct {
	Round     int     `json:"epoch"`
	Steps     int     `json:"steps"`
	AtStep    int64   `json:"at_step"`
	TrainLoss float64 `json:"train_loss"` // masked-LM cross-entropy (the NSP term is trained but not in it)
	TrainAcc  float64 `json:"train_acc"`  // masked-LM accuracy
	ValLoss   float64 `json:"val_loss"`
	ValAcc    float64 `json:"val_acc"`
	ValNSPAcc float64 `json:"val_nsp_acc,omitempty"`
	SeqPerSec float64 `json:"seq_s"`
	TrainSec  float64 `json:"train_s"`
	TotalSec  float64 `json:"total_s"`
	LR        float64 `json:"lr"`
}

// MLMSummary is a run's result, and the last line of -metrics.
type MLMSummary struct {
	Config    MLMConfig      `json:"config"`
	Corpus    string         `json:"corpus"`
	Vocab     int            `json:"vocab"`
	Kernels   string         `json:"kernels"`
	Params    int            `json:"params"`
	Rounds    []MLMRound     `json:"epochs"`
	ValLoss   float64        `json:"final_val_loss"`
	ValAcc    float64        `json:"final_val_acc"`
	TotalSec  float64        `json:"total_s"`
	Summary   bool           `json:"summary"`
	CommStats comm.Stats     `json:"comm_rank0"`
	Launcher  cluster.Source `json:"launcher,omitempty"`
}

// RunMLM trains with c.Workers in-process ranks, each on its own goroutine.
func RunMLM(ctx context.Context, c MLMConfig, stdout, stderr io.Writer) (*MLMSummary, error) {
	return c.startup().InProcess(ctx, stdout, stderr)
}

// RunMLMProcess trains this process's rank of a launched job (env from cluster.DetectEnv,
// c.Workers its world size) like one of RunMLM's workers: every rank reads the corpus and
// builds the same vocabulary and sequence pairs; rank 0 prints and writes -metrics.
func RunMLMProcess(ctx context.Context, c MLMConfig, env cluster.Env, stdout, stderr io.Writer) (*MLMSummary, error) {
	return c.startup().Process(ctx, env, stdout, stderr)
}

// startup is RunMLM's and RunMLMProcess's start-up on c (train.Startup): the flag check,
// loadCorpus and trainMLMRanks.
func (c *MLMConfig) startup() train.Startup[MLMConfig, *MLMCorpus, *MLMSummary] {
	return train.Startup[MLMConfig, *MLMCorpus, *MLMSummary]{Config: c, Workers: &c.Workers, Progress: &c.Progress, Resume: &c.Resume,
		Checkpoint: &c.Checkpoint, Check: c.check, Load: c.loadCorpus, Train: trainMLMRanks}
}

// loadCorpus finds the corpus (findCorpus, which sets c.Data to it) and reads it
// (LoadMLMCorpus).
func (c *MLMConfig) loadCorpus(ctx context.Context, _, stderr io.Writer) (*MLMCorpus, error) {
	var err error
	if c.Data, err = c.findCorpus(ctx, stderr); err != nil {
		return nil, err
	}
	return LoadMLMCorpus(ctx, *c)
}

// trainMLMRanks trains this process's ranks (rank 0 prints the results, writes -metrics and draws -plot).
func trainMLMRanks(ctx context.Context, c MLMConfig, groups []comm.Group, corpus *MLMCorpus, stdout, stderr io.Writer, launcher cluster.Source) (*MLMSummary, error) {
	vocab := corpus.Tokenizer.Vocab()
	if groups[0].Rank() == 0 {
		fmt.Fprintln(stdout, corpus.Summary)
		if c.SaveVocab != "" {
			if err := vocab.Save(c.SaveVocab); err != nil {
				return nil, fmt.Errorf("-save-vocab: %w", err)
			}
			fmt.Fprintf(stdout, "vocabulary: %s\n", c.SaveVocab)
		}
	}
	sum := &MLMSummary{Config: c, Corpus: corpus.Summary, Vocab: vocab.Size(), Kernels: kernels.Impl(), Summary: true, Launcher: launcher}
	start := time.Now()
	err := train.Job{Groups: groups, Flags: &c.Flags, Resume: c.Resume, Stdout: stdout, Start: start}.Run(ctx,
		func(ctx context.Context, g comm.Group, metrics *train.MetricsLog) error {
			w := &mlmWorker{cfg: c, group: g, corpus: corpus, stdout: stdout, stderr: stderr, metrics: metrics, sum: sum, start: start}
			return w.run(ctx)
		},
		func(totalSec float64) any {
			sum.TotalSec = totalSec
			if len(sum.Rounds) == 0 {
				fmt.Fprintf(stdout, "done: nothing left to train: the checkpoint in %s is at the end of the run\n", c.Checkpoint)
				return nil
			}
			last := sum.Rounds[len(sum.Rounds)-1]
			sum.ValLoss, sum.ValAcc = last.ValLoss, last.ValAcc
			_ = train.Print(stdout, "done", sum, fmt.Sprintf("done: bert-%s %s, %d workers × batch %d × %d tokens, %d steps: held-out MLM loss %.4f, accuracy %.2f%%, NSP accuracy %.2f%%, %.0fs total",
				c.Model, c.Hook, c.Workers, c.Batch, c.Seq, last.AtStep, last.ValLoss, 100*last.ValAcc, 100*last.ValNSPAcc, sum.TotalSec))
			return sum
		})
	if err != nil {
		return nil, err
	}
	return sum, nil
}

// mlmWorker is one rank of a masked-LM run.
type mlmWorker struct {
	cfg     MLMConfig
	group   comm.Group
	corpus  *MLMCorpus
	stdout  io.Writer
	stderr  io.Writer
	metrics *train.MetricsLog // rank 0's, with -metrics
	sum     *MLMSummary
	start   time.Time
}

func (w *mlmWorker) run(ctx context.Context) error {
	c, g := w.cfg, w.group
	rank, world := g.Rank(), g.Size()
	vocab := w.corpus.Tokenizer.Vocab()
	bcfg, err := models.BertPreset(c.Model)
	if err != nil {
		return err
	}
	bcfg.VocabSize = vocab.Size()
	bcfg.HiddenDropout, bcfg.AttentionDropout = c.Dropout, c.Dropout
	if pad, ok := vocab.ID(datasets.PadToken); ok {
		bcfg.PadTokenID = int(pad)
	}
	model, err := models.NewBertForPreTraining(bcfg, nn.NewRand(c.Seed))
	if err != nil {
		return err
	}
	dump, err := w.openDump(model)
	if err != nil {
		return err
	}
	defer dump.Close()
	loader, err := datasets.NewMLMLoader(w.corpus.Train, datasets.MLMLoaderOptions{Batch: c.Batch, Rank: rank, World: world, Shuffle: true, DropLast: true})
	if err != nil {
		return err
	}
	nb := loader.NumBatches()
	if nb == 0 {
		return fmt.Errorf("-batch %d × %d workers: the training text has only %d sequence pairs", c.Batch, world, w.corpus.Train.Len())
	}
	// batches yields the data's batches from global step s on, across data epochs.
	batches := func(ctx context.Context, s int) iter.Seq2[datasets.MLMBatch, error] {
		return func(yield func(datasets.MLMBatch, error) bool) {
			for {
				epoch, first := s/nb, s%nb
				for b, err := range loader.EpochFrom(ctx, epoch, first) {
					if !yield(b, err) || err != nil {
						return
					}
				}
				s = (epoch + 1) * nb
			}
		}
	}
	steps, round, err := c.runLength(nb)
	if err != nil {
		return err
	}
	tape := nn.NewTape()
	rep, err := train.Setup{Hook: c.hook, Flags: &c.Flags, BucketMB: c.BucketMB, Profile: c.Profile, Stdout: w.stdout,
		ProfileStep: func() (profile.Step, func(), error) {
			next, stop := iter.Pull2(batches(ctx, 0))
			nn.SetTraining(model, true)
			return func(backward func(*nn.Var) error) error {
				b, err, _ := next()
				if err != nil {
					return err
				}
				positions, labels := maskedPositions(b)
				tape.Reset()
				mlm, nsp := model.ForwardMaskedLM(tape, b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.N, b.SeqLen, positions)
				nspLabels := make([]int, b.N)
				for i, l := range b.NextSentence {
					nspLabels[i] = int(l)
				}
				return backward(model.Loss(mlm, nsp, labels, nspLabels))
			}, stop, nil
		},
		Agree: train.MetaFields(c.checkpointMeta(world, vocab.Size(), round), train.CheckpointFields(c.Checkpoint, c.CheckpointEvery, c.Resume, map[string]string{
			"run_steps": strconv.Itoa(steps), "eval_every": strconv.Itoa(c.EvalEvery), "eval_limit": strconv.Itoa(c.EvalLimit), "data": fmt.Sprintf("%d training pairs from %d documents, %d held out",
				w.corpus.Train.Len(), w.corpus.Train.Documents, w.corpus.Valid.Len())}))}.New(ctx, g, model)
	if err != nil {
		return err
	}
	dp, opt := rep.DDP, rep.Optimizer
	rounds := steps / round
	sched, schedSpec, err := c.newSchedule(steps, rounds, round, world)
	if err != nil {
		return err
	}
	evalLoader, err := datasets.NewMLMLoader(w.corpus.Valid, datasets.MLMLoaderOptions{Batch: c.Batch})
	if err != nil {
		return err
	}
	if rank == 0 {
		w.sum.Params = nn.NumParams(dp.Parameters())
		fmt.Fprintf(w.stdout, "model bert-%s: %d parameters in %d tensors, %d buckets; hook %s; %d workers × batch %d × %d tokens; %d steps (%d per data epoch), schedule %s; kernels %s, GOMAXPROCS %d\n",
			c.Model, w.sum.Params, len(dp.Parameters()), len(dp.Plan()), c.Hook, world, c.Batch, c.Seq, steps, nb, schedSpec, kernels.Impl(), runtime.GOMAXPROCS(0))
	}
	loop := &train.Loop[datasets.MLMBatch]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Schedule: sched, Epochs: rounds, StepsPerEpoch: round, Unit: "seq",
		Batches: func(ctx context.Context, r, start int) iter.Seq2[datasets.MLMBatch, error] {
			return batches(ctx, r*round+start)
		},
		Step: func(ctx context.Context, b datasets.MLMBatch) (train.StepResult, error) {
			if err := dump.write(b); err != nil {
				return train.StepResult{}, err
			}
			tape.SetGradEnabled(true)
			loss, mlmLoss, mlm, _, labels, _ := mlmForward(dp, model, tape, b)
			if err := dp.Backward(ctx, loss); err != nil {
				return train.StepResult{}, err
			}
			acc := float64(nn.Accuracy(mlm.Value, labels)) / float64(len(labels))
			return train.StepResult{Loss: float64(mlmLoss.Item()), Correct: acc * float64(b.N), N: b.N}, nil
		},
		EndEpoch: func(ctx context.Context, es train.EpochStats) error {
			vl, va, vn, err := w.evaluate(ctx, dp, model, tape, evalLoader)
			if err != nil {
				return err
			}
			if rank != 0 {
				return nil
			}
			res := MLMRound{Round: es.Epoch, Steps: es.Steps, AtStep: int64(es.Epoch * round), TrainLoss: es.Loss, TrainAcc: es.Acc,
				ValLoss: vl, ValAcc: va, ValNSPAcc: vn, SeqPerSec: es.Samples / es.TrainSec, TrainSec: es.TrainSec,
				TotalSec: time.Since(w.start).Seconds(), LR: opt.LR()}
			w.sum.Rounds = append(w.sum.Rounds, res)
			w.sum.CommStats = rep.Traffic()
			_ = train.Print(w.stdout, "epoch", res, fmt.Sprintf("step %d train_loss %.4f train_acc %.4f val_loss %.4f val_acc %.4f val_nsp_acc %.4f seq_s %.1f train_s %.1f total_s %.1f",
				res.AtStep, res.TrainLoss, res.TrainAcc, res.ValLoss, res.ValAcc, res.ValNSPAcc, res.SeqPerSec, res.TrainSec, res.TotalSec))
			return w.metrics.Write(res)
		},
		LogEvery: c.LogEvery,
		Start:    w.start,
	}
	if c.Checkpoint != "" {
		loop.Checkpoints = &train.Checkpointer{Dir: c.Checkpoint, Every: c.CheckpointEvery, Keep: c.Keep, Resume: c.Resume, Meta: c.checkpointMeta(world, vocab.Size(), round)}
	}
	loop.Report(rank, w.metrics, c.Progress, w.stdout, w.stderr, func(pos checkpoint.Position) string {
		return fmt.Sprintf("step %d", pos.Iteration)
	})
	return loop.Run(ctx)
}
