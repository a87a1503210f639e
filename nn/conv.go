package nn

import (
	"math"
	"math/rand/v2"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// Conv2d is a 2-D convolution over NCHW input with a square kernel, PyTorch's Conv2d
// semantics (cross-correlation, zero padding). Weight has shape [Out, In, K, K].
//
// The whole batch goes through one GEMM per pass. With at least 16
// input channels (kernels.UseConvNHWC), x is copied once into a zero-padded
// NHWC image and an indirect GEMM reads each output pixel's K·K channel runs
// in place (kernels.ConvNHWC); the result comes back to NCHW with the bias in
// one pass. Otherwise the column matrix [In·K·K, N·OH·OW] is kept implicit: the
// GEMM packs its panels straight from the image (kernels.SgemmIm2col), so the
// GEMM is wide even for the 2×2 maps at the end of VGG and no column matrix is
// ever stored. The weight gradient packs
// im2col(x)ᵀ, from an NHWC copy of x when it has enough channels
// (kernels.ConvWeightGrad); the input gradient of a stride-1 convolution is a
// convolution of dy with the flipped kernel, run through the same GEMM.
// SPARGO_CONV=winograd runs stride-1 3×3 forward and input-gradient passes through
// Winograd F(2×2,3×3) instead (kernels.UseWinograd).
//
// With ChannelsLast set, input and output are channels-last, [N, H, W, C] (see
// ToChannelsLast): the indirect GEMM reads the input (zero-padded by a row copy, or
// in place without padding) and writes the output where they lie, and backward reads
// the output gradient in place, so no layout pass runs (whatever SPARGO_CONV says:
// its im2col and Winograd paths are NCHW's). The weight keeps its
// [Out, In, K, K] layout, so checkpoints are the same in both modes.
type Conv2d struct {
	In, Out, Kernel, Stride, Padding int
	Weight                           *Param
	Bias                             *Param // nil without bias
	ChannelsLast                     bool
}

var _ ParamOwner = (*Conv2d)(nil)

// NewConv2d returns a convolution with PyTorch's default initialisation drawn from rng.
func NewConv2d(in, out, kernel, stride, padding int, bias bool, rng *rand.Rand) *Conv2d {
	c := &Conv2d{In: in, Out: out, Kernel: kernel, Stride: stride, Padding: padding,
		Weight: NewParam("weight", out, in, kernel, kernel)}
	fanIn := in * kernel * kernel
	KaimingUniformDefault(c.Weight.Value.Data, fanIn, rng)
	if bias {
		c.Bias = NewParam("bias", out)
		Uniform(c.Bias.Value.Data, 1/math.Sqrt(float64(fanIn)), rng)
	}
	return c
}

// OwnParams returns weight and bias.
func (c *Conv2d) OwnParams() []*Param {
	if c.Bias == nil {
		return []*Param{c.Weight}
	}
	return []*Param{c.Weight, c.Bias}
}

// Forward convolves x of shape [N, In, H, W] ([N, H, W, In] with ChannelsLast).
func (c *Conv2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail([]int{1, c.Out, 1, 1}, nil)
	}
	g, failed := c.geometry(x)
	if failed != nil {
		return failed
	}
	w, b, inputs := c.params(x)
	if c.ChannelsLast {
		return c.forwardNHWC(x, g, w, b, inputs)
	}
	oh, ow := g.OutH(), g.OutW()
	n, plane := s[0], oh*ow
	kdim, cols := g.ColRows(), g.ColCols()
	xd := x.Value.Data
	y := t.newVar(t.tensor([]int{n, c.Out, oh, ow}), false)
	var bias []float32
	if b != nil {
		bias = b.Value.Data
	}
	// out[Out, N·plane] is scratch for the backward pass's dyᵀ, and the
	// forward GEMM's result: W · im2col(x), packed straight from x, or
	// (NHWC path) y as [N·plane, Out] from the padded NHWC copy xp of x,
	// which the weight gradient reads again.
	out := t.buf(c.Out * cols)
	var xp []float32
	switch {
	case kernels.UseWinograd(g):
		kernels.WinogradConv3x3(g, xd, w.Value.Data, c.Out, false, bias, y.Value.Data, false)
	case kernels.UseConvNHWC(g):
		xp = t.buf(kernels.PaddedLen(g))
		kernels.PadNHWC(g, xd, xp)
		kernels.ConvNHWC(g, xp, w.Value.Data, c.Out, false, out)
		kernels.NHWCToNCHW(y.Value.Data, out, n, plane, c.Out, bias, false)
	default:
		kernels.SgemmIm2col(c.Out, 1, w.Value.Data, kdim, g, xd, 0, out, cols)
		kernels.CNToNC(y.Value.Data, out, c.Out, n, plane, bias, false)
	}
	t.record(y, func(dy []float32) {
		var dyT []float32 // dY as [Out, N·plane], made only where something reads it
		if xp != nil && b == nil && (!x.needsGrad || stride1InputGrad(g)) {
			// The weight gradient reads each image's rows of dY where they lie.
			kernels.ConvWeightGradNHWCPlanes(g, xp, dy, c.Out, w.grad())
		} else {
			dyT = out // reuse the forward scratch
			kernels.NCToCN(dyT, dy, n, c.Out, plane)
			if xp != nil {
				kernels.ConvWeightGradNHWC(g, xp, dyT, c.Out, cols, w.grad())
			} else {
				kernels.ConvWeightGrad(g, xd, dyT, c.Out, cols, w.grad())
			}
			if b != nil {
				db := b.grad()
				for o := 0; o < c.Out; o++ {
					db[o] += kernels.Sum(dyT[o*cols : (o+1)*cols])
				}
			}
		}
		if x.needsGrad {
			dx, fresh := x.gradOverwrite()
			c.inputGrad(t, g, w.Value.Data, dy, dyT, dx, !fresh)
		}
	}, inputs...)
	return y
}

