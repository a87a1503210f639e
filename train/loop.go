package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"time"

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
	// Progress, when set (rank 0), shows each epoch's progress: on a terminal a bar fitted
	// to its width; on anything else (a file, a pipe, a launcher's log) a plain line per
	// tenth of the epoch and at least one every ProgressEvery, without carriage returns; on
	// a JSON Printer (-log-format json) those lines as JSON records. EndEpoch and Eval get it
	// in their context, so that Evaluate (StartProgress) shows the evaluation's progress too.
	Progress io.Writer
	// Unit names a sample in the progress bar's rate ("img" when empty: img/s).
	Unit string
	// Describe, when set, gives the progress text after each step from the epoch's running
	// mean loss and accuracy and the samples per second over all ranks (the step count and
	// the time left follow it); nil: the epoch, loss, accuracy and img/s.
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

func (l *Loop[B]) save(ctx context.Context, pos checkpoint.Position) (string, error) {
	ck := l.Checkpoints
	path, err := checkpoint.Saver{Dir: ck.Dir, Keep: ck.Keep}.Save(ctx, l.state(), ck.Meta, pos)
	if err != nil {
		return "", err
	}
	if ck.Saved != nil {
		ck.Saved(path, pos)
	}
	return path, nil
}

// Run trains (from the resumed position, if any) until Epochs are done: per epoch it runs
// the steps (step), with a step record (record), a mid-epoch evaluation (evaluate) and a
// checkpoint (saveStep) where their periods fall, then the epoch's end (endEpoch).
func (l *Loop[B]) Run(ctx context.Context) error {
	pos, err := l.Resume()
	if err != nil {
		return err
	}
	if l.LogEvery < 0 || l.EvalEvery < 0 {
		return fmt.Errorf("-log-every %d, -eval-every %d: want 0 or more", l.LogEvery, l.EvalEvery)
	}
	r := &loopRun{start: l.Start, iteration: pos.Iteration, samples: pos.Samples, recStat: make([]float32, 2), saved: -1}
	if l.Progress != nil {
		r.out = newProgressOut(l.Progress)
	}
	if r.start.IsZero() {
		r.start = time.Now()
	}
	for epoch := pos.Epoch; epoch < l.Epochs; epoch++ {
		e := &loopEpoch{epoch: epoch}
		if epoch == pos.Epoch {
			e.first = pos.Step
			e.lossSum, e.correct, e.seen = pos.Totals[totalLoss], pos.Totals[totalCorrect], pos.Totals[totalSeen]
		}
		if err := l.runEpoch(ctx, r, e); err != nil {
			return err
		}
		if epoch+1 < l.Epochs {
			if err := l.stopAtBoundary(ctx, r, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// loopRun is what a run carries from step to step and epoch to epoch.
type loopRun struct {
	start     time.Time // for StepRecord.TotalSec
	iteration int64     // optimizer steps done in the run
	samples   int64     // samples trained on over all ranks
	// The loss since the last step record, and its steps, on this rank.
	recLoss  float64
	recSteps int
	recStat  []float32
	out      *progressOut // rank 0's progress output (Progress); nil elsewhere
	saved    int64        // the iteration of the last checkpoint saved
}

// loopEpoch is one epoch's state on this rank.
type loopEpoch struct {
	epoch, first, step     int // from 0; the step it started (resumed) from; steps done
	lossSum, correct, seen float64
	start                  time.Time
	evalTime               time.Duration // Eval's, within the epoch
	progress               *Progress
}

// totals are the epoch's running sums, as a checkpoint.Position keeps them.
func (e *loopEpoch) totals() map[string]float64 {
	return map[string]float64{totalLoss: e.lossSum, totalCorrect: e.correct, totalSeen: e.seen}
}

// runEpoch trains the steps of one epoch from e.first on, then ends it.
func (l *Loop[B]) runEpoch(ctx context.Context, r *loopRun, e *loopEpoch) error {
	rank := l.Group.Rank()
	if r.out != nil {
		e.progress = newProgress(r.out, "step %d/%d", l.StepsPerEpoch, e.first,
			ProgressRecord{Phase: "train", Epoch: e.epoch + 1, Epochs: l.Epochs, Unit: orDefault(l.Unit, "img")})
	}
	nn.SetTraining(l.Model, true)
	e.start = time.Now()
	for b, err := range l.Batches(ctx, e.epoch, e.first) {
		if err != nil {
			return err
		}
		if e.step+e.first == l.StepsPerEpoch {
			break
		}
		gradNorm, err := l.step(ctx, r, e, b)
		if err != nil {
			return err
		}
		if err := l.record(ctx, r, e, gradNorm); err != nil {
			return err
		}
		if err := l.evaluate(ctx, r, e); err != nil {
			return fmt.Errorf("rank %d, epoch %d, step %d: %w", rank, e.epoch+1, e.first+e.step, err)
		}
		if err := l.saveStep(ctx, r, e); err != nil {
			return fmt.Errorf("rank %d, epoch %d, step %d: %w", rank, e.epoch+1, e.first+e.step, err)
		}
		if e.first+e.step < l.StepsPerEpoch {
			if err := l.stopAtBoundary(ctx, r, e); err != nil {
				return err
			}
		}
	}
	if done := e.first + e.step; done < l.StepsPerEpoch {
		return fmt.Errorf("epoch %d ended after %d of %d steps: the data has fewer batches", e.epoch+1, done, l.StepsPerEpoch)
	}
	return l.endEpoch(ctx, r, e)
}

// step trains on one batch: the learning rate, Step (forward and DDP backward), the flush on
// the epoch's last step, Clip, the optimizer step, the statistics and the progress bar. It
// returns Clip's gradient norm (0 without clipping).
func (l *Loop[B]) step(ctx context.Context, r *loopRun, e *loopEpoch, b B) (float64, error) {
	rank, world, steps := l.Group.Rank(), l.Group.Size(), l.StepsPerEpoch
	step := e.first + e.step // within the epoch, from 0
	if l.Schedule != nil {
		l.Optimizer.SetLR(l.Schedule.LR(e.epoch, step, steps))
	}
	l.Optimizer.ZeroGrad()
	res, err := l.Step(ctx, b)
	if err != nil {
		return 0, fmt.Errorf("rank %d, epoch %d, step %d: %w", rank, e.epoch+1, step+1, err)
	}
	if step == steps-1 { // the epoch's last step applies every late result (osp)
		if err := l.DDP.Flush(ctx); err != nil {
			return 0, fmt.Errorf("rank %d, epoch %d: %w", rank, e.epoch+1, err)
		}
	}
	var gradNorm float64
	if l.Clip != nil && l.MaxNorm > 0 { // on the synchronised gradients, as every rank has them
		gradNorm = l.Clip(l.DDP.Parameters(), l.MaxNorm)
	}
	l.Optimizer.Step()
	r.recLoss += res.Loss
	r.recSteps++
	e.lossSum += res.Loss * float64(res.N)
	e.correct += res.Correct
	e.seen += float64(res.N)
	r.samples += int64(res.N * world)
	e.step++
	r.iteration++
	if p := e.progress; p != nil {
		ips := (e.seen - float64(e.first)) * float64(world) / time.Since(e.start).Seconds()
		p.rec.Loss, p.rec.Acc, p.rec.Rate = e.lossSum/e.seen, e.correct/e.seen, ips
		detail := fmt.Sprintf("epoch %d/%d loss %.3f acc %.1f%% %.0f %s/s", e.epoch+1, l.Epochs, e.lossSum/e.seen, 100*e.correct/e.seen, ips, p.rec.Unit)
		if l.Describe != nil {
			detail = l.Describe(e.epoch, e.lossSum/e.seen, e.correct/e.seen, ips)
		}
		p.update(e.first+e.step, detail)
	}
	return gradNorm, nil
}

// record averages the loss since the last step record over the ranks and passes it to
// LogStep, every LogEvery optimizer steps of the run.
func (l *Loop[B]) record(ctx context.Context, r *loopRun, e *loopEpoch, gradNorm float64) error {
	if l.LogEvery <= 0 || r.iteration%int64(l.LogEvery) != 0 {
		return nil
	}
	r.recStat[0], r.recStat[1] = float32(r.recLoss), float32(r.recSteps)
	if err := comm.AllReduce(ctx, l.Group, tagStepStats, r.recStat, comm.Auto); err != nil {
		return fmt.Errorf("rank %d, epoch %d, step %d: step record: %w", l.Group.Rank(), e.epoch+1, e.first+e.step, err)
	}
	if l.LogStep != nil {
		rec := StepRecord{Step: r.iteration, Loss: float64(r.recStat[0]) / float64(r.recStat[1]), LR: l.Optimizer.LR(),
			GradNorm: gradNorm, TotalSec: time.Since(r.start).Seconds(), StepsPerEpoch: l.StepsPerEpoch}
		if err := l.LogStep(rec); err != nil {
			return err
		}
	}
	r.recLoss, r.recSteps = 0, 0
	return nil
}

// evaluate calls Eval every EvalEvery optimizer steps, except at an epoch's end (endEpoch's
// EndEpoch evaluates there), and leaves its time out of the epoch's.
func (l *Loop[B]) evaluate(ctx context.Context, r *loopRun, e *loopEpoch) error {
	if l.Eval == nil || l.EvalEvery <= 0 || r.iteration%int64(l.EvalEvery) != 0 || e.first+e.step >= l.StepsPerEpoch {
		return nil
	}
	t := time.Now()
	if err := l.Eval(withProgress(ctx, r.out), r.iteration); err != nil {
		return err
	}
	nn.SetTraining(l.Model, true)
	e.evalTime += time.Since(t)
	return nil
}

// saving reports whether the loop saves checkpoints.
func (l *Loop[B]) saving() bool { return l.Checkpoints != nil && l.Checkpoints.Dir != "" }

// saveStep saves a mid-epoch checkpoint every Checkpoints.Every optimizer steps (the
// epoch's end has its own, endEpoch's).
func (l *Loop[B]) saveStep(ctx context.Context, r *loopRun, e *loopEpoch) error {
	step := e.first + e.step
	if !l.saving() || l.Checkpoints.Every <= 0 || r.iteration%int64(l.Checkpoints.Every) != 0 || step >= l.StepsPerEpoch {
		return nil
	}
	r.saved = r.iteration
	_, err := l.save(ctx, e.position(r))
	return err
}

// endEpoch all-reduces the epoch's statistics, tells DDP the epoch ended (and averages the
// BatchNorm statistics under AverageBuffers), calls EndEpoch and saves the epoch's
// checkpoint.
func (l *Loop[B]) endEpoch(ctx context.Context, r *loopRun, e *loopEpoch) error {
	trainSec := (time.Since(e.start) - e.evalTime).Seconds()
	e.progress.Finish()
	stat := []float32{float32(e.lossSum), float32(e.correct), float32(e.seen)}
	if err := comm.AllReduce(ctx, l.Group, tagEpochStats, stat, comm.Auto); err != nil {
		return err
	}
	es := EpochStats{Epoch: e.epoch + 1, Steps: l.StepsPerEpoch, Loss: float64(stat[0]) / float64(stat[2]), Acc: float64(stat[1]) / float64(stat[2]),
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
		if err := l.EndEpoch(withProgress(ctx, r.out), es); err != nil {
			return err
		}
	}
	if l.saving() {
		r.saved = r.iteration
		if _, err := l.save(ctx, checkpoint.Position{Epoch: e.epoch + 1, Samples: r.samples, Iteration: r.iteration}); err != nil {
			return fmt.Errorf("rank %d, end of epoch %d: %w", l.Group.Rank(), e.epoch+1, err)
		}
	}
	return nil
}
