package kernels

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/cpu"
)

// gemmImpl describes one micro-kernel implementation and its blocking.
type gemmImpl struct {
	name   string
	mr, nr int // micro-tile rows / columns
	mc     int // rows of packed A block (multiple of mr)
	kc     int // depth of packed panels
	nc     int // columns of packed B block (multiple of nr)
	// kernel computes the mr×nr tile C = alpha*Apanel*Bpanel + beta*C where
	// a holds k groups of mr values (packed A sliver) and b holds k groups of
	// nr values (packed B sliver). beta == 0 overwrites C. c has row stride ldc.
	kernel func(k int, a, b, c []float32, ldc int, alpha, beta float32)
	// indirect is the indirect-GEMM micro-kernel of ConvNHWC (nil: the
	// convolution layers keep the implicit-im2col GEMM).
	indirect indirectKernel
	// indirectNarrow is indirect for the tile's first nr/2 columns, B still packed nr
	// wide: an output-channel sliver that ends half way through the tile (16 channels
	// on AVX-512) costs half the FMAs and needs no scratch tile; bit-identical to
	// indirect's columns (nil: indirect through a scratch tile).
	indirectNarrow indirectKernel
	// bIndirect is the weight-gradient micro-kernel of ConvWeightGradNHWC:
	// C = A·B + beta·C with A packed and row p of B the nr/2 floats at
	// x[base+offs[p]:] followed by the nr/2 at x[base+split+offs[p]:] (nil: B is
	// packed by packNHWCT).
	bIndirect func(k int, a, x []float32, base, split int, offs []int, c []float32, ldc int, beta float32)
	// bIndirectRows is bIndirect for the first rows rows of the tile only (an
	// edge of M); it reports false for a row count it has no kernel for (nil:
	// none), and the edge goes through a scratch tile.
	bIndirectRows func(rows, k int, a, x []float32, base, split int, offs []int, c []float32, ldc int, beta float32) bool
	// vec holds the elementwise / reduction kernels paired with this path.
	vec *vecOps
	// half holds the binary16 conversions (half.go): F16C on the amd64 paths when the
	// CPU has it, else the scalar loops.
	half *halfOps
}

