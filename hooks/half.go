package hooks

import (
	"context"
	"fmt"
	"math"
	"unsafe"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
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
// payload.
func Float32ToHalf(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	frac := b & 0x7fffff
	if exp == 0xff {
		if frac != 0 {
			return sign | 0x7e00 | uint16(frac>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // the binary16 biased exponent
	switch {
	case e >= 0x1f:
		return sign | 0x7c00
	case e <= 0:
		if e < -10 {
			return sign // below 2^-25: rounds to zero
		}
		// Subnormal: the 24-bit significand in units of 2^-24 is m·2^(exp-150)/2^-24 =
		// m >> (14-e). Rounding may carry into 0x400, the smallest normal: that is its code.
		m := frac | 0x800000
		shift := uint(14 - e)
		h := m >> shift
		rem, half := m&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	}
	h := uint16(e)<<10 | uint16(frac>>13)
	if rem := frac & 0x1fff; rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // a carry into the exponent is right, up to Inf (0x7c00)
	}
	return sign | h
}

// HalfToFloat32 returns the float32 value of IEEE binary16 bits h (exact). A NaN keeps its
// sign and payload.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h & 0x3ff)
	switch exp {
	case 0:
		v := float32(frac) * 0x1p-24 // exact: frac < 2^10
		if sign != 0 {
			v = -v
		}
		return v
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | frac<<13)
}

// Float32ToBFloat16 converts x to bfloat16 bits, rounding to nearest with ties to even (as
// torch's float32 → bfloat16 cast). Values that round past the largest finite bfloat16 become
// ±Inf; subnormals round like normals. A NaN stays a NaN of the same sign, quiet, keeping the
// top 6 bits of its payload.
func Float32ToBFloat16(x float32) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BFloat16ToFloat32 returns the float32 value of bfloat16 bits h (exact).
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// encode sets dst[i] to the format's bits of src[i]/div (divided in float32, then rounded
// once to 16 bits). div = 1 encodes src as it is.
func (f Format16) encode(dst []uint16, src []float32, div float32) {
	dst = dst[:len(src)]
	switch {
	case f == BF16 && div == 1:
		for i, x := range src {
			dst[i] = Float32ToBFloat16(x)
		}
	case f == BF16:
		for i, x := range src {
			dst[i] = Float32ToBFloat16(x / div)
		}
	case div == 1:
		for i, x := range src {
			dst[i] = Float32ToHalf(x)
		}
	default:
		for i, x := range src {
			dst[i] = Float32ToHalf(x / div)
		}
	}
}

// decode sets dst[i] to the value of src[i].
func (f Format16) decode(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	if f == BF16 {
		for i, h := range src {
			dst[i] = BFloat16ToFloat32(h)
		}
		return
	}
	for i, h := range src {
		dst[i] = HalfToFloat32(h)
	}
}

// roundInPlace rounds every element of x to the format.
func (f Format16) roundInPlace(x []float32) {
	if f == BF16 {
		for i, v := range x {
			x[i] = BFloat16ToFloat32(Float32ToBFloat16(v))
		}
		return
	}
	for i, v := range x {
		x[i] = HalfToFloat32(Float32ToHalf(v))
	}
}

// addInto sets dst[i] to the format's rounding of the float32 sum of a[i] and b[i]: what
// one reduction step of a 16-bit all-reduce computes (NCCL's fp16 and bf16 sums do the same:
// widen, add, narrow).
func (f Format16) addInto(dst, a, b []uint16) {
	b = b[:len(a)]
	dst = dst[:len(a)]
	if f == BF16 {
		for i := range a {
			dst[i] = Float32ToBFloat16(BFloat16ToFloat32(a[i]) + BFloat16ToFloat32(b[i]))
		}
		return
	}
	for i := range a {
		dst[i] = Float32ToHalf(HalfToFloat32(a[i]) + HalfToFloat32(b[i]))
	}
}

// u16Bytes views h as bytes without copying (host order, little-endian on every platform
// spargo supports, like comm.F32Bytes).
func u16Bytes(h []uint16) []byte {
	if len(h) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&h[0])), 2*len(h))
}

