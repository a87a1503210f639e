package nn

import "github.com/spargo-dl/spargo/internal/kernels"

// Channels-last activations. A convolutional network can keep its
// activations as [N, H, W, C] (PyTorch's channels_last memory format, here
// with the shape saying so): the convolutions then read and write them in
// place, where the NCHW path copies every convolution's input into an NHWC
// image and its output back. The layers with a ChannelsLast option (Conv2d,
// BatchNorm2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, SubsamplePad) take and
// return channels-last tensors when it is set; element-wise ops do not care.
// ToChannelsLast and ToChannelsFirst convert at the network's edges (a model's
// input images, and before a Flatten of a map larger than 1×1, whose element
// order would otherwise differ from PyTorch's).

// ToChannelsLast returns x [N, C, H, W] as [N, H, W, C].
func ToChannelsLast(x *Var) *Var {
	return layoutOp(x, "nn.ToChannelsLast", "[N C H W]", true)
}

// ToChannelsFirst returns x [N, H, W, C] as [N, C, H, W].
func ToChannelsFirst(x *Var) *Var {
	return layoutOp(x, "nn.ToChannelsFirst", "[N H W C]", false)
}

// layoutOp moves the channels of x last (toLast) or first.
func layoutOp(x *Var, name, want string, toLast bool) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken || len(s) != 4 {
		if x.broken {
			return t.fail([]int{1, 1, 1, 1}, nil)
		}
		return t.failf([]int{1, 1, 1, 1}, "%s: input shape %v, want %s", name, s, want)
	}
	n, c, plane, out := s[0], s[1], s[2]*s[3], []int{s[0], s[2], s[3], s[1]}
	if !toLast {
		c, plane, out = s[3], s[1]*s[2], []int{s[0], s[3], s[1], s[2]}
	}
	y := t.newVar(t.tensor(out), false)
	// first moves [n, plane, c] to [n, c, plane]; last the other way.
	first := func(dst, src []float32, acc bool) { kernels.NHWCToNCHW(dst, src, n, plane, c, nil, acc) }
	last := func(dst, src []float32, acc bool) {
		if !acc {
			kernels.NCHWToNHWC(dst, src, n, c, plane)
			return
		}
		tmp := t.buf(len(dst))
		kernels.NCHWToNHWC(tmp, src, n, c, plane)
		kernels.Add(dst, dst, tmp)
	}
	fwd, bwd := first, last
	if toLast {
		fwd, bwd = last, first
	}
	fwd(y.Value.Data, x.Value.Data, false)
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		bwd(dx, dy, !fresh)
	}, x)
	return y
}
