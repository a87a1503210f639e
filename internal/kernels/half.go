package kernels

import "math"

// 16-bit float conversions: IEEE 754 binary16 ("half", torch.float16) and bfloat16
// (torch.bfloat16). The scalar Float32ToHalf, HalfToFloat32, Float32ToBFloat16 and
// BFloat16ToFloat32, and the slice kernels the 16-bit comm hooks run on whole buckets
// (EncodeHalf, DecodeHalf, AddHalf and their BF16 twins). On the amd64 paths (avx2, avx512)
// the slice kernels work on 8 elements at a time: binary16 with F16C's VCVTPS2PH /
// VCVTPH2PS when the CPU has F16C, bfloat16 with AVX2 integer arithmetic; elsewhere, and
// with SPARGO_KERNELS=generic, they loop over the scalar functions. Every path gives the same
// bits for every input (half_test.go checks it), up to which NaN payload the additions keep
// when both operands are NaNs (see AddHalf).

// Float32ToHalf converts x to IEEE binary16 bits, rounding to nearest with ties to even.
// Magnitudes from 65520 up become ±Inf, those at or below 2^-25 become ±0 (2^-25 itself is a
// tie and goes to the even 0), values in between that are smaller than 2^-14 become
// subnormals. A NaN stays a NaN of the same sign, quiet, keeping the top 9 bits of its
// payload (what F16C's VCVTPS2PH does).
//
// The rounding increments are computed without branches (h += (rem + half−1 + odd) >> shift
// is 1 exactly when rem > half, or rem = half and h is odd): random low bits made the
// branchy form mispredict on about every other element.
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
		h += (m&(1<<shift-1) + 1<<(shift-1) - 1 + h&1) >> shift
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | frac>>13
	h += (frac&0x1fff + 0xfff + h&1) >> 13 // a carry into the exponent is right, up to Inf (0x7c00)
	return sign | uint16(h)
}

// HalfToFloat32 returns the float32 value of IEEE binary16 bits h (exact). A NaN keeps its
// sign and payload and becomes quiet (what F16C's VCVTPH2PS does): a signalling NaN
// 0x7c01–0x7dff gets the quiet bit 0x400000.
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
		if frac != 0 {
			frac |= 0x200
		}
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

// BFloat16ToFloat32 returns the float32 value of bfloat16 bits h (exact; a NaN keeps its
// bits).
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// halfOps are the slice conversions of one implementation, binary16 and bfloat16 (lengths
// checked by callers; any length).
type halfOps struct {
	encode, encodeBF16 func(dst []uint16, src []float32, div float32)
	decode, decodeBF16 func(dst []float32, src []uint16)
	add, addBF16       func(dst, a, b []uint16)
}

var genericHalf = &halfOps{
	encode: encodeHalfGeneric, decode: decodeHalfGeneric, add: addHalfGeneric,
	encodeBF16: encodeBF16Generic, decodeBF16: decodeBF16Generic, addBF16: addBF16Generic,
}

func encodeHalfGeneric(dst []uint16, src []float32, div float32) {
	dst = dst[:len(src)]
	if div == 1 {
		for i, x := range src {
			dst[i] = Float32ToHalf(x)
		}
		return
	}
	for i, x := range src {
		dst[i] = Float32ToHalf(x / div)
	}
}

func decodeHalfGeneric(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = HalfToFloat32(h)
	}
}

func addHalfGeneric(dst, a, b []uint16) {
	b = b[:len(a)]
	dst = dst[:len(a)]
	for i := range a {
		dst[i] = Float32ToHalf(HalfToFloat32(a[i]) + HalfToFloat32(b[i]))
	}
}

func encodeBF16Generic(dst []uint16, src []float32, div float32) {
	dst = dst[:len(src)]
	if div == 1 {
		for i, x := range src {
			dst[i] = Float32ToBFloat16(x)
		}
		return
	}
	for i, x := range src {
		dst[i] = Float32ToBFloat16(x / div)
	}
}

func decodeBF16Generic(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = BFloat16ToFloat32(h)
	}
}

func addBF16Generic(dst, a, b []uint16) {
	b = b[:len(a)]
	dst = dst[:len(a)]
	for i := range a {
		dst[i] = Float32ToBFloat16(BFloat16ToFloat32(a[i]) + BFloat16ToFloat32(b[i]))
	}
}

// EncodeHalf sets dst[i] to Float32ToHalf(src[i] / div): divided in float32, then rounded
// once to binary16 (div = 1 converts src as it is). len(dst) must equal len(src).
func EncodeHalf(dst []uint16, src []float32, div float32) {
	checkLen("EncodeHalf", len(dst), len(src))
	impl.half.encode(dst, src, div)
}

// DecodeHalf sets dst[i] to HalfToFloat32(src[i]). len(dst) must equal len(src).
func DecodeHalf(dst []float32, src []uint16) {
	checkLen("DecodeHalf", len(dst), len(src))
	impl.half.decode(dst, src)
}

// AddHalf sets dst[i] to Float32ToHalf(HalfToFloat32(a[i]) + HalfToFloat32(b[i])): one
// reduction step of a binary16 all-reduce (widen, add in float32, round). dst may be a or
// b. When a[i] and b[i] are both NaNs the result is a quiet NaN with b[i]'s payload on the
// F16C path; on the generic path it is whichever operand's the Go compiler puts first in the
// addition (b[i]'s with Go 1.26; the language leaves it open). Every other input gives the
// same bits on every path. The three lengths must be equal.
func AddHalf(dst, a, b []uint16) {
	checkLen("AddHalf", len(dst), len(a), len(b))
	impl.half.add(dst, a, b)
}

// EncodeBF16 sets dst[i] to Float32ToBFloat16(src[i] / div) (div = 1: src as it is).
// len(dst) must equal len(src).
func EncodeBF16(dst []uint16, src []float32, div float32) {
	checkLen("EncodeBF16", len(dst), len(src))
	impl.half.encodeBF16(dst, src, div)
}

// DecodeBF16 sets dst[i] to BFloat16ToFloat32(src[i]). len(dst) must equal len(src).
func DecodeBF16(dst []float32, src []uint16) {
	checkLen("DecodeBF16", len(dst), len(src))
	impl.half.decodeBF16(dst, src)
}

// AddBF16 sets dst[i] to Float32ToBFloat16(BFloat16ToFloat32(a[i]) + BFloat16ToFloat32(b[i]))
// (dst may be a or b), with AddHalf's rule for two NaN operands. The three lengths must be
// equal.
func AddBF16(dst, a, b []uint16) {
	checkLen("AddBF16", len(dst), len(a), len(b))
	impl.half.addBF16(dst, a, b)
}
