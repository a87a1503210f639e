package nn

// SubsamplePad takes every Stride-th row and column of NCHW input (x[:, :, ::Stride,
// ::Stride] in PyTorch, so the output is ceil(H/Stride)×ceil(W/Stride)) and adds Before
// zero channels in front and After behind: [N, C, H, W] → [N, Before+C+After, ⌈H/S⌉,
// ⌈W/S⌉]. It is the parameter-free "option A" shortcut of He et al.'s CIFAR ResNets,
// F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, planes//4, planes//4)) in the common PyTorch code.
// Stride 0 means 1. With ChannelsLast, input and output are channels-last, [N, H, W, C] →
// [N, ⌈H/S⌉, ⌈W/S⌉, Before+C+After]: each pixel's run of C channels gets Before zeros in
// front and After behind.
type SubsamplePad struct {
	Stride, Before, After int
	ChannelsLast          bool
}

// Forward subsamples and pads x.
func (p SubsamplePad) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	st := p.Stride
	if st == 0 {
		st = 1
	}
	if x.broken || len(s) != 4 || st < 0 || p.Before < 0 || p.After < 0 {
		out := []int{1, max(p.Before, 0) + max(p.After, 0) + 1, 1, 1}
		if x.broken {
			return t.fail(out, nil)
		}
		layout := "[N C H W]"
		if p.ChannelsLast {
			layout = "[N H W C]"
		}
		return t.failf(out, "nn.SubsamplePad(stride %d, channels +%d/+%d): input shape %v, want %s and non-negative options", p.Stride, p.Before, p.After, s, layout)
	}
	if p.ChannelsLast {
		return p.forwardNHWC(x, st)
	}
	n, c, h, w := s[0], s[1], s[2], s[3]
	oh, ow := (h+st-1)/st, (w+st-1)/st
	oc := p.Before + c + p.After
	y := t.newVar(t.tensor([]int{n, oc, oh, ow}), false)
	xd, yd := x.Value.Data, y.Value.Data
	clear(yd)
	for b := 0; b < n; b++ {
		for ch := 0; ch < c; ch++ {
			src := xd[(b*c+ch)*h*w : (b*c+ch+1)*h*w]
			dst := yd[(b*oc+p.Before+ch)*oh*ow : (b*oc+p.Before+ch+1)*oh*ow]
			for i := 0; i < oh; i++ {
				row := src[i*st*w:]
				for j := 0; j < ow; j++ {
					dst[i*ow+j] = row[j*st]
				}
			}
		}
	}
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		if fresh {
			clear(dx)
		}
		for b := 0; b < n; b++ {
			for ch := 0; ch < c; ch++ {
				dst := dx[(b*c+ch)*h*w : (b*c+ch+1)*h*w]
				src := dy[(b*oc+p.Before+ch)*oh*ow : (b*oc+p.Before+ch+1)*oh*ow]
				for i := 0; i < oh; i++ {
					row := dst[i*st*w:]
					for j := 0; j < ow; j++ {
						row[j*st] += src[i*ow+j]
					}
				}
			}
		}
	}, x)
	return y
}

// forwardNHWC is Forward with ChannelsLast and stride st.
func (p SubsamplePad) forwardNHWC(x *Var, st int) *Var {
	t := x.tape
	n, h, w, c := x.Value.Shape[0], x.Value.Shape[1], x.Value.Shape[2], x.Value.Shape[3]
	oh, ow := (h+st-1)/st, (w+st-1)/st
	oc := p.Before + c + p.After
	y := t.newVar(t.tensor([]int{n, oh, ow, oc}), false)
	xd, yd := x.Value.Data, y.Value.Data
	clear(yd)
	// src returns the input pixel output pixel q reads.
	src := func(q int) int {
		b, i, j := q/(oh*ow), q/ow%oh, q%ow
		return ((b*h+i*st)*w + j*st) * c
	}
	for q := range n * oh * ow {
		copy(yd[q*oc+p.Before:q*oc+p.Before+c], xd[src(q):src(q)+c])
	}
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		if fresh {
			clear(dx)
		}
		for q := range n * oh * ow {
			d, s := dx[src(q):src(q)+c], dy[q*oc+p.Before:q*oc+p.Before+c]
			for k, v := range s {
				d[k] += v
			}
		}
	}, x)
	return y
}
