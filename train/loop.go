package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// StepResult is what one training step reports for the epoch's statistics.
type StepResult struct {
	Loss    float64 // the batch's mean loss
	Correct float64 // correctly classified samples (0 where it does not apply)
	N       int     // samples in the batch
}

// EpochStats are an epoch's training statistics over all ranks.
type EpochStats struct {
	Epoch     int // from 1
	Steps     int
	Loss, Acc float64 // sample-weighted means over all ranks
	Samples   float64 // over all ranks
	TrainSec  float64 // this process's training time in the epoch (since the resume, for a resumed epoch)
}

// StepRecord is a -metrics step record (see package plot for the schema it follows): the
// training loss averaged over the ranks and over the steps since the previous record.
type StepRecord struct {
	Step          int64   `json:"step"`                // optimizer steps done in the run, counted from its start
	Loss          float64 `json:"loss"`                // mean training loss since the last record, over all ranks
	LR            float64 `json:"lr"`                  // the learning rate of the record's last step
	GradNorm      float64 `json:"grad_norm,omitempty"` // Clip's total norm at the record's last step (with Clip)
	TotalSec      float64 `json:"total_s"`             // wall seconds since Loop.Start
	StepsPerEpoch int     `json:"steps_per_epoch"`     // places the record on plot's epochs axis
}

// Loop is the epoch loop of a data-parallel training program, shared by the examples: per
// step it sets the learning rate, zeroes the gradients, runs Step (forward and DDP backward
// on one batch), flushes late results on the epoch's last step, clips the gradients (Clip),
// steps the optimizer and updates the statistics (and every LogEvery steps reports a
// StepRecord); per epoch it all-reduces them, tells DDP (EndEpoch, and the
// BatchNorm statistics under AverageBuffers), calls EndEpoch (evaluation, metrics) and saves
// a checkpoint. With a Checkpointer it also saves every Every steps and resumes from the
// latest checkpoint, mid-epoch included (Batches gets the step to start from).
//
// B is the program's batch type.
type Loop[B any] struct {
	Group     comm.Group
	DDP       *ddp.DDP
	Model     nn.Module
	Optimizer optim.Optimizer
	Schedule  optim.Schedule // nil: the optimizer's learning rate stays
	Epochs    int
	// StepsPerEpoch is how many steps an epoch runs (Batches must yield at least that many).
	StepsPerEpoch int
	// Batches yields the epoch's batches from batch start on (datasets.Loader.EpochFrom).
	Batches func(ctx context.Context, epoch, start int) iter.Seq2[B, error]
	// Step trains on one batch: forward through DDP and DDP.Backward (not the optimizer step).
	Step func(ctx context.Context, b B) (StepResult, error)
	// EndEpoch runs after each epoch's statistics are known (evaluation, printing, metrics);
	// optional.
	EndEpoch func(ctx context.Context, st EpochStats) error
	// AverageBuffers averages the BatchNorm statistics over the ranks before EndEpoch
	// (-dist-bn reduce).
	AverageBuffers bool
	// Checkpoints, when set, saves and resumes.
	Checkpoints *Checkpointer
	// Progress, when set (rank 0), shows a progress bar per epoch.
	Progress io.Writer
	// Unit names a sample in the progress bar's rate ("img" when empty: img/s).
	Unit string
	// Describe, when set, gives the progress bar's text after each step from the epoch's
	// running mean loss and accuracy and the samples per second over all ranks; nil: loss,
	// accuracy and img/s.
	Describe func(epoch int, loss, acc, perSec float64) string

	// Clip, when set with MaxNorm > 0, clips the gradients of DDP's parameters to a total
	// norm of MaxNorm after they are synchronised (and flushed) and before the optimizer
	// step, and returns their norm before clipping (optim.ClipGradNorm has this shape).
	// Nil: no clipping.
	Clip    func(params []*nn.Param, maxNorm float64) float64
	MaxNorm float64

	// LogEvery > 0 averages the training loss over the ranks every LogEvery optimizer steps
	// (a collective: every rank takes part) and passes the StepRecord to LogStep (set it on
	// the rank that writes -metrics; nil elsewhere).
	LogEvery int
	LogStep  func(StepRecord) error
	// EvalEvery > 0 calls Eval on every rank after every EvalEvery optimizer steps (counted
	// like LogEvery's) except an epoch's last, where EndEpoch evaluates; the model is put
	// back in training mode after it, and its time is left out of the epoch's TrainSec.
	// iteration is the optimizer steps done in the run.
	EvalEvery int
	Eval      func(ctx context.Context, iteration int64) error
	// Start is when the run started, for StepRecord.TotalSec (zero: when Run was called).
	Start time.Time
}

