package kernels

import "testing"

// TestCountFLOPs checks the counted work of each GEMM-backed entry point
// against its nominal 2·m·n·k, and that nothing is counted outside CountFLOPs.
func TestCountFLOPs(t *testing.T) {
	g := ConvGeom{N: 2, C: 16, H: 6, W: 5, KH: 3, KW: 3, PadH: 1, PadW: 1, StrideH: 2, StrideW: 2}
	const m = 7
	conv := int64(2 * m * g.ColRows() * g.ColCols())
	x := make([]float32, g.N*g.C*g.H*g.W)
	w := make([]float32, m*g.ColRows())
	dy := make([]float32, m*g.ColCols())
	xp := make([]float32, PaddedLen(g))
	PadNHWC(g, x, xp)
	y := make([]float32, m*g.ColCols())
	a, b, c := make([]float32, 3*5), make([]float32, 5*4), make([]float32, 3*4)
	cb, cOff := make([]float32, 8*3*4), make([]int, 8)
	for i := range cOff {
		cOff[i] = i * 3 * 4
	}
	forEachImpl(t, func(t *testing.T) {
		for _, tc := range []struct {
			name string
			f    func()
			want int64
		}{
			{"Sgemm 3×4×5", func() { Sgemm(false, false, 3, 4, 5, 1, a, 5, b, 4, 0, c, 4) }, 2 * 3 * 4 * 5},
			{"SgemmIm2col", func() { SgemmIm2col(m, 1, w, g.ColRows(), g, x, 0, y, g.ColCols()) }, conv},
			{"ConvNHWC", func() { ConvNHWC(g, xp, w, m, false, y) }, conv},
			{"ConvWeightGrad", func() { ConvWeightGrad(g, x, dy, m, g.ColCols(), w) }, conv},
			{"SgemmBatched, 8 products", func() { // in parallel (sgemmSerial) from 2 threads
				SgemmBatched(false, false, 3, 4, 5, 1, a, make([]int, 8), 5, b, make([]int, 8), 4, 0, cb, cOff, 4)
			}, 8 * 2 * 3 * 4 * 5},
			{"two products", func() {
				Sgemm(false, false, 3, 4, 5, 1, a, 5, b, 4, 0, c, 4)
				Sgemm(true, false, 5, 4, 3, 1, a, 5, c, 4, 0, b, 4)
			}, 4 * 3 * 4 * 5},
		} {
			if got := CountFLOPs(tc.f); got != tc.want {
				t.Errorf("%s: CountFLOPs = %d, want %d", tc.name, got, tc.want)
			}
		}
		Sgemm(false, false, 3, 4, 5, 1, a, 5, b, 4, 0, c, 4) // not counted
		if got := CountFLOPs(func() {}); got != 0 {
			t.Errorf("empty function: CountFLOPs = %d, want 0", got)
		}
	})
}
