package hooks

import (
	"math"
)

// The sign methods: one bit per element, packed 32 to a word (bit set for a negative value).
//
//   - signsgd (Bernstein et al., "signSGD", ICML 2018): each rank sends sign(g); the result is
//     the majority vote sign(Σ_r sign(g_r)) (0 on a tie). No error feedback. Words per call:
//     (P-1)⌈n/32⌉ received per rank (all-gather).
//   - signum (same paper): signSGD of the local momentum m = β·m + (1-β)·g (m is state).
//     Words as signsgd.
//   - efsignsgd (Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019): each rank
//     sends (‖G‖₁/n)·sign(G) of G = g + ξ, ξ = G − what it sent; the result is the mean.
//     Words: (P-1)(⌈n/32⌉+1) (the scale is one word).
//   - onebit (Seide et al., "1-bit SGD", Interspeech 2014, in DeepSpeed's compressed
//     all-reduce of 1-bit Adam): the two-stage pattern with error feedback at the worker and
//     the server; each chunk of c elements travels as (‖x‖₂/√c)·sign(x), ⌈c/32⌉+1 words.
//     With W = Σ_j (⌈c_j/32⌉+1) over the P chunks c_j (n/P, the first n mod P one longer),
//     rank r receives (P-1)(⌈c_r/32⌉+1) words in stage 1 and W − (⌈c_r/32⌉+1) in stage 2: the
//     busiest, rank 0, W + (P-2)(⌈c_0/32⌉+1).

// signCompressor sends one bit per element and, when scale is set, one scale word first: the
// message decodes to ±scale(x) (±1 without a scale).
type signCompressor struct {
	scale       func(x []float32) float32
	majority    bool // the result is sign(Σ signs)
	momentum    float64
	hasMomentum bool // Signum: the sign of a momentum of β = momentum
}

func (s signCompressor) header() int {
	if s.scale != nil {
		return 1
	}
	return 0
}

func (s signCompressor) Words(n int) int { return s.header() + packedWords(n, 1) }

func (s signCompressor) WordsFormula() string {
	if s.scale != nil {
		return "⌈n/32⌉+1"
	}
	return "⌈n/32⌉"
}

func (signCompressor) Summable() bool { return false }

func (s signCompressor) Compress(msg []byte, x []float32, _ CompressCall) []byte {
	if s.scale != nil {
		msg = putFloat(msg, s.scale(x))
	}
	p := bitPacker{b: msg}
	for _, v := range x {
		p.put(math.Float32bits(v)>>31, 1)
	}
	return p.bytes()
}

func (s signCompressor) Decompress(acc []float32, msg []byte, _ CompressCall) error {
	if err := checkWords(msg, len(acc), s.Words(len(acc))); err != nil {
		return err
	}
	scale := float32(1)
	if s.scale != nil {
		scale = getFloat(msg, 0)
	}
	r := bitReader{b: msg[4*s.header():]}
	for i := range acc {
		if r.get(1) == 1 {
			acc[i] -= scale
		} else {
			acc[i] += scale
		}
	}
	return nil
}

// Aggregate is the majority vote of signsgd and signum; the mean otherwise.
func (s signCompressor) Aggregate(sum []float32, p int) {
	for i, v := range sum {
		switch {
		case !s.majority:
			sum[i] = v / float32(p)
		case v > 0:
			sum[i] = 1
		case v < 0:
			sum[i] = -1
		default:
			sum[i] = 0
		}
	}
}

// Prepare replaces g by Signum's momentum m = β·m + (1-β)·g.
func (s signCompressor) Prepare(g []float32, v Vectors, _ CompressCall) {
	if !s.hasMomentum {
		return
	}
	m := v.Get("momentum")
	b := float32(s.momentum)
	for i, x := range g {
		m[i] = b*m[i] + (1-b)*x
		g[i] = m[i]
	}
}

// meanAbs is efsignsgd's scale ‖x‖₁/n.
func meanAbs(x []float32) float32 {
	if len(x) == 0 {
		return 0
	}
	var s float64
	for _, v := range x {
		s += math.Abs(float64(v))
	}
	return float32(s / float64(len(x)))
}

// rms is onebit's scale ‖x‖₂/√n (DeepSpeed's compressed backend).
func rms(x []float32) float32 {
	if len(x) == 0 {
		return 0
	}
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return float32(math.Sqrt(s / float64(len(x))))
}

func init() {
	registerCompressed("signsgd", "signSGD with majority vote (Bernstein et al. 2018): 1 bit per element, all-gather; (P-1)⌈n/32⌉ words",
		nil, AllGathered, false, func(Values) (Compressor, error) { return signCompressor{majority: true}, nil })
	registerCompressed("signum", "Signum (Bernstein et al. 2018): signSGD of the local momentum, majority vote; (P-1)⌈n/32⌉ words",
		[]Option{{Name: "beta", Default: "0.9", Help: "momentum β of m = β·m + (1-β)·g, in [0, 1)"}}, AllGathered, false,
		func(o Values) (Compressor, error) {
			b, err := o.Float("beta")
			if err != nil {
				return nil, err
			}
			if !(b >= 0 && b < 1) {
				return nil, optionError("signum", "beta", b, "a number in [0, 1)")
			}
			return signCompressor{majority: true, momentum: b, hasMomentum: true}, nil
		})
	registerCompressed("efsignsgd", "EF-SignSGD (Karimireddy et al. 2019): (‖G‖₁/n)·sign(G) with error feedback, all-gather; (P-1)(⌈n/32⌉+1) words",
		nil, AllGathered, true, func(Values) (Compressor, error) { return signCompressor{scale: meanAbs}, nil })
	registerCompressed("onebit", "1-bit SGD (Seide et al. 2014) as DeepSpeed's compressed all-reduce: (‖x‖₂/√c)·sign per chunk, "+
		"two stages with worker and server error feedback; W+(P-2)(⌈c₀/32⌉+1) words, W = Σ_j(⌈c_j/32⌉+1)",
		nil, TwoStage, true, func(Values) (Compressor, error) { return signCompressor{scale: rms}, nil })
}
