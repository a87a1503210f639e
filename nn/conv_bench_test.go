package nn

import (
	"fmt"
	"testing"
)

// BenchmarkConvLayer measures nn.Conv2d (3×3, stride 1, pad 1, no bias) on
// the VGG CIFAR layer shapes at batch 32, forward alone and forward +
// backward (input and weight gradients), in GFLOP/s of direct convolution —
// the same measurement as scripts/torch_kernels.py:
//
//	go test -run '^$' -bench ConvLayer ./nn/
func BenchmarkConvLayer(b *testing.B) {
	type layer struct{ c, o, hw int }
	for _, l := range []layer{{64, 64, 32}, {128, 128, 16}, {256, 256, 8}, {512, 512, 4}, {512, 512, 2}} {
		const batch = 32
		rng := NewRand(1)
		conv := NewConv2d(l.c, l.o, 3, 1, 1, false, rng)
		x := NewTensor(batch, l.c, l.hw, l.hw)
		Uniform(x.Data, 1, rng)
		flops := 2 * float64(l.o*l.c*9) * float64(batch*l.hw*l.hw)
		name := fmt.Sprintf("c%d_o%d_hw%d", l.c, l.o, l.hw)
		tape := NewTape()
		b.Run(name+"/fwd", func(b *testing.B) {
			tape.SetGradEnabled(false)
			defer tape.SetGradEnabled(true)
			for range b.N {
				tape.Reset()
				conv.Forward(tape.Const(x))
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(name+"/fwd+bwd", func(b *testing.B) {
			for range b.N {
				tape.Reset()
				xv := tape.Input(x)
				y := conv.Forward(xv)
				if err := tape.BackwardFrom(y, y.Value.Data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(3*flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
