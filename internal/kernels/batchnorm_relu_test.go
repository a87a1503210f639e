package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// bnReluShapes are the (n, c, plane) triples of the fused BatchNorm+ReLU tests:
// bnShapes (small planes, planes that are not multiples of 8, several plane groups)
// plus 2×2 and 5×4 maps, a 2-D input (plane 1) and ResNet's 32×32 maps at n = 1…32.
var bnReluShapes = append(append([][3]int(nil), bnShapes...),
	[3]int{3, 4, 4}, [3]int{32, 8, 4}, [3]int{5, 7, 20}, [3]int{8, 6, 1},
	[3]int{1, 3, 1024}, [3]int{4, 2, 1024}, [3]int{32, 2, 1024}, [3]int{16, 3, 196})

// forEachReluPath runs f with every implementation this machine runs, then with
// each of their vector tables stripped of the planes kernels ("-perplane": the
// generic path's structure, one kernel call per plane, with that table's kernels).
func forEachReluPath(t *testing.T, f func(t *testing.T)) {
	forEachImpl(t, f)
	for _, name := range availableImpls() {
		if implTable[name].vec.bnPlanes == nil {
			continue // already per plane
		}
		t.Run(name+"-perplane", func(t *testing.T) {
			defer setImpl(name)()
			g := *impl
			v := *g.vec
			v.bnPlanes = nil
			g.vec = &v
			old := impl
			impl = &g
			defer func() { impl = old }()
			f(t)
		})
	}
}

// firstBitDiff reports the first index where got and want differ bit for bit, or -1.
func firstBitDiff(got, want []float32) int {
	if len(got) != len(want) {
		return 0
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

func requireSameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if i := firstBitDiff(got, want); i >= 0 {
		if len(got) != len(want) {
			t.Fatalf("%s: %d elements, want %d", what, len(got), len(want))
		}
		t.Fatalf("%s[%d] = %v (%#x), unfused %v (%#x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
	}
}

// withNegZeros returns a copy of s with every third element replaced by −0 (a
// gradient buffer's value that ReluBackward and the Axpy composition treat differently).
func withNegZeros(s []float32) []float32 {
	s = clone(s)
	for i := 0; i < len(s); i += 3 {
		s[i] = float32(math.Copysign(0, -1))
	}
	return s
}

// The fused forward kernels against BatchNormForwardTrain / BatchNormApply, then Add
// (the BatchNorm output first, as nn.Add(bn(x), r)) and ReluForward, bit for bit.
func TestBatchNormReLUForwardMatchesUnfused(t *testing.T) {
	forEachReluPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(21, 22))
		for _, s := range bnReluShapes {
			n, c, plane := s[0], s[1], s[2]
			l := n * c * plane
			x := bnInput(r, n, c, plane)
			res := randSlice(r, l)
			gamma, beta := randSlice(r, c), randSlice(r, c)
			for _, withRes := range []bool{false, true} {
				var rr []float32
				if withRes {
					rr = res
				}
				name := fmt.Sprintf("%v residual=%v", s, withRes)
				// Training: batch statistics.
				want := make([]float32, l)
				wm, wv, wi := make([]float32, c), make([]float32, c), make([]float32, c)
				BatchNormForwardTrain(want, x, n, c, plane, gamma, beta, 1e-5, wm, wv, wi)
				if withRes {
					Add(want, want, rr)
				}
				ReluForward(want, want)
				got := make([]float32, l)
				gm, gv, gi := make([]float32, c), make([]float32, c), make([]float32, c)
				BatchNormForwardTrainReLU(got, x, rr, n, c, plane, gamma, beta, 1e-5, gm, gv, gi)
				requireSameBits(t, name+" train y", got, want)
				requireSameBits(t, name+" mean", gm, wm)
				requireSameBits(t, name+" variance", gv, wv)
				requireSameBits(t, name+" invstd", gi, wi)
				// In place.
				xi := clone(x)
				BatchNormForwardTrainReLU(xi, xi, rr, n, c, plane, gamma, beta, 1e-5, gm, gv, gi)
				requireSameBits(t, name+" train y in place", xi, want)
				// Evaluation: fixed statistics.
				mean, scale := randSlice(r, c), randSlice(r, c)
				BatchNormApply(want, x, n, c, plane, mean, scale, beta)
				if withRes {
					Add(want, want, rr)
				}
				ReluForward(want, want)
				BatchNormApplyReLU(got, x, rr, n, c, plane, mean, scale, beta)
				requireSameBits(t, name+" eval y", got, want)
			}
		}
	})
}

