package models

import (
	"testing"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// BenchmarkLSTMLMStep is one training step (forward, cross-entropy, backward) of Zaremba's
// small PTB model on one bptt window of 20 columns × 35 words, the example's per-worker
// batch. Words per second = 700 / (ns/op · 1e-9); GFLOP/s counts the step's matrix
// products (kernels.CountFLOPs), for the roofline ratio against the SGEMM peak. The step is
// NewTokenStep's, as `spargo bench train -model lstm-ptb-small` times it (with an SGD step).
//
//	go test ./models -run '^$' -bench LSTMLMStep -benchtime 20x
func BenchmarkLSTMLMStep(b *testing.B) {
	s, err := NewTokenStep("lstm-ptb-small", TokenStepConfig{Batch: 20, Seq: 35}, nn.NewRand(0), nn.NewRand(1))
	if err != nil {
		b.Fatal(err)
	}
	params := nn.Parameters(s.Model)
	tape := nn.NewTape()
	step := func() {
		tape.Reset()
		nn.ZeroGrad(params)
		if err := tape.Backward(s.Loss(tape)); err != nil {
			b.Fatal(err)
		}
	}
	flops := kernels.CountFLOPs(step) // a warm-up step
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.ReportMetric(float64(s.Tokens()*b.N)/b.Elapsed().Seconds(), "words/s")
	b.ReportMetric(float64(flops)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
