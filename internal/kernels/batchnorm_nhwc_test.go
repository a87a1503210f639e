package kernels

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// bnhCs and bnhRowCounts are the channel and row counts of the channels-last tests:
// c below, at and above the vector width and not multiples of 8; one row, odd rows,
// and enough rows for several blocks.
var (
	bnhCs        = []int{1, 3, 8, 16, 24, 64, 256}
	bnhRowCounts = []int{1, 7, 64, 1000}
)

// bnhShapes are (rows, c) pairs: every combination above plus shapes with many
// blocks (and a last block with fewer rows), wide rows and c with an odd chunk.
func bnhShapes() [][2]int {
	var s [][2]int
	for _, c := range bnhCs {
		for _, rows := range bnhRowCounts {
			s = append(s, [2]int{rows, c})
		}
	}
	return append(s, [2]int{5000, 5}, [2]int{3001, 16}, [2]int{70, 1000}, [2]int{9, 1001}, [2]int{33, 520}, [2]int{2, 4100})
}

// bnhInput returns rows × c channels-last data, channel ch drawn around its own
// offset (off plus a channel-dependent shift) with its own spread.
func bnhInput(r *rand.Rand, rows, c int, off float64) []float32 {
	x := make([]float32, rows*c)
	for ch := range c {
		o := off + float64(ch%3)*10*(r.Float64()-0.3)
		sc := 0.1 + 3*r.Float64()
		if off != 0 {
			sc = 0.01 + 0.1*r.Float64()
		}
		for p := range rows {
			x[p*c+ch] = float32(o + sc*r.NormFloat64())
		}
	}
	return x
}

// nhwcToPlanes returns x (rows × c) as one NCHW sample [c, rows].
func nhwcToPlanes(x []float32, rows, c int) []float32 {
	out := make([]float32, len(x))
	for p := range rows {
		for ch := range c {
			out[ch*rows+p] = x[p*c+ch]
		}
	}
	return out
}

// refBNHStats returns the exact (float64) mean and biased variance per channel.
func refBNHStats(x []float32, rows, c int) (mean, vr []float64) {
	mean, vr = make([]float64, c), make([]float64, c)
	for ch := range c {
		var s float64
		for p := range rows {
			s += float64(x[p*c+ch])
		}
		mu := s / float64(rows)
		var ss float64
		for p := range rows {
			d := float64(x[p*c+ch]) - mu
			ss += d * d
		}
		mean[ch], vr[ch] = mu, ss/float64(rows)
	}
	return mean, vr
}

// refBNHBackward returns dx, dgamma, dbeta in float64 for the statistics mean, invstd.
func refBNHBackward(dy, x []float32, rows, c int, mean, invstd, gamma []float32, training bool) (dx, dg, db []float64) {
	dx, dg, db = make([]float64, len(x)), make([]float64, c), make([]float64, c)
	m := float64(rows)
	for ch := range c {
		mu, is := float64(mean[ch]), float64(invstd[ch])
		var sdy, sdyx float64
		for p := range rows {
			k := p*c + ch
			sdy += float64(dy[k])
			sdyx += float64(dy[k]) * (float64(x[k]) - mu) * is
		}
		dg[ch], db[ch] = sdyx, sdy
		g := float64(gamma[ch])
		for p := range rows {
			k := p*c + ch
			if training {
				xh := (float64(x[k]) - mu) * is
				dx[k] = g * is / m * (m*float64(dy[k]) - sdy - xh*sdyx)
			} else {
				dx[k] = g * is * float64(dy[k])
			}
		}
	}
	return dx, dg, db
}

// ulpsOff returns |got − want| in units of float32 ulps at want.
func ulpsOff(got float32, want float64) float64 { return math.Abs(float64(got)-want) / ulp32(want) }