// The fused backward kernel against ReluBackwardSet into a buffer, then
// BatchNormBackward of that buffer, bit for bit: training and evaluation,
// overwriting and accumulating dx, with and without each output.
func TestBatchNormReLUBackwardMatchesUnfused(t *testing.T) {
	forEachReluPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(23, 24))
		for _, s := range bnReluShapes {
			n, c, plane := s[0], s[1], s[2]
			l := n * c * plane
			x := bnInput(r, n, c, plane)
			res, dy := randSlice(r, l), randSlice(r, l)
			gamma, beta := randSlice(r, c), randSlice(r, c)
			y := make([]float32, l)
			mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
			BatchNormForwardTrainReLU(y, x, res, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
			g := make([]float32, l)
			ReluBackwardSet(g, y, dy)
			for _, training := range []bool{true, false} {
				for _, acc := range []bool{false, true} {
					name := fmt.Sprintf("%v training=%v acc=%v", s, training, acc)
					dx0, dg0, db0 := randSlice(r, l), randSlice(r, c), randSlice(r, c)
					wdx, wdg, wdb := clone(dx0), clone(dg0), clone(db0)
					BatchNormBackward(wdx, g, x, n, c, plane, mean, is, gamma, training, acc, wdg, wdb)
					dx, dg, db := clone(dx0), clone(dg0), clone(db0)
					BatchNormBackwardReLU(dx, dy, y, x, n, c, plane, mean, is, gamma, training, acc, dg, db)
					requireSameBits(t, name+" dx", dx, wdx)
					requireSameBits(t, name+" dgamma", dg, wdg)
					requireSameBits(t, name+" dbeta", db, wdb)
				}
				name := fmt.Sprintf("%v training=%v", s, training)
				// Parameter gradients only, then dx only.
				wdg, wdb := make([]float32, c), make([]float32, c)
				BatchNormBackward(nil, g, x, n, c, plane, mean, is, gamma, training, false, wdg, wdb)
				dg, db := make([]float32, c), make([]float32, c)
				BatchNormBackwardReLU(nil, dy, y, x, n, c, plane, mean, is, gamma, training, false, dg, db)
				requireSameBits(t, name+" no dx: dgamma", dg, wdg)
				requireSameBits(t, name+" no dx: dbeta", db, wdb)
				wdx, dx := make([]float32, l), make([]float32, l)
				BatchNormBackward(wdx, g, x, n, c, plane, mean, is, gamma, training, false, nil, nil)
				BatchNormBackwardReLU(dx, dy, y, x, n, c, plane, mean, is, gamma, training, false, nil, nil)
				requireSameBits(t, name+" no dgamma: dx", dx, wdx)
			}
		}
	})
}

// ReluBackwardAxpy is ReluBackwardSet into a buffer, then AxpyParallel(1, …), bit for
// bit (−0 in dx included), on lengths around the vector widths and the parallel chunk.
func TestReluBackwardAxpy(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(25, 26))
		for _, n := range []int{0, 1, 7, 8, 9, 33, 100, 3*elemChunk + 77} {
			y, dy := randSlice(r, n), randSlice(r, n)
			for i := 0; i < n; i += 5 {
				dy[i] = float32(math.Copysign(0, -1))
			}
			dx0 := withNegZeros(randSlice(r, n))
			g := make([]float32, n)
			ReluBackwardSet(g, y, dy)
			want := clone(dx0)
			AxpyParallel(1, g, want)
			got := clone(dx0)
			ReluBackwardAxpy(got, y, dy)
			requireSameBits(t, fmt.Sprintf("n=%d dx", n), got, want)
		}
	})
}

