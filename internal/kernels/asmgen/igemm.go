package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// vecISA describes the vector registers of one micro-kernel family: the
// AVX-512 kernels use zmm (32 columns per tile row in two registers), the
// AVX2 kernels ymm (16 columns).
type vecISA struct {
	suffix string // name suffix: "AVX512x8", "AVX2x6"
	doc    string // the instruction set, for the doc comments
	mr     int    // tile rows
	bytes  int    // bytes per vector register
	alloc  func() reg.VecVirtual
	zero   func(ops ...Op)
}

var (
	isaAVX512 = vecISA{suffix: "AVX512x8", doc: "AVX-512F", mr: 8, bytes: 64, alloc: ZMM, zero: VPXORD}
	// 6×16 uses all sixteen ymm registers: 12 accumulators, two B vectors, one broadcast.
	isaAVX2 = vecISA{suffix: "AVX2x6", doc: "AVX2+FMA", mr: 6, bytes: 32, alloc: YMM, zero: VXORPS}
)

// genIndirect emits sgemmIndirect<suffix>, the indirect-GEMM micro-kernel
// of the NHWC convolution (convnhwc.go): an mr×nr tile (nr = two vectors)
// C = A·B + beta·C where row r of A is not packed but read in place, as
// taps runs of clen contiguous floats starting at base + offs[t·mr + r]
// (element offsets into a padded NHWC image: one output pixel's input
// window, channel-contiguous per kernel tap). B is packed like the SGEMM
// kernel's: taps·clen groups of nr floats.
//
// With narrow set it emits sgemmIndirect<suffix>n, the same for the tile's first
// vector of columns only (nr/2), B still packed nr floats a group: the sliver of
// a layer whose output channels end half way through a tile (16 of AVX-512's 32:
// every sliver of ResNet's 16-channel layers, forward and input gradient) costs
// half the FMAs and is written in place instead of through a scratch tile.
func genIndirect(isa vecISA, narrow bool) {
	mr, nr, nv := isa.mr, 2*isa.bytes/4, 2
	name := "sgemmIndirect" + isa.suffix
	what := fmt.Sprintf("an %d×%d tile", mr, nr)
	if narrow {
		nv, name = 1, name+"n"
		what = fmt.Sprintf("the first %d columns of an %d×%d tile (B packed %d wide)", nr/2, mr, nr, nr)
	}
	TEXT(name, NOSPLIT, "func(taps, clen int, base *float32, offs *int, b, c *float32, ldc int, beta float32)")
	Doc(fmt.Sprintf("%s computes %s C = A·B + beta·C where A's rows are read through an offset table (%s).", name, what, isa.doc))
	taps := Load(Param("taps"), GP64())
	offs := Load(Param("offs"), GP64())
	b := Load(Param("b"), GP64())

	acc := zeroAccumulators(mr, nv, isa.alloc, isa.zero)
	bv := make([]reg.VecVirtual, nv)
	for v := range bv {
		bv[v] = isa.alloc()
	}
	abc := isa.alloc()
	rows := make([]reg.GPVirtual, mr)
	for r := range rows {
		rows[r] = GP64()
	}
	idx, n := GP64(), GP64()

	TESTQ(taps, taps)
	JE(LabelRef(name + "_store"))
	Label(name + "_tap")
	for r := range rows {
		MOVQ(Mem{Base: offs, Disp: r * 8}, rows[r])
		SHLQ(U8(2), rows[r])
		ADDQ(paramAddr("base"), rows[r])
	}
	ADDQ(U8(mr*8), offs)
	XORQ(idx, idx)
	Load(Param("clen"), n)
	step := func(u int) {
		for v, bvec := range bv {
			VMOVUPS(Mem{Base: b, Disp: u*nr*4 + v*isa.bytes}, bvec)
		}
		for r := range mr {
			VBROADCASTSS(Mem{Base: rows[r], Index: idx, Scale: 1, Disp: u * 4}, abc)
			for v, bvec := range bv {
				VFMADD231PS(abc, bvec, acc[r][v])
			}
		}
	}
	kLoop(name, n, "_next", step, func(count int) {
		ADDQ(U8(count*4), idx)
		ADDQ(U32(count*nr*4), b)
	})

	Label(name + "_next")
	DECQ(taps)
	JNZ(LabelRef(name + "_tap"))

	Label(name + "_store")
	c := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	SHLQ(U8(2), ldc)
	storeTile(name, acc, c, ldc, bv[nv-1], isa.bytes)
}