// checkBNHStats checks mean, variance and invstd against the float64 statistics:
// the mean within 2 ulps plus 1e-6 of the spread (the float32 lane sums of x−K),
// variance and invstd within 1e-5 relative (a few ulps of the float32 sums).
func checkBNHStats(t *testing.T, name string, mean, vr, is []float32, wm, wv []float64, eps float64) {
	t.Helper()
	for ch := range mean {
		sd := math.Sqrt(wv[ch])
		if d := math.Abs(float64(mean[ch]) - wm[ch]); d > 2*ulp32(wm[ch])+1e-6*sd {
			t.Fatalf("%s ch %d: mean %v, want %v (%.1f ulps, spread %g)", name, ch, mean[ch], wm[ch], ulpsOff(mean[ch], wm[ch]), sd)
		}
		if !closeTo(vr[ch], wv[ch], 1e-30, 1e-5) {
			t.Fatalf("%s ch %d: variance %v, want %v (%.1f ulps)", name, ch, vr[ch], wv[ch], ulpsOff(vr[ch], wv[ch]))
		}
		if wis := 1 / math.Sqrt(wv[ch]+eps); !closeTo(is[ch], wis, 0, 1e-5) {
			t.Fatalf("%s ch %d: invstd %v, want %v", name, ch, is[ch], wis)
		}
	}
}

func TestBatchNormNHWCForwardTrain(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(41, 42))
		var worstMean, worstVar float64
		for _, off := range []float64{0, 1000} {
			for _, s := range bnhShapes() {
				rows, c := s[0], s[1]
				name := fmt.Sprintf("rows=%d c=%d offset=%v", rows, c, off)
				x := bnhInput(r, rows, c, off)
				gamma, beta := randSlice(r, c), randSlice(r, c)
				const eps = 1e-5
				y := make([]float32, len(x))
				mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
				BatchNormForwardTrainNHWC(y, x, rows, c, gamma, beta, eps, mean, vr, is)
				wm, wv := refBNHStats(x, rows, c)
				checkBNHStats(t, name, mean, vr, is, wm, wv, eps)
				for ch := range c {
					worstMean = max(worstMean, ulpsOff(mean[ch], wm[ch]))
					if wv[ch] > 0 {
						worstVar = max(worstVar, ulpsOff(vr[ch], wv[ch]))
					}
				}
				for k, v := range y {
					ch := k % c
					wis := 1 / math.Sqrt(wv[ch]+eps)
					want := (float64(x[k])-wm[ch])*wis*float64(gamma[ch]) + float64(beta[ch])
					// The float32 mean's rounding shifts x−mean by up to half an ulp of the mean.
					tol := 1e-5*(math.Abs(float64(gamma[ch]))+math.Abs(float64(beta[ch]))) + math.Abs(float64(gamma[ch]))*wis*ulp32(wm[ch])
					if !closeTo(v, want, tol, 1e-5) {
						t.Fatalf("%s: y[%d] = %v, want %v", name, k, v, want)
					}
				}
				// In place.
				yi := clone(x)
				BatchNormForwardTrainNHWC(yi, yi, rows, c, gamma, beta, eps, make([]float32, c), make([]float32, c), make([]float32, c))
				requireSameBits(t, name+" in place", yi, y)
			}
		}
		t.Logf("largest errors against float64: mean %.2f ulps, variance %.2f ulps", worstMean, worstVar)
	})
}

