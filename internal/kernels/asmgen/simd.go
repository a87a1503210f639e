package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// simd is what an elementwise kernel body needs from its instruction set, so that the LSTM,
// GELU, LayerNorm and SGD bodies are written once for AVX-512 (zmm, opmask tails, constants as
// embedded broadcasts: mathvec.go) and AVX2 (ymm, VMASKMOVPS tails, 32-byte constant rows:
// mathvec_avx2.go). A body's mask argument is the stream's tail mask (nil for whole vectors).
type simd struct {
	suffix string // of the kernels' names
	doc    string // the instruction sets, in the kernels' doc comments
	lanes  int
	vec    func() reg.VecVirtual
	stream func(name string, n reg.GPVirtual, ptrs []reg.GPVirtual, body func(off int, mask reg.Register))
	load   func(m Mem, mask reg.Register, v reg.VecVirtual) // lanes outside the mask load 0
	store  func(v reg.VecVirtual, mask reg.Register, m Mem) // lanes outside the mask are not stored
	param  func(name string) reg.VecVirtual                 // a float32 parameter in every lane
	splat  func(name string) reg.VecVirtual                 // a constant of mathConsts in every lane
	zeroed func(k int) []reg.VecVirtual
	mulK   func(name string, x, dst reg.VecVirtual)     // dst = x·constant
	subZ   func(a, x reg.VecVirtual, mask reg.Register) // x −= a, and 0 outside the mask
	reduce func(acc []reg.VecVirtual, i int)            // the sum of four float32 accumulators to return value i

	expRegs func() expRegs
	exp     func(x reg.VecVirtual, r expRegs)
	phi     func(v reg.VecVirtual, g geluRegs) reg.VecVirtual
	sigmoid func(x reg.VecVirtual, r expRegs, one reg.VecVirtual)
	tanh    func(x reg.VecVirtual, r expRegs, one reg.VecVirtual) reg.VecVirtual
}

// unit is the index (0…3) of the vector at byte offset off within a stream's group of four.
func (s *simd) unit(off int) int { return off / (4 * s.lanes) }

func (s *simd) geluRegs() geluRegs {
	return geluRegs{exp: s.expRegs(), one: s.splat("one"), two: s.splat("two")}
}

var avx512 = &simd{
	suffix: "AVX512", doc: "AVX-512F", lanes: 16,
	vec:    func() reg.VecVirtual { return ZMM() },
	stream: stream, load: load, store: store, param: bcast, splat: splat, zeroed: zeroed,
	mulK: func(name string, x, dst reg.VecVirtual) { VMULPS_BCST(kc(name), x, dst) },
	subZ: func(a, x reg.VecVirtual, mask reg.Register) {
		if mask == nil {
			VSUBPS(a, x, x)
		} else {
			VSUBPS_Z(a, x, mask, x)
		}
	},
	reduce:  reduce4,
	expRegs: loadExpRegs,
	exp:     func(x reg.VecVirtual, r expRegs) { emitExp(x, r, nil) },
	phi:     emitPhi, sigmoid: emitSigmoid, tanh: emitTanh,
}

var avx2 = &simd{
	suffix: "AVX2", doc: "AVX2, FMA", lanes: 8,
	vec:    func() reg.VecVirtual { return YMM() },
	stream: streamY, load: loadY, store: storeY, param: bcastY, splat: splatY, zeroed: zeroedY,
	mulK: func(name string, x, dst reg.VecVirtual) { VMULPS(ky(name), x, dst) },
	subZ: func(a, x reg.VecVirtual, mask reg.Register) {
		VSUBPS(a, x, x)
		if mask != nil {
			VANDPS(mask, x, x)
		}
	},
	reduce:  func(acc []reg.VecVirtual, i int) { VMOVSS(reduceY(acc), retAddr(i)) },
	expRegs: loadExpRegsY,
	exp:     emitExpY,
	phi:     emitPhiY, sigmoid: emitSigmoidY, tanh: emitTanhY,
}
