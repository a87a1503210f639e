package hooks

import (
	"context"
	"fmt"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// This file holds PyTorch's 16-bit compression hooks (fp16_compress_hook,
// bf16_compress_hook) and their wrappers (fp16_compress_wrapper, bf16_compress_wrapper):
// the two 16-bit formats, an all-reduce whose messages are 16-bit words, the hooks, and the
// wrapper that runs another hook on 16-bit-rounded gradients.

// Format16 is a 16-bit floating-point format that gradients can travel in.
type Format16 int

const (
	// FP16 is IEEE 754 binary16 (torch.float16): 1 sign bit, 5 exponent bits, 10 fraction
	// bits; largest finite value 65504, smallest subnormal 2^-24.
	FP16 Format16 = iota + 1
	// BF16 is bfloat16 (torch.bfloat16): float32's upper 16 bits, 8 fraction bits fewer;
	// float32's range, about 3 significant decimal digits.
	BF16
)

// String returns "fp16" or "bf16", the hooks' names.
func (f Format16) String() string {
	switch f {
	case FP16:
		return "fp16"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("Format16(%d)", int(f))
}

func (f Format16) check() error {
	if f != FP16 && f != BF16 {
		return fmt.Errorf("hooks: unknown 16-bit format %v (want FP16 or BF16)", f)
	}
	return nil
}

// Encode rounds x to the format (round to nearest, ties to even) and returns its bits.
func (f Format16) Encode(x float32) uint16 {
	if f == BF16 {
		return Float32ToBFloat16(x)
	}
	return Float32ToHalf(x)
}

// Decode returns the float32 value of bits h (exact: both formats are subsets of float32).
func (f Format16) Decode(h uint16) float32 {
	if f == BF16 {
		return BFloat16ToFloat32(h)
	}
	return HalfToFloat32(h)
}

// Round returns x rounded to the format, as a float32.
func (f Format16) Round(x float32) float32 { return f.Decode(f.Encode(x)) }

// UnitRoundoff is the largest relative error of rounding a normal number to the format:
// 2^-11 for FP16, 2^-8 for BF16.
func (f Format16) UnitRoundoff() float64 {
	if f == BF16 {
		return 0x1p-8
	}
	return 0x1p-11
}

// Underflow is the largest absolute error of rounding a number in the format's subnormal
// range: half the smallest subnormal, 2^-25 for FP16 and 2^-134 for BF16.
func (f Format16) Underflow() float64 {
	if f == BF16 {
		return 0x1p-134
	}
	return 0x1p-25
}

// Float32ToHalf converts x to IEEE binary16 bits, rounding to nearest with ties to even.
// Magnitudes from 65520 up become ±Inf, those at or below 2^-25 become ±0 (2^-25 itself is a
// tie and goes to the even 0), values in between that are smaller than 2^-14 become
// subnormals. A NaN stays a NaN of the same sign, quiet, keeping the top 9 bits of its
// payload. It is kernels.Float32ToHalf; the hook converts whole slices with kernels'
// EncodeHalf (F16C where the CPU has it), which gives the same bits.
func Float32ToHalf(x float32) uint16 { return kernels.Float32ToHalf(x) }

// HalfToFloat32 returns the float32 value of IEEE binary16 bits h (exact). A NaN keeps its
// sign and payload and is made quiet (as F16C's VCVTPH2PS does). It is kernels.HalfToFloat32.
func HalfToFloat32(h uint16) float32 { return kernels.HalfToFloat32(h) }

// Float32ToBFloat16 converts x to bfloat16 bits, rounding to nearest with ties to even (as
// torch's float32 → bfloat16 cast). Values that round past the largest finite bfloat16 become
// ±Inf; subnormals round like normals. A NaN stays a NaN of the same sign, quiet, keeping the
// top 6 bits of its payload. It is kernels.Float32ToBFloat16 (the hook converts slices with
// kernels.EncodeBF16, AVX2 where the CPU has it, same bits).
func Float32ToBFloat16(x float32) uint16 { return kernels.Float32ToBFloat16(x) }

// BFloat16ToFloat32 returns the float32 value of bfloat16 bits h (exact).
func BFloat16ToFloat32(h uint16) float32 { return kernels.BFloat16ToFloat32(h) }

// encode sets dst[i] to the format's bits of src[i]/div (divided in float32, then rounded
// once to 16 bits). div = 1 encodes src as it is. It and decode, addInto and roundInPlace go
// through kernels' slice conversions (F16C for FP16, AVX2 for BF16 where the CPU has them):
// with the scalar FP16 conversion, whose rounding branch mispredicted on about every other
// gradient element, fp16 trained the LSTM at 0.77× dense throughput.
func (f Format16) encode(dst []uint16, src []float32, div float32) {
	if f == FP16 {
		kernels.EncodeHalf(dst[:len(src)], src, div)
	} else {
		kernels.EncodeBF16(dst[:len(src)], src, div)
	}
}

// decode sets dst[i] to the value of src[i].
func (f Format16) decode(dst []float32, src []uint16) {
	if f == FP16 {
		kernels.DecodeHalf(dst[:len(src)], src)
	} else {
		kernels.DecodeBF16(dst[:len(src)], src)
	}
}

// roundBlock is how many elements roundInPlace converts per kernel call (its 16-bit copy
// lives on the stack and in L1).
const roundBlock = 2048

// roundInPlace rounds every element of x to the format.
func (f Format16) roundInPlace(x []float32) {
	var buf [roundBlock]uint16
	for lo := 0; lo < len(x); lo += roundBlock {
		blk := x[lo:min(lo+roundBlock, len(x))]
		f.encode(buf[:len(blk)], blk, 1)
		f.decode(blk, buf[:len(blk)])
	}
}

// addInto sets dst[i] to the format's rounding of the float32 sum of a[i] and b[i]: what
// one reduction step of a 16-bit all-reduce computes (NCCL's fp16 and bf16 sums do the same:
// widen, add, narrow). When both are NaNs the vector paths keep b's payload (see
// kernels.AddHalf): every rank runs the same code on the same operands, so ranks agree.
func (f Format16) addInto(dst, a, b []uint16) {
	if f == FP16 {
		kernels.AddHalf(dst[:len(a)], a, b[:len(a)])
	} else {
		kernels.AddBF16(dst[:len(a)], a, b[:len(a)])
	}
}

// AllReduce16 sums buf, a vector of 16-bit words in format f, over all ranks in place: every
// reduction step decodes both operands, adds them in float32 and rounds the sum back to 16
// bits, so 2 bytes per element travel on the wire, and every rank ends with the same bits
// (each element is reduced in exactly one place, or by both partners of an exchange with the
// same operands in the same order, NaN payloads included, and then copied). Every rank must
// pass the same len(buf), tag, f and alg.
//
// It is comm.AllReduceOf with that step as the reduction: comm.AllReduce's algorithms and
// rounds (Ring, Rabenseifner, RecursiveDoubling, non-power-of-two P folded in MPICH's way),
// its volumes in half the bytes, and its Auto choice by size in bytes: recursive doubling for
// messages up to comm.SmallAllReduceBytes (1024 elements), else Rabenseifner for power-of-two
// P and the ring otherwise.
//
// Rounding: every element takes part in at most P-1 additions, each exact in float32 up to
// one float32 rounding, then rounded to the format, so the result differs from the exact sum
// of the decoded inputs by at most (P-1)·(u+2^-24)·Σ_r|x_r| + (P-1)·η (u = f.UnitRoundoff(),
// η = f.Underflow()), to first order. FP16 partial sums beyond 65504 become Inf.
func AllReduce16(ctx context.Context, g comm.Group, tag uint32, buf []uint16, f Format16, alg comm.Algorithm) error {
	if err := f.check(); err != nil {
		return err
	}
	if err := comm.AllReduceOf(ctx, g, tag, buf, f.addInto, alg); err != nil {
		return fmt.Errorf("hooks: AllReduce16(%v): %w", f, err)
	}
	return nil
}

// AllReduceFunc sums buf over all ranks in place; every rank gets the same bits. Hooks whose
// communication is made of such sums take one (see DenseAllReducer).
type AllReduceFunc func(ctx context.Context, g comm.Group, tag uint32, buf []float32) error

// AllReduce32 is the float32 AllReduceFunc: comm.AllReduce with comm.Auto.
func AllReduce32(ctx context.Context, g comm.Group, tag uint32, buf []float32) error {
	return comm.AllReduce(ctx, g, tag, buf, comm.Auto)
}

// AllReduceFunc returns an AllReduceFunc that carries the sum in format f: it rounds buf to
// f, sums the 16-bit words with AllReduce16 (alg) and decodes the result into buf.
func (f Format16) AllReduceFunc(alg comm.Algorithm) AllReduceFunc {
	return func(ctx context.Context, g comm.Group, tag uint32, buf []float32) error {
		enc := make([]uint16, len(buf))
		f.encode(enc, buf, 1)
		if err := AllReduce16(ctx, g, tag, enc, f, alg); err != nil {
			return err
		}
		f.decode(buf, enc)
		return nil
	}
}

// DenseAllReducer is implemented by hooks whose only communication is dense float32 sums
// made through an AllReduceFunc that a wrapper may replace (PowerSGD: the uncompressed
// tensors, P and Q). Wrap16 gives such a hook Format16.AllReduceFunc, so its messages are
// 16-bit.
type DenseAllReducer interface {
	ddp.CommHook
	// SetAllReduce replaces the hook's all-reduce; nil restores AllReduce32.
	SetAllReduce(AllReduceFunc)
}

// Compress16 is PyTorch's fp16_compress_hook / bf16_compress_hook: every rank divides its
// bucket by P (in float32, as PyTorch divides before the all-reduce so that fp16 sums do not
// overflow), rounds it to Format, all-reduces the 16-bit words with AllReduce16 (2 bytes per
// element on the wire, half of allreduce's volume; same rounds) and decodes the average back
// to float32. The result is bit-identical on every rank.
//
// Error: |out - mean| <= P·(u+2^-24)·Σ_r|g_r|/P + (2P-1)·η to first order (u =
// Format.UnitRoundoff(), η = Format.Underflow()): one rounding of each g_r/P and at most P-1
// rounded additions. FP16
// turns averaged magnitudes beyond 65504 into Inf and those below 2^-25 into 0, as PyTorch's
// hook does; BF16 has float32's range and 8 significant bits.
type Compress16 struct {
	Format    Format16
	Algorithm comm.Algorithm
}

var _ ddp.CommHook = (*Compress16)(nil)

// Name returns "fp16" or "bf16".
func (h *Compress16) Name() string { return h.Format.String() }

// Run averages the bucket in 16-bit messages.
func (h *Compress16) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	flat := b.Flat()
	enc := make([]uint16, len(flat))
	h.Format.encode(enc, flat, float32(g.Size()))
	if err := AllReduce16(ctx, g, b.Tag(), enc, h.Format, h.Algorithm); err != nil {
		return ddp.Ready(nil, fmt.Errorf("hooks: %s: bucket %d: %w", h.Name(), b.Index(), err))
	}
	h.Format.decode(flat, enc)
	return ddp.Ready(flat, nil)
}

// Wrapped16 is PyTorch's fp16_compress_wrapper / bf16_compress_wrapper around another hook:
// the bucket is rounded to Format before Inner runs and Inner's result is rounded to Format
// after. Build it with Wrap16, which also makes Inner's messages 16-bit when Inner is a
// DenseAllReducer.
//
// What it saves on the wire: for a DenseAllReducer (powersgd) every all-reduce of Inner
// carries 16-bit words (half the bytes; no division before the sum: Inner divides, so fp16
// partial sums beyond 65504 overflow as they do in PyTorch). For a hook that is not one (the
// sparse hooks), nothing: its messages stay float32, and the wrapper only changes the
// precision of its input and output. Inner's computation and state (matrix products,
// orthogonalisation, error-feedback memory) stay float32, where PyTorch's run in 16 bits.
type Wrapped16 struct {
	Format Format16
	Inner  ddp.CommHook
}

var (
	_ ddp.CommHook = (*Wrapped16)(nil)
	_ ddp.Stateful = (*Wrapped16)(nil)
)

// Wrap16 wraps inner in format f (spec "fp16+INNER"). An allreduce inner gives the Compress16
// hook itself, as PyTorch's fp16_compress_hook is fp16_compress_wrapper(allreduce_hook); a
// DenseAllReducer gets f.AllReduceFunc(comm.Auto) (Wrap16 takes inner over: do not run it
// unwrapped afterwards). Wrapping a 16-bit hook or wrapper is refused.
func Wrap16(f Format16, inner ddp.CommHook) (ddp.CommHook, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	switch in := inner.(type) {
	case nil:
		return nil, fmt.Errorf("hooks: %v wrapper: nil inner hook", f)
	case ddp.AllReduceHook:
		return &Compress16{Format: f, Algorithm: in.Algorithm}, nil
	case *ddp.AllReduceHook:
		return &Compress16{Format: f, Algorithm: in.Algorithm}, nil
	case *Compress16, *Wrapped16:
		return nil, fmt.Errorf("hooks: %v wrapper: cannot wrap the 16-bit hook %s", f, inner.Name())
	case *OSP:
		return nil, fmt.Errorf("hooks: %v wrapper: cannot wrap osp, which delivers part of its result late (ddp.LateFuture)", f)
	case DenseAllReducer:
		in.SetAllReduce(f.AllReduceFunc(comm.Auto))
	}
	return &Wrapped16{Format: f, Inner: inner}, nil
}

// Name returns "fp16+" or "bf16+" and Inner's name.
func (w *Wrapped16) Name() string { return w.Format.String() + "+" + w.Inner.Name() }

// Run rounds the bucket to Format, runs Inner and rounds its result when it is waited for.
func (w *Wrapped16) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	w.Format.roundInPlace(b.Flat())
	return ddp.Then(w.Inner.Run(ctx, g, b), func(out []float32) ([]float32, error) {
		w.Format.roundInPlace(out)
		return out, nil
	})
}

