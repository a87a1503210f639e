package hooks

import (
	"math"
)

// terngrad is TernGrad (Wen et al., "TernGrad", NeurIPS 2017): with gradient clipping at
// c·σ (σ the standard deviation of the bucket's gradient; the paper's c = 2.5; 0 turns it
// off) and s = max|x| of the clipped bucket, each element travels as s·sign(x)·b with b = 1
// with probability |x|/s (unbiased for the clipped gradient), drawn from the hook's seed,
// the bucket, the call and the rank. The scale is per bucket (the paper's per layer;
// without its scalar sharing). No error feedback. Words: s and 2 bits per element, ⌈n/16⌉+1;
// all-gathered, (P-1)(⌈n/16⌉+1) received per rank.
type terngrad struct{ clip float64 }

func (terngrad) Words(n int) int { return 1 + packedWords(n, 2) }

func (terngrad) WordsFormula() string { return "⌈n/16⌉+1" }

func (terngrad) Summable() bool { return false }

// bound is the clipping bound c·σ (+Inf without clipping).
func (t terngrad) bound(x []float32) float64 {
	if t.clip == 0 || len(x) == 0 {
		return math.Inf(1)
	}
	var s, s2 float64
	for _, v := range x {
		s += float64(v)
		s2 += float64(v) * float64(v)
	}
	mean := s / float64(len(x))
	return t.clip * math.Sqrt(max(0, s2/float64(len(x))-mean*mean))
}

func (t terngrad) Compress(msg []byte, x []float32, c CompressCall) []byte {
	bound := t.bound(x)
	var s float64
	for _, v := range x {
		s = max(s, min(bound, math.Abs(float64(v))))
	}
	msg = putFloat(msg, float32(s))
	rng := c.Local()
	p := bitPacker{b: msg}
	for _, v := range x {
		var f uint32
		if a := min(bound, math.Abs(float64(v))); s > 0 && rng.Float64()*s < a {
			f = 1 + math.Float32bits(v)>>31 // 1: +s, 2: −s
		}
		p.put(f, 2)
	}
	return p.bytes()
}

func (t terngrad) Decompress(acc []float32, msg []byte, _ CompressCall) error {
	if err := checkWords(msg, len(acc), t.Words(len(acc))); err != nil {
		return err
	}
	s := getFloat(msg, 0)
	r := bitReader{b: msg[4:]}
	for i := range acc {
		switch r.get(2) {
		case 1:
			acc[i] += s
		case 2:
			acc[i] -= s
		}
	}
	return nil
}

func init() {
	registerCompressed("terngrad", "TernGrad (Wen et al. 2017): stochastic ternary {-s,0,s} with clipping at c·σ, all-gather; (P-1)(⌈n/16⌉+1) words",
		[]Option{{Name: "clip", Default: "2.5", Help: "c: clip the gradient at c·σ before ternarising; 0: no clipping"}, seedOption},
		AllGathered, false,
		func(o Values) (Compressor, error) {
			c, err := o.Float("clip")
			if err != nil {
				return nil, err
			}
			if !(c >= 0) || math.IsInf(c, 1) {
				return nil, optionError("terngrad", "clip", c, "a finite number >= 0")
			}
			return terngrad{clip: c}, nil
		})
}
