package nn

import (
	"math"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// BatchNorm2d normalises each channel of NCHW input, with PyTorch's semantics: in
// training it uses the batch statistics (biased variance) and updates the running
// statistics as running = (1-momentum)·running + momentum·batch with the unbiased
// variance; in evaluation it uses the running statistics. Defaults: momentum 0.1,
// eps 1e-5, weight 1, bias 0, running mean 0, running variance 1.
type BatchNorm2d struct {
	C                 int
	Momentum, Eps     float64
	Weight, Bias      *Param
	RunningMean       *Buffer
	RunningVar        *Buffer
	NumBatchesTracked *Buffer // a count, stored as float32 like every buffer
	training          bool
}

var (
	_ ParamOwner     = (*BatchNorm2d)(nil)
	_ BufferOwner    = (*BatchNorm2d)(nil)
	_ TrainingSetter = (*BatchNorm2d)(nil)
)

// NewBatchNorm2d returns a BatchNorm2d over c channels in training mode.
func NewBatchNorm2d(c int) *BatchNorm2d {
	bn := &BatchNorm2d{C: c, Momentum: 0.1, Eps: 1e-5,
		Weight: NewParam("weight", c), Bias: NewParam("bias", c),
		RunningMean: NewBuffer("running_mean", c), RunningVar: NewBuffer("running_var", c),
		NumBatchesTracked: NewBuffer("num_batches_tracked"), training: true}
	for i := range bn.Weight.Value.Data {
		bn.Weight.Value.Data[i] = 1
		bn.RunningVar.Value.Data[i] = 1
	}
	return bn
}

// OwnParams returns weight and bias.
func (bn *BatchNorm2d) OwnParams() []*Param { return []*Param{bn.Weight, bn.Bias} }

// OwnBuffers returns the running statistics and the batch counter.
func (bn *BatchNorm2d) OwnBuffers() []*Buffer {
	return []*Buffer{bn.RunningMean, bn.RunningVar, bn.NumBatchesTracked}
}

// SetTraining selects batch statistics (true) or running statistics (false).
func (bn *BatchNorm2d) SetTraining(training bool) { bn.training = training }

// Forward normalises x of shape [N, C, H, W] (or [N, C]).
func (bn *BatchNorm2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail(s, nil)
	}
	if (len(s) != 4 && len(s) != 2) || s[1] != bn.C {
		return t.failf(s, "nn.BatchNorm2d(%d): input shape %v, want [N %d H W]", bn.C, s, bn.C)
	}
	n, c := s[0], s[1]
	plane := 1
	if len(s) == 4 {
		plane = s[2] * s[3]
	}
	m := n * plane
	if bn.training && m < 2 {
		return t.failf(s, "nn.BatchNorm2d(%d): training needs more than one value per channel, input shape %v", bn.C, s)
	}
	xd := x.Value.Data
	w, b := t.Param(bn.Weight), t.Param(bn.Bias)
	y := t.newVar(t.tensor(s), false)
	yd := y.Value.Data
	// Per-channel mean and 1/sqrt(var+eps), kept for backward (plus scratch).
	stats := t.buf(3 * c)
	mean, invstd, scratch := stats[:c], stats[c:2*c], stats[2*c:]
	if bn.training {
		kernels.BatchNormForwardTrain(yd, xd, n, c, plane, w.Value.Data, b.Value.Data, bn.Eps, mean, scratch, invstd)
		rm, rv := bn.RunningMean.Value.Data, bn.RunningVar.Value.Data
		unbias := float64(m) / float64(m-1)
		for ch := 0; ch < c; ch++ {
			rm[ch] = float32((1-bn.Momentum)*float64(rm[ch]) + bn.Momentum*float64(mean[ch]))
			rv[ch] = float32((1-bn.Momentum)*float64(rv[ch]) + bn.Momentum*float64(scratch[ch])*unbias)
		}
		bn.NumBatchesTracked.Value.Data[0]++
	} else {
		// y = (x − running mean)·invstd·γ + β.
		scale := scratch
		for ch := 0; ch < c; ch++ {
			is := float32(1 / math.Sqrt(float64(bn.RunningVar.Value.Data[ch])+bn.Eps))
			mean[ch], invstd[ch] = bn.RunningMean.Value.Data[ch], is
			scale[ch] = is * w.Value.Data[ch]
		}
		kernels.BatchNormApply(yd, xd, n, c, plane, mean, scale, b.Value.Data)
	}
	training := bn.training
	t.record(y, func(dy []float32) {
		dw, db := w.grad(), b.grad()
		var dx []float32
		acc := true
		if x.needsGrad {
			var fresh bool
			dx, fresh = x.gradOverwrite()
			acc = !fresh
		}
		kernels.BatchNormBackward(dx, dy, xd, n, c, plane, mean, invstd, w.Value.Data, training, acc, dw, db)
	}, x, w, b)
	return y
}
