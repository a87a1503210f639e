package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// float32ToHalfRef and halfToFloat32Ref are the scalar conversions as hooks had them before
// the slice kernels (branchy rounding; NaNs decoded without the quiet bit), kept verbatim as
// the reference every implementation must match bit for bit (halfToFloat32Ref up to the quiet
// bit of a signalling NaN, which HalfToFloat32 now sets as VCVTPH2PS does).
func float32ToHalfRef(x float32) uint16 {
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
	e := exp - 127 + 15
	switch {
	case e >= 0x1f:
		return sign | 0x7c00
	case e <= 0:
		if e < -10 {
			return sign
		}
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
		h++
	}
	return sign | h
}

func halfToFloat32Ref(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h & 0x3ff)
	switch exp {
	case 0:
		v := float32(frac) * 0x1p-24
		if sign != 0 {
			v = -v
		}
		return v
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | frac<<13)
}

// decodeRef is halfToFloat32Ref's bits with a NaN made quiet.
func decodeRef(h uint16) uint32 {
	b := math.Float32bits(halfToFloat32Ref(h))
	if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
		b |= 0x400000
	}
	return b
}

// halfEncodeInputs returns float32 values of every class for the encoder: every one of the
// 65536 upper halves (sign, exponent, top 7 fraction bits) with 48 lower halves that put each
// rounding position (bit 12 for normals, bits 13–23 for subnormals) at, just below and just
// above a tie with either parity (the three bits above bit 13 take all 8 values), then
// random bit patterns. NaNs (any payload) and infinities are among them.
func halfEncodeInputs() []float32 {
	var lows []uint32
	for top := range uint32(8) {
		for _, low := range []uint32{0, 1, 0xfff, 0x1000, 0x1001, 0x1fff} {
			lows = append(lows, top<<13|low)
		}
	}
	xs := make([]float32, 0, 1<<16*len(lows)+1<<20)
	for hi := range uint32(1 << 16) {
		for _, lo := range lows {
			xs = append(xs, math.Float32frombits(hi<<16|lo))
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 1 << 20 {
		xs = append(xs, math.Float32frombits(rng.Uint32()))
	}
	return xs
}

// Every one of the 65536 binary16 values decodes to the reference's float32 bits (a NaN: made
// quiet), through DecodeHalf (vector body and scalar tail: 65536 = 8·8192, so the slice is
// also decoded at an odd offset) and HalfToFloat32.
func TestDecodeHalfAll65536(t *testing.T) {
	src := make([]uint16, 1<<16+3)
	for i := range src {
		src[i] = uint16(i)
	}
	forEachImpl(t, func(t *testing.T) {
		for _, off := range []int{0, 3} {
			s := src[off : off+1<<16]
			dst := make([]float32, len(s))
			DecodeHalf(dst, s)
			for i, h := range s {
				if got, want := math.Float32bits(dst[i]), decodeRef(h); got != want {
					t.Fatalf("DecodeHalf(%#04x) = %#08x, want %#08x", h, got, want)
				}
				if got, want := math.Float32bits(HalfToFloat32(h)), decodeRef(h); got != want {
					t.Fatalf("HalfToFloat32(%#04x) = %#08x, want %#08x", h, got, want)
				}
			}
		}
	})
}

// EncodeHalf and Float32ToHalf give the reference's bits on halfEncodeInputs, divided by 1
// (as they are), 4 (exact) and 3 (a rounded division first), and on slices of every length
// up to 40 (the scalar tails).
func TestEncodeHalf(t *testing.T) {
	xs := halfEncodeInputs()
	for i, x := range xs {
		if got, want := Float32ToHalf(x), float32ToHalfRef(x); got != want {
			t.Fatalf("Float32ToHalf(%#08x) = %#04x, want %#04x (input %d)", math.Float32bits(x), got, want, i)
		}
	}
	dst := make([]uint16, len(xs))
	forEachImpl(t, func(t *testing.T) {
		for _, div := range []float32{1, 4, 3} {
			EncodeHalf(dst, xs, div)
			for i, x := range xs {
				if want := float32ToHalfRef(x / div); dst[i] != want {
					t.Fatalf("EncodeHalf(%#08x / %v) = %#04x, want %#04x", math.Float32bits(x), div, dst[i], want)
				}
			}
		}
		for n := range 41 {
			d := make([]uint16, n)
			EncodeHalf(d, xs[1000:1000+n], 3)
			for i, x := range xs[1000 : 1000+n] {
				if want := float32ToHalfRef(x / 3); d[i] != want {
					t.Fatalf("n = %d: EncodeHalf(%v/3)[%d] = %#04x, want %#04x", n, x, i, d[i], want)
				}
			}
		}
	})
}

// AddHalf is the reference's decode, float32 add and encode for every first operand (all
// 65536 values) against 80 second operands of every class (zeros, subnormals, normals near
// 1 and near 65504, infinities, NaNs of both kinds and signs) and on random pairs, in place
// (dst = a) and not. Both operands NaN: a quiet NaN with b's payload on the F16C path (its
// vector part), a's or b's on the generic one.
func TestAddHalf(t *testing.T) {
	special := []uint16{0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x3c00,
		0xbc00, 0x3c01, 0xbc01, 0x7bff, 0xfbff, 0x7bfe, 0x7c00, 0xfc00, 0x7c01, 0xfc01, 0x7e00,
		0xfe00, 0x7fff, 0xffff, 0x1400, 0x9400, 0x1401, 0x6800, 0xe801}
	rng := rand.New(rand.NewPCG(3, 4))
	for len(special) < 80 {
		special = append(special, uint16(rng.Uint32()))
	}
	var a, b []uint16
	for _, y := range special {
		for x := range 1 << 16 {
			a, b = append(a, uint16(x)), append(b, y)
		}
	}
	for range 1 << 20 {
		a, b = append(a, uint16(rng.Uint32())), append(b, uint16(rng.Uint32()))
	}
	isNaN := func(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }
	check := func(t *testing.T, what string, got []uint16) {
		t.Helper()
		for i := range a {
			want := float32ToHalfRef(halfToFloat32Ref(a[i]) + halfToFloat32Ref(b[i]))
			if isNaN(a[i]) && isNaN(b[i]) {
				if Impl() != "generic" && i < len(a)&^7 && got[i] != b[i]|0x200 {
					t.Fatalf("%s: NaN %#04x + NaN %#04x = %#04x, want b's payload", what, a[i], b[i], got[i])
				}
				if got[i] != a[i]|0x200 && got[i] != b[i]|0x200 {
					t.Fatalf("%s: NaN %#04x + NaN %#04x = %#04x, want a quiet one of them", what, a[i], b[i], got[i])
				}
				continue
			}
			if got[i] != want {
				t.Fatalf("%s: %#04x + %#04x = %#04x, want %#04x", what, a[i], b[i], got[i], want)
			}
		}
	}
	forEachImpl(t, func(t *testing.T) {
		dst := make([]uint16, len(a))
		AddHalf(dst, a, b)
		check(t, "AddHalf", dst)
		copy(dst, a)
		AddHalf(dst, dst, b)
		check(t, "AddHalf in place", dst)
	})
}

// Encoding after decoding gives back every non-NaN binary16 value and the quiet form of
// every NaN.
func TestHalfRoundTrip(t *testing.T) {
	src := make([]uint16, 1<<16)
	for i := range src {
		src[i] = uint16(i)
	}
	forEachImpl(t, func(t *testing.T) {
		f := make([]float32, len(src))
		back := make([]uint16, len(src))
		DecodeHalf(f, src)
		EncodeHalf(back, f, 1)
		for i, h := range src {
			want := h
			if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
				want |= 0x200
			}
			if back[i] != want {
				t.Fatalf("%#04x came back as %#04x", h, back[i])
			}
		}
	})
}

// BenchmarkHalf times the slice conversions (binary16, and bfloat16 as bf16-*) on 1 Mi
// elements (about 6 MB per call, beyond L2) for every implementation; the bytes are the
// float32 side's (4 per element).
//
//	go test ./internal/kernels -run '^$' -bench Half
func BenchmarkHalf(b *testing.B) {
	const n = 1 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() / math.Sqrt(rng.Float64()+1e-3))
	}
	h, h2, y := make([]uint16, n), make([]uint16, n), make([]float32, n)
	encodeHalfGeneric(h2, x, 3)
	for _, name := range availableImpls() {
		b.Run(name+"/encode", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(4 * n)
			for b.Loop() {
				EncodeHalf(h, x, 4)
			}
		})
		b.Run(name+"/decode", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(4 * n)
			for b.Loop() {
				DecodeHalf(y, h)
			}
		})
		b.Run(name+"/add", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(4 * n)
			for b.Loop() {
				AddHalf(h, h, h2)
			}
		})
		b.Run(name+"/bf16-encode", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(4 * n)
			for b.Loop() {
				EncodeBF16(h, x, 4)
			}
		})
		b.Run(name+"/bf16-decode", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(4 * n)
			for b.Loop() {
				DecodeBF16(y, h)
			}
		})
		b.Run(name+"/bf16-add", func(b *testing.B) {
			defer setImpl(name)()
			b.SetBytes(4 * n)
			for b.Loop() {
				AddBF16(h, h, h2)
			}
		})
	}
}

