package kernels

import "testing"

// The layer kernels allocate nothing in the steady state, whether they run on the
// calling goroutine or split the work over the pool (pooled layerTask).
func TestLayerKernelAllocations(t *testing.T) {
	small := func(n int) []float32 { return make([]float32, n) }
	const n, c, plane = 2, 3, 5
	x, y, dy, dx := small(n*c*plane), small(n*c*plane), small(n*c*plane), small(n*c*plane)
	pc := func() []float32 { p := small(c); Fill(p, 1); return p }
	g, b, mean, vr, is, dg, db := pc(), pc(), pc(), pc(), pc(), pc(), pc()
	pg := PoolGeom{4, 4, 6, 2, 2, 0}
	px, py, parg := small(4*4*6), small(4*2*3), make([]int32, 4*2*3)
	ws, gs, bs := [][]float32{small(10), small(20)}, [][]float32{small(10), small(20)}, [][]float32{small(10), small(20)}
	first := []bool{false, false}
	prob, rl, labels := small(12), small(3), []int{0, 1, 3}
	bigN := 4 * elemChunk
	bx, by, bdy := small(bigN), small(bigN), small(bigN)
	bws, bgs, bbs := [][]float32{bx}, [][]float32{by}, [][]float32{bdy}
	ng := PoolGeom{4, 16, 16, 3, 2, 1} // NHWC, 64 channels: split over the pool
	nx, ny, narg := small(4*16*16*64), small(4*8*8*64), make([]int32, 4*8*8*64)
	var c4 [5][]float32
	for i := range c4 {
		c4[i] = small(4)
	}
	cases := []struct {
		name string
		max  float64
		f    func()
	}{
		{"BatchNormForwardTrain", 0, func() { BatchNormForwardTrain(y, x, n, c, plane, g, b, 1e-5, mean, vr, is) }},
		{"BatchNormApply", 0, func() { BatchNormApply(y, x, n, c, plane, mean, g, b) }},
		{"BatchNormBackward", 0, func() { BatchNormBackward(dx, dy, x, n, c, plane, mean, is, g, true, false, dg, db) }},
		{"MaxPool2dForward", 0, func() { MaxPool2dForward(pg, py, parg, px) }},
		{"MaxPool2dBackward", 0, func() { MaxPool2dBackward(pg, px, py, parg, false) }},
		{"AvgPool2dForward", 0, func() { AvgPool2dForward(pg, py, px) }},
		{"AvgPool2dBackward", 0, func() { AvgPool2dBackward(pg, px, py, true) }},
		{"MaxPool2dForwardNHWC", 0, func() { MaxPool2dForwardNHWC(pg, 1, py, parg, px) }},
		{"AvgPool2dBackwardNHWC", 0, func() { AvgPool2dBackwardNHWC(pg, 1, px, py, true) }},
		{"big/MaxPool2dForwardNHWC", 0, func() { MaxPool2dForwardNHWC(ng, 64, ny, narg, nx) }},
		{"big/MaxPool2dBackwardNHWC", 0, func() { MaxPool2dBackwardNHWC(ng, 64, nx, ny, narg, false) }},
		{"big/AvgPool2dForwardNHWC", 0, func() { AvgPool2dForwardNHWC(ng, 64, ny, nx) }},
		{"big/AvgPool2dBackwardNHWC", 0, func() { AvgPool2dBackwardNHWC(ng, 64, nx, ny, true) }},
		{"SoftmaxCrossEntropy", 0, func() { SoftmaxCrossEntropy(prob, rl, prob, labels, 3, 4) }},
		{"SoftmaxCrossEntropyBackward", 0, func() { SoftmaxCrossEntropyBackward(prob, prob, labels, 3, 4, 1, true) }},
		{"SGDUpdateAll", 0, func() { SGDUpdateAll(ws, gs, bs, first, 0.1, 0, 0.9, 0, false) }},
		{"BatchNormForwardTrainReLU", 0, func() { BatchNormForwardTrainReLU(y, x, dx, n, c, plane, g, b, 1e-5, mean, vr, is) }},
		{"BatchNormApplyReLU", 0, func() { BatchNormApplyReLU(y, x, dx, n, c, plane, mean, g, b) }},
		{"BatchNormBackwardReLU", 0, func() { BatchNormBackwardReLU(dx, dy, y, x, n, c, plane, mean, is, g, true, false, dg, db) }},
		{"plane24/BatchNormForwardTrainReLU", 0, func() {
			BatchNormForwardTrainReLU(by[:96], bx[:96], nil, 2, 2, 24, g[:2], b[:2], 1e-5, mean[:2], vr[:2], is[:2])
		}},
		{"plane24/BatchNormBackwardReLU", 0, func() {
			BatchNormBackwardReLU(bx[:96], bdy[:96], by[:96], bx[96:192], 2, 2, 24, mean[:2], is[:2], g[:2], true, false, dg[:2], db[:2])
		}},
		{"ReluBackwardSet", 0, func() { ReluBackwardSet(dx, y, dy) }},
		{"ReluBackwardAxpy", 0, func() { ReluBackwardAxpy(dx, y, dy) }},
		{"Copy", 0, func() { Copy(dx, y) }},
		{"Zero", 0, func() { Zero(dx) }},
		{"big/ReluBackwardSet", 0, func() { ReluBackwardSet(bx, by, bdy) }},
		{"big/ReluForward", 0, func() { ReluForward(bx, by) }},
		{"big/ReluBackwardAxpy", 0, func() { ReluBackwardAxpy(bx, by, bdy) }},
		{"big/SGDUpdateAll", 0, func() { SGDUpdateAll(bws, bgs, bbs, first[:1], 0.1, 0, 0.9, 0, false) }},
		{"big/BatchNormForwardTrain", 0, func() {
			BatchNormForwardTrain(bx, by, 4, 4, elemChunk/4, c4[0], c4[1], 1e-5, c4[2], c4[3], c4[4])
		}},
	}
	for _, tc := range cases {
		if got := testing.AllocsPerRun(20, tc.f); got > tc.max {
			t.Errorf("%s: %v allocations per call, want at most %v", tc.name, got, tc.max)
		}
	}
}