// stride1InputGrad reports whether inputGrad takes its stride-1 way for g,
// which reads dy only (not dyT).
func stride1InputGrad(g kernels.ConvGeom) bool {
	return g.StrideH == 1 && g.StrideW == 1 && g.PadH <= g.KH-1 && g.PadW <= g.KW-1
}

// inputGrad writes the input gradient into dx (adds it when accumulate is set). A stride-1 convolution's
// input gradient is itself a stride-1 convolution of dy (NCHW) with the
// flipped, transposed kernel and padding K-1-P, so it runs through the same
// implicit GEMM as the forward pass; other strides go through an explicit
// column matrix (from dyT, dy as [Out, N·OH·OW]) and Col2im.
func (c *Conv2d) inputGrad(t *Tape, g kernels.ConvGeom, w, dy, dyT, dx []float32, accumulate bool) {
	oh, ow := g.OutH(), g.OutW()
	if stride1InputGrad(g) {
		gt := kernels.ConvGeom{N: g.N, C: c.Out, H: oh, W: ow, KH: g.KH, KW: g.KW,
			PadH: g.KH - 1 - g.PadH, PadW: g.KW - 1 - g.PadW, StrideH: 1, StrideW: 1}
		if kernels.UseWinograd(gt) {
			kernels.WinogradConv3x3(gt, dy, w, c.In, true, nil, dx, accumulate)
			return
		}
		plane := g.H * g.W
		if kernels.UseConvNHWC(gt) {
			dyp := t.buf(kernels.PaddedLen(gt))
			kernels.PadNHWC(gt, dy, dyp)
			dxm := t.buf(g.N * plane * c.In) // [N·H·W, In]
			kernels.ConvNHWC(gt, dyp, w, c.In, true, dxm)
			kernels.NHWCToNCHW(dx, dxm, g.N, plane, c.In, nil, accumulate)
			return
		}
		dxm := t.buf(c.In * g.N * plane) // [In, N·H·W]
		kernels.SgemmFlippedKernelIm2col(w, c.Out, c.In, gt, dy, dxm, g.N*plane)
		kernels.CNToNC(dx, dxm, c.In, g.N, plane, nil, accumulate)
		return
	}
	kdim, cols := g.ColRows(), g.ColCols()
	dcol := t.buf(kdim * cols)
	kernels.Sgemm(true, false, kdim, cols, c.Out, 1, w, kdim, dyT, cols, 0, dcol, cols)
	if !accumulate {
		clear(dx)
	}
	kernels.Col2im(g, dcol, dx)
}

