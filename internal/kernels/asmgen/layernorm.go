package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// LayerNorm row kernels (kernels.LayerNormForward / LayerNormBackward): the row
// statistics in float64 as the Go loops keep them, the normalisation, and the
// backward pass's row sums, dx and the column sums of dgamma and dbeta.

func genLayerNorm() {
	genLNStats()
	genLNApply(avx512)
	genLNBwdStats(avx512)
	genLNBwdDx(avx512, false)
	genLNBwdDx(avx512, true)
	genLNParamGrad()
}

// widen converts the 16 floats of z to two zmm of 8 float64 (lanes 0–7, 8–15).
func widen(z reg.VecVirtual) (lo, hi reg.VecVirtual) {
	lo, hi = ZMM(), ZMM()
	yh := YMM()
	VCVTPS2PD(z.AsY(), lo)
	VEXTRACTF64X4(U8(1), z, yh)
	VCVTPS2PD(yh, hi)
	return lo, hi
}

// genLNStats emits lnStatsAVX512: the mean Σx/n and Σ(x−mean)², both over the
// float32 values widened to float64 and summed in float64 (eight accumulators of 8
// lanes, fixed order), two passes as the Go loop.
func genLNStats() {
	const name = "lnStatsAVX512"
	TEXT(name, NOSPLIT, "func(x *float32, n int) (mean, ss float64)")
	Doc(name+" returns mean = sum x[i] / n and ss = sum (x[i]-mean)² for i < n, n >= 1, from the",
		"values widened to float64 and summed in float64 in a fixed order (AVX-512F).")
	x, n := gp("x"), gp("n")
	x2, n2 := GP64(), GP64()
	MOVQ(x, x2)
	MOVQ(n, n2)
	acc := zeroed(8)
	stream(name+"_sum", n, []reg.GPVirtual{x}, func(off int, mask reg.Register) {
		zx := ZMM()
		load(Mem{Base: x, Disp: off}, mask, zx) // masked-off lanes are 0
		lo, hi := widen(zx)
		a := acc[2*(off/64):]
		VADDPD(lo, a[0], a[0])
		VADDPD(hi, a[1], a[1])
	})
	sumAcc8(acc, 0)
	mean := XMM()
	VMOVSD(retAddr(0), mean)
	fn := XMM()
	VCVTSI2SDQ(n2, fn, fn)
	VDIVSD(fn, mean, mean)
	VMOVSD(mean, retAddr(0))
	zmu := ZMM()
	VBROADCASTSD(mean, zmu)
	acc = zeroed(8)
	stream(name+"_dev", n2, []reg.GPVirtual{x2}, func(off int, mask reg.Register) {
		zx := ZMM()
		load(Mem{Base: x2, Disp: off}, mask, zx)
		lo, hi := widen(zx)
		a := acc[2*(off/64):]
		VSUBPD(zmu, lo, lo)
		VSUBPD(zmu, hi, hi)
		if mask == nil {
			VFMADD231PD(lo, lo, a[0])
			VFMADD231PD(hi, hi, a[1])
			return
		}
		// Lanes outside the mask keep their accumulator (their x−mean is −mean).
		khi := K()
		KSHIFTRW(U8(8), mask, khi)
		VFMADD231PD(lo, lo, mask, a[0])
		VFMADD231PD(hi, hi, khi, a[1])
	})
	sumAcc8(acc, 1)
	VZEROUPPER()
	RET()
}

// sumAcc8 adds eight float64 accumulators pairwise, reduces the four sums and stores
// the float64 result to return value i.
func sumAcc8(acc []reg.VecVirtual, i int) {
	for j := 0; j < 8; j += 2 {
		VADDPD(acc[j+1], acc[j], acc[j])
	}
	reduceTree([]reg.VecVirtual{acc[0], acc[2], acc[4], acc[6]}, VADDPD, VADDSD, true, i)
}

