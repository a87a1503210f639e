package models

import (
	"testing"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// BenchmarkLSTMLMStep is one training step (forward, cross-entropy, backward) of Zaremba's
// small PTB model on one bptt window of 20 columns × 35 words, the example's per-worker
// batch. Words per second = 700 / (ns/op · 1e-9); GFLOP/s counts the step's matrix
// products (kernels.CountFLOPs), for the roofline ratio against the SGEMM peak.
//
//	go test ./models -run '^$' -bench LSTMLMStep -benchtime 20x
func BenchmarkLSTMLMStep(b *testing.B) {
	cfg, _ := LSTMLMPreset("ptb-small")
	m, err := NewLSTMLM(cfg, nn.NewRand(0))
	if err != nil {
		b.Fatal(err)
	}
	const steps, cols = 35, 20
	rng := nn.NewRand(1)
	x := nn.NewTensor(steps, cols)
	labels := make([]int, steps*cols)
	for i := range x.Data {
		x.Data[i] = float32(rng.IntN(cfg.Vocab))
		labels[i] = rng.IntN(cfg.Vocab)
	}
	m.State = m.NewState(cols)
	params := nn.Parameters(m)
	tape := nn.NewTape()
	step := func() {
		tape.Reset()
		nn.ZeroGrad(params)
		loss := nn.CrossEntropy(m.Forward(tape.Const(x)), labels)
		if err := tape.Backward(loss); err != nil {
			b.Fatal(err)
		}
	}
	flops := kernels.CountFLOPs(step) // a warm-up step
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.ReportMetric(float64(steps*cols*b.N)/b.Elapsed().Seconds(), "words/s")
	b.ReportMetric(float64(flops)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