// The channels-last kernels agree with the NCHW kernels on the transposed data to
// rounding: statistics within a few ulps, outputs and gradients within 1e-5 of their
// scale.
func TestBatchNormNHWCMatchesNCHW(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(43, 44))
		for _, off := range []float64{0, 1000} {
			for _, s := range bnhShapes() {
				rows, c := s[0], s[1]
				name := fmt.Sprintf("rows=%d c=%d offset=%v", rows, c, off)
				x := bnhInput(r, rows, c, off)
				dy, res := randSlice(r, len(x)), randSlice(r, len(x))
				gamma, beta := randSlice(r, c), randSlice(r, c)
				xp, dyp, resp := nhwcToPlanes(x, rows, c), nhwcToPlanes(dy, rows, c), nhwcToPlanes(res, rows, c)
				pc := func() []float32 { return make([]float32, c) }
				y, yp := make([]float32, len(x)), make([]float32, len(x))
				mean, vr, is, meanP, vrP, isP := pc(), pc(), pc(), pc(), pc(), pc()
				BatchNormForwardTrainReLUNHWC(y, x, res, rows, c, gamma, beta, 1e-5, mean, vr, is)
				BatchNormForwardTrainReLU(yp, xp, resp, 1, c, rows, gamma, beta, 1e-5, meanP, vrP, isP)
				for ch := range c {
					sd := math.Sqrt(float64(vrP[ch]))
					if d := math.Abs(float64(mean[ch]) - float64(meanP[ch])); d > 2*ulp32(float64(meanP[ch]))+1e-6*sd {
						t.Fatalf("%s ch %d: mean %v, NCHW %v", name, ch, mean[ch], meanP[ch])
					}
					if !closeTo(vr[ch], float64(vrP[ch]), 1e-30, 1e-5) || !closeTo(is[ch], float64(isP[ch]), 0, 1e-5) {
						t.Fatalf("%s ch %d: variance %v invstd %v, NCHW %v %v", name, ch, vr[ch], is[ch], vrP[ch], isP[ch])
					}
				}
				yt := nhwcToPlanes(y, rows, c)
				for k := range yt {
					ch := k / rows
					if !closeTo(yt[k], float64(yp[k]), 1e-5*(math.Abs(float64(gamma[ch]))+math.Abs(float64(beta[ch]))+math.Abs(float64(resp[k]))), 1e-5) {
						t.Fatalf("%s: y (channel %d, row %d) = %v, NCHW %v", name, ch, k%rows, yt[k], yp[k])
					}
				}
				// Backward of the fused op with the same statistics on both sides.
				for _, training := range []bool{true, false} {
					dx, dxp := make([]float32, len(x)), make([]float32, len(x))
					dg, db, dgp, dbp := pc(), pc(), pc(), pc()
					BatchNormBackwardReLUNHWC(dx, dy, y, x, rows, c, meanP, isP, gamma, training, false, dg, db)
					BatchNormBackwardReLU(dxp, dyp, nhwcToPlanes(y, rows, c), xp, 1, c, rows, meanP, isP, gamma, training, false, dgp, dbp)
					for ch := range c {
						if !closeTo(dg[ch], float64(dgp[ch]), 1e-5, 1e-5) || !closeTo(db[ch], float64(dbp[ch]), 1e-5, 1e-5) {
							t.Fatalf("%s training=%v ch %d: dgamma %v dbeta %v, NCHW %v %v", name, training, ch, dg[ch], db[ch], dgp[ch], dbp[ch])
						}
					}
					dxt := nhwcToPlanes(dx, rows, c)
					for k := range dxt {
						ch := k / rows
						sc := math.Abs(float64(gamma[ch]) * float64(isP[ch]))
						if !closeTo(dxt[k], float64(dxp[k]), 1e-5*sc, 1e-5) {
							t.Fatalf("%s training=%v: dx (channel %d, row %d) = %v, NCHW %v", name, training, ch, k%rows, dxt[k], dxp[k])
						}
					}
				}
			}
		}
	})
}

func TestBatchNormNHWCApply(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(45, 46))
		for _, s := range bnhShapes() {
			rows, c := s[0], s[1]
			x := bnhInput(r, rows, c, 0)
			mean, scale, shift := randSlice(r, c), randSlice(r, c), randSlice(r, c)
			y := make([]float32, len(x))
			BatchNormApplyNHWC(y, x, rows, c, mean, scale, shift)
			for k, v := range y {
				ch := k % c
				want := fma32(x[k]-mean[ch], scale[ch], shift[ch])
				if math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("rows=%d c=%d: y[%d] = %v, want %v", rows, c, k, v, want)
				}
			}
			// Against the NCHW kernel (whose portable loops do not fuse): to rounding.
			yp := make([]float32, len(x))
			BatchNormApply(yp, nhwcToPlanes(x, rows, c), 1, c, rows, mean, scale, shift)
			for k, v := range nhwcToPlanes(y, rows, c) {
				if !closeTo(v, float64(yp[k]), 1e-6, 1e-6) {
					t.Fatalf("rows=%d c=%d: y %v, NCHW %v", rows, c, v, yp[k])
				}
			}
		}
	})
}