func retAddr(i int) Mem {
	r, err := ReturnIndex(i).Resolve()
	if err != nil {
		panic(err)
	}
	return r.Addr
}

func genLNApply(s *simd) {
	name := "lnApply" + s.suffix
	TEXT(name, NOSPLIT, "func(y, x, gamma, beta *float32, n int, mu, inv float32)")
	Doc(name + " computes y[i] = (x[i]-mu)*inv*gamma[i] + beta[i] for i < n (" + s.doc + ", the last step fused).")
	y, x, g, b, n := gp("y"), gp("x"), gp("gamma"), gp("beta"), gp("n")
	zmu, zinv := s.param("mu"), s.param("inv")
	s.stream(name, n, []reg.GPVirtual{y, x, g, b}, func(off int, mask reg.Register) {
		zx, zg, zb := s.vec(), s.vec(), s.vec()
		s.load(Mem{Base: x, Disp: off}, mask, zx)
		s.load(Mem{Base: g, Disp: off}, mask, zg)
		s.load(Mem{Base: b, Disp: off}, mask, zb)
		VSUBPS(zmu, zx, zx)
		VMULPS(zinv, zx, zx)
		VFMADD231PS(zg, zx, zb)
		s.store(zb, mask, Mem{Base: y, Disp: off})
	})
	VZEROUPPER()
	RET()
}

func genLNBwdStats(s *simd) {
	name := "lnBwdStats" + s.suffix
	TEXT(name, NOSPLIT, "func(dy, x, gamma *float32, n int, mu, inv float32) (s1, s2 float32)")
	Doc(name+" returns s1 = sum dy[i]*gamma[i] and s2 = sum dy[i]*gamma[i]*(x[i]-mu)*inv for i < n",
		"("+s.doc+"); fixed summation order.")
	dy, x, g, n := gp("dy"), gp("x"), gp("gamma"), gp("n")
	zmu, zinv := s.param("mu"), s.param("inv")
	s1, s2 := s.zeroed(4), s.zeroed(4)
	s.stream(name, n, []reg.GPVirtual{dy, x, g}, func(off int, mask reg.Register) {
		zd, zx := lnGradHat(s, dy, x, g, off, mask, zmu, zinv)
		u := s.unit(off)
		VADDPS(zd, s1[u], s1[u])
		VFMADD231PS(zx, zd, s2[u])
	})
	s.reduce(s1, 0)
	s.reduce(s2, 1)
	VZEROUPPER()
	RET()
}

// lnGradHat loads the vector at byte offset off and returns dy·gamma and
// x̂ = (x−mu)·inv, both 0 outside the mask.
func lnGradHat(s *simd, dy, x, g reg.GPVirtual, off int, mask reg.Register, zmu, zinv reg.VecVirtual) (gg, xh reg.VecVirtual) {
	gg, xh = s.vec(), s.vec()
	zg := s.vec()
	s.load(Mem{Base: dy, Disp: off}, mask, gg)
	s.load(Mem{Base: x, Disp: off}, mask, xh)
	s.load(Mem{Base: g, Disp: off}, mask, zg)
	VMULPS(zg, gg, gg)
	s.subZ(zmu, xh, mask)
	VMULPS(zinv, xh, xh)
	return gg, xh
}