// bf16Ref is Float32ToBFloat16 as hooks had it before it moved here (unchanged).
func bf16Ref(x float32) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// The bfloat16 slice kernels match the scalar reference on every path: decode on all 65536
// values (h << 16), encode on halfEncodeInputs (the rounding bit 15 at, below and above a tie
// of either parity) divided by 1, 4 and 3 and on every length up to 40, the addition on
// every first operand against 80 second ones and on random pairs (two NaNs: a quiet NaN with
// b's payload on the vector part of the AVX2 path, a's or b's on the generic one).
func TestBF16Kernels(t *testing.T) {
	xs := halfEncodeInputs()
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var a, b []uint16
	for range 80 {
		y := uint16(rng.Uint32())
		for x := range 1 << 16 {
			a, b = append(a, uint16(x)), append(b, y)
		}
	}
	for _, y := range []uint16{0, 0x8000, 0x7f80, 0xff80, 0x7f81, 0xffc1, 0x7f7f, 0x0001} {
		for x := range 1 << 16 {
			a, b = append(a, uint16(x)), append(b, y)
		}
	}
	isNaN := func(h uint16) bool { return h&0x7f80 == 0x7f80 && h&0x7f != 0 }
	forEachImpl(t, func(t *testing.T) {
		dec := make([]float32, len(all))
		DecodeBF16(dec, all)
		for i, h := range all {
			if got := math.Float32bits(dec[i]); got != uint32(h)<<16 || math.Float32bits(BFloat16ToFloat32(h)) != got {
				t.Fatalf("DecodeBF16(%#04x) = %#08x", h, got)
			}
		}
		enc := make([]uint16, len(xs))
		for _, div := range []float32{1, 4, 3} {
			EncodeBF16(enc, xs, div)
			for i, x := range xs {
				if want := bf16Ref(x / div); enc[i] != want || Float32ToBFloat16(x/div) != want {
					t.Fatalf("EncodeBF16(%#08x / %v) = %#04x, want %#04x", math.Float32bits(x), div, enc[i], want)
				}
			}
		}
		for n := range 41 {
			d := make([]uint16, n)
			EncodeBF16(d, xs[5000:5000+n], 3)
			for i, x := range xs[5000 : 5000+n] {
				if want := bf16Ref(x / 3); d[i] != want {
					t.Fatalf("n = %d: EncodeBF16(%v/3)[%d] = %#04x, want %#04x", n, x, i, d[i], want)
				}
			}
		}
		sum := make([]uint16, len(a))
		copy(sum, a)
		AddBF16(sum, sum, b)
		for i := range a {
			if isNaN(a[i]) && isNaN(b[i]) {
				if Impl() != "generic" && sum[i] != b[i]|0x40 || sum[i] != a[i]|0x40 && sum[i] != b[i]|0x40 {
					t.Fatalf("NaN %#04x + NaN %#04x = %#04x", a[i], b[i], sum[i])
				}
				continue
			}
			want := bf16Ref(math.Float32frombits(uint32(a[i])<<16) + math.Float32frombits(uint32(b[i])<<16))
			if sum[i] != want {
				t.Fatalf("AddBF16: %#04x + %#04x = %#04x, want %#04x", a[i], b[i], sum[i], want)
			}
		}
	})
}
