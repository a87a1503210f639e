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
//     sends (‖G‖₁/n)·sign(G) of G = g + ξ, ξ = G − what it sent; the result is the mean. By
//     default G is the whole model's gradient, one bucket (buckets=model: Algorithm 1 on the
//     model's vector, as the PyTorch yardstick); with DDP's buckets (buckets=ddp) each bucket
//     has its own scale, which diverged on VGG-11 (BENCHMARKS.md). scale=tensor takes one
//     scale per tensor t, (‖G_t‖₁/|t|)·sign(G_t), as the authors' optimizer scales each
//     parameter (it trained worse still at the convergence check's recipe). Words:
//     (P-1)(⌈n/32⌉+T), T scales: 1, or one per tensor of the bucket with scale=tensor.
//   - onebit (Seide et al., "1-bit SGD", Interspeech 2014, in DeepSpeed's compressed
//     all-reduce of 1-bit Adam): the two-stage pattern with error feedback at the worker and
//     the server; each chunk of c elements travels as s·sign(x), ⌈c/32⌉+1 words. The scale s
//     is ‖x‖₁/c by default (scale=mean): the one value that minimises ‖x − s·sign(x)‖₂, as
//     Seide's reconstruction values minimise the squared error, so that the error left behind,
//     ‖x‖₂² − ‖x‖₁²/c, is always less than ‖x‖₂². scale=rms takes DeepSpeed's ‖x‖₂/√c, which
//     keeps the chunk's norm but leaves an error of 2‖x‖₂²(1 − ρ), ρ = ‖x‖₁/(√c‖x‖₂): larger
//     than x itself once ρ < 1/2, as SGD gradients are after a few steps (ρ fell from 0.68 to
//     0.15 over VGG-11's first 30 steps); DeepSpeed compresses Adam's momentum, whose ρ stays
//     higher. On the LSTM mean did better than rms. As efsignsgd, onebit takes the whole
//     model as one bucket by default (buckets=model), cut into the P chunks: DeepSpeed's
//     flattened buffer, and the PyTorch yardstick's vector. With DDP's buckets (buckets=ddp)
//     every chunk of each bucket has its own scale, the small bucket's (VGG-11's classifier
//     and last BatchNorm) too, and VGG-11 did not train at the convergence check's lr 0.01
//     with either scale (BENCHMARKS.md); with one bucket it does.
//     With W = Σ_j (⌈c_j/32⌉+1) over the P chunks c_j (n/P, the first n mod P one longer),
//     rank r receives (P-1)(⌈c_r/32⌉+1) words in stage 1 and W − (⌈c_r/32⌉+1) in stage 2: the
//     busiest, rank 0, W + (P-2)(⌈c_0/32⌉+1).

// signCompressor sends one bit per element and, when scale is set, scale words first (one,
// or one per tensor with perTensor): the message decodes to ±scale(x) of x's tensor (±1
// without a scale).
type signCompressor struct {
	scale       func(x []float32) float32
	perTensor   bool // one scale per tensor of the bucket (CompressCall.Tensors)
	majority    bool // the result is sign(Σ signs)
	momentum    float64
	hasMomentum bool // Signum: the sign of a momentum of β = momentum
}

// segments returns where the parts of a vector of n elements that share a scale start, and n
// last: the tensors of the call with perTensor, else the whole vector.
func (s signCompressor) segments(n int, c CompressCall) []int { return c.segments(n, s.perTensor) }

// header is the number of scale words of a message of n elements in call c.
func (s signCompressor) header(n int, c CompressCall) int {
	if s.scale == nil {
		return 0
	}
	return len(s.segments(n, c)) - 1
}

// Words is for a vector of one tensor; a bucket of T tensors sends T-1 more with perTensor.
func (s signCompressor) Words(n int) int { return s.header(n, CompressCall{}) + packedWords(n, 1) }

func (s signCompressor) WordsFormula() string {
	switch {
	case s.perTensor:
		return "⌈n/32⌉+T"
	case s.scale != nil:
		return "⌈n/32⌉+1"
	}
	return "⌈n/32⌉"
}

func (signCompressor) Summable() bool { return false }

func (s signCompressor) Compress(msg []byte, x []float32, c CompressCall) []byte {
	if s.scale != nil {
		segs := s.segments(len(x), c)
		for i := range len(segs) - 1 {
			msg = putFloat(msg, s.scale(x[segs[i]:segs[i+1]]))
		}
	}
	p := bitPacker{b: msg}
	for _, v := range x {
		p.put(math.Float32bits(v)>>31, 1)
	}
	return p.bytes()
}

func (s signCompressor) Decompress(acc []float32, msg []byte, c CompressCall) error {
	h := s.header(len(acc), c)
	if err := checkWords(msg, len(acc), h+packedWords(len(acc), 1)); err != nil {
		return err
	}
	segs := s.segments(len(acc), c)
	seg, scale := 0, float32(1)
	r := bitReader{b: msg[4*h:]}
	for i := range acc {
		for h > 0 && i == segs[seg] { // the first element of a tensor: its scale
			scale = getFloat(msg, seg)
			seg++
		}
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

// meanAbs is efsignsgd's scale ‖x‖₁/n, and onebit's by default.
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

// rms is onebit's scale=rms, ‖x‖₂/√n (DeepSpeed's compressed backend).
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
	registerCompressed("efsignsgd", "EF-SignSGD (Karimireddy et al. 2019): (‖G‖₁/n)·sign(G) of the whole model's gradient with error feedback, all-gather; "+
		"(P-1)(⌈n/32⌉+T) words, T scales (1; scale=tensor: one per tensor)",
		[]Option{
			bucketsOption(BucketsModel),
			{Name: "scale", Default: "bucket", Help: "bucket: one scale for the bucket (the whole model with buckets=model) | tensor: one per tensor (the authors' code)"},
		},
		AllGathered, true, func(o Values) (Compressor, error) {
			v, err := o.Enum("scale", "bucket", "tensor")
			if err != nil {
				return nil, err
			}
			return signCompressor{scale: meanAbs, perTensor: v == "tensor"}, nil
		})
	registerCompressed("onebit", "1-bit SGD (Seide et al. 2014) as DeepSpeed's compressed all-reduce: (‖x‖₁/c)·sign per chunk of the whole model's gradient, "+
		"two stages with worker and server error feedback; W+(P-2)(⌈c₀/32⌉+1) words, W = Σ_j(⌈c_j/32⌉+1)",
		[]Option{
			bucketsOption(BucketsModel),
			{Name: "scale", Default: "mean", Help: "mean: ‖x‖₁/c per chunk, the least-squares scale | rms: ‖x‖₂/√c, DeepSpeed's (not a contraction once ‖x‖₁ < √c‖x‖₂/2)"},
		},
		TwoStage, true, func(o Values) (Compressor, error) {
			v, err := o.Enum("scale", "mean", "rms")
			if err != nil {
				return nil, err
			}
			if v == "rms" {
				return signCompressor{scale: rms}, nil
			}
			return signCompressor{scale: meanAbs}, nil
		})
}
