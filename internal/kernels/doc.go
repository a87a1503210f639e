// Package kernels owns spargo's numeric hot loops: single-precision GEMM
// (Sgemm), convolution lowering (Im2col / Col2im) and the elementwise /
// reduction primitives used by tensors, layers and optimisers (Axpy, Scale,
// Add, Mul, Dot, Sum, Fill, ReluForward, ReluBackward).
//
// # Sgemm
//
// Sgemm is a BLIS-style blocked GEMM on row-major float32 matrices. Panels of
// op(A) are packed into MR-row slivers and panels of op(B) into NR-column
// slivers (zero padded at the edges), so that one register-blocked MR×NR
// micro-kernel serves all four transposition variants. Blocking (MC, KC, NC)
// is chosen per micro-kernel for Zen 4 caches (32 KiB L1d, 1 MiB L2). Work is
// split over blocks of C (never over K), claimed dynamically by GOMAXPROCS
// goroutines from a persistent worker pool, so results are bit-identical for
// any goroutine count. Packing buffers are pooled: steady-state calls do not
// allocate.
//
// # Dispatch
//
// The micro-kernel implementation is chosen once at package initialisation
// from the CPU features reported by golang.org/x/sys/cpu:
//
//	avx512  AVX-512F micro-kernel in Go assembly (amd64 only)
//	avx2    AVX2+FMA micro-kernel in Go assembly (amd64 only)
//	generic portable pure-Go micro-kernel (all architectures)
//
// The environment variable SPARGO_KERNELS=generic|avx2|avx512 overrides the
// choice (useful for testing every path); a request the CPU cannot run falls
// back to the best supported implementation below it. Impl reports the name
// of the implementation in use.
//
// # Regenerating the assembly
//
// The amd64 micro-kernels are generated with avo by the program in ./asmgen.
// sgemm_amd64.s and sgemm_stub_amd64.go are generated files and are
// committed; after editing asmgen run, from this directory:
//
//	go generate ./
//
// which executes `go run ./asmgen -out sgemm_amd64.s -stubs sgemm_stub_amd64.go`.
package kernels
