package kernels

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
)

// BenchmarkTune compares micro-kernel tiles and blockings. Only runs with
// SPARGO_TUNE=1; TUNE_K (kernel, default x8), TUNE_MC, TUNE_KC and TUNE_NC override the
// shipped AVX-512 blocking:
//
//	SPARGO_TUNE=1 TUNE_KC=384 GOMAXPROCS=1 go test -run '^$' -bench Tune ./internal/kernels/
func BenchmarkTune(b *testing.B) {
	if os.Getenv("SPARGO_TUNE") == "" {
		b.Skip("set SPARGO_TUNE=1")
	}
	if !slices.Contains(availableImpls(), "avx512") {
		b.Skip("the tuning kernels need AVX-512")
	}
	kerns := map[string]struct {
		mr int
		f  asmKernel
	}{
		"x8": {8, sgemmKernelAVX512x8},
	}
	kn := cmp.Or(os.Getenv("TUNE_K"), "x8")
	kk, ok := kerns[kn]
	if !ok {
		b.Fatalf("TUNE_K=%q: unknown kernel (have x8)", kn)
	}
	mc, kc, nc := avx512Impl.mc, avx512Impl.kc, avx512Impl.nc
	for name, v := range map[string]*int{"TUNE_MC": &mc, "TUNE_KC": &kc, "TUNE_NC": &nc} {
		if s := os.Getenv(name); s != "" {
			if _, err := fmt.Sscan(s, v); err != nil || *v <= 0 {
				b.Fatalf("%s=%q: want a positive integer", name, s)
			}
		}
	}
	p := &gemmImpl{name: "tune", mr: kk.mr, nr: 32, mc: roundUp(mc, kk.mr), kc: kc, nc: nc, kernel: wrapKernel(kk.f)}
	old := impl
	impl = p
	defer func() { impl = old }()
	for _, s := range benchShapes {
		b.Run(s.name, func(b *testing.B) {
			av, bv, cv, lda, ldb := s.operands()
			_ = runtime.GOMAXPROCS(0)
			for b.Loop() {
				Sgemm(s.ta, s.tb, s.m, s.n, s.k, 1, av, lda, bv, ldb, 0, cv, s.n)
			}
			b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
