package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The fused LSTM cell of one batch row (kernels/lstm.go, PyTorch's gate order i, f, g, o):
// the forward applies sigmoid32's and tanh32's formulas 16 (AVX-512) or 8 (AVX2) lanes at
// a time on the exponential of mathvec.go or mathvec_avx2.go, the backward is the same
// products as lstmBwdGeneric. A row of gates holds four blocks of n floats; the cell
// tensors hold n.

// genLSTM emits the six LSTM row kernels of s.
func genLSTM(s *simd) {
	genLSTMFwd(s, false)
	genLSTMFwd(s, true)
	for _, prev := range []bool{false, true} {
		for _, rec := range []bool{false, true} {
			genLSTMBwd(s, prev, rec)
		}
	}
}

// emitSigmoid replaces the 16 lanes of x by 1/(1 + e^−x) (sigmoid32).
func emitSigmoid(x reg.VecVirtual, r expRegs, one reg.VecVirtual) {
	VPXORD_BCST(kc("negZero"), x, x) // −x
	emitExp(x, r, nil)
	VADDPS(one, x, x)
	VDIVPS(x, one, x)
}

// emitTanh returns tanh of the 16 lanes of x (x is kept), tanh32's steps: with a = |x|
// and e = e^(−2a), sign(x)·(1 − e)/(1 + e), and the Taylor polynomial where a < 1/16
// (1 − e would cancel there). Large |x| gives exactly ±1 (as tanh32's a ≥ 20 branch), a
// NaN stays NaN.
func emitTanh(x reg.VecVirtual, r expRegs, one reg.VecVirtual) reg.VecVirtual {
	a, e, num, y := ZMM(), ZMM(), ZMM(), ZMM()
	VPANDD_BCST(kc("absMask"), x, a)
	VMULPS_BCST(kc("negTwo"), a, e)
	emitExp(e, r, nil)
	VSUBPS(e, one, num) // 1 − e
	VADDPS(e, one, e)   // 1 + e
	VDIVPS(e, num, y)
	s := ZMM()
	VPANDD_BCST(kc("negZero"), x, s)
	VPORD(s, y, y) // the sign of x
	x2, p := ZMM(), ZMM()
	VMULPS(x, x, x2)
	VBROADCASTSS(kc("t7"), p)
	VFMADD213PS_BCST(kc("t5"), x2, p) // p = x²·p + c
	VFMADD213PS_BCST(kc("t3"), x2, p)
	VFMADD213PS(one, x2, p)
	small := K()
	VCMPPS_BCST(U8(0x11), kc("tanhSmall"), a, small) // a < 1/16 (LT_OQ: false for NaN)
	VMULPS(p, x, small, y)                           // x·p there
	return y
}

// gateAddr returns the address of gate block k (0…3: i, f, g, o) at byte offset off of
// a row at base; b1 holds the block's size in bytes, b3 three times that.
func gateAddr(base, b1, b3 reg.GPVirtual, k, off int) Mem {
	switch k {
	case 0:
		return Mem{Base: base, Disp: off}
	case 1:
		return Mem{Base: base, Index: b1, Scale: 1, Disp: off}
	case 2:
		return Mem{Base: base, Index: b1, Scale: 2, Disp: off}
	}
	return Mem{Base: base, Index: b3, Scale: 1, Disp: off}
}

// blockBytes returns registers holding n·4 and 3·n·4 (before stream consumes n).
func blockBytes(n reg.GPVirtual) (b1, b3 reg.GPVirtual) {
	b1, b3 = GP64(), GP64()
	MOVQ(n, b1)
	SHLQ(U8(2), b1)
	LEAQ(Mem{Base: b1, Index: b1, Scale: 2}, b3)
	return b1, b3
}

// genLSTMFwd emits lstmFwd<suffix> (zero previous cell) or lstmFwdPrev<suffix>.
func genLSTMFwd(s *simd, prev bool) {
	name, sig, cpDoc := "lstmFwd"+s.suffix, "func(gates, c, tc, h *float32, n int)", "0"
	if prev {
		name, sig, cpDoc = "lstmFwdPrev"+s.suffix, "func(gates, cPrev, c, tc, h *float32, n int)", "f·cPrev[k]"
	}
	TEXT(name, NOSPLIT, sig)
	Doc(name+" applies one LSTM row's gates for k < n: gates[k], gates[n+k], gates[3n+k] become",
		"their sigmoids i, f, o and gates[2n+k] its tanh g, then c[k] = "+cpDoc+" + i·g, tc[k] = tanh(c[k]),",
		"h[k] = o·tc[k] ("+s.doc+").")
	g := gp("gates")
	ptrs := []reg.GPVirtual{g}
	var cp reg.GPVirtual
	if prev {
		cp = gp("cPrev")
		ptrs = append(ptrs, cp)
	}
	c, tc, h, n := gp("c"), gp("tc"), gp("h"), gp("n")
	ptrs = append(ptrs, c, tc, h)
	b1, b3 := blockBytes(n)
	r := s.expRegs()
	one := s.splat("one")
	s.stream(name, n, ptrs, func(off int, mask reg.Register) {
		var z [4]reg.VecVirtual
		for k := range z {
			z[k] = s.vec()
			s.load(gateAddr(g, b1, b3, k, off), mask, z[k])
			if k == 2 {
				z[k] = s.tanh(z[k], r, one)
			} else {
				s.sigmoid(z[k], r, one)
			}
			s.store(z[k], mask, gateAddr(g, b1, b3, k, off))
		}
		cv := s.vec()
		VMULPS(z[2], z[0], cv) // i·g
		if prev {
			zc := s.vec()
			s.load(Mem{Base: cp, Disp: off}, mask, zc)
			VFMADD231PS(zc, z[1], cv) // + f·cPrev
		}
		s.store(cv, mask, Mem{Base: c, Disp: off})
		t := s.tanh(cv, r, one)
		s.store(t, mask, Mem{Base: tc, Disp: off})
		VMULPS(t, z[3], t)
		s.store(t, mask, Mem{Base: h, Disp: off})
	})
	VZEROUPPER()
	RET()
}

// genLSTMBwd emits lstmBwd{Prev}{Rec}<suffix>: the backward of one row with dy given and
// the previous cell (prev) and the recurrent gradient dhRec (rec) present or zero.
func genLSTMBwd(s *simd, prev, rec bool) {
	name, params := "lstmBwd", "d, a"
	if prev {
		name, params = name+"Prev", params+", cPrev"
	}
	params += ", tc, dy"
	if rec {
		name, params = name+"Rec", params+", dhRec"
	}
	name += s.suffix
	TEXT(name, NOSPLIT, fmt.Sprintf("func(%s, dc *float32, n int)", params))
	cpDoc, dhDoc := "0", "dy"
	if prev {
		cpDoc = "cPrev"
	}
	if rec {
		dhDoc = "dy + dhRec"
	}
	Doc(name+" is the backward of one LSTM row for k < n, with acts a = (i, f, g, o) in four",
		"blocks of n, dh = "+dhDoc+", tc = tanh(c) and cp = "+cpDoc+": dc' = dc + dh·o·(1 − tc²);",
		"d = (dc'·g·i·(1−i), dc'·cp·f·(1−f), dc'·i·(1−g²), dh·tc·o·(1−o)); dc = dc'·f ("+s.doc+").")
	d, a := gp("d"), gp("a")
	ptrs := []reg.GPVirtual{d, a}
	var cp, dr reg.GPVirtual
	if prev {
		cp = gp("cPrev")
		ptrs = append(ptrs, cp)
	}
	tc, dy := gp("tc"), gp("dy")
	ptrs = append(ptrs, tc, dy)
	if rec {
		dr = gp("dhRec")
		ptrs = append(ptrs, dr)
	}
	dc, n := gp("dc"), gp("n")
	ptrs = append(ptrs, dc)
	b1, b3 := blockBytes(n)
	one := s.splat("one")
	var zero reg.VecVirtual
	if !prev {
		zero = s.zeroed(1)[0]
	}
	s.stream(name, n, ptrs, func(off int, mask reg.Register) {
		dh, t := s.vec(), s.vec()
		s.load(Mem{Base: dy, Disp: off}, mask, dh)
		if rec {
			zr := s.vec()
			s.load(Mem{Base: dr, Disp: off}, mask, zr)
			VADDPS(zr, dh, dh)
		}
		var z [4]reg.VecVirtual
		for k := range z {
			z[k] = s.vec()
			s.load(gateAddr(a, b1, b3, k, off), mask, z[k])
		}
		i, f, g, o := z[0], z[1], z[2], z[3]
		s.load(Mem{Base: tc, Disp: off}, mask, t)
		// dc' = dc + dh·o·(1 − t²)
		u, w, dcv := s.vec(), s.vec(), s.vec()
		VMOVAPS(one, u)
		VFNMADD231PS(t, t, u)
		VMULPS(o, dh, w)
		VMULPS(u, w, w)
		s.load(Mem{Base: dc, Disp: off}, mask, dcv)
		VADDPS(w, dcv, dcv)
		// oneMinus(v) returns 1 − v in a fresh register.
		oneMinus := func(v reg.VecVirtual) reg.VecVirtual {
			m := s.vec()
			VSUBPS(v, one, m)
			return m
		}
		di := s.vec()
		VMULPS(g, dcv, di)
		VMULPS(i, di, di)
		VMULPS(oneMinus(i), di, di)
		s.store(di, mask, gateAddr(d, b1, b3, 0, off))
		df, cpv := s.vec(), zero
		if prev {
			cpv = s.vec()
			s.load(Mem{Base: cp, Disp: off}, mask, cpv)
		}
		VMULPS(cpv, dcv, df)
		VMULPS(f, df, df)
		VMULPS(oneMinus(f), df, df)
		s.store(df, mask, gateAddr(d, b1, b3, 1, off))
		dg, u2 := s.vec(), s.vec()
		VMULPS(i, dcv, dg)
		VMOVAPS(one, u2)
		VFNMADD231PS(g, g, u2) // 1 − g²
		VMULPS(u2, dg, dg)
		s.store(dg, mask, gateAddr(d, b1, b3, 2, off))
		do := s.vec()
		VMULPS(t, dh, do)
		VMULPS(o, do, do)
		VMULPS(oneMinus(o), do, do)
		s.store(do, mask, gateAddr(d, b1, b3, 3, off))
		VMULPS(f, dcv, dcv)
		s.store(dcv, mask, Mem{Base: dc, Disp: off})
	})
	VZEROUPPER()
	RET()
}
