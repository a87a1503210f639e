// Package kernels owns spargo's numeric hot loops: single-precision GEMM
// (Sgemm), convolution (implicit-im2col GEMMs, Winograd F(2×2,3×3), explicit
// Im2col / Col2im for the general case), layout conversions, the elementwise /
// reduction primitives used by tensors, layers and optimisers, and the
// selection kernels sparse communication is built on (FilterAbs, TopKAbs,
// KthLargestAbs, ScatterAdd, Gather, MergeCOO).
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
// any goroutine count; a small C with a long K (a convolution's weight
// gradient) is split down to single micro-tiles. Packing buffers are pooled:
// steady-state calls do not allocate.
//
// The pool's workers poll for the next task for a while (SPARGO_SPIN, default
// 200µs) before they park, and a dispatching goroutine polls for its helpers
// before it sleeps: a futex wake-up costs 50–100 µs on a virtual machine, and a
// training step runs hundreds of short parallel kernels (a ResNet-20 step at
// batch 32 spent a third of its time with one core idle). The polling yields to
// other goroutines and stops for 50 ms whenever two dispatches overlap (in-process
// data-parallel workers, which keep each other's helpers busy); SPARGO_SPIN=0
// turns it off, the OMP_WAIT_POLICY=PASSIVE of this pool, for machines shared with
// other busy processes.
//
// # Convolution
//
// A convolution's column matrix im2col(x) ([C·KH·KW, N·OH·OW]) is never
// stored: SgemmIm2col and SgemmIm2colT pack their B panels straight from the
// NCHW image (forward pass; weight gradient), and SgemmFlippedKernelIm2col
// runs a stride-1 convolution's input gradient as a convolution of dy with the
// flipped, transposed kernel, read straight from the weight. Their results are
// bit-identical to Im2col followed by Sgemm. Operands that several parallel
// units would pack again (A when N is split, B when M is split) are packed
// once, in parallel, into a shared buffer.
//
// With an indirect micro-kernel (AVX-512 8×32, AVX2 6×16, and the portable
// one) and at least 16 channels, the convolution layers instead copy the image once into a
// zero-padded NHWC layout (PadNHWC), where a GEMM row's KH·KW·C values are
// KH·KW contiguous channel runs. ConvNHWC reads those runs in place through a
// table of per-pixel offsets (an indirect GEMM, as in XNNPACK): the image is
// never packed, only the weights are (AVX-512 gathers), and NHWCToNCHW brings
// the [N·OH·OW, M] result back to NCHW with the bias. ConvWeightGradNHWC reads
// the same padded copy, its B rows in place through the bIndirect micro-kernel
// (each sliver as two runs of channels, so any multiple of half a tile in
// channels qualifies: ResNet's 16-channel layers on AVX-512 had gone through
// packed panels, 2.3× slower).
// An output-channel sliver of at most half a tile (16 channels on AVX-512, 8 on
// AVX2) goes through a narrow form of the indirect kernel that computes only
// those columns, with the same bits: ResNet's 16-channel layers, forward and input
// gradient, had spent half their AVX-512 FMAs on zero padding.
// The layout transposes run in registers (16×16 on AVX-512, 8×8 on AVX2).
// On AVX2 this path made a ResNet-20 training step about 4× faster than the
// implicit-im2col GEMMs, whose packing had taken 43 % of the step. UseConvNHWC says
// which path a geometry takes; SPARGO_CONV=im2col forces the implicit-im2col
// GEMMs.
//
// Winograd F(2×2, 3×3) (WinogradConv3x3: 16 GEMMs with 2.25× fewer flops,
// plus input, kernel and output transforms) is available for stride-1 3×3
// convolutions with SPARGO_CONV=winograd. It is off by default: with scalar-Go
// transforms it wins only on 16×16 maps (see UseWinograd for the numbers).
//
// # Dispatch
//
// The micro-kernel implementation is chosen once at package initialisation
// from the CPU features reported by golang.org/x/sys/cpu:
//
//	avx512  8×32 AVX-512F micro-kernel in Go assembly, plus AVX-512
//	        elementwise kernels (amd64; needs AVX512F, AVX512VL, BMI2) and,
//	        where it has none of its own, the AVX2 ones: BatchNorm (NCHW and
//	        channels-last, fused with ReLU), the channels-last max-pool
//	        window, the 8×8 transposes
//	avx2    6×16 AVX2+FMA micro-kernel in Go assembly (amd64; AVX2, FMA),
//	        the indirect convolution kernels, BatchNorm's per-plane passes,
//	        the ReLU, add, mul, scale, axpy and 8×8 transpose passes, and
//	        the exponential, GELU, LSTM-cell and LayerNorm row kernels
//	generic portable pure-Go 4×8 micro-kernel (all architectures)
//
// Every table fills every entry its callers do not check for nil
// (TestImplTablesComplete checks them all, also those this CPU cannot run).
// SPARGO_KERNELS=avx512-shaped selects, for testing, the AVX-512 structure (8×32
// tile, blocking, packing and transpose routes) in kernels any AVX2 machine runs
// (shaped_amd64.go): the kernels' tests run every case with it where the CPU has
// no AVX-512, and CI runs the layer and model tests with it, so the AVX-512
// path's Go code is tested on machines without AVX-512.
//
// The other elementwise functions (dot, sum, the optimizers' updates) use pure
// Go except on the avx512 path.
// CountFLOPs counts the work of the GEMMs and convolutions a function runs
// (spargo bench train's roofline ratio).
// The binary16 conversions (EncodeHalf, DecodeHalf, AddHalf: the fp16 comm
// hook's encode, decode and reduction step) use F16C's VCVTPS2PH / VCVTPH2PS
// on both the avx2 and avx512 paths when CPUID reports F16C, the scalar
// Float32ToHalf / HalfToFloat32 otherwise; the bits are the same.
//
// # Exponentials
//
// The softmax, cross-entropy and exact-GELU kernels evaluate e^x and erfc
// through float32 formulas (fastmath.go: exp32, erfc32; relative errors below
// 1e-6 and 1e-5) instead of package math. The generic path runs them per
// element in Go; the avx512 and avx2 paths run the same formulas 16 and 8 lanes
// at a time (asmgen/mathvec.go, mathvec_avx2.go; AVX2 scales by 2^n as two
// normal factors where AVX-512 has VSCALEFPS, one rounding either way), so they
// agree with the generic path to a few ulps. GELU stays the exact erf form
// PyTorch uses by default (TestGeluAccuracy bounds it against math.Erfc). The
// LSTM cell (LSTMCellForward, LSTMCellBackward) runs one batch row per kernel
// call: the generic path with the scalar sigmoid32 and tanh32, the avx512 and
// avx2 paths fused in one pass over the row's gates and cells on the same
// vectorised exponential (asmgen/lstm.go, mathvec_avx2.go; TestLSTMGateAccuracy:
// sigmoid within 1e-6 relative, tanh within 2e-7 absolute of float64).
//
// LayerNormForward and LayerNormBackward also run row kernels: Go loops on the
// generic path, 16-lane ones on the avx512 path (asmgen/layernorm.go), 8-lane
// ones on the avx2 path (asmgen/mathvec_avx2.go). All widen
// the row's values to float64 and sum the mean and variance in float64, so the
// saved statistics agree to within one float32 rounding (TestLayerNormMatchesFloat64).
//
// # Packed B
//
// PackB packs op(B) once into the micro-kernel's panels and SgemmPackedB
// multiplies it with any number of A, bit for bit as Sgemm would: nn.LSTM packs
// its recurrent weight once per forward and once per backward instead of at
// every time step (where packing cost a third of each small product).
//
// The environment variable SPARGO_KERNELS=generic|avx2|avx512 overrides the
// choice (useful for testing every path); a request the CPU cannot run falls
// back to the best supported implementation below it. Impl reports the name
// of the implementation in use.
//
// # Regenerating the assembly
//
// The amd64 kernels are generated with avo (github.com/mmcloughlin/avo) by the
// program in ./asmgen. sgemm_amd64.s and sgemm_stub_amd64.go are generated
// files and are committed; after editing asmgen run, from this directory:
//
//	go generate ./
//
// which executes `go run -C asmgen . -out ../sgemm_amd64.s -stubs
// ../sgemm_stub_amd64.go -pkg kernels`. asmgen is a separate Go module
// (asmgen/go.mod) because avo v0.6.0's x/tools v0.16.1 does not compile with
// current Go; this also keeps the generator out of `go build ./...`.
//
// Block sizes and tiles can be re-measured with
// SPARGO_TUNE=1 TUNE_K=x8 TUNE_MC=256 TUNE_KC=256 TUNE_NC=4096 go test -run XXX -bench Tune -cpu 1.
package kernels
