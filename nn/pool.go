package nn

import "math"

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
	y := t.newVar(t.tensor([]int{n, c, oh, ow}), false)
	arg := t.ibuf(n * c * oh * ow)
	xd, yd := x.Value.Data, y.Value.Data
	for nc := 0; nc < n*c; nc++ {
		src := xd[nc*h*w : (nc+1)*h*w]
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				best := float32(math.Inf(-1))
				bi := int32(-1)
				for a := 0; a < p.Kernel; a++ {
					r := i*stride - p.Padding + a
					if r < 0 || r >= h {
						continue
					}
					for b := 0; b < p.Kernel; b++ {
						q := j*stride - p.Padding + b
						if q < 0 || q >= w {
							continue
						}
						if v := src[r*w+q]; v > best || bi < 0 || v != v {
							best, bi = v, int32(r*w+q)
						}
					}
				}
				o := (nc*oh+i)*ow + j
				yd[o] = best
				arg[o] = bi
			}
		}
	}
	t.record(y, func(dy []float32) {
		dx := x.grad()
		plane := oh * ow
		for nc := 0; nc < n*c; nc++ {
			base := nc * h * w
			for j, g := range dy[nc*plane : (nc+1)*plane] {
				dx[base+int(arg[nc*plane+j])] += g
			}
		}
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
	y := t.newVar(t.tensor([]int{n, c, oh, ow}), false)
	xd, yd := x.Value.Data, y.Value.Data
	k, pad := p.Kernel, p.Padding
	// window returns the clipped window rows/cols and the divisor (padded cells count).
	window := func(i, j int) (r0, r1, q0, q1 int, div float32) {
		r0, q0 = i*stride-pad, j*stride-pad
		r1, q1 = min(r0+k, h+pad), min(q0+k, w+pad)
		div = float32((r1 - r0) * (q1 - q0))
		return max(r0, 0), min(r1, h), max(q0, 0), min(q1, w), div
	}
	for nc := 0; nc < n*c; nc++ {
		src := xd[nc*h*w : (nc+1)*h*w]
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				r0, r1, q0, q1, div := window(i, j)
				var sum float32
				for r := r0; r < r1; r++ {
					for q := q0; q < q1; q++ {
						sum += src[r*w+q]
					}
				}
				yd[(nc*oh+i)*ow+j] = sum / div
			}
		}
	}
	t.record(y, func(dy []float32) {
		dx := x.grad()
		for nc := 0; nc < n*c; nc++ {
			dst := dx[nc*h*w : (nc+1)*h*w]
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					r0, r1, q0, q1, div := window(i, j)
					g := dy[(nc*oh+i)*ow+j] / div
					for r := r0; r < r1; r++ {
						for q := q0; q < q1; q++ {
							dst[r*w+q] += g
						}
					}
				}
			}
		}
	}, x)
	return y
}
