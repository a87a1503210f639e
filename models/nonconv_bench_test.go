package models

import (
	"testing"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// BenchmarkNonConvStep times the per-step work of a VGG training step outside the
// convolutions and the classifier, at batch 32: every BatchNorm → ReLU (→ MaxPool)
// segment forward and backward (each on its own tape, input gradient requested as
// a convolution's output would be), then ZeroGrad and the SGD step (momentum 0.9,
// weight decay 5e-4) over all of the model's parameters.
func BenchmarkNonConvStep(b *testing.B) {
	for _, name := range []string{"vgg11", "vgg16"} {
		b.Run(name, func(b *testing.B) {
			const batch = 32
			m, err := NewVGG(name, CIFAR10, nn.NewRand(0))
			if err != nil {
				b.Fatal(err)
			}
			opt, _ := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4})
			rng := nn.NewRand(1)
			type segment struct {
				layers []nn.Module
				x      *nn.Tensor
				r      []float32
				tape   *nn.Tape
			}
			var segs []*segment
			cfg := vggConfigs[name]
			size := 32
			for i, v := range cfg {
				if v == 0 {
					continue
				}
				s := &segment{layers: []nn.Module{nn.NewBatchNorm2d(v), nn.ReLU{}}, tape: nn.NewTape()}
				s.x = nn.NewTensor(batch, v, size, size)
				for j := range s.x.Data {
					s.x.Data[j] = float32(rng.NormFloat64())
				}
				out := batch * v * size * size
				if i+1 < len(cfg) && cfg[i+1] == 0 {
					s.layers = append(s.layers, nn.MaxPool2d{Kernel: 2, Stride: 2})
					size /= 2
					out /= 4
				}
				s.r = make([]float32, out)
				for j := range s.r {
					s.r[j] = float32(rng.NormFloat64())
				}
				segs = append(segs, s)
			}
			step := func() {
				opt.ZeroGrad()
				for _, s := range segs {
					s.tape.Reset()
					y := s.tape.Input(s.x)
					for _, l := range s.layers {
						y = l.Forward(y)
					}
					if err := s.tape.BackwardFrom(y, s.r); err != nil {
						b.Fatal(err)
					}
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
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/step")
		})
	}
}
