package train

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
)

// tagStop is the all-reduce tag of the ranks' agreement to stop at a step boundary.
const tagStop = 105

// StoppedError is what Loop.Run returns when its context asked it to stop
// (cluster.NotifyGraceful's first SIGINT or SIGTERM, cluster.WithStopper): the run stopped at
// a step boundary, after saving a checkpoint when it has a Checkpointer with a Dir.
type StoppedError struct {
	Cause       error  // the *cluster.SignalError, or why another rank stopped
	Epoch, Step int    // where it stopped: epoch from 1, the steps of it done
	Checkpoint  string // the checkpoint saved there ("" without -checkpoint)
}

func (e *StoppedError) Error() string {
	s := fmt.Sprintf("stopped at epoch %d, step %d (%v)", e.Epoch, e.Step, e.Cause)
	if e.Checkpoint != "" {
		return s + ": checkpoint " + e.Checkpoint + "; -resume continues from it"
	}
	return s + ": no checkpoint saved (no -checkpoint)"
}

func (e *StoppedError) Unwrap() error { return e.Cause }

// errOtherRank is a StoppedError's cause on a rank that was not asked itself.
var errOtherRank = errors.New("another rank was asked to stop")

// position is where a mid-epoch checkpoint of e resumes.
func (e *loopEpoch) position(r *loopRun) checkpoint.Position {
	return checkpoint.Position{Epoch: e.epoch, Step: e.first + e.step, Samples: r.samples, Iteration: r.iteration, Totals: e.totals()}
}

// stopAtBoundary is called by every rank between two steps (and between two epochs): when
// ctx carries a stop request (cluster.Stopping), the ranks agree whether any of them was
// asked to stop (one all-reduce of one value, so that all stop at the same step), and if so
// they save a checkpoint there (unless one was just saved) and return a *StoppedError. It
// costs nothing without a stop request in ctx.
func (l *Loop[B]) stopAtBoundary(ctx context.Context, r *loopRun, e *loopEpoch) error {
	cause, ok := cluster.Stopping(ctx)
	if !ok {
		return nil
	}
	flag := []float32{0}
	if cause != nil {
		flag[0] = 1
	}
	if err := comm.AllReduce(ctx, l.Group, tagStop, flag, comm.Auto); err != nil {
		return fmt.Errorf("rank %d, epoch %d: agree on stopping: %w", l.Group.Rank(), e.epoch+1, err)
	}
	if flag[0] == 0 {
		return nil
	}
	if cause == nil {
		cause = errOtherRank
	}
	e.progress.Finish()
	stopped := &StoppedError{Cause: cause, Epoch: e.epoch + 1, Step: e.first + e.step}
	if l.saving() {
		if r.saved == r.iteration {
			stopped.Checkpoint = l.Checkpoints.Dir
			if path, err := checkpoint.Latest(l.Checkpoints.Dir); err == nil {
				stopped.Checkpoint = path
			}
		} else {
			path, err := l.save(ctx, e.position(r))
			if err != nil {
				return fmt.Errorf("rank %d: %v: save a checkpoint: %w", l.Group.Rank(), cause, err)
			}
			stopped.Checkpoint = path
		}
	}
	if l.Group.Rank() == 0 {
		slog.Warn("training stopped", "cause", cause.Error(), "epoch", stopped.Epoch, "step", stopped.Step, "checkpoint", stopped.Checkpoint)
	}
	return stopped
}
