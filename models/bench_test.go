package models

import (
	"fmt"
	"testing"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// BenchmarkTrainStep measures one single-process training step (forward, backward,
// SGD with momentum) at batch 32 on random CIFAR-shaped data and reports images/s —
// the same measurement as scripts/torch_throughput.py for PyTorch:
//
//	go test -run '^$' -bench TrainStep -benchtime 20x -count 5 ./models/
func BenchmarkTrainStep(b *testing.B) {
	for _, name := range []string{"vgg11", "vgg16", "resnet20"} {
		b.Run(fmt.Sprintf("%s/batch32", name), func(b *testing.B) {
			const batch = 32
			m, err := New(name, nn.NewRand(0))
			if err != nil {
				b.Fatal(err)
			}
			ps := nn.Parameters(m)
			opt, _ := optim.NewSGD(ps, optim.SGDConfig{LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4})
			rng := nn.NewRand(1)
			x := nn.NewTensor(batch, 3, 32, 32)
			for i := range x.Data {
				x.Data[i] = float32(rng.NormFloat64())
			}
			y := make([]int, batch)
			for i := range y {
				y[i] = rng.IntN(10)
			}
			tape := nn.NewTape()
			step := func() {
				tape.Reset()
				opt.ZeroGrad()
				if err := tape.Backward(nn.CrossEntropy(m.Forward(tape.Const(x)), y)); err != nil {
					b.Fatal(err)
				}
				opt.Step()
			}
			step()
			step()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step()
			}
			b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "img/s")
		})
	}
}
