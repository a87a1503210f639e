package hooks

import (
	"math"
	"math/bits"
)

// qsgd is QSGD (Alistarh et al., "QSGD", NeurIPS 2017) with s = Levels quantisation levels:
// the bucket is cut into chunks of Chunk elements (the paper's buckets of d elements; 0: the
// whole DDP bucket is one), and each element x of a chunk of norm ‖v‖₂ travels as its sign
// and a level ℓ in 0…s, ℓ = ⌊s|x|/‖v‖⌋ + 1 with probability s|x|/‖v‖ − ⌊s|x|/‖v‖⌋
// (stochastic rounding, unbiased: E[‖v‖·sign(x)·ℓ/s] = x), drawn from the hook's seed, the
// bucket, the call and the rank. No error feedback (the paper's). Words: the message is one
// norm word per chunk and b = 1 + ⌊log2 s⌋+1 bits per element packed 32 to a word (a
// fixed-width code, not the paper's Elias code), ⌈n/d⌉ + ⌈b·n/32⌉ words; all-gathered,
// (P-1)(⌈n/d⌉ + ⌈b·n/32⌉) words received per rank.
type qsgd struct {
	levels, chunk int
}

func (q qsgd) width() uint { return 1 + uint(bits.Len(uint(q.levels))) }

func (q qsgd) chunks(n int) int {
	if q.chunk == 0 {
		return min(n, 1)
	}
	return (n + q.chunk - 1) / q.chunk
}

func (q qsgd) chunkLen(n int) int {
	if q.chunk == 0 {
		return n
	}
	return q.chunk
}

func (q qsgd) Words(n int) int { return q.chunks(n) + packedWords(n, q.width()) }

func (q qsgd) WordsFormula() string { return "⌈n/d⌉+⌈b·n/32⌉, b = 2+⌊log2 s⌋" }

func (qsgd) Summable() bool { return false }

func (q qsgd) Compress(msg []byte, x []float32, c CompressCall) []byte {
	d := q.chunkLen(len(x))
	norms := make([]float64, 0, q.chunks(len(x)))
	for lo := 0; lo < len(x); lo += d {
		var s float64
		for _, v := range x[lo:min(lo+d, len(x))] {
			s += float64(v) * float64(v)
		}
		norm := float32(math.Sqrt(s))
		msg = putFloat(msg, norm)
		norms = append(norms, float64(norm))
	}
	rng := c.Local()
	p := bitPacker{b: msg}
	s := float64(q.levels)
	for i, v := range x {
		var level uint32
		if norm := norms[i/d]; norm > 0 {
			a := min(s, s*math.Abs(float64(v))/norm)
			l := math.Floor(a)
			if rng.Float64() < a-l {
				l++
			}
			level = uint32(l)
		}
		p.put(level<<1|math.Float32bits(v)>>31, q.width())
	}
	return p.bytes()
}

func (q qsgd) Decompress(acc []float32, msg []byte, _ CompressCall) error {
	n := len(acc)
	if err := checkWords(msg, n, q.Words(n)); err != nil {
		return err
	}
	d, nc := q.chunkLen(n), q.chunks(n)
	r := bitReader{b: msg[4*nc:]}
	s := float32(q.levels)
	for i := range acc {
		f := r.get(q.width())
		v := getFloat(msg, i/d) * float32(f>>1) / s
		if f&1 == 1 {
			v = -v
		}
		acc[i] += v
	}
	return nil
}

func init() {
	registerCompressed("qsgd", "QSGD (Alistarh et al. 2017): stochastic rounding to s levels of each chunk's norm, all-gather; "+
		"(P-1)(⌈n/d⌉+⌈b·n/32⌉) words, b = 2+⌊log2 s⌋",
		[]Option{
			{Name: "levels", Default: "127", Help: "s, quantisation levels (1..2^30); 127: sign + 7 bits, one byte per element"},
			{Name: "chunk", Default: "512", Help: "d, elements per norm (the paper's bucket size); 0: one norm per DDP bucket"},
			seedOption,
		}, AllGathered, false,
		func(o Values) (Compressor, error) {
			s, err := o.Int("levels")
			if err != nil {
				return nil, err
			}
			d, err := o.Int("chunk")
			if err != nil {
				return nil, err
			}
			if s < 1 || s > 1<<30 {
				return nil, optionError("qsgd", "levels", s, "an integer in 1..2^30")
			}
			if d < 0 {
				return nil, optionError("qsgd", "chunk", d, ">= 0")
			}
			return qsgd{levels: s, chunk: d}, nil
		})
}
