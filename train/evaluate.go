package train

import (
	"context"
	"fmt"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// evalTag is the all-reduce tag of Evaluate's sums (below DDP's bucket tags).
const evalTag = 101

// Evaluate runs model (through dp, with the tape's recording off, so a hook's late results
// leave the true parameters in place) over the batches of ld and returns the mean
// cross-entropy and the accuracy. The batches are split across ranks (batch i on rank
// i mod P) and the sums all-reduced; replicas are identical, so this equals one rank
// evaluating everything. limit > 0 stops after that many images. sample is one input's
// shape, e.g. {3, 32, 32}. The model is left in evaluation mode. Called from a Loop's
// EndEpoch or Eval, rank 0 shows its progress (StartProgress).
func Evaluate(ctx context.Context, g comm.Group, dp *ddp.DDP, model nn.Module, tape *nn.Tape, ld *datasets.Loader, limit int, sample ...int) (loss, acc float64, err error) {
	nn.SetTraining(model, false)
	tape.SetGradEnabled(false)
	defer tape.SetGradEnabled(true)
	per := 1
	for _, d := range sample {
		per *= d
	}
	var sums [3]float32
	i, seen := 0, 0
	total := ld.NumSamples()
	if limit > 0 && limit < total {
		total = limit
	}
	progress := StartProgress(ctx, total, "img") // rank 0's, under a Loop with Progress
	defer progress.Finish()
	for b, err := range ld.Epoch(ctx, 0) {
		if err != nil {
			return 0, 0, err
		}
		if limit > 0 && seen >= limit {
			break
		}
		n := b.N
		if limit > 0 && seen+n > limit {
			n = limit - seen
		}
		seen += n
		mine := i%g.Size() == g.Rank()
		i++
		if !mine { // another rank's batch: counted as it goes by
			progress.Add(n)
			continue
		}
		x, err := nn.FromSlice(b.X[:n*per], append([]int{n}, sample...)...)
		if err != nil {
			return 0, 0, err
		}
		tape.Reset()
		logits := dp.Forward(tape.Const(x))
		l := nn.CrossEntropy(logits, b.Y[:n])
		if err := tape.Err(); err != nil {
			return 0, 0, err
		}
		sums[0] += l.Item() * float32(n)
		sums[1] += float32(nn.Accuracy(logits.Value, b.Y[:n]))
		sums[2] += float32(n)
		progress.Add(n)
	}
	s := sums[:]
	if err := comm.AllReduce(ctx, g, evalTag, s, comm.Auto); err != nil {
		return 0, 0, err
	}
	if s[2] == 0 {
		return 0, 0, fmt.Errorf("evaluation saw no test images")
	}
	return float64(s[0] / s[2]), float64(s[1] / s[2]), nil
}

// ClassifierStep is a Loop's Step for a classifier trained with cross-entropy: it runs the
// batch (inputs of shape sample, e.g. 3, 32, 32) forward through dp on tape and backward
// with dp.Backward, and reports the loss and the correct predictions.
func ClassifierStep(dp *ddp.DDP, tape *nn.Tape, sample ...int) func(context.Context, datasets.Batch) (StepResult, error) {
	shape := append([]int{0}, sample...)
	return func(ctx context.Context, b datasets.Batch) (StepResult, error) {
		shape[0] = b.N
		x, err := nn.FromSlice(b.X, shape...)
		if err != nil {
			return StepResult{}, err
		}
		tape.Reset()
		tape.SetGradEnabled(true)
		logits := dp.Forward(tape.Const(x))
		loss := nn.CrossEntropy(logits, b.Y)
		if err := dp.Backward(ctx, loss); err != nil {
			return StepResult{}, err
		}
		return StepResult{Loss: float64(loss.Item()), Correct: float64(nn.Accuracy(logits.Value, b.Y)), N: b.N}, nil
	}
}
