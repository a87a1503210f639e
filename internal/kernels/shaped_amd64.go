package kernels

// avx512ShapedImpl ("avx512-shaped", selected only by SPARGO_KERNELS) is the
// AVX-512 implementation's structure in kernels every AVX2 machine runs: its 8×32
// tile and blocking with the portable micro-kernels (kernelGeneric,
// indirectGeneric and its narrow form, bIndirectGeneric), and its vector table's
// routes (the 32-wide weight gather, the 16×16 transposes, the 8-row packer)
// through Go loops that follow those entries' contracts, the other entries being
// the AVX2 table's (which the AVX-512 table shares for BatchNorm, pooling and the
// 8×8 transposes). It exists for testing: on a CPU without AVX-512 the drivers'
// 8×32 paths (packing, edges, the channels-last convolutions) would otherwise never
// run. The kernels' tests run every case with it (forEachImpl), CI the layer and
// model tests. The bits differ from the real AVX-512 path's (no fused
// multiply-adds in the micro-kernels); the tests hold both to the same references.
var avx512ShapedImpl = func() *gemmImpl {
	p := *avx512Impl
	p.name = shapedName
	p.kernel = kernelGeneric(p.mr, p.nr)
	p.indirect, p.indirectNarrow = indirectGeneric, indirectGenericNarrow
	p.bIndirect = func(k int, a, x []float32, base, split int, offs []int, c []float32, ldc int, beta float32) {
		bIndirectGeneric(8, 32, k, a, x, base, split, offs, c, ldc, beta)
	}
	v := *avx2Vec
	v.pack6, v.packT6 = nil, nil // the six-row slivers: not this tile's
	v.gather32 = func(dst, src []float32, rows, srcStep int, idx *[32]int32) {
		for i := range rows {
			for q, o := range idx {
				dst[32*i+q] = src[i*srcStep+int(o)]
			}
		}
	}
	v.transpose16 = func(dst []float32, ldd int, src []float32, lds, blocks int) {
		for b := range blocks {
			for i := range 16 {
				for j := range 16 {
					dst[(16*b+j)*ldd+i] = src[i*lds+16*b+j]
				}
			}
		}
	}
	v.pack8 = func(dst, src []float32, lds, blocks int) {
		for p := range 16 * blocks {
			for r := range 8 {
				dst[p*8+r] = src[r*lds+p]
			}
		}
	}
	p.vec = &v
	return &p
}()