func genLNBwdDx(s *simd, acc bool) {
	name, op := "lnBwdDxSet"+s.suffix, "="
	if acc {
		name, op = "lnBwdDxAcc"+s.suffix, "+="
	}
	TEXT(name, NOSPLIT, "func(dx, dy, x, gamma *float32, n int, mu, inv, s1, s2 float32)")
	Doc(name + " computes dx[i] " + op + " inv*(dy[i]*gamma[i] - s1 - (x[i]-mu)*inv*s2) for i < n (" + s.doc + ").")
	dx, dy, x, g, n := gp("dx"), gp("dy"), gp("x"), gp("gamma"), gp("n")
	zmu, zinv, zs1, zs2 := s.param("mu"), s.param("inv"), s.param("s1"), s.param("s2")
	s.stream(name, n, []reg.GPVirtual{dx, dy, x, g}, func(off int, mask reg.Register) {
		zd, zx := lnGradHat(s, dy, x, g, off, mask, zmu, zinv)
		VSUBPS(zs1, zd, zd)       // − s1
		VFNMADD231PS(zs2, zx, zd) // − x̂·s2
		if acc {
			zo := s.vec()
			s.load(Mem{Base: dx, Disp: off}, mask, zo)
			VFMADD231PS(zinv, zd, zo)
			s.store(zo, mask, Mem{Base: dx, Disp: off})
			return
		}
		VMULPS(zinv, zd, zd)
		s.store(zd, mask, Mem{Base: dx, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genLNParamGrad emits lnParamGradAVX512: up to 64 columns (four 16-lane strips with
// their own masks, so four independent FMA chains) of the dgamma / dbeta column sums
// over all rows, in row order (the Go loop's order per column).
func genLNParamGrad() {
	const name = "lnParamGradAVX512"
	TEXT(name, NOSPLIT, "func(sg, sb, dy, x, mean, rstd *float32, rows, d, n int)")
	Doc(name+" adds, for the n <= 64 columns i < n, sum over r < rows of dy[r*d+i]*(x[r*d+i]-mean[r])*rstd[r]",
		"to sg[i] and of dy[r*d+i] to sb[i], in row order (AVX-512F).")
	sg, sb, dy, x := gp("sg"), gp("sb"), gp("dy"), gp("x")
	mp, rp, rows, d, n := gp("mean"), gp("rstd"), gp("rows"), gp("d"), gp("n")
	const strips = 4
	var ks [strips]reg.Register
	var zsg, zsb [strips]reg.VecVirtual
	zero, m, t := GP64(), GP32(), GP64()
	XORQ(zero, zero)
	for j := range strips {
		// Lanes of strip j: clamp(n − 16j, 0, 16) (BZHI saturates at 16 by itself).
		MOVQ(n, t)
		SUBQ(U8(16*j), t)
		CMOVQLT(zero, t)
		MOVL(U32(0xffff), m)
		BZHIL(t.As32(), m, m)
		ks[j] = K()
		KMOVW(m, ks[j])
		zsg[j], zsb[j] = ZMM(), ZMM()
		load(Mem{Base: sg, Disp: 64 * j}, ks[j], zsg[j])
		load(Mem{Base: sb, Disp: 64 * j}, ks[j], zsb[j])
	}
	SHLQ(U8(2), d) // row stride in bytes
	Label(name + "_row")
	TESTQ(rows, rows)
	JE(LabelRef(name + "_done"))
	zmu, zinv := ZMM(), ZMM()
	VBROADCASTSS(Mem{Base: mp}, zmu)
	VBROADCASTSS(Mem{Base: rp}, zinv)
	for j := range strips {
		zd, zx := ZMM(), ZMM()
		load(Mem{Base: dy, Disp: 64 * j}, ks[j], zd)
		load(Mem{Base: x, Disp: 64 * j}, ks[j], zx)
		VSUBPS(zmu, zx, zx)
		VMULPS(zd, zx, zx) // dy·(x−mean), 0 outside the mask
		VFMADD231PS(zinv, zx, zsg[j])
		VADDPS(zd, zsb[j], zsb[j])
	}
	ADDQ(d, dy)
	ADDQ(d, x)
	ADDQ(U8(4), mp)
	ADDQ(U8(4), rp)
	DECQ(rows)
	JMP(LabelRef(name + "_row"))
	Label(name + "_done")
	for j := range strips {
		store(zsg[j], ks[j], Mem{Base: sg, Disp: 64 * j})
		store(zsb[j], ks[j], Mem{Base: sb, Disp: 64 * j})
	}
	VZEROUPPER()
	RET()
}