// Checkpointer is a Loop's checkpoint policy (the -checkpoint, -checkpoint-every, -resume
// flags).
type Checkpointer struct {
	// Dir holds the checkpoints; empty disables saving and resuming.
	Dir string
	// Every saves after every Every steps too (0: only at the end of each epoch).
	Every int
	// Keep is how many checkpoints to keep (0: all).
	Keep int
	// Resume continues from Dir's latest checkpoint; it is an error if there is none.
	Resume bool
	// Meta describes the run; resuming requires the same Model, Hook, World and Config.
	Meta checkpoint.Meta
	// RNG are the training loop's own generators (the layers' are saved with the model).
	RNG map[string]checkpoint.RandState
	// Arrays are the training loop's own per-rank arrays (the LSTM language model's carried
	// hidden state), saved with each rank's state and restored in place on resume.
	Arrays map[string]checkpoint.Array
	// Saved, when set, is called on every rank after each save with the checkpoint's path.
	Saved func(path string, pos checkpoint.Position)
}

// Totals keys of checkpoint.Position.
const (
	totalLoss    = "loss"
	totalCorrect = "correct"
	totalSeen    = "seen"
)

// tagEpochStats is the all-reduce tag of the epoch's statistics (the examples' tag 100).
const tagEpochStats = 100

// tagStepStats is the all-reduce tag of a step record's loss (LogEvery).
const tagStepStats = 103

func (l *Loop[B]) state() checkpoint.State {
	st := checkpoint.State{Model: l.Model, DDP: l.DDP, Optimizer: l.Optimizer}
	if l.Checkpoints != nil {
		st.RNG, st.Arrays = l.Checkpoints.RNG, l.Checkpoints.Arrays
	}
	return st
}

// Resume loads the latest checkpoint when the Checkpointer asks for it and returns the
// position to start from (the zero Position otherwise). Run calls it.
func (l *Loop[B]) Resume() (checkpoint.Position, error) {
	ck := l.Checkpoints
	if ck == nil || !ck.Resume {
		return checkpoint.Position{}, nil
	}
	if ck.Dir == "" {
		return checkpoint.Position{}, errors.New("-resume needs -checkpoint DIR")
	}
	path, err := checkpoint.Latest(ck.Dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return checkpoint.Position{}, fmt.Errorf("-resume: %w", err)
		}
		return checkpoint.Position{}, err
	}
	pos, err := checkpoint.Load(path, l.state(), ck.Meta)
	if err != nil {
		return checkpoint.Position{}, fmt.Errorf("-resume: %w", err)
	}
	if pos.Step >= l.StepsPerEpoch && pos.Step > 0 {
		return checkpoint.Position{}, fmt.Errorf("-resume: %s stopped at step %d of epoch %d, which has %d steps in this run", path, pos.Step, pos.Epoch+1, l.StepsPerEpoch)
	}
	return pos, nil
}

func (l *Loop[B]) save(ctx context.Context, pos checkpoint.Position) error {
	ck := l.Checkpoints
	path, err := checkpoint.Saver{Dir: ck.Dir, Keep: ck.Keep}.Save(ctx, l.state(), ck.Meta, pos)
	if err != nil {
		return err
	}
	if ck.Saved != nil {
		ck.Saved(path, pos)
	}
	return nil
}