// AllReduce16 sums buf, a vector of 16-bit words in format f, over all ranks in place: every
// reduction step decodes both operands, adds them in float32 and rounds the sum back to 16
// bits, so 2 bytes per element travel on the wire, and every rank ends with the same bits
// (each element is reduced in exactly one place, or by both partners of an exchange with the
// same operands, and then copied). Every rank must pass the same len(buf), tag, f and alg.
//
// The algorithms and their rounds are comm.AllReduce's (Ring, Rabenseifner, RecursiveDoubling,
// non-power-of-two P folded in MPICH's way); volumes are comm.AllReduce's in half the bytes.
// Auto picks recursive doubling for messages up to comm.SmallAllReduceBytes (1024 elements),
// else Rabenseifner for power-of-two P and the ring otherwise.
//
// Rounding: every element takes part in at most P-1 additions, each exact in float32 up to
// one float32 rounding, then rounded to the format, so the result differs from the exact sum
// of the decoded inputs by at most (P-1)·(u+2^-24)·Σ_r|x_r| + (P-1)·η (u = f.UnitRoundoff(),
// η = f.Underflow()), to first order. FP16 partial sums beyond 65504 become Inf.
func AllReduce16(ctx context.Context, g comm.Group, tag uint32, buf []uint16, f Format16, alg comm.Algorithm) error {
	if g == nil {
		return fmt.Errorf("hooks: AllReduce16: nil Group")
	}
	if err := f.check(); err != nil {
		return err
	}
	p, n := g.Size(), len(buf)
	if alg == comm.Auto {
		switch {
		case 2*n <= comm.SmallAllReduceBytes:
			alg = comm.RecursiveDoubling
		case isPow2(p):
			alg = comm.Rabenseifner
		default:
			alg = comm.Ring
		}
	}
	switch alg {
	case comm.Ring, comm.Rabenseifner, comm.RecursiveDoubling:
	default:
		return fmt.Errorf("hooks: AllReduce16: rank %d: algorithm %v is not an all-reduce algorithm (use Auto, Ring, Rabenseifner or RecursiveDoubling)", g.Rank(), alg)
	}
	if p == 1 || n == 0 {
		return nil
	}
	var err error
	switch alg {
	case comm.Ring:
		err = ring16(ctx, g, tag, buf, f)
	case comm.Rabenseifner:
		err = folded16(ctx, g, tag, buf, f, rabenseifner16)
	case comm.RecursiveDoubling:
		err = folded16(ctx, g, tag, buf, f, recursiveDoubling16)
	}
	if err != nil {
		return fmt.Errorf("hooks: AllReduce16(%v, %v) of %d elements, rank %d of %d, tag %d: %w", f, alg, n, g.Rank(), p, tag, err)
	}
	return nil
}

// exchange16 is one round (comm.SendRecv) that requires the received message to fill recv:
// a shorter one means the ranks disagree on the vector's length.
func exchange16(ctx context.Context, g comm.Group, tag uint32, to int, send []uint16, from int, recv []uint16) error {
	n, err := comm.SendRecv(ctx, g, tag, to, u16Bytes(send), from, u16Bytes(recv))
	if err != nil {
		return err
	}
	if from >= 0 && n != 2*len(recv) {
		return fmt.Errorf("rank %d: recv from rank %d tag %d: got %d bytes, want %d (do the ranks pass the same sizes?)", g.Rank(), from, tag, n, 2*len(recv))
	}
	return nil
}

// splitBlocks splits n elements into p blocks as evenly as possible (the first n%p get one
// more) and returns the counts and offsets (len p+1), as the comm collectives do.
func splitBlocks(n, p int) (counts, offs []int) {
	counts, offs = make([]int, p), make([]int, p+1)
	for i := range p {
		counts[i] = n / p
		if i < n%p {
			counts[i]++
		}
		offs[i+1] = offs[i] + counts[i]
	}
	return counts, offs
}

// ring16: reduce-scatter around the ring (rank r ends owning the sum of block r+1), then an
// all-gather of the finished blocks; 2(P-1) rounds.
func ring16(ctx context.Context, g comm.Group, tag uint32, buf []uint16, f Format16) error {
	p, r := g.Size(), g.Rank()
	counts, offs := splitBlocks(len(buf), p)
	scratch := make([]uint16, counts[0])
	right, left := (r+1)%p, (r-1+p)%p
	block := func(i int) []uint16 { return buf[offs[i]:offs[i+1]] }
	mod := func(i int) int { return ((i % p) + p) % p }
	for s := range p - 1 {
		sb, rb := mod(r-s), mod(r-s-1)
		in := scratch[:counts[rb]]
		if err := exchange16(ctx, g, tag, right, block(sb), left, in); err != nil {
			return fmt.Errorf("reduce-scatter step %d: %w", s, err)
		}
		f.addInto(block(rb), block(rb), in)
	}
	for s := range p - 1 {
		sb, rb := mod(r+1-s), mod(r-s)
		if err := exchange16(ctx, g, tag, right, block(sb), left, block(rb)); err != nil {
			return fmt.Errorf("all-gather step %d: %w", s, err)
		}
	}
	return nil
}