func TestBatchNormNHWCBackward(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(47, 48))
		for _, off := range []float64{0, 1000} {
			for _, s := range bnhShapes() {
				rows, c := s[0], s[1]
				x := bnhInput(r, rows, c, off)
				dy := randSlice(r, len(x))
				gamma := randSlice(r, c)
				mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
				BatchNormForwardTrainNHWC(make([]float32, len(x)), x, rows, c, gamma, make([]float32, c), 1e-5, mean, vr, is)
				for _, training := range []bool{true, false} {
					wdx, wdg, wdb := refBNHBackward(dy, x, rows, c, mean, is, gamma, training)
					// The parameter gradients cancel: their error is relative to Σ|dy|, Σ|dy·x̂|.
					pTol := 1e-5 + 1e-7*float64(rows)
					dxTol := func(ch int) float64 { return 1e-5 * math.Abs(float64(gamma[ch])*float64(is[ch])) }
					for _, acc := range []bool{false, true} {
						name := fmt.Sprintf("rows=%d c=%d offset=%v training=%v acc=%v", rows, c, off, training, acc)
						dx0 := randSlice(r, len(x))
						dx := clone(dx0)
						dg0, db0 := randSlice(r, c), randSlice(r, c)
						dg, db := clone(dg0), clone(db0)
						BatchNormBackwardNHWC(dx, dy, x, rows, c, mean, is, gamma, training, acc, dg, db)
						for ch := range c {
							if !closeTo(dg[ch], float64(dg0[ch])+wdg[ch], pTol, 1e-4) || !closeTo(db[ch], float64(db0[ch])+wdb[ch], pTol, 1e-4) {
								t.Fatalf("%s ch %d: dgamma %v dbeta %v, want %v %v", name, ch, dg[ch], db[ch], float64(dg0[ch])+wdg[ch], float64(db0[ch])+wdb[ch])
							}
						}
						for k := range dx {
							want := wdx[k]
							if acc {
								want += float64(dx0[k])
							}
							if !closeTo(dx[k], want, dxTol(k%c), 1e-5) {
								t.Fatalf("%s dx[%d] = %v, want %v", name, k, dx[k], want)
							}
						}
					}
					// Parameter gradients only (no dx), and dx only (nil dgamma, dbeta).
					dg, db := make([]float32, c), make([]float32, c)
					BatchNormBackwardNHWC(nil, dy, x, rows, c, mean, is, gamma, training, false, dg, db)
					for ch := range c {
						if !closeTo(dg[ch], wdg[ch], pTol, 1e-4) || !closeTo(db[ch], wdb[ch], pTol, 1e-4) {
							t.Fatalf("rows=%d c=%d no dx: ch %d: dgamma %v dbeta %v, want %v %v", rows, c, ch, dg[ch], db[ch], wdg[ch], wdb[ch])
						}
					}
					dx := make([]float32, len(x))
					BatchNormBackwardNHWC(dx, dy, x, rows, c, mean, is, gamma, training, false, nil, nil)
					for k := range dx {
						if !closeTo(dx[k], wdx[k], dxTol(k%c), 1e-5) {
							t.Fatalf("rows=%d c=%d training=%v no dgamma: dx[%d] = %v, want %v", rows, c, training, k, dx[k], wdx[k])
						}
					}
				}
			}
		}
	})
}

