package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// newPackJob plans a ConvNHWC weight packing of w for c input channels, m
// output channels and a kh×kw kernel on the implementation in use, with a
// NaN-filled panel buffer; it returns the job and packSliver's scratch.
func newPackJob(c, m, kh, kw int, flip bool, w []float32) (*convJob, []float32) {
	g := ConvGeom{N: 1, C: c, H: kh, W: kw, KH: kh, KW: kw, StrideH: 1, StrideW: 1}
	j := &convJob{p: impl, g: g, w: w, m: m, flip: flip, taps: kh * kw}
	j.plan()
	j.bp = make([]float32, j.nPad*j.taps*c)
	for i := range j.bp {
		j.bp[i] = float32(math.NaN())
	}
	return j, make([]float32, j.packGroup*j.taps*16)
}

// packSliverRef is packSliver as the plain strided loop it replaces: row
// (t, ch) of sliver s holds w's output channels n0..n0+nr-1, zero past m.
func packSliverRef(j *convJob, s int) {
	nr, c, taps := j.p.nr, j.g.C, j.taps
	n0 := s * nr
	cols := min(nr, j.m-n0)
	stride, rowStep := c*taps, taps
	if j.flip {
		stride, rowStep = taps, j.m*taps
	}
	for t := range taps {
		tg := t / j.tpb
		tt := t - tg*j.tpb
		for chunk := range j.cchunks {
			_, nt, c0, cl, koff := j.block(tg*j.cchunks + chunk)
			at := koff*j.nPad + s*nr*nt*cl + tt*cl*nr
			d := j.bp[at : at+cl*nr]
			src0 := (n0*c+c0)*taps + t
			if j.flip {
				src0 = (c0*j.m+n0)*taps + taps - 1 - t
			}
			for cc := range cl {
				dd := d[cc*nr : (cc+1)*nr]
				src := j.w[src0+cc*rowStep:]
				for q := range cols {
					dd[q] = src[q*stride]
				}
				clear(dd[cols:])
			}
		}
	}
}

// TestConvPackSliver checks that packSliver writes exactly the panels of the
// plain strided loop, every element, on every implementation: forward and
// flipped weights; 1×1, 3×3, 2×3, 5×5 (transposed groups smaller than a
// chunk) and 9×9 kernels (more taps than packSliver16's offsets on the
// stack); channel counts below a tile, off the 8×8 tiles, several taps per K
// block and chunked K (C ≥ KC, chunks not a multiple of 8); partial last
// slivers.
func TestConvPackSliver(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, c := range []int{1, 3, 16, 24, 64, 300, 512, 513} {
			for _, k := range [][2]int{{1, 1}, {3, 3}, {2, 3}, {5, 5}, {9, 9}} {
				for _, m := range []int{5, 16, 40, 64, 72} {
					for _, flip := range []bool{false, true} {
						w := randSlice(r, m*c*k[0]*k[1])
						got, sc := newPackJob(c, m, k[0], k[1], flip, w)
						want, _ := newPackJob(c, m, k[0], k[1], flip, w)
						for s := range got.slivers {
							got.packSliver(s, sc)
							packSliverRef(want, s)
						}
						assertBitEqual(t, fmt.Sprintf("C=%d %dx%d m=%d flip=%v", c, k[0], k[1], m, flip), got.bp, want.bp)
					}
				}
			}
		}
	})
}

// BenchmarkConvPackWeights times ConvNHWC's weight packing alone, all
// slivers on one goroutine, for VGG-16's and ResNet-50's layers, forward
// (w is [m, C, KH, KW]) and flipped (the input gradient: w is [C, m, KH, KW]):
//
//	go test -run '^$' -bench ConvPackWeights ./internal/kernels/
func BenchmarkConvPackWeights(b *testing.B) {
	for _, l := range []struct{ c, m, k int }{
		{512, 512, 3},  // VGG-16 conv4/conv5, ResNet-50 stage 4
		{256, 256, 3},  // ResNet-50 stage 3, VGG-16 conv3
		{64, 64, 3},    // ResNet-50 stage 1, VGG-16 conv1
		{1024, 256, 1}, // ResNet-50 stage 3 reduce
		{256, 1024, 1}, // ResNet-50 stage 3 expand
	} {
		w := randSlice(rand.New(rand.NewPCG(1, 1)), l.m*l.c*l.k*l.k)
		for _, flip := range []bool{false, true} {
			c, m := l.c, l.m
			name := fmt.Sprintf("c%d_m%d_%dx%d", c, m, l.k, l.k)
			if flip { // the input gradient of that layer: C and m swap
				c, m = m, c
				name += "/flip"
			}
			b.Run(name+"/"+impl.name, func(b *testing.B) {
				j, sc := newPackJob(c, m, l.k, l.k, flip, w)
				b.SetBytes(int64(4 * len(w)))
				for b.Loop() {
					for s := range j.slivers {
						j.packSliver(s, sc)
					}
				}
			})
		}
	}
}