// geometry checks x's shape against c (in c's layout) and returns the
// convolution's geometry, or the result of the failed op.
func (c *Conv2d) geometry(x *Var) (kernels.ConvGeom, *Var) {
	t, s := x.tape, x.Value.Shape
	fail, layout := []int{1, c.Out, 1, 1}, ""
	if c.ChannelsLast {
		fail, layout = []int{1, 1, 1, c.Out}, ", channels last"
	}
	var g kernels.ConvGeom
	switch {
	case c.ChannelsLast && (len(s) != 4 || s[3] != c.In):
		return g, t.failf(fail, "nn.Conv2d(%d→%d, k%d, channels last): input shape %v, want [N H W %d]", c.In, c.Out, c.Kernel, s, c.In)
	case !c.ChannelsLast && (len(s) != 4 || s[1] != c.In):
		return g, t.failf(fail, "nn.Conv2d(%d→%d, k%d): input shape %v, want [N %d H W]", c.In, c.Out, c.Kernel, s, c.In)
	}
	g = kernels.ConvGeom{N: s[0], C: c.In, H: s[2], W: s[3], KH: c.Kernel, KW: c.Kernel,
		PadH: c.Padding, PadW: c.Padding, StrideH: c.Stride, StrideW: c.Stride}
	if c.ChannelsLast {
		g.H, g.W = s[1], s[2]
	}
	if g.OutH() <= 0 || g.OutW() <= 0 || c.Stride <= 0 {
		return g, t.failf(fail, "nn.Conv2d(%d→%d, k%d, stride %d, pad %d%s): input %v gives an empty output", c.In, c.Out, c.Kernel, c.Stride, c.Padding, layout, s)
	}
	return g, nil
}

// params records c's weight and bias (nil without one) on x's tape and
// returns them with the op's inputs.
func (c *Conv2d) params(x *Var) (w, b *Var, inputs []*Var) {
	w = x.tape.Param(c.Weight)
	inputs = []*Var{x, w}
	if c.Bias != nil {
		b = x.tape.Param(c.Bias)
		inputs = append(inputs, b)
	}
	return w, b, inputs
}

// forwardNHWC is Forward with ChannelsLast: x is [N, H, W, In], the result
// [N, OH, OW, Out].
func (c *Conv2d) forwardNHWC(x *Var, g kernels.ConvGeom, w, b *Var, inputs []*Var) *Var {
	t := x.tape
	oh, ow := g.OutH(), g.OutW()
	y := t.newVar(t.tensor([]int{g.N, oh, ow, c.Out}), false)
	xp := padNHWC(t, g, x.Value.Data)
	kernels.ConvNHWC(g, xp, w.Value.Data, c.Out, false, y.Value.Data)
	if b != nil {
		kernels.AddBiasNHWC(y.Value.Data, b.Value.Data)
	}
	t.record(y, func(dy []float32) {
		kernels.ConvWeightGradNHWCRows(g, xp, dy, c.Out, w.grad())
		if b != nil {
			kernels.BiasGradNHWC(b.grad(), dy)
		}
		if !x.needsGrad {
			return
		}
		dx, fresh := x.gradOverwrite()
		if !stride1InputGrad(g) {
			kernels.ConvInputGradNHWC(g, dy, w.Value.Data, c.Out, dx, !fresh)
			return
		}
		// The input gradient of a stride-1 convolution: dy, padded by K-1-P,
		// convolved with the flipped kernel.
		gt := kernels.ConvGeom{N: g.N, C: c.Out, H: oh, W: ow, KH: g.KH, KW: g.KW,
			PadH: g.KH - 1 - g.PadH, PadW: g.KW - 1 - g.PadW, StrideH: 1, StrideW: 1}
		dyp := padNHWC(t, gt, dy)
		if fresh {
			kernels.ConvNHWC(gt, dyp, w.Value.Data, c.In, true, dx)
		} else {
			kernels.ConvNHWCAdd(gt, dyp, w.Value.Data, c.In, true, dx)
		}
	}, inputs...)
	return y
}

// padNHWC returns the channels-last image x of geometry g with its zero
// border, as ConvNHWC reads it: x itself when g has no padding.
func padNHWC(t *Tape, g kernels.ConvGeom, x []float32) []float32 {
	if g.PadH == 0 && g.PadW == 0 {
		return x
	}
	xp := t.buf(kernels.PaddedLen(g))
	kernels.PadNHWCFromNHWC(g, x, xp)
	return xp
}
