package hooks

import (
	"math"
)

// natural is natural compression (Horváth et al., "Natural Compression for Distributed Deep
// Learning", 2019): each element rounds stochastically to one of the two powers of two around
// it, 2^a ≤ |x| < 2^(a+1), up with probability (|x| − 2^a)/2^a (unbiased), so it travels as
// its sign and its float32 exponent: 9 bits, the mantissa dropped. Subnormals round between 0
// and 2^-126 the same way; infinities and NaNs travel as infinities; the largest exponent
// does not round up (to stay finite). The draws come from the hook's seed, the bucket, the
// call and the rank. No error feedback. Words: ⌈9n/32⌉; all-gathered, (P-1)⌈9n/32⌉ received
// per rank.
type natural struct{}

func (natural) Words(n int) int { return packedWords(n, 9) }

func (natural) WordsFormula() string { return "⌈9n/32⌉" }

func (natural) Summable() bool { return false }

func (natural) Compress(msg []byte, x []float32, c CompressCall) []byte {
	rng := c.Local()
	p := bitPacker{b: msg}
	for _, v := range x {
		b := math.Float32bits(v)
		sign, exp, mant := b>>31, b>>23&0xff, b&0x7fffff
		switch {
		case exp == 0xff:
		case exp == 0: // |x| = mant·2^-149 in [0, 2^-126): 2^-126 with probability mant/2^23
			if rng.Uint32()&0x7fffff < mant {
				exp = 1
			}
		case exp < 0xfe && rng.Uint32()&0x7fffff < mant:
			exp++
		}
		p.put(sign<<8|exp, 9)
	}
	return p.bytes()
}

func (n natural) Decompress(acc []float32, msg []byte, _ CompressCall) error {
	if err := checkWords(msg, len(acc), n.Words(len(acc))); err != nil {
		return err
	}
	r := bitReader{b: msg}
	for i := range acc {
		f := r.get(9)
		acc[i] += math.Float32frombits(f>>8<<31 | (f&0xff)<<23)
	}
	return nil
}

func init() {
	registerCompressed("natural", "natural compression (Horváth et al. 2019): stochastic rounding to a power of two, sign + 8-bit exponent, all-gather; (P-1)⌈9n/32⌉ words",
		[]Option{seedOption}, AllGathered, false, func(Values) (Compressor, error) { return natural{}, nil })
}
