package nn

// AdaptiveAvgPool2d averages NCHW input over windows chosen so that the output is
// OutH×OutW whatever the input size, with PyTorch's window rule: output row i covers
// input rows floor(i·H/OutH) to ceil((i+1)·H/OutH) (the same for columns), so windows
// overlap when H is not a multiple of OutH. OutH = OutW = 1 is the global average pool
// of ResNets (torchvision's avgpool before fc). With ChannelsLast, input and output are
// [N, H, W, C] and [N, OutH, OutW, C]; every element is the same sum, in the same
// order, as without.
type AdaptiveAvgPool2d struct {
	OutH, OutW   int
	ChannelsLast bool
}

// adaptiveWindow returns input indices [lo, hi) of output index i of out over size in.
func adaptiveWindow(i, in, out int) (lo, hi int) {
	return i * in / out, ((i+1)*in + out - 1) / out
}

// Forward pools x of shape [N, C, H, W] to [N, C, OutH, OutW].
func (p AdaptiveAvgPool2d) Forward(x *Var) *Var {
	t := x.tape
	s := x.Value.Shape
	out := []int{1, 1, max(p.OutH, 1), max(p.OutW, 1)}
	layout, h, w, c := "[N C H W]", 0, 0, 0
	if len(s) == 4 {
		out[0], out[1] = s[0], s[1]
		h, w, c = s[2], s[3], s[1]
	}
	if p.ChannelsLast {
		out = []int{out[0], out[2], out[3], 1}
		layout = "[N H W C]"
		if len(s) == 4 {
			out[3] = s[3]
			h, w, c = s[1], s[2], s[3]
		}
	}
	if x.broken {
		return t.fail(out, nil)
	}
	if len(s) != 4 || p.OutH <= 0 || p.OutW <= 0 || h == 0 || w == 0 {
		return t.failf(out, "nn.AdaptiveAvgPool2d(%d×%d): input shape %v, want %s with H, W > 0 and a positive output size", p.OutH, p.OutW, s, layout)
	}
	if p.ChannelsLast {
		return p.forwardNHWC(x, out, h, w, c)
	}
	planes, oh, ow := s[0]*s[1], p.OutH, p.OutW
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

// forwardNHWC is Forward with ChannelsLast: x is [N, h, w, c], the result out.
// Each output pixel's window is summed row by row, pixel by pixel, as a run of
// c channels: per channel the NCHW loop's order.
func (p AdaptiveAvgPool2d) forwardNHWC(x *Var, out []int, h, w, c int) *Var {
	t := x.tape
	n, oh, ow := out[0], p.OutH, p.OutW
	y := t.newVar(t.tensor(out), false)
	xd, yd := x.Value.Data, y.Value.Data
	for b := range n {
		img := xd[b*h*w*c : (b+1)*h*w*c]
		for i := range oh {
			r0, r1 := adaptiveWindow(i, h, oh)
			for j := range ow {
				q0, q1 := adaptiveWindow(j, w, ow)
				dst := yd[((b*oh+i)*ow+j)*c:][:c]
				clear(dst)
				for r := r0; r < r1; r++ {
					for q := q0; q < q1; q++ {
						for k, v := range img[(r*w+q)*c:][:c] {
							dst[k] += v
						}
					}
				}
				div := float32((r1 - r0) * (q1 - q0))
				for k := range dst {
					dst[k] /= div
				}
			}
		}
	}
	t.record(y, func(dy []float32) {
		dx, fresh := x.gradOverwrite()
		if fresh {
			clear(dx)
		}
		for b := range n {
			img := dx[b*h*w*c : (b+1)*h*w*c]
			for i := range oh {
				r0, r1 := adaptiveWindow(i, h, oh)
				for j := range ow {
					q0, q1 := adaptiveWindow(j, w, ow)
					src := dy[((b*oh+i)*ow+j)*c:][:c]
					div := float32((r1 - r0) * (q1 - q0))
					for r := r0; r < r1; r++ {
						for q := q0; q < q1; q++ {
							for k, g := range img[(r*w+q)*c:][:c] {
								img[(r*w+q)*c+k] = g + src[k]/div
							}
						}
					}
				}
			}
		}
	}, x)
	return y
}
