package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// Channels-last BatchNorm passes (batchnorm_nhwc.go), AVX2. Each walks rows rows
// of e floats (e a multiple of 8): the stream arrays (x, y, dy, dx, r) hold the
// rows one after another, the lane arrays (per-element parameters and float32
// accumulators, e floats each) are reused by every row, so element j of a row is
// paired with lane j. Each product is fused with the addition that follows it (one
// rounding, the NCHW kernels' AVX2 arithmetic); the portable loops compute the same
// fused results exactly (fma32), so the assembly and the Go loops give the same bits
// for every element.
//
// The passes walk the rows in memory order, loading the lane values with the
// stream values (the loads, not the arithmetic, bound them in cache): walking a
// strip of lanes down the rows with the lane values in registers was faster on data
// in cache, but the strided walk defeated the hardware prefetchers, and the passes
// over activations larger than the caches were up to twice as slow.

// nhwcRowsAVX2 emits the row and lane loops of a pass, 32 floats per iteration
// (four ymm), then 8, and the return. lanes and streams are the pointer arguments;
// body(lane, stream) emits the work on 8 floats, with lane(i, off) and stream(i,
// off) the addresses of lane array i and stream array i at byte offset off from
// the current position.
func nhwcRowsAVX2(name string, lanes, streams []reg.GPVirtual, body func(lane, stream func(i, off int) Mem, off int)) {
	e, rows := gp("e"), gp("rows")
	SHLQ(U8(2), e) // bytes per row
	idx, cnt := GP64(), GP64()
	lane := func(i, off int) Mem { return Mem{Base: lanes[i], Index: idx, Scale: 1, Disp: off} }
	stream := func(i, off int) Mem { return Mem{Base: streams[i], Index: idx, Scale: 1, Disp: off} }
	TESTQ(rows, rows)
	JE(LabelRef(name + "_done"))
	Label(name + "_row")
	XORQ(idx, idx)
	MOVQ(e, cnt)
	Label(name + "_loop32")
	CMPQ(cnt, U32(128))
	JL(LabelRef(name + "_loop8"))
	for u := range 4 {
		body(lane, stream, 32*u)
	}
	ADDQ(U32(128), idx)
	SUBQ(U32(128), cnt)
	JMP(LabelRef(name + "_loop32"))
	Label(name + "_loop8")
	TESTQ(cnt, cnt)
	JE(LabelRef(name + "_next"))
	body(lane, stream, 0)
	ADDQ(U8(32), idx)
	SUBQ(U8(32), cnt)
	JMP(LabelRef(name + "_loop8"))
	Label(name + "_next")
	for _, s := range streams {
		ADDQ(e, s)
	}
	DECQ(rows)
	JNZ(LabelRef(name + "_row"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

func gps(names ...string) []reg.GPVirtual {
	r := make([]reg.GPVirtual, len(names))
	for i, n := range names {
		r[i] = gp(n)
	}
	return r
}

func genBatchNormNHWCAVX2() {
	const rowsDoc = " for every row of e floats (e a multiple of 8) of rows rows, lane j of a row pairing with element j of the lane arrays (AVX2, FMA: a product and the addition that follows it round once)."
	{
		const name = "bnhSumDevAVX2"
		TEXT(name, NOSPLIT, "func(acc, k, x *float32, e, rows int)")
		Doc(name + " computes acc[j] += x[j] - k[j]" + rowsDoc)
		lanes, streams := gps("acc", "k"), gps("x")
		nhwcRowsAVX2(name, lanes, streams, func(lane, stream func(i, off int) Mem, off int) {
			v := YMM()
			VMOVUPS(stream(0, off), v)
			VSUBPS(lane(1, off), v, v)
			VADDPS(lane(0, off), v, v)
			VMOVUPS(v, lane(0, off))
		})
	}
	{
		const name = "bnhSumSqDevAVX2"
		TEXT(name, NOSPLIT, "func(acc, mu, x *float32, e, rows int)")
		Doc(name + " computes acc[j] += (x[j] - mu[j])²" + rowsDoc)
		lanes, streams := gps("acc", "mu"), gps("x")
		nhwcRowsAVX2(name, lanes, streams, func(lane, stream func(i, off int) Mem, off int) {
			v := YMM()
			VMOVUPS(stream(0, off), v)
			VSUBPS(lane(1, off), v, v)
			a := YMM()
			VMOVUPS(lane(0, off), a)
			VFMADD231PS(v, v, a)
			VMOVUPS(a, lane(0, off))
		})
	}
	for _, relu := range []bool{false, true} {
		name, sig, g := "bnhDyStatsAVX2", "func(s, t, mu, dy, x *float32, e, rows int)", "dy[j]"
		if relu {
			name, sig, g = "bnhDyStatsReluAVX2", "func(s, t, mu, dy, y, x *float32, e, rows int)", "dy[j] where y[j] > 0, else 0"
		}
		TEXT(name, NOSPLIT, sig)
		Doc(name + " computes s[j] += g and t[j] += g·(x[j] - mu[j]), g = " + g + "," + rowsDoc)
		lanes := gps("s", "t", "mu")
		streams := gps("dy")
		if relu {
			streams = append(streams, gp("y"))
		}
		streams = append(streams, gp("x"))
		xi := len(streams) - 1
		var zero reg.VecVirtual
		if relu {
			zero = zeroY()
		}
		nhwcRowsAVX2(name, lanes, streams, func(lane, stream func(i, off int) Mem, off int) {
			gv, d, a := YMM(), YMM(), YMM()
			if relu {
				maskedY(gv, zero, stream(0, off), stream(1, off))
			} else {
				VMOVUPS(stream(0, off), gv)
			}
			VADDPS(lane(0, off), gv, a)
			VMOVUPS(a, lane(0, off))
			VMOVUPS(stream(xi, off), d)
			VSUBPS(lane(2, off), d, d)
			t := YMM()
			VMOVUPS(lane(1, off), t)
			VFMADD231PS(d, gv, t)
			VMOVUPS(t, lane(1, off))
		})
	}
	for _, kind := range []int{0, 1, 2} { // affine, +relu, +residual+relu
		name, sig := "bnhAffineAVX2", "func(dst, x, mu, a, b *float32, e, rows int)"
		doc := name + " computes dst[j] = (x[j] - mu[j])·a[j] + b[j]"
		switch kind {
		case 1:
			name = "bnhAffineReluAVX2"
			doc = name + " computes dst[j] = max((x[j] - mu[j])·a[j] + b[j], 0), NaN giving 0,"
		case 2:
			name, sig = "bnhAffineAddReluAVX2", "func(dst, x, r, mu, a, b *float32, e, rows int)"
			doc = name + " computes dst[j] = max(((x[j] - mu[j])·a[j] + b[j]) + r[j], 0), NaN giving 0,"
		}
		TEXT(name, NOSPLIT, sig)
		Doc(doc + rowsDoc)
		streams := gps("dst", "x")
		if kind == 2 {
			streams = append(streams, gp("r"))
		}
		lanes := gps("mu", "a", "b")
		var zero reg.VecVirtual
		if kind > 0 {
			zero = zeroY()
		}
		nhwcRowsAVX2(name, lanes, streams, func(lane, stream func(i, off int) Mem, off int) {
			v := YMM()
			VMOVUPS(stream(1, off), v)
			VSUBPS(lane(0, off), v, v)
			a := YMM()
			VMOVUPS(lane(1, off), a)
			VFMADD213PS(lane(2, off), a, v) // a·(x-mu) + b
			if kind == 2 {
				VADDPS(stream(2, off), v, v)
			}
			if kind > 0 {
				// Intel order: max(src1=v, src2=0) returns src2 when v is NaN.
				VMAXPS(zero, v, v)
			}
			VMOVUPS(v, stream(0, off))
		})
	}
	for _, relu := range []bool{false, true} {
		for _, acc := range []bool{false, true} {
			kind, op := "Set", "="
			if acc {
				kind, op = "Acc", "+="
			}
			name, sig, g := "bnhBwd"+kind+"AVX2", "func(dst, dy, x, mu, a, b, c *float32, e, rows int)", "dy[j]"
			if relu {
				name, sig, g = "bnhBwdRelu"+kind+"AVX2", "func(dst, dy, y, x, mu, a, b, c *float32, e, rows int)", "g"
			}
			doc := name + " computes dst[j] " + op + " a[j]·" + g + " + (b[j]·(x[j] - mu[j]) + c[j])"
			if relu {
				doc += ", g = dy[j] where y[j] > 0, else 0,"
			}
			TEXT(name, NOSPLIT, sig)
			Doc(doc + rowsDoc)
			streams := gps("dst", "dy")
			if relu {
				streams = append(streams, gp("y"))
			}
			streams = append(streams, gp("x"))
			xi := len(streams) - 1
			lanes := gps("mu", "a", "b", "c")
			var zero reg.VecVirtual
			if relu {
				zero = zeroY()
			}
			nhwcRowsAVX2(name, lanes, streams, func(lane, stream func(i, off int) Mem, off int) {
				v, gv := YMM(), YMM()
				VMOVUPS(stream(xi, off), v)
				VSUBPS(lane(0, off), v, v)
				b := YMM()
				VMOVUPS(lane(2, off), b)
				VFMADD213PS(lane(3, off), b, v) // b·(x-mu) + c
				if relu {
					maskedY(gv, zero, stream(1, off), stream(2, off))
				} else {
					VMOVUPS(stream(1, off), gv)
				}
				VFMADD231PS(lane(1, off), gv, v) // a·g + (b·(x-mu) + c)
				if acc {
					VADDPS(stream(0, off), v, v)
				}
				VMOVUPS(v, stream(0, off))
			})
		}
	}
}
