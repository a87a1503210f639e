package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkPackIm2col measures the implicit-im2col packing alone (one
// goroutine), in elements packed per second:
//
//	go test -run '^$' -bench PackIm2col ./internal/kernels/
func BenchmarkPackIm2col(b *testing.B) {
	for _, l := range [][2]int{{64, 32}, {128, 16}, {256, 8}, {512, 4}, {512, 2}} {
		g := ConvGeom{N: 32, C: l[0], H: l[1], W: l[1], KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 1, StrideW: 1}
		x := randSlice(rand.New(rand.NewPCG(1, 1)), g.N*g.C*g.H*g.W)
		kc, nc := 256, min(4096, g.ColCols())
		dst := make([]float32, kc*roundUp(max(nc, 576), 32))
		b.Run(fmt.Sprintf("B/c%d_hw%d", l[0], l[1]), func(b *testing.B) {
			for range b.N {
				packIm2col(32, g, x, 0, kc, 0, nc, dst)
			}
			b.ReportMetric(float64(kc*nc)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Melem/s")
		})
		kc, nc = min(256, g.ColCols()), min(576, g.ColRows())
		b.Run(fmt.Sprintf("BT/c%d_hw%d", l[0], l[1]), func(b *testing.B) {
			for range b.N {
				packIm2colT(32, g, x, 0, kc, 0, nc, dst)
			}
			b.ReportMetric(float64(kc*nc)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Melem/s")
		})
	}
}

// BenchmarkPackA packs a 192×256 block of a row-major A (lda 4096, the
// weight gradient's dY of a ResNet-20 layer) into 6- and 8-row slivers, with the
// implementation's register packers (pack6 on avx2, pack8 on avx512) and without,
// and (mr6T, mr8T) the same block of a transposed A (the weight gradient's dYᵀ of
// a linear layer).
func BenchmarkPackA(b *testing.B) {
	const lda, mc, kc = 4096, 192, 256
	a := make([]float32, max(mc, kc)*lda)
	dst := make([]float32, mc*kc)
	for _, trans := range []bool{false, true} {
		for _, mr := range []int{6, 8} {
			for _, v := range []*vecOps{nil, impl.vec} {
				name := fmt.Sprintf("mr%d", mr)
				if trans {
					name += "T"
				}
				if v != nil {
					name += "/" + impl.name
				} else {
					name += "/go"
				}
				b.Run(name, func(b *testing.B) {
					b.SetBytes(mc * kc * 4)
					for b.Loop() {
						packA(mr, trans, a, lda, 0, mc, 0, kc, dst, v)
					}
				})
			}
		}
	}
}

// BenchmarkPackB packs a 256×512 block of B (ldb 4096) into 16- and 32-column
// slivers, plain and transposed, with the implementation's tile transpose.
func BenchmarkPackB(b *testing.B) {
	const ldb, kc, nc = 4096, 256, 512
	src := make([]float32, max(kc, nc)*ldb)
	dst := make([]float32, kc*nc)
	tr, ts := impl.vec.packBTranspose()
	for _, trans := range []bool{false, true} {
		for _, nr := range []int{16, 32} {
			name := fmt.Sprintf("nr%d", nr)
			if trans {
				name += "T"
			}
			b.Run(name+"/"+impl.name, func(b *testing.B) {
				b.SetBytes(kc * nc * 4)
				for b.Loop() {
					packB(nr, trans, src, ldb, 0, kc, 0, nc, dst, tr, ts)
				}
			})
		}
	}
}
