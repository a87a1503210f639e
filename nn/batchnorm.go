package nn

import "math"

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
	// Per-channel mean and 1/sqrt(var+eps), kept for backward.
	stats := t.buf(2 * c)
	mean, invstd := stats[:c], stats[c:]
	for ch := 0; ch < c; ch++ {
		var mu, v float64
		if bn.training {
			var sum float64
			for i := 0; i < n; i++ {
				for _, e := range xd[(i*c+ch)*plane : (i*c+ch+1)*plane] {
					sum += float64(e)
				}
			}
			mu = sum / float64(m)
			var ss float64
			for i := 0; i < n; i++ {
				for _, e := range xd[(i*c+ch)*plane : (i*c+ch+1)*plane] {
					d := float64(e) - mu
					ss += d * d
				}
			}
			v = ss / float64(m)
			rm, rv := bn.RunningMean.Value.Data, bn.RunningVar.Value.Data
			rm[ch] = float32((1-bn.Momentum)*float64(rm[ch]) + bn.Momentum*mu)
			rv[ch] = float32((1-bn.Momentum)*float64(rv[ch]) + bn.Momentum*ss/float64(m-1))
		} else {
			mu = float64(bn.RunningMean.Value.Data[ch])
			v = float64(bn.RunningVar.Value.Data[ch])
		}
		is := 1 / math.Sqrt(v+bn.Eps)
		mean[ch], invstd[ch] = float32(mu), float32(is)
		scale := float32(is) * w.Value.Data[ch]
		shift := b.Value.Data[ch] - float32(mu)*scale
		for i := 0; i < n; i++ {
			src := xd[(i*c+ch)*plane : (i*c+ch+1)*plane]
			dst := yd[(i*c+ch)*plane : (i*c+ch+1)*plane]
			for j, e := range src {
				dst[j] = e*scale + shift
			}
		}
	}
	if bn.training {
		bn.NumBatchesTracked.Value.Data[0]++
	}
	training := bn.training
	t.record(y, func(dy []float32) {
		dw, db := w.grad(), b.grad()
		var dx []float32
		if x.needsGrad {
			dx = x.grad()
		}
		for ch := 0; ch < c; ch++ {
			mu, is := mean[ch], invstd[ch]
			var sdy, sdyx float64 // Σ dy and Σ dy·x̂
			for i := 0; i < n; i++ {
				off := (i*c + ch) * plane
				for j, g := range dy[off : off+plane] {
					sdy += float64(g)
					sdyx += float64(g) * float64((xd[off+j]-mu)*is)
				}
			}
			dw[ch] += float32(sdyx)
			db[ch] += float32(sdy)
			if dx == nil {
				continue
			}
			gamma := w.Value.Data[ch]
			if !training {
				k := gamma * is
				for i := 0; i < n; i++ {
					off := (i*c + ch) * plane
					for j, g := range dy[off : off+plane] {
						dx[off+j] += g * k
					}
				}
				continue
			}
			// dx = γ·invstd/M · (M·dy − Σdy − x̂·Σdy·x̂)
			k := gamma * is / float32(m)
			a := float32(sdy)
			bb := float32(sdyx)
			fm := float32(m)
			for i := 0; i < n; i++ {
				off := (i*c + ch) * plane
				for j, g := range dy[off : off+plane] {
					xh := (xd[off+j] - mu) * is
					dx[off+j] += k * (fm*g - a - xh*bb)
				}
			}
		}
	}, x, w, b)
	return y
}
