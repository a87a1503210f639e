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
//
// With ChannelsLast set, 4-D input is channels-last, [N, H, W, C] (see
// ToChannelsLast), and the kernels walk it as N·H·W rows of C channels. The
// statistics are the same up to float32 rounding (the sums run in another order).
type BatchNorm2d struct {
	C                 int
	Momentum, Eps     float64
	Weight, Bias      *Param
	RunningMean       *Buffer
	RunningVar        *Buffer
	NumBatchesTracked *Buffer // a count, stored as float32 like every buffer
	ChannelsLast      bool
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

// Forward normalises x of shape [N, C, H, W] ([N, H, W, C] with ChannelsLast) or [N, C].
func (bn *BatchNorm2d) Forward(x *Var) *Var { return bn.forward("", x, nil, false) }

// ForwardReLU returns Relu(bn.Forward(x)) as one op: the BatchNorm statistics as in
// Forward, then one pass writing max(bn(x), 0), with no pre-rectifier tensor stored;
// its backward applies the rectifier's mask as the BatchNorm backward passes read the
// gradient. Values and gradients are bit-identical to the composition's, in training
// and in evaluation mode.
func (bn *BatchNorm2d) ForwardReLU(x *Var) *Var {
	return bn.forward(".ForwardReLU", x, nil, true)
}

// ForwardAddReLU returns Relu(Add(bn.Forward(x), r)) as one op — a residual block's
// sum with its shortcut r (shaped like x): one pass writes max(bn(x) + r, 0); backward
// writes r's gradient once (the rectifier's mask applied to the output gradient) and
// BatchNorm's backward reads it. Values and gradients are bit-identical to the
// composition's, in training and in evaluation mode.
func (bn *BatchNorm2d) ForwardAddReLU(x, r *Var) *Var {
	return bn.forward(".ForwardAddReLU", x, r, true)
}

// forward is Forward, rectified (after adding r, when non-nil) when relu is set; method
// names the op in error messages.
func (bn *BatchNorm2d) forward(method string, x, r *Var, relu bool) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken || (r != nil && r.broken) {
		return t.fail(s, nil)
	}
	cl := bn.ChannelsLast && len(s) == 4
	switch {
	case cl && s[3] != bn.C:
		return t.failf(s, "nn.BatchNorm2d(%d)%s: input shape %v, want [N H W %d] (channels last)", bn.C, method, s, bn.C)
	case !cl && ((len(s) != 4 && len(s) != 2) || s[1] != bn.C):
		return t.failf(s, "nn.BatchNorm2d(%d)%s: input shape %v, want [N %d H W]", bn.C, method, s, bn.C)
	}
	if r != nil && !sameShape(r.Value.Shape, s) {
		return t.failf(s, "nn.BatchNorm2d(%d)%s: input shape %v and residual shape %v differ", bn.C, method, s, r.Value.Shape)
	}
	n, c := s[0], bn.C
	plane := 1
	switch {
	case cl:
		plane = s[1] * s[2]
	case len(s) == 4:
		plane = s[2] * s[3]
	}
	m := n * plane
	if bn.training && m < 2 {
		return t.failf(s, "nn.BatchNorm2d(%d)%s: training needs more than one value per channel, input shape %v", bn.C, method, s)
	}
	xd := x.Value.Data
	var rd []float32
	if r != nil {
		rd = r.Value.Data
	}
	w, b := t.Param(bn.Weight), t.Param(bn.Bias)
	y := t.newVar(t.tensor(s), false)
	yd := y.Value.Data
	// Per-channel mean and 1/sqrt(var+eps), kept for backward (plus scratch).
	stats := t.buf(3 * c)
	mean, invstd, scratch := stats[:c], stats[c:2*c], stats[2*c:]
	if bn.training {
		switch {
		case cl && relu:
			kernels.BatchNormForwardTrainReLUNHWC(yd, xd, rd, m, c, w.Value.Data, b.Value.Data, bn.Eps, mean, scratch, invstd)
		case cl:
			kernels.BatchNormForwardTrainNHWC(yd, xd, m, c, w.Value.Data, b.Value.Data, bn.Eps, mean, scratch, invstd)
		case relu:
			kernels.BatchNormForwardTrainReLU(yd, xd, rd, n, c, plane, w.Value.Data, b.Value.Data, bn.Eps, mean, scratch, invstd)
		default:
			kernels.BatchNormForwardTrain(yd, xd, n, c, plane, w.Value.Data, b.Value.Data, bn.Eps, mean, scratch, invstd)
		}
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
		switch {
		case cl && relu:
			kernels.BatchNormApplyReLUNHWC(yd, xd, rd, m, c, mean, scale, b.Value.Data)
		case cl:
			kernels.BatchNormApplyNHWC(yd, xd, m, c, mean, scale, b.Value.Data)
		case relu:
			kernels.BatchNormApplyReLU(yd, xd, rd, n, c, plane, mean, scale, b.Value.Data)
		default:
			kernels.BatchNormApply(yd, xd, n, c, plane, mean, scale, b.Value.Data)
		}
	}
	training := bn.training
	backward := func(dy []float32) {
		dw, db := w.grad(), b.grad()
		// g is the gradient BatchNorm's backward reads: dy, masked with yd > 0 on the
		// fly when mask is set (the rectified ops).
		g, mask := dy, relu
		if r != nil && r.needsGrad {
			// The composition's order: r's gradient (the masked dy), then x's.
			if dr, fresh := r.gradOverwrite(); fresh {
				kernels.ReluBackwardSet(dr, yd, dy)
				if r != x {
					g, mask = dr, false // dr holds exactly the masked gradient
				}
			} else {
				kernels.ReluBackwardAxpy(dr, yd, dy)
			}
		}
		var dx []float32
		acc := true
		if x.needsGrad {
			var fresh bool
			dx, fresh = x.gradOverwrite()
			acc = !fresh
		}
		switch {
		case cl && mask:
			kernels.BatchNormBackwardReLUNHWC(dx, g, yd, xd, m, c, mean, invstd, w.Value.Data, training, acc, dw, db)
		case cl:
			kernels.BatchNormBackwardNHWC(dx, g, xd, m, c, mean, invstd, w.Value.Data, training, acc, dw, db)
		case mask:
			kernels.BatchNormBackwardReLU(dx, g, yd, xd, n, c, plane, mean, invstd, w.Value.Data, training, acc, dw, db)
		default:
			kernels.BatchNormBackward(dx, g, xd, n, c, plane, mean, invstd, w.Value.Data, training, acc, dw, db)
		}
	}
	if r != nil {
		t.record(y, backward, x, w, b, r)
	} else {
		t.record(y, backward, x, w, b)
	}
	return y
}
