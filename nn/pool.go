package nn

import "github.com/spargo-dl/spargo/internal/kernels"

// MaxPool2d takes the maximum over Kernel×Kernel windows of NCHW input (PyTorch
// semantics: padding is -inf, floor output size). Stride defaults to Kernel when 0.
type MaxPool2d struct{ Kernel, Stride, Padding int }

// AvgPool2d averages over Kernel×Kernel windows; padded cells count in the divisor
// (PyTorch's count_include_pad=True default). Stride defaults to Kernel when 0.
type AvgPool2d struct{ Kernel, Stride, Padding int }

// poolGeom validates a pooling window on input shape s (stride 0 means the kernel
// size) and returns the effective stride and the output size.
func poolGeom(name string, s []int, k, stride, pad int) (st, oh, ow int, err error) {
	if stride == 0 {
		stride = k
	}
	if len(s) != 4 {
		return 0, 0, 0, errorf("nn.%s: input shape %v, want [N C H W]", name, s)
	}
	if k <= 0 || stride <= 0 || pad < 0 || 2*pad > k {
		return 0, 0, 0, errorf("nn.%s: kernel %d stride %d padding %d invalid (padding must be at most half the kernel)", name, k, stride, pad)
	}
	oh = (s[2]+2*pad-k)/stride + 1
	ow = (s[3]+2*pad-k)/stride + 1
	if oh <= 0 || ow <= 0 {
		return 0, 0, 0, errorf("nn.%s(k%d): input %v too small", name, k, s)
	}
	return stride, oh, ow, nil
}

// Forward pools x of shape [N, C, H, W].
func (p MaxPool2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail(s, nil)
	}
	stride, oh, ow, err := poolGeom("MaxPool2d", s, p.Kernel, p.Stride, p.Padding)
	if err != nil {
		return t.fail(s, err)
	}
	n, c, h, w := s[0], s[1], s[2], s[3]
	g := kernels.PoolGeom{Planes: n * c, H: h, W: w, K: p.Kernel, Stride: stride, Pad: p.Padding}
	y := t.newVar(t.tensor([]int{n, c, oh, ow}), false)
	arg := t.ibuf(n * c * oh * ow)
	kernels.MaxPool2dForward(g, y.Value.Data, arg, x.Value.Data)
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		kernels.MaxPool2dBackward(g, dx, dy, arg, !fresh)
	}, x)
	return y
}

// Forward pools x of shape [N, C, H, W].
func (p AvgPool2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail(s, nil)
	}
	stride, oh, ow, err := poolGeom("AvgPool2d", s, p.Kernel, p.Stride, p.Padding)
	if err != nil {
		return t.fail(s, err)
	}
	n, c, h, w := s[0], s[1], s[2], s[3]
	g := kernels.PoolGeom{Planes: n * c, H: h, W: w, K: p.Kernel, Stride: stride, Pad: p.Padding}
	y := t.newVar(t.tensor([]int{n, c, oh, ow}), false)
	kernels.AvgPool2dForward(g, y.Value.Data, x.Value.Data)
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		kernels.AvgPool2dBackward(g, dx, dy, !fresh)
	}, x)
	return y
}