// The fused kernels are bit-identical to the unfused compositions.
func TestBatchNormNHWCReLUMatchesUnfused(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(49, 50))
		for _, s := range bnhShapes() {
			rows, c := s[0], s[1]
			x := bnhInput(r, rows, c, 0)
			res, dy := randSlice(r, len(x)), withNegZeros(randSlice(r, len(x)))
			gamma, beta := randSlice(r, c), randSlice(r, c)
			pc := func() []float32 { return make([]float32, c) }
			for _, rr := range [][]float32{nil, res} {
				name := fmt.Sprintf("rows=%d c=%d residual=%v", rows, c, rr != nil)
				want := make([]float32, len(x))
				wm, wv, wi := pc(), pc(), pc()
				BatchNormForwardTrainNHWC(want, x, rows, c, gamma, beta, 1e-5, wm, wv, wi)
				if rr != nil {
					Add(want, want, rr)
				}
				ReluForward(want, want)
				got := make([]float32, len(x))
				gm, gv, gi := pc(), pc(), pc()
				BatchNormForwardTrainReLUNHWC(got, x, rr, rows, c, gamma, beta, 1e-5, gm, gv, gi)
				requireSameBits(t, name+" y", got, want)
				requireSameBits(t, name+" mean", gm, wm)
				requireSameBits(t, name+" variance", gv, wv)
				requireSameBits(t, name+" invstd", gi, wi)
				// Evaluation mode.
				BatchNormApplyNHWC(want, x, rows, c, wm, wi, beta)
				if rr != nil {
					Add(want, want, rr)
				}
				ReluForward(want, want)
				BatchNormApplyReLUNHWC(got, x, rr, rows, c, wm, wi, beta)
				requireSameBits(t, name+" apply", got, want)

				y := got
				g := make([]float32, len(x))
				ReluBackwardSet(g, y, dy)
				for _, training := range []bool{true, false} {
					for _, acc := range []bool{false, true} {
						bname := fmt.Sprintf("%s training=%v acc=%v", name, training, acc)
						dx0 := randSlice(r, len(x))
						dg0, db0 := randSlice(r, c), randSlice(r, c)
						wdx, wdg, wdb := clone(dx0), clone(dg0), clone(db0)
						BatchNormBackwardNHWC(wdx, g, x, rows, c, wm, wi, gamma, training, acc, wdg, wdb)
						gdx, gdg, gdb := clone(dx0), clone(dg0), clone(db0)
						BatchNormBackwardReLUNHWC(gdx, dy, y, x, rows, c, wm, wi, gamma, training, acc, gdg, gdb)
						requireSameBits(t, bname+" dx", gdx, wdx)
						requireSameBits(t, bname+" dgamma", gdg, wdg)
						requireSameBits(t, bname+" dbeta", gdb, wdb)
					}
				}
			}
		}
	})
}

// bnhRunAll runs every channels-last kernel on one input and returns all outputs.
func bnhRunAll(x, res, dy []float32, rows, c int, gamma, beta []float32) [][]float32 {
	pc := func() []float32 { return make([]float32, c) }
	y, yr := make([]float32, len(x)), make([]float32, len(x))
	mean, vr, is := pc(), pc(), pc()
	BatchNormForwardTrainNHWC(y, x, rows, c, gamma, beta, 1e-5, mean, vr, is)
	BatchNormForwardTrainReLUNHWC(yr, x, res, rows, c, gamma, beta, 1e-5, pc(), pc(), pc())
	ya := make([]float32, len(x))
	BatchNormApplyReLUNHWC(ya, x, res, rows, c, mean, is, beta)
	dx, dxr := clone(res), make([]float32, len(x))
	dg, db, dgr, dbr := pc(), pc(), pc(), pc()
	BatchNormBackwardNHWC(dx, dy, x, rows, c, mean, is, gamma, true, true, dg, db)
	BatchNormBackwardReLUNHWC(dxr, dy, yr, x, rows, c, mean, is, gamma, true, false, dgr, dbr)
	return [][]float32{y, mean, vr, is, yr, ya, dx, dg, db, dxr, dgr, dbr}
}

// The results do not depend on the goroutine count, nor on the implementation (the
// assembly and the portable loops round alike).
func TestBatchNormNHWCDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, s := range [][2]int{{32 * 16 * 16, 32}, {5000, 24}, {3001, 3}, {2048, 512}, {64, 1000}, {1000, 1}} {
		rows, c := s[0], s[1]
		x := bnhInput(r, rows, c, 0)
		res, dy := randSlice(r, len(x)), randSlice(r, len(x))
		gamma, beta := randSlice(r, c), randSlice(r, c)
		var ref [][]float32
		refName := ""
		for _, name := range availableImpls() {
			restore := setImpl(name)
			for _, p := range []int{1, 2, 3, 4, 8} {
				var got [][]float32
				withProcs(p, func() { got = bnhRunAll(x, res, dy, rows, c, gamma, beta) })
				if ref == nil {
					ref, refName = got, fmt.Sprintf("%s GOMAXPROCS=%d", name, p)
					continue
				}
				for i := range got {
					requireSameBits(t, fmt.Sprintf("rows=%d c=%d %s GOMAXPROCS=%d (vs %s) output %d", rows, c, name, p, refName, i), got[i], ref[i])
				}
			}
			restore()
		}
	}
}

