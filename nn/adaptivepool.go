package nn

// AdaptiveAvgPool2d averages NCHW input over windows chosen so that the output is
// OutH×OutW whatever the input size, with PyTorch's window rule: output row i covers
// input rows floor(i·H/OutH) to ceil((i+1)·H/OutH) (the same for columns), so windows
// overlap when H is not a multiple of OutH. OutH = OutW = 1 is the global average pool
// of ResNets (torchvision's avgpool before fc).
type AdaptiveAvgPool2d struct{ OutH, OutW int }

// adaptiveWindow returns input indices [lo, hi) of output index i of out over size in.
func adaptiveWindow(i, in, out int) (lo, hi int) {
	return i * in / out, ((i+1)*in + out - 1) / out
}

// Forward pools x of shape [N, C, H, W] to [N, C, OutH, OutW].
func (p AdaptiveAvgPool2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	out := []int{1, 1, max(p.OutH, 1), max(p.OutW, 1)}
	if len(s) == 4 {
		out[0], out[1] = s[0], s[1]
	}
	if x.broken {
		return t.fail(out, nil)
	}
	if len(s) != 4 || p.OutH <= 0 || p.OutW <= 0 || s[2] == 0 || s[3] == 0 {
		return t.failf(out, "nn.AdaptiveAvgPool2d(%d×%d): input shape %v, want [N C H W] with H, W > 0 and a positive output size", p.OutH, p.OutW, s)
	}
	planes, h, w, oh, ow := s[0]*s[1], s[2], s[3], p.OutH, p.OutW
	y := t.newVar(t.tensor(out), false)
	xd, yd := x.Value.Data, y.Value.Data
	for pl := 0; pl < planes; pl++ {
		src, dst := xd[pl*h*w:(pl+1)*h*w], yd[pl*oh*ow:(pl+1)*oh*ow]
		for i := 0; i < oh; i++ {
			r0, r1 := adaptiveWindow(i, h, oh)
			for j := 0; j < ow; j++ {
				q0, q1 := adaptiveWindow(j, w, ow)
				var sum float32
				for r := r0; r < r1; r++ {
					for _, v := range src[r*w+q0 : r*w+q1] {
						sum += v
					}
				}
				dst[i*ow+j] = sum / float32((r1-r0)*(q1-q0))
			}
		}
	}
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		if fresh {
			clear(dx)
		}
		for pl := 0; pl < planes; pl++ {
			dst, src := dx[pl*h*w:(pl+1)*h*w], dy[pl*oh*ow:(pl+1)*oh*ow]
			for i := 0; i < oh; i++ {
				r0, r1 := adaptiveWindow(i, h, oh)
				for j := 0; j < ow; j++ {
					q0, q1 := adaptiveWindow(j, w, ow)
					g := src[i*ow+j] / float32((r1-r0)*(q1-q0))
					for r := r0; r < r1; r++ {
						row := dst[r*w+q0 : r*w+q1]
						for k := range row {
							row[k] += g
						}
					}
				}
			}
		}
	}, x)
	return y
}
