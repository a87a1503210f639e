package kernels

import "sync/atomic"

// FLOP counting for roofline figures (spargo bench train): while CountFLOPs
// runs, every GEMM (Sgemm and the implicit-im2col and weight-gradient GEMMs
// built on it) and every indirect NHWC convolution adds 2·m·n·k for its
// logical (unpadded) sizes. On the default convolution paths this is the
// model's nominal convolution and linear-layer work; under
// SPARGO_CONV=winograd it is the smaller work of the Winograd GEMMs.
var (
	flopCounting atomic.Bool
	flopCount    atomic.Int64
)

// CountFLOPs runs f and returns the floating-point operations (two per
// multiply-add) of the matrix products and convolutions f ran. Calls must
// not overlap (one counter for the process).
func CountFLOPs(f func()) int64 {
	flopCount.Store(0)
	flopCounting.Store(true)
	defer flopCounting.Store(false)
	f()
	return flopCount.Load()
}

// countGEMM adds an m×n×k product to the running count when one is running.
func countGEMM(m, n, k int) {
	if flopCounting.Load() {
		flopCount.Add(2 * int64(m) * int64(n) * int64(k))
	}
}