func TestBatchNormNHWCConstantChannel(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		const rows, c = 100, 3
		x := make([]float32, rows*c)
		for i := range x {
			x[i] = float32(i%c) + 1000.5
		}
		mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
		y := make([]float32, len(x))
		BatchNormForwardTrainNHWC(y, x, rows, c, []float32{1, 2, 3}, []float32{0.5, -1, 0}, 1e-5, mean, vr, is)
		for ch := range c {
			if mean[ch] != float32(ch)+1000.5 || vr[ch] != 0 {
				t.Fatalf("ch %d: mean %v variance %v", ch, mean[ch], vr[ch])
			}
		}
		for k, v := range y {
			if want := []float32{0.5, -1, 0}[k%c]; v != want {
				t.Fatalf("y[%d] = %v, want %v", k, v, want)
			}
		}
	})
}

func TestBatchNormNHWCPanics(t *testing.T) {
	pc := make([]float32, 3)
	x := make([]float32, 12)
	for name, f := range map[string]func(){
		"rows0":      func() { BatchNormForwardTrainNHWC(nil, nil, 0, 3, pc, pc, 1e-5, pc, pc, pc) },
		"short x":    func() { BatchNormForwardTrainNHWC(x, x[:11], 4, 3, pc, pc, 1e-5, pc, pc, pc) },
		"short r":    func() { BatchNormForwardTrainReLUNHWC(x, x, x[:9], 4, 3, pc, pc, 1e-5, pc, pc, pc) },
		"short mean": func() { BatchNormForwardTrainNHWC(x, x, 4, 3, pc, pc, 1e-5, pc[:2], pc, pc) },
		"apply":      func() { BatchNormApplyNHWC(x, x, 4, 3, pc, pc, pc[:1]) },
		"apply -1":   func() { BatchNormApplyReLUNHWC(x, x, nil, -1, 3, pc, pc, pc) },
		"backward":   func() { BatchNormBackwardNHWC(x[:3], x, x, 4, 3, pc, pc, pc, true, false, nil, nil) },
		"dgamma":     func() { BatchNormBackwardNHWC(x, x, x, 4, 3, pc, pc, pc, true, false, pc[:2], nil) },
		"relu y":     func() { BatchNormBackwardReLUNHWC(x, x, x[:6], x, 4, 3, pc, pc, pc, true, false, nil, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
	// Empty inputs are fine where the NCHW kernels accept them.
	BatchNormApplyNHWC(nil, nil, 0, 3, pc, pc, pc)
	BatchNormBackwardNHWC(nil, nil, nil, 0, 3, pc, pc, pc, true, false, make([]float32, 3), nil)
	BatchNormForwardTrainNHWC(nil, nil, 5, 0, nil, nil, 1e-5, nil, nil, nil)
}

// The kernels allocate nothing in the steady state, serial or split over the pool.
func TestBatchNormNHWCAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	r := rand.New(rand.NewPCG(53, 54))
	for _, s := range [][2]int{{7, 3}, {4096, 64}} {
		rows, c := s[0], s[1]
		x := bnhInput(r, rows, c, 0)
		dy, y, dx := randSlice(r, len(x)), make([]float32, len(x)), make([]float32, len(x))
		pc := func() []float32 { p := make([]float32, c); Fill(p, 1); return p }
		g, b, mean, vr, is, dg, db := pc(), pc(), pc(), pc(), pc(), pc(), pc()
		for name, f := range map[string]func(){
			"forward":  func() { BatchNormForwardTrainReLUNHWC(y, x, dy, rows, c, g, b, 1e-5, mean, vr, is) },
			"apply":    func() { BatchNormApplyNHWC(y, x, rows, c, mean, is, b) },
			"backward": func() { BatchNormBackwardReLUNHWC(dx, dy, y, x, rows, c, mean, is, g, true, false, dg, db) },
		} {
			f()
			if a := testing.AllocsPerRun(20, f); a > 0 {
				t.Errorf("rows=%d c=%d %s: %v allocations per call", rows, c, name, a)
			}
		}
	}
}

// BenchmarkBatchNormNHWC times the fused BatchNorm+ReLU forward (training, with a
// residual) and backward passes on channels-last data, next to the NCHW kernels at
// the same sizes: ResNet-20's three stages at batch 32 and two ResNet-50 stages at
// 64×64 inputs (batch 32).
func BenchmarkBatchNormNHWC(b *testing.B) {
	for _, s := range []struct{ n, c, hw int }{
		{32, 16, 32 * 32}, {32, 32, 16 * 16}, {32, 64, 8 * 8}, {32, 256, 16 * 16}, {32, 512, 8 * 8},
	} {
		rows, c := s.n*s.hw, s.c
		r := rand.New(rand.NewPCG(1, 1))
		x := bnhInput(r, rows, c, 0)
		res, dy := randSlice(r, len(x)), randSlice(r, len(x))
		gamma, beta := randSlice(r, c), randSlice(r, c)
		mean, vr, is := make([]float32, c), make([]float32, c), make([]float32, c)
		dg, db := make([]float32, c), make([]float32, c)
		y, dx := make([]float32, len(x)), make([]float32, len(x))
		name := fmt.Sprintf("%dx%dx%d", s.n, c, s.hw)
		b.Run("fwd-relu/nhwc/"+name, func(b *testing.B) {
			for b.Loop() {
				BatchNormForwardTrainReLUNHWC(y, x, res, rows, c, gamma, beta, 1e-5, mean, vr, is)
			}
		})
		b.Run("fwd-relu/nchw/"+name, func(b *testing.B) {
			for b.Loop() {
				BatchNormForwardTrainReLU(y, x, res, s.n, c, s.hw, gamma, beta, 1e-5, mean, vr, is)
			}
		})
		BatchNormForwardTrainReLUNHWC(y, x, res, rows, c, gamma, beta, 1e-5, mean, vr, is)
		b.Run("bwd-relu/nhwc/"+name, func(b *testing.B) {
			for b.Loop() {
				BatchNormBackwardReLUNHWC(dx, dy, y, x, rows, c, mean, is, gamma, true, false, dg, db)
			}
		})
		b.Run("bwd-relu/nchw/"+name, func(b *testing.B) {
			for b.Loop() {
				BatchNormBackwardReLU(dx, dy, y, x, s.n, c, s.hw, mean, is, gamma, true, false, dg, db)
			}
		})
	}
}

// fma32 rounds a·b + c once: it matches the exact sum rounded to float32 (to nearest,
// ties to even), on random operands of every magnitude and on cancelling ones.
func TestFMA32(t *testing.T) {
	r := rand.New(rand.NewPCG(55, 56))
	rnd := func() float32 {
		switch r.IntN(4) {
		case 0:
			return math.Float32frombits(r.Uint32()) // any bit pattern
		case 1:
			return float32(r.NormFloat64())
		default:
			return float32(math.Ldexp(r.Float64()*2-1, r.IntN(60)-30))
		}
	}
	check := func(a, b, c float32) {
		got := fma32(a, b, c)
		if a != a || b != b || c != c || math.IsInf(float64(a), 0) || math.IsInf(float64(b), 0) || math.IsInf(float64(c), 0) {
			return // NaN and infinities: not compared
		}
		exact := new(big.Float).SetPrec(400).SetFloat64(float64(a))
		exact.Mul(exact, new(big.Float).SetPrec(400).SetFloat64(float64(b)))
		exact.Add(exact, new(big.Float).SetPrec(400).SetFloat64(float64(c)))
		want, _ := exact.Float32()
		if exact.Sign() == 0 {
			want = float32(float64(a)*float64(b) + float64(c)) // the sign of an exact zero
		}
		if math.Float32bits(got) != math.Float32bits(want) && !(got == 0 && want == 0) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%#x), want %g (%#x)", a, b, c, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	for range 200000 {
		a, b := rnd(), rnd()
		check(a, b, rnd())
		// c cancelling most of the product, and c a neighbour of it.
		p := a * b
		check(a, b, -p)
		check(a, b, -math.Nextafter32(p, 0))
		check(a, b, math.Float32frombits(math.Float32bits(p)^1)*float32(math.Ldexp(1, r.IntN(40)-20)))
	}
	// Halfway cases of the float32 rounding after an inexact float64 sum.
	check(1+0x1p-23, 1+0x1p-23, 0x1p-80)
	check(1+0x1p-23, 1-0x1p-24, -0x1p-70)
	check(0x1p-126, 0x1p-20, 0x1p-149)
}