// genGather32AVX512 emits gather32AVX512, the weight packer of ConvNHWC: for
// each of rows rows, 32 floats gathered from src (row i starts srcStep
// floats after row i-1) at the element offsets idx[0..32), written
// contiguously to dst.
func genGather32AVX512() {
	name := "gather32AVX512"
	TEXT(name, NOSPLIT, "func(dst, src *float32, rows, srcStep int, idx *int32)")
	Doc(name + " writes dst[32·i+q] = src[i·srcStep+idx[q]] for i < rows, q < 32 (AVX-512F gathers).")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	rows := Load(Param("rows"), GP64())
	step := Load(Param("srcStep"), GP64())
	idx := Load(Param("idx"), GP64())
	SHLQ(U8(2), step)
	i0, i1 := ZMM(), ZMM()
	VMOVDQU32(Mem{Base: idx}, i0)
	VMOVDQU32(Mem{Base: idx, Disp: 64}, i1)
	TESTQ(rows, rows)
	JE(LabelRef(name + "_done"))
	Label(name + "_loop")
	k0, k1 := K(), K()
	v0, v1 := ZMM(), ZMM()
	KXNORW(k0, k0, k0)
	KXNORW(k1, k1, k1)
	VGATHERDPS(Mem{Base: src, Index: i0, Scale: 4}, k0, v0)
	VGATHERDPS(Mem{Base: src, Index: i1, Scale: 4}, k1, v1)
	VMOVUPS(v0, Mem{Base: dst})
	VMOVUPS(v1, Mem{Base: dst, Disp: 64})
	ADDQ(U8(128), dst)
	ADDQ(step, src)
	DECQ(rows)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// genTranspose16AVX512 emits transpose16AVX512: blocks 16×16 transposes,
// dst[(16b+j)·ldd + i] = src[i·lds + 16b + j] for i, j < 16 and b < blocks
// (strides in floats), in registers: unpack 32-bit, unpack 64-bit, then two
// rounds of 128-bit lane shuffles. The layout passes of the NHWC
// convolution (PadNHWC, NHWCToNCHW) and its weight packing use it.
func genTranspose16AVX512() {
	name := "transpose16AVX512"
	TEXT(name, NOSPLIT, "func(dst *float32, ldd int, src *float32, lds, blocks int)")
	Doc(name + " transposes blocks 16×16 tiles: dst[(16b+j)·ldd+i] = src[i·lds+16b+j] (AVX-512F).")
	dst := Load(Param("dst"), GP64())
	ldd := Load(Param("ldd"), GP64())
	src := Load(Param("src"), GP64())
	lds := Load(Param("lds"), GP64())
	blocks := Load(Param("blocks"), GP64())
	SHLQ(U8(2), ldd)
	SHLQ(U8(2), lds)
	r := make([]reg.VecVirtual, 16)
	t := make([]reg.VecVirtual, 16)
	for i := range r {
		r[i], t[i] = ZMM(), ZMM()
	}
	p := GP64()
	TESTQ(blocks, blocks)
	JE(LabelRef(name + "_done"))
	Label(name + "_loop")
	MOVQ(src, p)
	for i := range 16 {
		VMOVUPS(Mem{Base: p}, r[i])
		if i < 15 {
			ADDQ(lds, p)
		}
	}
	// Go operand order: OP b, a, dst computes dst = op(a, b).
	for i := 0; i < 16; i += 2 {
		VUNPCKLPS(r[i+1], r[i], t[i])
		VUNPCKHPS(r[i+1], r[i], t[i+1])
	}
	for i := 0; i < 16; i += 4 {
		VUNPCKLPD(t[i+2], t[i], r[i])
		VUNPCKHPD(t[i+2], t[i], r[i+1])
		VUNPCKLPD(t[i+3], t[i+1], r[i+2])
		VUNPCKHPD(t[i+3], t[i+1], r[i+3])
	}
	for h := 0; h < 16; h += 8 {
		for i := range 4 {
			VSHUFF32X4(U8(0x88), r[h+i+4], r[h+i], t[h+i])
			VSHUFF32X4(U8(0xdd), r[h+i+4], r[h+i], t[h+i+4])
		}
	}
	for i := range 8 {
		VSHUFF32X4(U8(0x88), t[i+8], t[i], r[i])
		VSHUFF32X4(U8(0xdd), t[i+8], t[i], r[i+8])
	}
	MOVQ(dst, p)
	for i := range 16 {
		VMOVUPS(r[i], Mem{Base: p})
		if i < 15 {
			ADDQ(ldd, p)
		}
	}
	ADDQ(U8(64), src)
	// dst advances 16 rows.
	for range 16 {
		ADDQ(ldd, dst)
	}
	DECQ(blocks)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// genBIndirect emits sgemmBIndirect<suffix>, the weight-gradient
// micro-kernel of ConvWeightGradNHWC: an mr×nr tile C = A·B + beta·C, A
// packed (k groups of mr floats) and row p of B read in place as two runs of
// nr/2 floats, at base + offs[p] and base + split + offs[p] (element offsets
// into a padded NHWC image: one output pixel's input at one kernel tap, nr/2
// consecutive channels each; split = nr/2 when the tile's columns are nr
// channels of one tap, the offset of the next tap's run when a layer's channels
// are a multiple of half a tile only: 16 channels on AVX-512).
//
// With rows < isa.mr it emits sgemmBIndirect<suffix>r<rows>, the same for
// the first rows rows of the packed sliver only (the edge of an M that is
// not a multiple of mr: ResNet's 16 and 32 output channels on AVX2), so the
// edge tile needs no scratch tile and wastes no FMAs.
func genBIndirect(isa vecISA, rows int) {
	mr, nr := isa.mr, 2*isa.bytes/4
	name := "sgemmBIndirect" + isa.suffix
	if rows < mr {
		name += fmt.Sprintf("r%d", rows)
	}
	TEXT(name, NOSPLIT, "func(k int, a, base *float32, split int, offs *int, c *float32, ldc int, beta float32)")
	if rows < mr {
		Doc(fmt.Sprintf("%s computes the first %d rows of an %d×%d tile C = A·B + beta·C (A packed in slivers of %d rows) where B's rows are read through an offset table (%s).", name, rows, mr, nr, mr, isa.doc))
	} else {
		Doc(fmt.Sprintf("%s computes an %d×%d tile C = A·B + beta·C where B's rows are read through an offset table (%s).", name, mr, nr, isa.doc))
	}
	k := Load(Param("k"), GP64())
	a := Load(Param("a"), GP64())
	base := Load(Param("base"), GP64())
	base2 := Load(Param("split"), GP64()) // the second run's base: base + 4·split
	SHLQ(U8(2), base2)
	ADDQ(base, base2)
	offs := Load(Param("offs"), GP64())
	acc := zeroAccumulators(rows, 2, isa.alloc, isa.zero)
	b0, b1, abc := isa.alloc(), isa.alloc(), isa.alloc()
	row := GP64()
	step := func(u int) {
		MOVQ(Mem{Base: offs, Disp: u * 8}, row)
		VMOVUPS(Mem{Base: base, Index: row, Scale: 4}, b0)
		VMOVUPS(Mem{Base: base2, Index: row, Scale: 4}, b1)
		for r := range rows {
			VBROADCASTSS(Mem{Base: a, Disp: (u*mr + r) * 4}, abc)
			VFMADD231PS(abc, b0, acc[r][0])
			VFMADD231PS(abc, b1, acc[r][1])
		}
	}
	kLoop(name, k, "_store", step, func(count int) {
		ADDQ(U32(count*mr*4), a)
		ADDQ(U8(count*8), offs)
	})

	Label(name + "_store")
	c := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	SHLQ(U8(2), ldc)
	storeTile(name, acc, c, ldc, b1, isa.bytes)
}

// genPack8AVX512 emits pack8AVX512, the packing of eight rows of A into the AVX-512
// micro-kernel's sliver layout, 16 columns at a time: dst[(16b+p)·8+r] =
// src[r·lds+16b+p] for r < 8, p < 16, b < blocks. Three rounds of two-source
// permutes interleave rows pairwise (pairs, quads, octets).
func genPack8AVX512() {
	const name = "pack8AVX512"
	// Index tables (element e of the result takes element idx[e] of the table pair,
	// 0–15 from the first, 16–31 from the second).
	idx := func(f func(e int) int) []int {
		v := make([]int, 16)
		for e := range v {
			v[e] = f(e)
		}
		return v
	}
	tables := [][]int{
		idx(func(e int) int { return e/2 + 16*(e%2) }),             // pairs, columns 0–7
		idx(func(e int) int { return 8 + e/2 + 16*(e%2) }),         // pairs, columns 8–15
		idx(func(e int) int { return 2*(e/4) + e%2 + 16*(e%4/2) }), // quads, columns 0–3 of 8
		idx(func(e int) int { return 8 + 2*(e/4) + e%2 + 16*(e%4/2) }),
		idx(func(e int) int { return 4*(e/8) + e%4 + 16*(e%8/4) }), // octets, columns 0–1 of 4
		idx(func(e int) int { return 8 + 4*(e/8) + e%4 + 16*(e%8/4) }),
	}
	glob := GLOBL("pack8_idx", RODATA|NOPTR)
	for t, v := range tables {
		for e, x := range v {
			DATA(64*t+4*e, U32(x))
		}
	}
	TEXT(name, NOSPLIT, "func(dst, src *float32, lds, blocks int)")
	Doc(name+" packs eight rows of A for the 8×32 micro-kernel, 16 columns per block:",
		"dst[(16b+p)·8+r] = src[r·lds+16b+p] for r < 8, p < 16, b < blocks (AVX-512F).")
	dst, src, lds, blocks := gp("dst"), gp("src"), gp("lds"), gp("blocks")
	SHLQ(U8(2), lds)
	lds3, src4 := GP64(), GP64()
	LEAQ(Mem{Base: lds, Index: lds, Scale: 2}, lds3)
	LEAQ(Mem{Base: src, Index: lds, Scale: 4}, src4)
	ix := make([]reg.VecVirtual, len(tables))
	for t := range ix {
		ix[t] = ZMM()
		VMOVDQU32(glob.Offset(64*t), ix[t])
	}
	// perm returns the permute of the table pair (a, b) by index register i.
	perm := func(a, b, i reg.VecVirtual) reg.VecVirtual {
		out := ZMM()
		VMOVAPS(a, out)
		VPERMT2PS(b, i, out)
		return out
	}
	TESTQ(blocks, blocks)
	JE(LabelRef(name + "_done"))
	Label(name + "_loop")
	rows := make([]reg.VecVirtual, 8)
	for r := range rows {
		rows[r] = ZMM()
		base, m := src, r
		if r >= 4 {
			base, m = src4, r-4
		}
		switch m {
		case 0:
			VMOVUPS(Mem{Base: base}, rows[r])
		case 3:
			VMOVUPS(Mem{Base: base, Index: lds3, Scale: 1}, rows[r])
		default:
			VMOVUPS(Mem{Base: base, Index: lds, Scale: uint8(m)}, rows[r])
		}
	}
	// pairs[q][h]: rows 2q, 2q+1 interleaved, columns 8h…8h+7.
	var pairs [4][2]reg.VecVirtual
	for q := range 4 {
		for h := range 2 {
			pairs[q][h] = perm(rows[2*q], rows[2*q+1], ix[h])
		}
	}
	// quads[g][c]: rows 4g…4g+3 interleaved, columns 4c…4c+3.
	var quads [2][4]reg.VecVirtual
	for g := range 2 {
		for h := range 2 {
			for s := range 2 {
				quads[g][2*h+s] = perm(pairs[2*g][h], pairs[2*g+1][h], ix[2+s])
			}
		}
	}
	// Octets: all eight rows, columns 2o, 2o+1: the packed output in order.
	for c := range 4 {
		for s := range 2 {
			o := perm(quads[0][c], quads[1][c], ix[4+s])
			VMOVUPS(o, Mem{Base: dst, Disp: 64 * (2*c + s)})
		}
	}
	ADDQ(U8(64), src)
	ADDQ(U8(64), src4)
	ADDQ(U32(512), dst)
	DECQ(blocks)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}