// The fused kernels' results do not depend on the goroutine count.
func TestBatchNormReLUDeterministic(t *testing.T) {
	for _, s := range [][3]int{{8, 37, 64}, {16, 300, 4}, {4, 40, 20}} {
		t.Run(fmt.Sprint(s), func(t *testing.T) {
			forEachReluPath(t, func(t *testing.T) {
				n, c, plane := s[0], s[1], s[2]
				r := rand.New(rand.NewPCG(27, 28))
				x := bnInput(r, n, c, plane)
				res, dy := randSlice(r, len(x)), randSlice(r, len(x))
				gamma, beta := randSlice(r, c), randSlice(r, c)
				run := func() [][]float32 {
					y := make([]float32, len(x))
					mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
					BatchNormForwardTrainReLU(y, x, res, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
					dx, dg, db := make([]float32, len(x)), make([]float32, c), make([]float32, c)
					BatchNormBackwardReLU(dx, dy, y, x, n, c, plane, mean, is, gamma, true, false, dg, db)
					ye := make([]float32, len(x))
					BatchNormApplyReLU(ye, x, nil, n, c, plane, mean, is, beta)
					return [][]float32{y, mean, vr, is, dx, dg, db, ye}
				}
				var ref [][]float32
				withProcs(1, func() { ref = run() })
				for _, p := range []int{2, 3, 8} {
					var got [][]float32
					withProcs(p, func() { got = run() })
					for i := range ref {
						requireSameBits(t, fmt.Sprintf("GOMAXPROCS=%d output %d", p, i), got[i], ref[i])
					}
				}
			})
		})
	}
}

// TestBatchNormReLUPrimitives compares the fused per-plane primitives with the unfused
// ones bit for bit on every length around the vector widths, NaN, ±0 and ±Inf in
// the rectifier's input and output included.
func TestBatchNormReLUPrimitives(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		v := impl.vec
		r := rand.New(rand.NewPCG(29, 30))
		nan, inf, nz := float32(math.NaN()), float32(math.Inf(1)), float32(math.Copysign(0, -1))
		for n := 0; n <= 80; n++ {
			x, dy, y, res, d0 := randSlice(r, n), randSlice(r, n), randSlice(r, n), randSlice(r, n), randSlice(r, n)
			for i := 0; i < n; i += 7 {
				y[i] = []float32{nan, 0, nz, inf, -inf}[i%5]
				res[i] = []float32{nan, nz, -inf, 0, 1}[i%5]
			}
			const mu, a, b, c = 0.3, 1.7, -0.2, 0.05
			for _, rr := range [][]float32{nil, res} {
				want := make([]float32, n)
				v.affine(want, x, mu, a, b)
				if rr != nil {
					v.add(want, want, rr)
				}
				v.reluFwd(want, want)
				got := make([]float32, n)
				v.affineRelu(got, x, rr, mu, a, b)
				requireSameBits(t, fmt.Sprintf("affineRelu n=%d residual=%v", n, rr != nil), got, want)
			}
			g := make([]float32, n)
			v.reluBwdSet(g, y, dy)
			ws, wt := v.dyStats(g, x, mu)
			gs, gt := v.dyStatsRelu(dy, y, x, mu)
			requireSameBits(t, fmt.Sprintf("dyStatsRelu n=%d", n), []float32{gs, gt}, []float32{ws, wt})
			for _, acc := range []bool{false, true} {
				want, got := clone(d0), clone(d0)
				v.bnBwd(want, g, x, mu, a, b, c, acc)
				v.bnBwdRelu(got, dy, y, x, mu, a, b, c, acc)
				requireSameBits(t, fmt.Sprintf("bnBwdRelu n=%d acc=%v", n, acc), got, want)
			}
		}
	})
}

