package main

import (
	"fmt"

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

// nhwcRowsAVX2 emits the loops of a pass and the return. The rows are taken in
// groups of up to eight; each group is walked in strips of w ymm (then of
// one ymm) of lanes: the strip's lane values (params) and accumulators (accs, stored
// back after the group) are held in registers while the strip walks down the group's
// rows, so the loop loads only the stream arrays. body(p, a, stream, u) emits the
// work on unit u (8 floats) of a strip at the current row, with p[i][u], a[i][u] the
// registers of lane array i and accumulator i, and stream(i, off) the address of
// stream array i at byte offset off from the strip in the current row.
func nhwcRowsAVX2(name string, w int, params, accs, streams []reg.GPVirtual,
	body func(p, a [][]reg.VecVirtual, stream func(i, off int) Mem, u int)) {
	const groupRows = 8
	e, rows := gp("e"), gp("rows")
	SHLQ(U8(2), e) // bytes per row
	idx, ro, cnt, rg := GP64(), GP64(), GP64(), GP64()
	stream := func(i, off int) Mem { return Mem{Base: streams[i], Index: ro, Scale: 1, Disp: off} }
	alloc := func(n, width int) [][]reg.VecVirtual {
		r := make([][]reg.VecVirtual, n)
		for i := range r {
			r[i] = make([]reg.VecVirtual, width)
			for u := range r[i] {
				r[i][u] = YMM()
			}
		}
		return r
	}
	p, a := alloc(len(params), w), alloc(len(accs), w)
	Label(name + "_group")
	TESTQ(rows, rows)
	JE(LabelRef(name + "_done"))
	MOVQ(U32(groupRows), rg)
	CMPQ(rows, rg)
	CMOVQLT(rows, rg)
	XORQ(idx, idx)
	for _, width := range []int{w, 1} {
		if width == 1 && w == 1 {
			break
		}
		lbl := fmt.Sprintf("%s_strip%d", name, width)
		Label(lbl)
		MOVQ(e, cnt)
		SUBQ(idx, cnt)
		CMPQ(cnt, U32(32*width))
		next := fmt.Sprintf("%s_strip%d", name, 1)
		if width == 1 || w == 1 {
			next = name + "_nextgroup"
		}
		JL(LabelRef(next))
		for i, l := range params {
			for u := range width {
				VMOVUPS(Mem{Base: l, Index: idx, Scale: 1, Disp: 32 * u}, p[i][u])
			}
		}
		for i, l := range accs {
			for u := range width {
				VMOVUPS(Mem{Base: l, Index: idx, Scale: 1, Disp: 32 * u}, a[i][u])
			}
		}
		MOVQ(idx, ro)
		MOVQ(rg, cnt)
		Label(lbl + "_row")
		for u := range width {
			body(p, a, stream, u)
		}
		ADDQ(e, ro)
		DECQ(cnt)
		JNZ(LabelRef(lbl + "_row"))
		for i, l := range accs {
			for u := range width {
				VMOVUPS(a[i][u], Mem{Base: l, Index: idx, Scale: 1, Disp: 32 * u})
			}
		}
		ADDQ(U32(32*width), idx)
		JMP(LabelRef(lbl))
	}
	Label(name + "_nextgroup")
	SUBQ(rg, rows)
	IMULQ(e, rg)
	for _, s := range streams {
		ADDQ(rg, s)
	}
	JMP(LabelRef(name + "_group"))
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
		accs, params, streams := gps("acc"), gps("k"), gps("x")
		nhwcRowsAVX2(name, 4, params, accs, streams, func(p, a [][]reg.VecVirtual, stream func(i, off int) Mem, u int) {
			v := YMM()
			VMOVUPS(stream(0, 32*u), v)
			VSUBPS(p[0][u], v, v)
			VADDPS(v, a[0][u], a[0][u])
		})
	}
	{
		const name = "bnhSumSqDevAVX2"
		TEXT(name, NOSPLIT, "func(acc, mu, x *float32, e, rows int)")
		Doc(name + " computes acc[j] += (x[j] - mu[j])²" + rowsDoc)
		accs, params, streams := gps("acc"), gps("mu"), gps("x")
		nhwcRowsAVX2(name, 4, params, accs, streams, func(p, a [][]reg.VecVirtual, stream func(i, off int) Mem, u int) {
			v := YMM()
			VMOVUPS(stream(0, 32*u), v)
			VSUBPS(p[0][u], v, v)
			VFMADD231PS(v, v, a[0][u])
		})
	}
	for _, relu := range []bool{false, true} {
		name, sig, g := "bnhDyStatsAVX2", "func(s, t, mu, dy, x *float32, e, rows int)", "dy[j]"
		if relu {
			name, sig, g = "bnhDyStatsReluAVX2", "func(s, t, mu, dy, y, x *float32, e, rows int)", "dy[j] where y[j] > 0, else 0"
		}
		TEXT(name, NOSPLIT, sig)
		Doc(name + " computes s[j] += g and t[j] += g·(x[j] - mu[j]), g = " + g + "," + rowsDoc)
		accs, params := gps("s", "t"), gps("mu")
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
		nhwcRowsAVX2(name, 4, params, accs, streams, func(p, a [][]reg.VecVirtual, stream func(i, off int) Mem, u int) {
			gv, d := YMM(), YMM()
			if relu {
				maskedY(gv, zero, stream(0, 32*u), stream(1, 32*u))
			} else {
				VMOVUPS(stream(0, 32*u), gv)
			}
			VADDPS(gv, a[0][u], a[0][u])
			VMOVUPS(stream(xi, 32*u), d)
			VSUBPS(p[0][u], d, d)
			VFMADD231PS(d, gv, a[1][u])
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
		params := gps("mu", "a", "b")
		var zero reg.VecVirtual
		if kind > 0 {
			zero = zeroY()
		}
		nhwcRowsAVX2(name, 4, params, nil, streams, func(p, _ [][]reg.VecVirtual, stream func(i, off int) Mem, u int) {
			v := YMM()
			VMOVUPS(stream(1, 32*u), v)
			VSUBPS(p[0][u], v, v)
			VFMADD213PS(p[2][u], p[1][u], v) // a·(x-mu) + b
			if kind == 2 {
				VADDPS(stream(2, 32*u), v, v)
			}
			if kind > 0 {
				// Intel order: max(src1=v, src2=0) returns src2 when v is NaN.
				VMAXPS(zero, v, v)
			}
			VMOVUPS(v, stream(0, 32*u))
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
			params := gps("mu", "a", "b", "c")
			var zero reg.VecVirtual
			if relu {
				zero = zeroY()
			}
			nhwcRowsAVX2(name, 2, params, nil, streams, func(p, _ [][]reg.VecVirtual, stream func(i, off int) Mem, u int) {
				v, gv := YMM(), YMM()
				VMOVUPS(stream(xi, 32*u), v)
				VSUBPS(p[0][u], v, v)
				VFMADD213PS(p[3][u], p[2][u], v) // b·(x-mu) + c
				if relu {
					maskedY(gv, zero, stream(1, 32*u), stream(2, 32*u))
				} else {
					VMOVUPS(stream(1, 32*u), gv)
				}
				VFMADD231PS(gv, p[1][u], v) // a·g + (b·(x-mu) + c)
				if acc {
					VADDPS(stream(0, 32*u), v, v)
				}
				VMOVUPS(v, stream(0, 32*u))
			})
		}
	}
}
