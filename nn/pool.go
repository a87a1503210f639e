package nn

import "github.com/spargo-dl/spargo/internal/kernels"

// MaxPool2d takes the maximum over Kernel×Kernel windows of NCHW input (PyTorch
// semantics: padding is -inf, floor output size). Stride defaults to Kernel when 0.
// With ChannelsLast, input and output are [N, H, W, C]; the values and the
// gradients are the same, bit for bit.
type MaxPool2d struct {
	Kernel, Stride, Padding int
	ChannelsLast            bool
}

// AvgPool2d averages over Kernel×Kernel windows; padded cells count in the divisor
// (PyTorch's count_include_pad=True default). Stride defaults to Kernel when 0.
// With ChannelsLast, input and output are [N, H, W, C].
type AvgPool2d struct {
	Kernel, Stride, Padding int
	ChannelsLast            bool
}

// poolGeom validates a pooling window on input shape s, channels last when cl
// (stride 0 means the kernel size), and returns the kernels' geometry (Planes: N·C,
// or N when channels last), the channel count and the output shape.
func poolGeom(name string, s []int, k, stride, pad int, cl bool) (g kernels.PoolGeom, c int, out []int, err error) {
	if stride == 0 {
		stride = k
	}
	if len(s) != 4 {
		if cl {
			return g, 0, nil, errorf("nn.%s: input shape %v, want [N H W C] (channels last)", name, s)
		}
		return g, 0, nil, errorf("nn.%s: input shape %v, want [N C H W]", name, s)
	}
	n, c, h, w := s[0], s[1], s[2], s[3]
	if cl {
		h, w, c = s[1], s[2], s[3]
	}
	if k <= 0 || stride <= 0 || pad < 0 || 2*pad > k {
		return g, 0, nil, errorf("nn.%s: kernel %d stride %d padding %d invalid (padding must be at most half the kernel)", name, k, stride, pad)
	}
	oh := (h+2*pad-k)/stride + 1
	ow := (w+2*pad-k)/stride + 1
	if oh <= 0 || ow <= 0 {
		return g, 0, nil, errorf("nn.%s(k%d): input %v too small", name, k, s)
	}
	g = kernels.PoolGeom{Planes: n * c, H: h, W: w, K: k, Stride: stride, Pad: pad}
	if cl {
		return kernels.PoolGeom{Planes: n, H: h, W: w, K: k, Stride: stride, Pad: pad}, c, []int{n, oh, ow, c}, nil
	}
	return g, c, []int{n, c, oh, ow}, nil
}

// Forward pools x of shape [N, C, H, W] ([N, H, W, C] with ChannelsLast).
func (p MaxPool2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail(s, nil)
	}
	g, c, out, err := poolGeom("MaxPool2d", s, p.Kernel, p.Stride, p.Padding, p.ChannelsLast)
	if err != nil {
		return t.fail(s, err)
	}
	y := t.newVar(t.tensor(out), false)
	arg := t.ibuf(len(y.Value.Data))
	if p.ChannelsLast {
		kernels.MaxPool2dForwardNHWC(g, c, y.Value.Data, arg, x.Value.Data)
	} else {
		kernels.MaxPool2dForward(g, y.Value.Data, arg, x.Value.Data)
	}
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		if p.ChannelsLast {
			kernels.MaxPool2dBackwardNHWC(g, c, dx, dy, arg, !fresh)
		} else {
			kernels.MaxPool2dBackward(g, dx, dy, arg, !fresh)
		}
	}, x)
	return y
}

// Forward pools x of shape [N, C, H, W] ([N, H, W, C] with ChannelsLast).
func (p AvgPool2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail(s, nil)
	}
	g, c, out, err := poolGeom("AvgPool2d", s, p.Kernel, p.Stride, p.Padding, p.ChannelsLast)
	if err != nil {
		return t.fail(s, err)
	}
	y := t.newVar(t.tensor(out), false)
	if p.ChannelsLast {
		kernels.AvgPool2dForwardNHWC(g, c, y.Value.Data, x.Value.Data)
	} else {
		kernels.AvgPool2dForward(g, y.Value.Data, x.Value.Data)
	}
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		if p.ChannelsLast {
			kernels.AvgPool2dBackwardNHWC(g, c, dx, dy, !fresh)
		} else {
			kernels.AvgPool2dBackward(g, dx, dy, !fresh)
		}
	}, x)
	return y
}