// vecOps are the elementwise implementations (lengths already checked).
type vecOps struct {
	axpy    func(alpha float32, x, y []float32)
	scale   func(alpha float32, x []float32)
	add     func(dst, a, b []float32)
	mul     func(dst, a, b []float32)
	dot     func(a, b []float32) float32
	sum     func(x []float32) float32
	reluFwd func(dst, x []float32)
	reluBwd func(dx, y, dy []float32)

	// Layer primitives (batchnorm.go, sgd.go, elementwise.go); lengths checked by callers.
	reluBwdSet func(dx, y, dy []float32)                                 // dx = dy where y > 0, else 0
	sumSqDev   func(x []float32, mu float32) float32                     // Σ (x−mu)²
	dyStats    func(dy, x []float32, mu float32) (float32, float32)      // Σ dy, Σ dy·(x−mu)
	affine     func(dst, x []float32, mu, a, b float32)                  // dst = (x−mu)·a + b
	bnBwd      func(dst, dy, x []float32, mu, a, b, c float32, acc bool) // dst (+)= a·dy + b·(x−mu) + c
	// The fused BatchNorm+ReLU passes, bit-identical to the passes above followed by
	// the rectifier (forward: add's residual first) or preceded by reluBwdSet's masking
	// (backward).
	affineRelu  func(dst, x, r []float32, mu, a, b float32)                  // dst = max((x−mu)·a + b + r, 0); r nil: no r
	dyStatsRelu func(dy, y, x []float32, mu float32) (float32, float32)      // dyStats of g = dy where y > 0, else 0
	bnBwdRelu   func(dst, dy, y, x []float32, mu, a, b, c float32, acc bool) // bnBwd of that g
	// bnPlanes runs those BatchNorm passes over several planes of a channel in one
	// call (nil: batchnorm.go calls the per-plane kernels above).
	bnPlanes *bnPlanesOps
	// bnNHWC are the channels-last BatchNorm passes (batchnorm_nhwc.go).
	bnNHWC   *bnNHWCOps
	sgdMom   func(w, g, buf []float32, lr, wd, mom, damp float32, nesterov bool)
	sgdPlain func(w, g []float32, lr, wd float32)
	// maxPool2x2Row pools rows r0, r1 (2·len(y) elements each) into y with argmax
	// indices base + 2j + {0, 1, w, w+1} (pooling.go).
	maxPool2x2Row func(y []float32, arg []int32, r0, r1 []float32, base, w int32)
	// maxPoolWindow pools one channels-last window of rows×cols taps, tap (r, s)
	// being the len(y) floats at x[r·rs + s·c:] with pixel index base + r·w + s
	// (pooling_nhwc.go).
	maxPoolWindow func(y []float32, arg []int32, x []float32, rows, cols, rs, c int, base, w int32)
	// gather32 writes dst[32·i+q] = src[i·srcStep+idx[q]] for i < rows
	// (convnhwc.go's weight packing; nil: a Go loop; idx increasing).
	gather32 func(dst, src []float32, rows, srcStep int, idx *[32]int32)
	// transpose16 writes dst[(16b+j)·ldd+i] = src[i·lds+16b+j] for i, j < 16,
	// b < blocks (nil: callers use scalar loops).
	transpose16 func(dst []float32, ldd int, src []float32, lds, blocks int)
	// transpose8 is transpose16 for 8×8 tiles (the AVX2 and AVX-512 paths; nil: scalar loops).
	transpose8 func(dst []float32, ldd int, src []float32, lds, blocks int)
	// pack8 writes dst[(16b+p)·8+r] = src[r·lds+16b+p] for r < 8, p < 16, b < blocks:
	// eight rows of A in the 8-row micro-kernel's sliver layout (nil: a Go loop).
	pack8 func(dst, src []float32, lds, blocks int)
	// pack6 is pack8 for the AVX2 micro-kernel's six-row slivers, in blocks of 8
	// columns: dst[(8b+p)·6+r] = src[r·lds+8b+p] for r < 6, p < 8 (nil: a Go loop).
	pack6 func(dst, src []float32, lds, blocks int)
	// packT6 writes dst[6p+r] = src[p·lds+r] for r < rows and 0 for rows ≤ r < 6,
	// p < len(dst)/6: a six-row sliver of a transposed A, rows 1…6 (nil: a Go loop).
	packT6 func(dst, src []float32, lds, rows int)

	// Exponential kernels (fastmath.go): the softmax, cross-entropy and exact GELU.
	expSum  func(dst, x []float32, shift float32) float64 // dst = e^(x−shift); returns Σ dst, summed in float64
	maxOf   func(x []float32) float32                     // the largest element, len(x) ≥ 1 (a NaN may be skipped)
	gelu    func(y, cdf, x []float32)                     // y = x·Φ(x), and cdf = Φ(x) unless cdf is nil
	geluBwd func(dx, x, cdf, dy []float32, acc bool)      // dx = (or +=) dy·(Φ(x) + x·φ(x)), Φ = cdf

	// The fused LSTM cell of one batch row (lstm.go); hidden = len(c) or len(dc), gates
	// hold four blocks of hidden, nil cPrev, dy or dhRec stand for zeros.
	lstmFwd func(g, cPrev, c, tc, h []float32)
	lstmBwd func(d, a, cPrev, tc, dy, dhRec, dc []float32)

	// LayerNorm rows (transformer.go); d = len(x) ≥ 1, lengths checked by callers.
	lnStats    func(x []float32) (mean, ss float64)                           // Σx/d and Σ(x−mean)², summed in float64
	lnApply    func(y, x, gamma, beta []float32, mu, inv float32)             // y = (x−mu)·inv·gamma + beta
	lnBwdStats func(dy, x, gamma []float32, mu, inv float32) (s1, s2 float32) // Σ dy·gamma, Σ dy·gamma·(x−mu)·inv
	lnBwdDx    func(dx, dy, x, gamma []float32, mu, inv, s1, s2 float32, acc bool)
	// lnParamGrad adds Σ_r dy[r·d+i]·(x[r·d+i]−mean[r])·rstd[r] to sg[i] and Σ_r dy[r·d+i]
	// to sb[i] for i < len(sg), r < len(mean), in row order.
	lnParamGrad func(sg, sb, dy, x, mean, rstd []float32, d int)
}