func benchBNRelu(b *testing.B, n, c, plane int) {
	r := rand.New(rand.NewPCG(1, 1))
	l := n * c * plane
	x := bnInput(r, n, c, plane)
	res, dy := randSlice(r, l), randSlice(r, l)
	gamma, beta := randSlice(r, c), randSlice(r, c)
	mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
	dg, db := make([]float32, c), make([]float32, c)
	pre, sum, y, g, dx, dres := make([]float32, l), make([]float32, l), make([]float32, l), make([]float32, l), make([]float32, l), make([]float32, l)
	name := fmt.Sprintf("%dx%dx%d", n, c, plane)
	// relu(bn(x)) forward and backward: as nn.Relu(bn.Forward(x)) runs it, then fused.
	b.Run("bn-relu/unfused/"+name, func(b *testing.B) {
		for b.Loop() {
			BatchNormForwardTrain(pre, x, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
			ReluForward(y, pre)
			ReluBackwardSet(g, y, dy)
			BatchNormBackward(dx, g, x, n, c, plane, mean, is, gamma, true, false, dg, db)
		}
	})
	b.Run("bn-relu/fused/"+name, func(b *testing.B) {
		for b.Loop() {
			BatchNormForwardTrainReLU(y, x, nil, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
			BatchNormBackwardReLU(dx, dy, y, x, n, c, plane, mean, is, gamma, true, false, dg, db)
		}
	})
	// relu(bn(x) + r), r's gradient fresh: as nn.Relu(nn.Add(bn.Forward(x), r)) runs it
	// (Add's backward copies the masked gradient to both inputs), then as the fused op
	// (r's gradient written once, BatchNorm's backward reading it).
	b.Run("bn-add-relu/unfused/"+name, func(b *testing.B) {
		for b.Loop() {
			BatchNormForwardTrain(pre, x, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
			Add(sum, pre, res)
			ReluForward(y, sum)
			ReluBackwardSet(g, y, dy)
			Copy(pre, g)
			Copy(dres, g)
			BatchNormBackward(dx, pre, x, n, c, plane, mean, is, gamma, true, false, dg, db)
		}
	})
	b.Run("bn-add-relu/fused/"+name, func(b *testing.B) {
		for b.Loop() {
			BatchNormForwardTrainReLU(y, x, res, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
			ReluBackwardSet(dres, y, dy)
			BatchNormBackward(dx, dres, x, n, c, plane, mean, is, gamma, true, false, dg, db)
		}
	})
	b.Run("bn-add-relu/fused-masked/"+name, func(b *testing.B) {
		for b.Loop() {
			BatchNormForwardTrainReLU(y, x, res, n, c, plane, gamma, beta, 1e-5, mean, vr, is)
			ReluBackwardSet(dres, y, dy)
			BatchNormBackwardReLU(dx, dy, y, x, n, c, plane, mean, is, gamma, true, false, dg, db)
		}
	})
}

// BenchmarkBatchNormReLU compares the unfused and fused BatchNorm+ReLU (forward and
// backward) on ResNet-20's three stages at batch 32 (the first is 32×16×32×32) and
// VGG's first and last layers.
func BenchmarkBatchNormReLU(b *testing.B) {
	benchBNRelu(b, 32, 16, 32*32)
	benchBNRelu(b, 32, 32, 16*16)
	benchBNRelu(b, 32, 64, 8*8)
	benchBNRelu(b, 32, 64, 32*32)
	benchBNRelu(b, 32, 512, 2*2)
}

// positiveMask (the branch-free y > 0 of relu32 and reluMask) agrees with the float
// comparison on the edges of every class of bit pattern and on random ones.
func TestPositiveMask(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	bits := []uint32{0, 1, 2, 0x007fffff, 0x00800000, 0x3f800000, 0x7f7fffff, 0x7f800000, 0x7f800001,
		0x7fc00000, 0x7fffffff, 0x80000000, 0x80000001, 0xbf800000, 0xff800000, 0xff800001, 0xffc00000, 0xffffffff}
	for range 1 << 16 {
		bits = append(bits, r.Uint32())
	}
	for _, b := range bits {
		v := math.Float32frombits(b)
		want := uint32(0)
		if v > 0 {
			want = ^uint32(0)
		}
		if got := positiveMask(b); got != want {
			t.Fatalf("positiveMask(%#x) = %#x, want %#x (%v > 0 is %v)", b, got, want, v, v > 0)
		}
		if got, want := relu32(v), reluMask(v, v); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("relu32(%#x) = %#x, reluMask %#x", b, math.Float32bits(got), math.Float32bits(want))
		}
	}
}
