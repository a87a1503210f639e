package nn

// PyTorch goldens: testdata/goldens/*.json, written by
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_goldens.py testdata/goldens
//
// Each layer case stores the input, parameters and buffers, an upstream gradient R,
// and PyTorch's output and gradients of Σ y·R (computed in float64).

import (
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
)

const goldenAtol, goldenRtol = 1e-5, 1e-4

func tensorOf(a golden.Array) *Tensor {
	return &Tensor{Data: append([]float32(nil), a.Data...), Shape: append([]int(nil), a.Shape...)}
}

// runGolden loads params and buffers into m, runs forward on the case's input and
// backward from its upstream gradient, and compares everything PyTorch recorded.
func runGolden(t *testing.T, c *golden.Case, m Module) {
	t.Helper()
	params := map[string]*Param{}
	for _, p := range Parameters(m) {
		params[p.Name] = p
	}
	for name, a := range c.Params {
		p, ok := params[name]
		if !ok {
			t.Fatalf("%s: golden parameter %q not in the model", c.Name, name)
		}
		if !sameShape(p.Value.Shape, a.Shape) {
			t.Fatalf("%s: %s shape %v, golden %v", c.Name, name, p.Value.Shape, a.Shape)
		}
		copy(p.Value.Data, a.Data)
		p.Grad.Zero()
	}
	bufs := map[string]*Buffer{}
	for _, b := range Buffers(m) {
		bufs[b.Name] = b
		if a, ok := c.Buffers[b.Name]; ok {
			copy(b.Value.Data, a.Data)
		}
	}
	tape := NewTape()
	x := tape.Input(tensorOf(c.Inputs["x"]))
	y := m.Forward(x)
	if err := tape.Err(); err != nil {
		t.Fatal(err)
	}
	golden.AssertArrayClose(t, c.Name+" output", y.Value.Shape, y.Value.Data, c.Outputs["y"], goldenAtol, goldenRtol)
	if err := tape.BackwardFrom(y, c.Upstream.Data); err != nil {
		t.Fatal(err)
	}
	golden.AssertArrayClose(t, c.Name+" grad x", x.Value.Shape, x.Grad.Data, c.Grads["x"], goldenAtol, goldenRtol)
	for name, want := range c.Grads {
		if name == "x" {
			continue
		}
		golden.AssertArrayClose(t, c.Name+" grad "+name, params[name].Grad.Shape, params[name].Grad.Data, want, goldenAtol, goldenRtol)
	}
	for name, want := range c.BuffersAfter {
		golden.AssertArrayClose(t, c.Name+" buffer "+name, bufs[name].Value.Shape, bufs[name].Value.Data, want, goldenAtol, goldenRtol)
	}
}

func TestGoldenLayers(t *testing.T) {
	rng := NewRand(0)
	for _, file := range []string{"linear", "conv2d", "batchnorm2d", "pool", "resnet_ops", "activation"} {
		f := golden.MustLoad(t, file)
		for i := range f.Cases {
			c := &f.Cases[i]
			t.Run(c.Name, func(t *testing.T) {
				var m Module
				switch c.Op {
				case "linear":
					m = NewLinear(c.Int("in_features"), c.Int("out_features"), c.Bool("bias"), rng)
				case "conv2d":
					m = NewConv2d(c.Int("in_channels"), c.Int("out_channels"), c.Int("kernel"), c.Int("stride"), c.Int("padding"), c.Bool("bias"), rng)
				case "batchnorm2d":
					bn := NewBatchNorm2d(c.Int("num_features"))
					bn.Eps, bn.Momentum = c.Float("eps"), c.Float("momentum")
					bn.SetTraining(c.Bool("training"))
					m = bn
				case "maxpool2d":
					m = MaxPool2d{Kernel: c.Int("kernel"), Stride: c.Int("stride"), Padding: c.Int("padding")}
				case "avgpool2d":
					if !c.Bool("count_include_pad") {
						t.Fatalf("%s: only count_include_pad=True is implemented", c.Name)
					}
					m = AvgPool2d{Kernel: c.Int("kernel"), Stride: c.Int("stride"), Padding: c.Int("padding")}
				case "adaptiveavgpool2d":
					m = AdaptiveAvgPool2d{OutH: c.Int("out_h"), OutW: c.Int("out_w")}
				case "subsample_pad":
					m = SubsamplePad{Stride: c.Int("stride"), Before: c.Int("before"), After: c.Int("after")}
				case "relu":
					m = ReLU{}
				case "flatten":
					m = Flatten{}
				default:
					t.Fatalf("unknown golden op %q", c.Op)
				}
				runGolden(t, c, m)
			})
		}
	}
}

