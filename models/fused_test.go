package models

import (
	"fmt"
	"math"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

// unfusedForward runs m with every BatchNorm, ReLU and residual sum as separate
// layers (the Forward of the models before BatchNorm+ReLU fusion).
func unfusedForward(m nn.Module, x *nn.Var) *nn.Var {
	switch m := m.(type) {
	case *VGG:
		return m.Classifier.Forward(nn.Flatten{}.Forward(m.Features.Forward(x)))
	case *ResNet:
		h := nn.Relu(m.BN1.Forward(m.Conv1.Forward(x)))
		if m.MaxPool != nil {
			h = m.MaxPool.Forward(h)
		}
		for _, l := range m.Layers {
			for _, c := range l.Children() {
				h = unfusedForward(c.Module, h)
			}
		}
		return m.Head.Forward(nn.Flatten{}.Forward(m.Pool.Forward(h)))
	case *BasicBlock:
		h := nn.Relu(m.BN1.Forward(m.Conv1.Forward(x)))
		h = m.BN2.Forward(m.Conv2.Forward(h))
		return nn.Relu(nn.Add(h, shortcut(m.Shortcut, x)))
	case *Bottleneck:
		h := nn.Relu(m.BN1.Forward(m.Conv1.Forward(x)))
		h = nn.Relu(m.BN2.Forward(m.Conv2.Forward(h)))
		h = m.BN3.Forward(m.Conv3.Forward(h))
		var sc nn.Module
		if m.Downsample != nil {
			sc = m.Downsample
		}
		return nn.Relu(nn.Add(h, shortcut(sc, x)))
	}
	panic(fmt.Sprintf("unfusedForward: %T", m))
}

// The models' fused Forward gives the unfused layers' bits: logits, input and
// parameter gradients and BatchNorm running statistics, in training and evaluation
// mode, for every block kind (CIFAR basic blocks with option-A shortcuts, torchvision
// basic blocks and bottlenecks with projections, VGG's Sequential).
func TestFusedForwardMatchesUnfused(t *testing.T) {
	tiny := Dataset{Name: "tiny", Classes: 5, Channels: 3, Size: 32}
	for _, c := range []struct {
		name string
		ds   Dataset
	}{
		{"resnet20", CIFAR10}, {"resnet18", tiny}, {"resnet50", tiny}, {"vgg11", CIFAR10},
	} {
		for _, training := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/training=%v", c.name, training), func(t *testing.T) {
				rng := nn.NewRand(3)
				x := nn.NewTensor(2, 3, 32, 32)
				for i := range x.Data {
					x.Data[i] = float32(rng.NormFloat64())
				}
				dy := make([]float32, 2*c.ds.Classes)
				for i := range dy {
					dy[i] = float32(rng.NormFloat64())
				}
				run := func(fused bool) (out []float32, grads, bufs [][]float32) {
					var m nn.Module
					var err error
					if c.name == "vgg11" {
						m, err = NewVGG(c.name, c.ds, nn.NewRand(5))
					} else {
						m, err = NewResNet(c.name, c.ds, nn.NewRand(5))
					}
					if err != nil {
						t.Fatal(err)
					}
					if !training {
						// Evaluation with non-trivial running statistics: one training
						// forward first, then evaluation mode.
						tape := nn.NewTape()
						tape.SetGradEnabled(false)
						m.Forward(tape.Const(x))
						nn.SetTraining(m, false)
					}
					tape := nn.NewTape()
					xv := tape.Input(x)
					var y *nn.Var
					if fused {
						y = m.Forward(xv)
					} else {
						y = unfusedForward(m, xv)
					}
					if err := tape.BackwardFrom(y, dy); err != nil {
						t.Fatal(err)
					}
					grads = [][]float32{xv.Grad.Data}
					for _, p := range nn.Parameters(m) {
						grads = append(grads, p.Grad.Data)
					}
					for _, b := range nn.Buffers(m) {
						bufs = append(bufs, b.Value.Data)
					}
					return y.Value.Data, grads, bufs
				}
				wy, wg, wb := run(false)
				gy, gg, gb := run(true)
				same := func(what string, got, want []float32) {
					t.Helper()
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s[%d] = %v, unfused %v", what, i, got[i], want[i])
						}
					}
				}
				same("logits", gy, wy)
				for i := range wg {
					same(fmt.Sprintf("gradient %d", i), gg[i], wg[i])
				}
				for i := range wb {
					same(fmt.Sprintf("buffer %d", i), gb[i], wb[i])
				}
			})
		}
	}
}
