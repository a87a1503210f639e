package kernels

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
)

// BenchmarkTune compares micro-kernel tiles and blockings (single core).
// Only runs with SPARGO_TUNE=1.
func BenchmarkTune(b *testing.B) {
	if os.Getenv("SPARGO_TUNE") == "" {
		b.Skip("set SPARGO_TUNE=1")
	}
	kerns := map[string]struct {
		mr int
		f  asmKernel
	}{
		"x8": {8, sgemmKernelAVX512x8},
	}
	kn := os.Getenv("TUNE_K")
	var mc, kc, nc int
	fmt.Sscan(os.Getenv("TUNE_MC"), &mc)
	fmt.Sscan(os.Getenv("TUNE_KC"), &kc)
	fmt.Sscan(os.Getenv("TUNE_NC"), &nc)
	kk := kerns[kn]
	p := &gemmImpl{name: "tune", mr: kk.mr, nr: 32, mc: roundUp(mc, kk.mr), kc: kc, nc: nc, kernel: wrapKernel(kk.f)}
	old := impl
	impl = p
	defer func() { impl = old }()
	for _, s := range benchShapes {
		b.Run(s.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			av, bv, cv := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), make([]float32, s.m*s.n)
			lda, ldb := s.k, s.n
			if s.ta {
				lda = s.m
			}
			if s.tb {
				ldb = s.k
			}
			_ = runtime.GOMAXPROCS(0)
			for b.Loop() {
				Sgemm(s.ta, s.tb, s.m, s.n, s.k, 1, av, lda, bv, ldb, 0, cv, s.n)
			}
			b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