// State returns Inner's state when Inner is ddp.Stateful, else none.
func (w *Wrapped16) State() (map[string][]float32, error) {
	if s, ok := w.Inner.(ddp.Stateful); ok {
		return s.State()
	}
	return map[string][]float32{}, nil
}

// LoadState restores Inner's state; a hook without state refuses a non-empty one.
func (w *Wrapped16) LoadState(st map[string][]float32) error {
	if s, ok := w.Inner.(ddp.Stateful); ok {
		return s.LoadState(st)
	}
	if len(st) > 0 {
		return fmt.Errorf("hooks: %s: LoadState: %s keeps no state, got %d keys", w.Name(), w.Inner.Name(), len(st))
	}
	return nil
}

func init() {
	for _, f := range []Format16{FP16, BF16} {
		torch := map[Format16]string{FP16: "float16", BF16: "bfloat16"}[f]
		Register(Spec{
			Name: f.String(),
			Summary: fmt.Sprintf("PyTorch's %s_compress_hook: divide by P, round to %s, all-reduce the 16-bit words (each step adds in float32 and rounds), cast back; half allreduce's bytes. As %s+SPEC it wraps another hook (%s_compress_wrapper): input and output rounded to %s, and a powersgd inner hook's all-reduces travel in 16 bits",
				f, torch, f, f, torch),
			Options: []Option{{Name: "algorithm", Default: "auto",
				Help: "auto|ring|rabenseifner|recursive_doubling (auto: recursive doubling up to 2 KiB of 16-bit words, then Rabenseifner for power-of-two P, else ring)"}},
			New: func(o Values) (ddp.CommHook, error) {
				a, err := o.Enum("algorithm", "auto", "ring", "rabenseifner", "recursive_doubling")
				if err != nil {
					return nil, err
				}
				return &Compress16{Format: f, Algorithm: allReduceAlgorithms[a]}, nil
			},
			Wrap: func(inner ddp.CommHook) (ddp.CommHook, error) { return Wrap16(f, inner) },
		})
	}
}