// Run trains (from the resumed position, if any) until Epochs are done.
func (l *Loop[B]) Run(ctx context.Context) error {
	pos, err := l.Resume()
	if err != nil {
		return err
	}
	rank, world := l.Group.Rank(), l.Group.Size()
	if l.LogEvery < 0 || l.EvalEvery < 0 {
		return fmt.Errorf("-log-every %d, -eval-every %d: want 0 or more", l.LogEvery, l.EvalEvery)
	}
	start := l.Start
	if start.IsZero() {
		start = time.Now()
	}
	// The loss since the last step record, and its steps, on this rank.
	var recLoss float64
	var recSteps int
	recStat := make([]float32, 2)
	saving := l.Checkpoints != nil && l.Checkpoints.Dir != ""
	steps := l.StepsPerEpoch
	iteration := pos.Iteration
	samples := pos.Samples
	stat := make([]float32, 3)
	for epoch := pos.Epoch; epoch < l.Epochs; epoch++ {
		first := 0
		var lossSum, correct, seen float64
		if epoch == pos.Epoch {
			first = pos.Step
			lossSum, correct, seen = pos.Totals[totalLoss], pos.Totals[totalCorrect], pos.Totals[totalSeen]
		}
		var bar *progressbar.ProgressBar
		if l.Progress != nil {
			bar = progressbar.NewOptions(steps, progressbar.OptionSetWriter(l.Progress),
				progressbar.OptionSetDescription(fmt.Sprintf("epoch %d/%d", epoch+1, l.Epochs)),
				progressbar.OptionShowCount(), progressbar.OptionSetWidth(24), progressbar.OptionThrottle(250*time.Millisecond),
				progressbar.OptionClearOnFinish())
			_ = bar.Set(first)
		}
		nn.SetTraining(l.Model, true)
		epochStart := time.Now()
		var evalTime time.Duration // Eval's, within the epoch
		step := first
		for b, err := range l.Batches(ctx, epoch, first) {
			if err != nil {
				return err
			}
			if step == steps {
				break
			}
			if l.Schedule != nil {
				l.Optimizer.SetLR(l.Schedule.LR(epoch, step, steps))
			}
			l.Optimizer.ZeroGrad()
			res, err := l.Step(ctx, b)
			if err != nil {
				return fmt.Errorf("rank %d, epoch %d, step %d: %w", rank, epoch+1, step+1, err)
			}
			if step == steps-1 { // the epoch's last step applies every late result (osp)
				if err := l.DDP.Flush(ctx); err != nil {
					return fmt.Errorf("rank %d, epoch %d: %w", rank, epoch+1, err)
				}
			}
			var gradNorm float64
			if l.Clip != nil && l.MaxNorm > 0 { // on the synchronised gradients, as every rank has them
				gradNorm = l.Clip(l.DDP.Parameters(), l.MaxNorm)
			}
			l.Optimizer.Step()
			recLoss += res.Loss
			recSteps++
			lossSum += res.Loss * float64(res.N)
			correct += res.Correct
			seen += float64(res.N)
			samples += int64(res.N * world)
			step++
			iteration++
			if bar != nil {
				ips := (seen - float64(first)) * float64(world) / time.Since(epochStart).Seconds()
				if l.Describe != nil {
					bar.Describe(l.Describe(epoch, lossSum/seen, correct/seen, ips))
				} else {
					bar.Describe(fmt.Sprintf("epoch %d/%d loss %.3f acc %.1f%% %.0f %s/s", epoch+1, l.Epochs, lossSum/seen, 100*correct/seen, ips, orDefault(l.Unit, "img")))
				}
				_ = bar.Add(1)
			}
			if l.LogEvery > 0 && iteration%int64(l.LogEvery) == 0 {
				recStat[0], recStat[1] = float32(recLoss), float32(recSteps)
				if err := comm.AllReduce(ctx, l.Group, tagStepStats, recStat, comm.Auto); err != nil {
					return fmt.Errorf("rank %d, epoch %d, step %d: step record: %w", rank, epoch+1, step, err)
				}
				if l.LogStep != nil {
					rec := StepRecord{Step: iteration, Loss: float64(recStat[0]) / float64(recStat[1]), LR: l.Optimizer.LR(),
						GradNorm: gradNorm, TotalSec: time.Since(start).Seconds(), StepsPerEpoch: steps}
					if err := l.LogStep(rec); err != nil {
						return err
					}
				}
				recLoss, recSteps = 0, 0
			}
			if l.Eval != nil && l.EvalEvery > 0 && iteration%int64(l.EvalEvery) == 0 && step < steps {
				t := time.Now()
				if err := l.Eval(ctx, iteration); err != nil {
					return fmt.Errorf("rank %d, epoch %d, step %d: %w", rank, epoch+1, step, err)
				}
				nn.SetTraining(l.Model, true)
				evalTime += time.Since(t)
			}
			if saving && l.Checkpoints.Every > 0 && iteration%int64(l.Checkpoints.Every) == 0 && step < steps {
				p := checkpoint.Position{Epoch: epoch, Step: step, Samples: samples, Iteration: iteration,
					Totals: map[string]float64{totalLoss: lossSum, totalCorrect: correct, totalSeen: seen}}
				if err := l.save(ctx, p); err != nil {
					return fmt.Errorf("rank %d, epoch %d, step %d: %w", rank, epoch+1, step, err)
				}
			}
		}
		if step < steps {
			return fmt.Errorf("epoch %d ended after %d of %d steps: the data has fewer batches", epoch+1, step, steps)
		}
		trainSec := (time.Since(epochStart) - evalTime).Seconds()
		if bar != nil {
			_ = bar.Finish()
		}
		stat[0], stat[1], stat[2] = float32(lossSum), float32(correct), float32(seen)
		if err := comm.AllReduce(ctx, l.Group, tagEpochStats, stat, comm.Auto); err != nil {
			return err
		}
		es := EpochStats{Epoch: epoch + 1, Steps: steps, Loss: float64(stat[0]) / float64(stat[2]), Acc: float64(stat[1]) / float64(stat[2]),
			Samples: float64(stat[2]), TrainSec: trainSec}
		if _, err := l.DDP.EndEpoch(ctx); err != nil { // epoch-adaptive hooks (osp's budget)
			return err
		}
		if l.AverageBuffers {
			if err := l.DDP.AverageBuffers(ctx); err != nil {
				return err
			}
		}
		if l.EndEpoch != nil {
			if err := l.EndEpoch(ctx, es); err != nil {
				return err
			}
		}
		if saving {
			if err := l.save(ctx, checkpoint.Position{Epoch: epoch + 1, Samples: samples, Iteration: iteration}); err != nil {
				return fmt.Errorf("rank %d, end of epoch %d: %w", rank, epoch+1, err)
			}
		}
	}
	return nil
}

// OpenMetrics opens a -metrics JSON-lines file: truncated for a new run, appended to when
// resuming, so that a resumed run's file holds every epoch once.
func OpenMetrics(path string, resume bool) (*os.File, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if resume {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w", err)
	}
	return f, nil
}
