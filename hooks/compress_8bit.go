package hooks

import (
	"math"
)

// minMax8 is Bagua's ByteGrad: each chunk of the two-stage pattern (DeepSpeed's and Bagua's
// compressed all-reduce: compress, scatter, decompress and average, compress, all-gather)
// travels as its minimum and maximum and one byte per element, the element's position between
// them rounded to the nearest of 256 levels (deterministic, as Bagua's MinMaxUInt8). No error
// feedback (ByteGrad has none). Words per chunk of c elements: w(c) = ⌈c/4⌉+2; with W =
// Σ_j w(c_j) over the P chunks, rank r receives (P-1)·w(c_r) in stage 1 and W − w(c_r) in
// stage 2: the busiest, rank 0, W + (P-2)·w(c_0).
type minMax8 struct{}

func (minMax8) Words(n int) int { return 2 + packedWords(n, 8) }

func (minMax8) WordsFormula() string { return "⌈n/4⌉+2" }

func (minMax8) Summable() bool { return false }

func (minMax8) Compress(msg []byte, x []float32, _ CompressCall) []byte {
	lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	if len(x) == 0 {
		lo, hi = 0, 0
	}
	msg = putFloat(putFloat(msg, lo), hi)
	scale := float32(0)
	if hi > lo {
		scale = 255 / (hi - lo)
	}
	p := bitPacker{b: msg}
	for _, v := range x {
		q := float32(math.Round(float64((v - lo) * scale)))
		p.put(uint32(min(255, max(0, q))), 8)
	}
	return p.bytes()
}

func (m minMax8) Decompress(acc []float32, msg []byte, _ CompressCall) error {
	if err := checkWords(msg, len(acc), m.Words(len(acc))); err != nil {
		return err
	}
	lo, hi := getFloat(msg, 0), getFloat(msg, 1)
	step := (hi - lo) / 255
	r := bitReader{b: msg[8:]}
	for i := range acc {
		acc[i] += lo + float32(r.get(8))*step
	}
	return nil
}

func init() {
	registerCompressed("8bit", "ByteGrad (Bagua): per-chunk min-max 8-bit quantisation in a compressed reduce-scatter + all-gather; "+
		"W+(P-2)(⌈c₀/4⌉+2) words, W = Σ_j(⌈c_j/4⌉+2)",
		nil, TwoStage, false, func(Values) (Compressor, error) { return minMax8{}, nil })
}
