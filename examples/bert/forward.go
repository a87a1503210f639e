package main

import (
	"context"
	"errors"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// maskedPositions lists the positions of b that carry an MLM label (sample-major flat
// indices) and their labels, for BertForPreTraining.ForwardMaskedLM.
func maskedPositions(b datasets.MLMBatch) (positions, labels []int) {
	for i, l := range b.Labels {
		if l != datasets.IgnoreLabel {
			positions = append(positions, i)
			labels = append(labels, int(l))
		}
	}
	return positions, labels
}

// firstRows is b cut to its first n sequences.
func firstRows(b datasets.MLMBatch, n int) datasets.MLMBatch {
	L := b.SeqLen
	b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.Labels = b.InputIDs[:n*L], b.TokenTypeIDs[:n*L], b.AttentionMask[:n*L], b.Labels[:n*L]
	b.NextSentence, b.N = b.NextSentence[:n], n
	return b
}

// mlmForward runs the model on b through dp and returns the total pre-training loss (MLM +
// NSP), the MLM cross-entropy and the MLM and NSP logits with their labels.
func mlmForward(dp *ddp.DDP, model *models.BertForPreTraining, tape *nn.Tape, b datasets.MLMBatch) (loss, mlmLoss, mlm, nsp *nn.Var, labels, nspLabels []int) {
	positions, labels := maskedPositions(b)
	nspLabels = make([]int, b.N)
	for i, l := range b.NextSentence {
		nspLabels[i] = int(l)
	}
	tape.Reset()
	dp.BeforeForward(tape)
	mlm, nsp = model.ForwardMaskedLM(tape, b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.N, b.SeqLen, positions)
	mlmLoss = nn.CrossEntropyIgnore(mlm, labels, nn.IgnoreIndex)
	loss = mlmLoss
	if nsp != nil {
		loss = nn.Add(mlmLoss, nn.CrossEntropyIgnore(nsp, nspLabels, nn.IgnoreIndex))
	}
	return loss, mlmLoss, mlm, nsp, labels, nspLabels
}

// tagMLMEval is the all-reduce tag of the held-out evaluation's sums.
const tagMLMEval = 104

// evaluate runs the model (recording off, dropout off) over the held-out pairs, split across
// ranks, and returns the masked-LM loss and accuracy and the NSP accuracy over all of them.
// Rank 0 shows its progress in sequences over all ranks (every rank walks every batch).
func (w *mlmWorker) evaluate(ctx context.Context, dp *ddp.DDP, model *models.BertForPreTraining, tape *nn.Tape, ld *datasets.MLMLoader) (loss, acc, nspAcc float64, err error) {
	g := w.group
	nn.SetTraining(model, false)
	tape.SetGradEnabled(false)
	defer tape.SetGradEnabled(true)
	var sums [5]float32 // loss × tokens, correct tokens, tokens, correct NSP, sequences
	i, seen := 0, 0
	total := w.corpus.Valid.Len()
	if limit := w.cfg.EvalLimit; limit > 0 && limit < total {
		total = limit
	}
	progress := train.StartProgress(ctx, total, "seq")
	defer progress.Finish()
	for b, err := range ld.Epoch(ctx, 0) {
		if err != nil {
			return 0, 0, 0, err
		}
		if w.cfg.EvalLimit > 0 && seen >= w.cfg.EvalLimit {
			break
		}
		if w.cfg.EvalLimit > 0 && seen+b.N > w.cfg.EvalLimit {
			b = firstRows(b, w.cfg.EvalLimit-seen)
		}
		seen += b.N
		mine := i%g.Size() == g.Rank()
		i++
		if !mine { // another rank's batch: counted as it goes by
			progress.Add(b.N)
			continue
		}
		_, mlmLoss, mlm, nsp, labels, nspLabels := mlmForward(dp, model, tape, b)
		if err := tape.Err(); err != nil {
			return 0, 0, 0, err
		}
		sums[0] += mlmLoss.Item() * float32(len(labels))
		sums[1] += float32(nn.Accuracy(mlm.Value, labels))
		sums[2] += float32(len(labels))
		if nsp != nil {
			sums[3] += float32(nn.Accuracy(nsp.Value, nspLabels))
			sums[4] += float32(b.N)
		}
		progress.Add(b.N)
	}
	s := sums[:]
	if err := comm.AllReduce(ctx, g, tagMLMEval, s, comm.Auto); err != nil {
		return 0, 0, 0, err
	}
	if s[2] == 0 {
		return 0, 0, 0, errors.New("evaluation saw no masked tokens")
	}
	if s[4] > 0 {
		nspAcc = float64(s[3] / s[4])
	}
	return float64(s[0] / s[2]), float64(s[1] / s[2]), nspAcc, nil
}
