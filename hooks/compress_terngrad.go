package hooks

import (
	"math"
)

// terngrad is TernGrad (Wen et al., "TernGrad", NeurIPS 2017): per layer (the paper's
// layer-wise ternarizing: each tensor of the bucket; scale=bucket takes the bucket as one),
// with gradient clipping at c·σ (σ the standard deviation of the layer's gradient; the
// paper's c = 2.5; 0 turns it off) and s = max|x| of the clipped layer, each element travels
// as s·sign(x)·b with b = 1 with probability |x|/s (unbiased for the clipped gradient), drawn
// from the hook's seed, the bucket, the call and the rank. Without the paper's scalar sharing
// and without error feedback. Words: T scales (one per layer) and 2 bits per element,
// ⌈n/16⌉+T; all-gathered, (P-1)(⌈n/16⌉+T) received per rank.
type terngrad struct {
	clip      float64
	perTensor bool
}

// Words is for a vector of one tensor; a bucket of T tensors sends T-1 more scales.
func (terngrad) Words(n int) int { return 1 + packedWords(n, 2) }

func (terngrad) WordsFormula() string { return "⌈n/16⌉+T" }

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
	segs := c.segments(len(x), t.perTensor)
	bounds, scales := make([]float64, len(segs)-1), make([]float64, len(segs)-1)
	for j := range bounds {
		part := x[segs[j]:segs[j+1]]
		bounds[j] = t.bound(part)
		for _, v := range part {
			scales[j] = max(scales[j], min(bounds[j], math.Abs(float64(v))))
		}
		msg = putFloat(msg, float32(scales[j]))
	}
	rng := c.Local()
	p := bitPacker{b: msg}
	for j := range bounds {
		bound, s := bounds[j], scales[j]
		for _, v := range x[segs[j]:segs[j+1]] {
			var f uint32
			if a := min(bound, math.Abs(float64(v))); s > 0 && rng.Float64()*s < a {
				f = 1 + math.Float32bits(v)>>31 // 1: +s, 2: −s
			}
			p.put(f, 2)
		}
	}
	return p.bytes()
}

func (t terngrad) Decompress(acc []float32, msg []byte, c CompressCall) error {
	segs := c.segments(len(acc), t.perTensor)
	h := len(segs) - 1
	if err := checkWords(msg, len(acc), h+packedWords(len(acc), 2)); err != nil {
		return err
	}
	seg, s := 0, float32(0)
	r := bitReader{b: msg[4*h:]}
	for i := range acc {
		for seg < h && i == segs[seg] { // the first element of a layer: its scale
			s = getFloat(msg, seg)
			seg++
		}
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
	registerCompressed("terngrad", "TernGrad (Wen et al. 2017): stochastic ternary {-s,0,s} per layer with clipping at c·σ, all-gather; "+
		"(P-1)(⌈n/16⌉+T) words, T layers in the bucket",
		[]Option{
			{Name: "clip", Default: "2.5", Help: "c: clip the gradient at c·σ before ternarising; 0: no clipping"},
			{Name: "scale", Default: "tensor", Help: "tensor: s and σ per layer (the paper's layer-wise ternarizing) | bucket: one for the bucket"},
			seedOption,
		},
		AllGathered, false,
		func(o Values) (Compressor, error) {
			c, err := o.Float("clip")
			if err != nil {
				return nil, err
			}
			if !(c >= 0) || math.IsInf(c, 1) {
				return nil, optionError("terngrad", "clip", c, "a finite number >= 0")
			}
			scale, err := o.Enum("scale", "tensor", "bucket")
			if err != nil {
				return nil, err
			}
			return terngrad{clip: c, perTensor: scale == "tensor"}, nil
		})
}