func TestGoldenCrossEntropy(t *testing.T) {
	f := golden.MustLoad(t, "loss")
	for i := range f.Cases {
		c := &f.Cases[i]
		t.Run(c.Name, func(t *testing.T) {
			tape := NewTape()
			logits := tape.Input(tensorOf(c.Inputs["logits"]))
			loss := CrossEntropy(logits, c.Inputs["labels"].Ints())
			if err := tape.Backward(loss); err != nil {
				t.Fatal(err)
			}
			golden.AssertClose(t, c.Name+" loss", loss.Value.Data, c.Outputs["loss"].Data, goldenAtol, goldenRtol)
			golden.AssertArrayClose(t, c.Name+" grad logits", logits.Value.Shape, logits.Grad.Data, c.Grads["logits"], goldenAtol, goldenRtol)
		})
	}
}

// The tiny VGG end to end: conv, BN (train), ReLU, max-pool, linear and the loss in one
// graph, with PyTorch's dotted names.
func TestGoldenTinyVGG(t *testing.T) {
	f := golden.MustLoad(t, "model")
	c, err := f.Case("vgg_tiny_train")
	if err != nil {
		t.Fatal(err)
	}
	rng := NewRand(0)
	m := NewSequential(NewConv2d(3, 4, 3, 1, 1, true, rng), NewBatchNorm2d(4), ReLU{}, MaxPool2d{Kernel: 2},
		NewConv2d(4, 6, 3, 1, 1, true, rng), NewBatchNorm2d(6), ReLU{}, MaxPool2d{Kernel: 2},
		Flatten{}, NewLinear(24, 5, true, rng))
	ps := map[string]*Param{}
	for _, p := range Parameters(m) {
		ps[p.Name] = p
		copy(p.Value.Data, c.Params[p.Name].Data)
	}
	bufs := map[string]*Buffer{}
	for _, b := range Buffers(m) {
		bufs[b.Name] = b
		copy(b.Value.Data, c.Buffers[b.Name].Data)
	}
	tape := NewTape()
	var ready []string
	tape.OnGradReady(func(p *Param) { ready = append(ready, p.Name) })
	x := tape.Input(tensorOf(c.Inputs["x"]))
	loss := CrossEntropy(m.Forward(x), c.Inputs["labels"].Ints())
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	golden.AssertClose(t, "loss", loss.Value.Data, c.Outputs["loss"].Data, goldenAtol, goldenRtol)
	golden.AssertArrayClose(t, "grad x", x.Value.Shape, x.Grad.Data, c.Grads["x"], goldenAtol, goldenRtol)
	for name, want := range c.Grads {
		if name != "x" {
			golden.AssertArrayClose(t, "grad "+name, ps[name].Grad.Shape, ps[name].Grad.Data, want, goldenAtol, goldenRtol)
		}
	}
	for name, want := range c.BuffersAfter {
		golden.AssertArrayClose(t, "buffer "+name, bufs[name].Value.Shape, bufs[name].Value.Data, want, goldenAtol, goldenRtol)
	}
	if len(ready) != len(ps) {
		t.Fatalf("grad-ready fired for %d of %d parameters: %v", len(ready), len(ps), ready)
	}
}