// core16 all-reduces buf among pp (a power of two) ranks; this rank is number nr of them and
// real(i) is the Group rank of number i.
type core16 func(ctx context.Context, g comm.Group, tag uint32, buf []uint16, f Format16, nr, pp int, real func(int) int) error

// folded16 runs core on P' = 2^floor(log2 P) ranks after folding the other rem = P-P' in:
// ranks r < 2·rem pair up, the even one sends its vector to the odd one, which adds it and
// takes part; at the end the odd one sends the result back.
func folded16(ctx context.Context, g comm.Group, tag uint32, buf []uint16, f Format16, core core16) error {
	p, r := g.Size(), g.Rank()
	pp := 1
	for pp*2 <= p {
		pp *= 2
	}
	rem := p - pp
	real := func(nr int) int {
		if nr < rem {
			return 2*nr + 1
		}
		return nr + rem
	}
	nr := r - rem
	if r < 2*rem {
		if r%2 == 0 {
			if err := exchange16(ctx, g, tag, r+1, buf, -1, nil); err != nil {
				return fmt.Errorf("fold in: %w", err)
			}
			if err := exchange16(ctx, g, tag, -1, nil, r+1, buf); err != nil {
				return fmt.Errorf("fold out: %w", err)
			}
			return nil
		}
		in := make([]uint16, len(buf))
		if err := exchange16(ctx, g, tag, -1, nil, r-1, in); err != nil {
			return fmt.Errorf("fold in: %w", err)
		}
		f.addInto(buf, in, buf)
		nr = r / 2
	}
	if err := core(ctx, g, tag, buf, f, nr, pp, real); err != nil {
		return err
	}
	if r < 2*rem {
		if err := exchange16(ctx, g, tag, r-1, buf, -1, nil); err != nil {
			return fmt.Errorf("fold out: %w", err)
		}
	}
	return nil
}

// rabenseifner16: recursive-halving reduce-scatter, then recursive-doubling all-gather;
// 2·log2 P' rounds.
func rabenseifner16(ctx context.Context, g comm.Group, tag uint32, buf []uint16, f Format16, nr, pp int, real func(int) int) error {
	_, offs := splitBlocks(len(buf), pp)
	span := func(lo, hi int) []uint16 { return buf[offs[lo]:offs[hi]] }
	scratch := make([]uint16, offs[pp/2]) // the largest half: the first blocks are the largest
	lo, hi := 0, pp
	for d := pp / 2; d >= 1; d /= 2 {
		partner := nr ^ d
		mid := (lo + hi) / 2
		keepLo, keepHi, sendLo, sendHi := lo, mid, mid, hi
		if nr&d != 0 {
			keepLo, keepHi, sendLo, sendHi = mid, hi, lo, mid
		}
		kept := span(keepLo, keepHi)
		in := scratch[:len(kept)]
		if err := exchange16(ctx, g, tag, real(partner), span(sendLo, sendHi), real(partner), in); err != nil {
			return fmt.Errorf("reduce-scatter distance %d: %w", d, err)
		}
		f.addInto(kept, kept, in)
		lo, hi = keepLo, keepHi
	}
	for d := 1; d < pp; d *= 2 {
		partner := nr ^ d
		plo, phi := hi, hi+d
		if nr&d != 0 {
			plo, phi = lo-d, lo
		}
		if err := exchange16(ctx, g, tag, real(partner), span(lo, hi), real(partner), span(plo, phi)); err != nil {
			return fmt.Errorf("all-gather distance %d: %w", d, err)
		}
		lo, hi = min(lo, plo), max(hi, phi)
	}
	return nil
}

// recursiveDoubling16 exchanges whole vectors with the partner at distance 1, 2, 4, ...;
// both partners add the same two operands, so they get the same bits. log2 P' rounds.
func recursiveDoubling16(ctx context.Context, g comm.Group, tag uint32, buf []uint16, f Format16, nr, pp int, real func(int) int) error {
	in := make([]uint16, len(buf))
	for d := 1; d < pp; d *= 2 {
		partner := nr ^ d
		if err := exchange16(ctx, g, tag, real(partner), buf, real(partner), in); err != nil {
			return fmt.Errorf("distance %d: %w", d, err)
		}
		f.addInto(buf, buf, in)
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
	return rounded16{w.Format, w.Inner.Run(ctx, g, b)}
}

type rounded16 struct {
	f     Format16
	inner ddp.Future
}

func (r rounded16) Wait() ([]float32, error) {
	out, err := r.inner.Wait()
	if err == nil {
		r.f.roundInPlace(out)
	}
	return out, err
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
