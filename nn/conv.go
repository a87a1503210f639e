package nn

import (
	"math"
	"math/rand/v2"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// Conv2d is a 2-D convolution over NCHW input with a square kernel, PyTorch's Conv2d
// semantics (cross-correlation, zero padding). Weight has shape [Out, In, K, K].
//
// The whole batch goes through one im2col and one GEMM: col is [In·K·K, N·OH·OW], so the
// GEMM is wide even for the 2×2 maps at the end of VGG.
type Conv2d struct {
	In, Out, Kernel, Stride, Padding int
	Weight                           *Param
	Bias                             *Param // nil without bias
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

// Forward convolves x of shape [N, In, H, W].
func (c *Conv2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail([]int{1, c.Out, 1, 1}, nil)
	}
	if len(s) != 4 || s[1] != c.In {
		return t.failf([]int{1, c.Out, 1, 1}, "nn.Conv2d(%d→%d, k%d): input shape %v, want [N %d H W]", c.In, c.Out, c.Kernel, s, c.In)
	}
	g := kernels.ConvGeom{N: s[0], C: s[1], H: s[2], W: s[3], KH: c.Kernel, KW: c.Kernel,
		PadH: c.Padding, PadW: c.Padding, StrideH: c.Stride, StrideW: c.Stride}
	oh, ow := g.OutH(), g.OutW()
	if oh <= 0 || ow <= 0 || c.Stride <= 0 {
		return t.failf([]int{1, c.Out, 1, 1}, "nn.Conv2d(%d→%d, k%d, stride %d, pad %d): input %v gives an empty output", c.In, c.Out, c.Kernel, c.Stride, c.Padding, s)
	}
	n, plane := s[0], oh*ow
	kdim, cols := g.ColRows(), g.ColCols()
	col := t.buf(kdim * cols)
	kernels.Im2col(g, x.Value.Data, col)
	w := t.Param(c.Weight)
	out := t.buf(c.Out * cols) // [Out, N·plane]
	kernels.Sgemm(false, false, c.Out, cols, kdim, 1, w.Value.Data, kdim, col, cols, 0, out, cols)
	y := t.newVar(t.tensor([]int{n, c.Out, oh, ow}), false)
	yd := y.Value.Data
	inputs := []*Var{x, w}
	var b *Var
	if c.Bias != nil {
		b = t.Param(c.Bias)
		inputs = append(inputs, b)
	}
	// [Out, N, plane] → [N, Out, plane], adding the bias.
	for o := 0; o < c.Out; o++ {
		var bias float32
		if b != nil {
			bias = b.Value.Data[o]
		}
		for i := 0; i < n; i++ {
			src := out[o*cols+i*plane : o*cols+(i+1)*plane]
			dst := yd[(i*c.Out+o)*plane : (i*c.Out+o+1)*plane]
			if bias == 0 {
				copy(dst, src)
			} else {
				for j, v := range src {
					dst[j] = v + bias
				}
			}
		}
	}
	t.record(y, func(dy []float32) {
		dyT := out // reuse the forward scratch: [Out, N·plane]
		for o := 0; o < c.Out; o++ {
			for i := 0; i < n; i++ {
				copy(dyT[o*cols+i*plane:o*cols+(i+1)*plane], dy[(i*c.Out+o)*plane:(i*c.Out+o+1)*plane])
			}
		}
		kernels.Sgemm(false, true, c.Out, kdim, cols, 1, dyT, cols, col, cols, 1, w.grad(), kdim)
		if b != nil {
			db := b.grad()
			for o := 0; o < c.Out; o++ {
				db[o] += kernels.Sum(dyT[o*cols : (o+1)*cols])
			}
		}
		if x.needsGrad {
			dcol := col // the forward columns are no longer needed
			kernels.Sgemm(true, false, kdim, cols, c.Out, 1, w.Value.Data, kdim, dyT, cols, 0, dcol, cols)
			kernels.Col2im(g, dcol, x.grad())
		}
	}, inputs...)
	return y
}