var genericVec = &vecOps{
	axpy: axpyGeneric, scale: scaleGeneric, add: addGeneric, mul: mulGeneric,
	dot: dotGeneric, sum: sumGeneric, reluFwd: reluFwdGeneric, reluBwd: reluBwdGeneric,
	reluBwdSet: reluBwdSetGeneric, sumSqDev: sumSqDevGeneric, dyStats: dyStatsGeneric,
	affine: affineGeneric, bnBwd: bnBwdGeneric, sgdMom: sgdMomGeneric, sgdPlain: sgdPlainGeneric,
	affineRelu: affineReluGeneric, dyStatsRelu: dyStatsReluGeneric, bnBwdRelu: bnBwdReluGeneric,
	bnNHWC:        bnNHWCGeneric,
	maxPool2x2Row: maxPool2x2RowGeneric, maxPoolWindow: maxPoolWindowGeneric,
	expSum: expSumGeneric, maxOf: maxGeneric, gelu: geluGeneric, geluBwd: geluBwdGeneric,
	lstmFwd: lstmFwdGeneric, lstmBwd: lstmBwdGeneric,
	lnStats: lnStatsGeneric, lnApply: lnApplyGeneric, lnBwdStats: lnBwdStatsGeneric,
	lnBwdDx: lnBwdDxGeneric, lnParamGrad: lnParamGradGeneric,
}

// implTable holds every implementation compiled into this binary
// (generic plus the architecture-specific ones from archImpls).
var implTable = func() map[string]*gemmImpl {
	t := map[string]*gemmImpl{genericImpl.name: genericImpl}
	for _, p := range archImpls() {
		t[p.name] = p
	}
	return t
}()

// implOrder is the preference order, best first.
var implOrder = []string{"avx512", "avx2", "generic"}

// shapedName is the testing implementation avx512ShapedImpl (amd64 only), which
// only an explicit SPARGO_KERNELS selects.
const shapedName = "avx512-shaped"

// implSupported reports whether the CPU can run the named implementation.
func implSupported(name string) bool {
	if _, ok := implTable[name]; !ok {
		return false
	}
	switch name {
	case "avx512":
		return cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasBMI2
	case "avx2", "avx512-shaped":
		return cpu.X86.HasAVX2 && cpu.X86.HasFMA
	case "generic":
		return true
	}
	return false
}

// impl is the implementation in use; chosen once at package initialisation.
var impl = pickImpl(os.Getenv("SPARGO_KERNELS"))

// pickImpl chooses the best supported implementation, or the one requested
// (falling back to the next supported one if the CPU cannot run it; from
// avx512-shaped, which is for testing, to the best one).
func pickImpl(req string) *gemmImpl {
	req = strings.ToLower(strings.TrimSpace(req))
	start := 0
	if req == shapedName {
		if implSupported(req) {
			return implTable[req]
		}
		req = ""
	}
	if req != "" {
		found := false
		for i, n := range implOrder {
			if n == req {
				start, found = i, true
				break
			}
		}
		if !found {
			fmt.Fprintf(os.Stderr, "spargo/kernels: ignoring unknown SPARGO_KERNELS=%q (want generic|avx2|avx512|avx512-shaped)\n", req)
		}
	}
	for _, n := range implOrder[start:] {
		if implSupported(n) {
			return implTable[n]
		}
	}
	return genericImpl
}

// Impl returns the name of the Sgemm micro-kernel implementation in use:
// "avx512", "avx2" or "generic" (or "avx512-shaped", for testing).
func Impl() string { return impl.name }

// availableImpls lists the implementations runnable on this machine (for tests).
func availableImpls() []string {
	var out []string
	for _, n := range implOrder {
		if implSupported(n) {
			out = append(out, n)
		}
	}
	return out
}

// setImpl switches the implementation (tests and benchmarks only; not safe
// concurrently with Sgemm). It returns a function restoring the previous one.
func setImpl(name string) (restore func()) {
	if !implSupported(name) {
		panic("kernels: implementation " + name + " not supported on this CPU")
	}
	old := impl
	impl = implTable[name]
	return func() { impl = old }
}
