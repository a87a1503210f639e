package models

import (
	"syscall"
	"testing"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// BERT training-step benchmarks at batch 8, sequence 128, in training mode (dropout 0.1
// on), to compare with scripts/torch_bert_step.py:
//
//	go test ./models/ -run XXX -bench 'BertTinyStep|BertBaseLayerStep' -benchtime 10x -count 5
//	/usr/bin/python3 scripts/torch_bert_step.py --runs 5 --steps 10
//
// ms/step is forward + backward (gradients zeroed each step, no optimizer).

const benchBatch, benchSeq = 8, 128

// bertBenchBatch is a deterministic pre-training batch: random ids, sentence B from
// the middle, the last 16 positions of odd samples padded, 15 % of the real positions
// carrying an MLM label.
func bertBenchBatch(cfg BertConfig) (ids, types, mask []int32, mlmLabels, nspLabels []int) {
	rng := nn.NewRand(9)
	n := benchBatch * benchSeq
	ids, types, mask = make([]int32, n), make([]int32, n), make([]int32, n)
	mlmLabels, nspLabels = make([]int, n), make([]int, benchBatch)
	for i := range n {
		s, p := i/benchSeq, i%benchSeq
		ids[i] = int32(1 + rng.IntN(cfg.VocabSize-1))
		mask[i] = 1
		if p >= benchSeq/2 {
			types[i] = 1
		}
		if s%2 == 1 && p >= benchSeq-16 {
			ids[i], mask[i], types[i] = 0, 0, 0
		}
		mlmLabels[i] = nn.IgnoreIndex
		if mask[i] == 1 && rng.Float64() < 0.15 {
			mlmLabels[i] = rng.IntN(cfg.VocabSize)
		}
	}
	for s := range nspLabels {
		nspLabels[s] = s % 2
	}
	return
}

func BenchmarkBertTinyStep(b *testing.B) {
	cfg, _ := BertPreset("tiny")
	m, err := NewBertForPreTraining(cfg, nn.NewRand(0))
	if err != nil {
		b.Fatal(err)
	}
	ps := nn.Parameters(m)
	ids, types, mask, mlmLabels, nspLabels := bertBenchBatch(cfg)
	tape := nn.NewTape()
	step := func() {
		tape.Reset()
		nn.ZeroGrad(ps)
		mlm, nsp := m.ForwardPreTraining(tape, ids, types, mask, benchBatch, benchSeq)
		if err := tape.Backward(m.Loss(mlm, nsp, mlmLabels, nspLabels)); err != nil {
			b.Fatal(err)
		}
	}
	step()
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/step")
}

func BenchmarkBertBaseLayerStep(b *testing.B) {
	cfg, _ := BertPreset("base")
	l, err := NewBertLayer(cfg, nn.NewRand(0))
	if err != nil {
		b.Fatal(err)
	}
	ps := nn.Parameters(l)
	rng := nn.NewRand(1)
	x := nn.NewTensor(benchBatch, benchSeq, cfg.Hidden)
	nn.Normal(x.Data, 1, rng)
	up := make([]float32, x.Len())
	nn.Normal(up, 1, rng)
	_, _, mask, _, _ := bertBenchBatch(BertConfig{VocabSize: 2})
	tape := nn.NewTape()
	step := func() {
		tape.Reset()
		nn.ZeroGrad(ps)
		y := l.ForwardMask(tape.Input(x), mask)
		if err := tape.BackwardFrom(y, up); err != nil {
			b.Fatal(err)
		}
	}
	step()
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/step")
}

// BenchmarkBertTinyMLMStep is examples/bert's step without the optimizer and DDP: BERT-tiny with
// an 8,000-token vocabulary (examples/bert's default on PTB), batch 16 × 128 tokens, every
// 7th real position masked (18 per sequence), the MLM head only at the masked positions
// (ForwardMaskedLM), dropout 0.1 on. GFLOP/s counts the step's matrix products
// (kernels.CountFLOPs), for the roofline ratio against the SGEMM peak. The step is
// NewTokenStep's, as `spargo bench train -model bert-tiny` times it (with an SGD step). The
// PyTorch side and a profile:
//
//	GOMAXPROCS=1 go test ./models/ -run XXX -bench BertTinyMLMStep -benchtime 10x
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_bert_step.py --only mlm --threads 1
//	go test ./models/ -run XXX -bench BertTinyMLMStep -benchtime 10x -cpuprofile cpu.out
//	go tool pprof -top models.test cpu.out
func BenchmarkBertTinyMLMStep(b *testing.B) {
	s, err := NewTokenStep("bert-tiny", TokenStepConfig{Batch: 16, Seq: 128, Vocab: 8000}, nn.NewRand(0), nn.NewRand(9))
	if err != nil {
		b.Fatal(err)
	}
	batch := s.Batch
	ps := nn.Parameters(s.Model)
	tape := nn.NewTape()
	step := func() {
		tape.Reset()
		nn.ZeroGrad(ps)
		if err := tape.Backward(s.Loss(tape)); err != nil {
			b.Fatal(err)
		}
	}
	flops := kernels.CountFLOPs(step) // the warm-up step
	b.ResetTimer()
	cpu0 := cpuSeconds()
	for range b.N {
		step()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/step")
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "seq/s")
	b.ReportMetric(float64(flops)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	// CPU time is what a loaded machine does not distort (wall time there measures the
	// share the process got): with GOMAXPROCS=1 it is the idle machine's single-core time.
	b.ReportMetric((cpuSeconds()-cpu0)*1000/float64(b.N), "cpu-ms/step")
}

// cpuSeconds is the process's user + system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
