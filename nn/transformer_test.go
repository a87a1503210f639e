package nn

// Goldens for the transformer layers: testdata/goldens/transformer.json, written by
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_bert_goldens.py testdata/goldens
//
// (the whole BERT layer and model cases are checked in package models).

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
)

// funcModule makes a parameterless op a Module for runGolden and gradCheck.
type funcModule func(*Var) *Var

func (f funcModule) Forward(x *Var) *Var { return f(x) }

// maskedAttention runs attention with a fixed padding mask as a Module.
type maskedAttention struct {
	*MultiHeadSelfAttention
	mask []int32
}

func (m maskedAttention) Forward(x *Var) *Var { return m.ForwardMask(x, m.mask) }

func int32s(a golden.Array) []int32 {
	out := make([]int32, len(a.Data))
	for i, v := range a.Ints() {
		out[i] = int32(v)
	}
	return out
}

func TestGoldenTransformerLayers(t *testing.T) {
	f := golden.MustLoad(t, "transformer")
	rng := NewRand(0)
	ran := 0
	for i := range f.Cases {
		c := &f.Cases[i]
		var m Module
		switch c.Op {
		case "layernorm":
			m = NewLayerNorm(c.Int("dim"), c.Float("eps"))
		case "gelu":
			m = GELU{}
		case "softmax":
			m = funcModule(Softmax)
		case "attention":
			a := NewMultiHeadSelfAttention(c.Int("hidden"), c.Int("heads"), c.Bool("out_proj"), 0.1, rng)
			a.SetTraining(false)
			m = maskedAttention{a, int32s(c.Inputs["mask"])}
		default:
			continue // bert_layer: package models; cross_entropy_ignore: below
		}
		ran++
		t.Run(c.Name, func(t *testing.T) { runGolden(t, c, m) })
	}
	if ran != 6 {
		t.Fatalf("ran %d layer cases, want 6 (golden file out of date?)", ran)
	}
}

func TestGoldenCrossEntropyIgnore(t *testing.T) {
	f := golden.MustLoad(t, "transformer")
	c, err := f.Case("cross_entropy_ignore_6x9")
	if err != nil {
		t.Fatal(err)
	}
	tape := NewTape()
	logits := tape.Input(tensorOf(c.Inputs["logits"]))
	loss := CrossEntropyIgnore(logits, c.Inputs["labels"].Ints(), c.Int("ignore_index"))
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	golden.AssertClose(t, "loss", loss.Value.Data, c.Outputs["loss"].Data, goldenAtol, goldenRtol)
	golden.AssertArrayClose(t, "grad logits", logits.Value.Shape, logits.Grad.Data, c.Grads["logits"], goldenAtol, goldenRtol)
}

func TestTransformerGradientsFiniteDifferences(t *testing.T) {
	rng := NewRand(11)
	ln := NewLayerNorm(6, 1e-5)
	Uniform(ln.Weight.Value.Data, 1.5, rng)
	Uniform(ln.Bias.Value.Data, 1, rng)
	attn := NewMultiHeadSelfAttention(6, 2, true, 0, rng)
	attnNoOut := NewMultiHeadSelfAttention(8, 4, false, 0, rng)
	cases := []struct {
		name  string
		m     Module
		shape []int
	}{
		{"layernorm", ln, []int{2, 3, 6}},
		{"gelu", GELU{}, []int{4, 5}},
		{"softmax", funcModule(Softmax), []int{3, 2, 5}},
		{"tanh", funcModule(Tanh), []int{3, 4}},
		{"select-rows", funcModule(func(x *Var) *Var { return SelectRows(x, []int{2, 0, 2}) }), []int{4, 3}},
		{"attention-mask-out", maskedAttention{attn, []int32{1, 1, 1, 1, 1, 1, 0, 0}}, []int{2, 4, 6}},
		{"attention-mask-noout", maskedAttention{attnNoOut, []int32{1, 1, 0, 1, 1, 1}}, []int{2, 3, 8}},
		{"attention-nomask", attnNoOut, []int{1, 5, 8}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gradCheck(t, c.name, c.m, randTensor(rng, c.shape...), 2e-3, 2e-2)
		})
	}
}

func TestCrossEntropyIgnoreFiniteDifferences(t *testing.T) {
	rng := NewRand(12)
	x := randTensor(rng, 5, 4)
	labels := []int{1, IgnoreIndex, 3, 0, IgnoreIndex}
	tape := NewTape()
	xv := tape.Input(x)
	if err := tape.Backward(CrossEntropyIgnore(xv, labels, IgnoreIndex)); err != nil {
		t.Fatal(err)
	}
	f := func() float64 { return float64(CrossEntropyIgnore(NewTape().Const(x), labels, IgnoreIndex).Item()) }
	const eps = 1e-2
	for i := range x.Data {
		o := x.Data[i]
		x.Data[i] = o + eps
		lp := f()
		x.Data[i] = o - eps
		lm := f()
		x.Data[i] = o
		if num := (lp - lm) / (2 * eps); math.Abs(num-float64(xv.Grad.Data[i])) > 1e-3 {
			t.Errorf("d loss/d x[%d] = %g, finite difference %g", i, xv.Grad.Data[i], num)
		}
	}
	// Every row ignored: NaN loss and a zero gradient, as PyTorch.
	tape = NewTape()
	xv = tape.Input(x)
	loss := CrossEntropyIgnore(xv, []int{-100, -100, -100, -100, -100}, IgnoreIndex)
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(float64(loss.Item())) {
		t.Fatalf("all rows ignored: loss %v, want NaN", loss.Item())
	}
	for i, g := range xv.Grad.Data {
		if g != 0 {
			t.Fatalf("all rows ignored: grad[%d] = %v, want 0", i, g)
		}
	}
}

// A padding key gets exactly zero attention, so changing it changes no real token's
// output, and the attention-probability dropout zeroes about P of the probabilities.
func TestAttentionMaskAndDropout(t *testing.T) {
	rng := NewRand(13)
	a := NewMultiHeadSelfAttention(8, 2, true, 0.25, rng)
	a.SetTraining(false)
	x := randTensor(rng, 1, 5, 8)
	mask := []int32{1, 1, 1, 0, 0}
	y0 := a.ForwardMask(NewTape().Const(x), mask).Value.Clone()
	for j := 3 * 8; j < 5*8; j++ {
		x.Data[j] += 5
	}
	y1 := a.ForwardMask(NewTape().Const(x), mask).Value
	for j := 0; j < 3*8; j++ {
		if y0.Data[j] != y1.Data[j] {
			t.Fatalf("output %d of a real token changed (%v → %v) when only padding changed", j, y0.Data[j], y1.Data[j])
		}
	}
	keep := make([]float32, 100000)
	dropoutMask(keep, 0.25, rng)
	zeros := 0
	for _, k := range keep {
		switch k {
		case 0:
			zeros++
		case 1 / 0.75:
		default:
			t.Fatalf("dropout mask value %v, want 0 or 1/(1-p)", k)
		}
	}
	if frac := float64(zeros) / float64(len(keep)); math.Abs(frac-0.25) > 0.01 {
		t.Fatalf("dropout zeroed %.3f of the probabilities, want 0.25", frac)
	}
	// In training, outputs differ between calls (fresh masks) yet backward runs cleanly
	// and fires each parameter's hook once.
	a.SetTraining(true)
	tape := NewTape()
	fired := map[*Param]int{}
	tape.OnGradReady(func(p *Param) { fired[p]++ })
	y := a.ForwardMask(tape.Input(x), mask)
	if err := tape.BackwardFrom(y, make([]float32, y.Value.Len())); err != nil {
		t.Fatal(err)
	}
	for _, p := range Parameters(a) {
		if fired[p] != 1 {
			t.Fatalf("grad-ready hook fired %d times for %s", fired[p], p.Name)
		}
	}
}

func TestTransformerLayersBadInput(t *testing.T) {
	rng := NewRand(14)
	cases := []struct {
		name string
		run  func(tp *Tape) *Var
		want string
	}{
		{"layernorm-dim", func(tp *Tape) *Var { return NewLayerNorm(8, 1e-5).Forward(tp.Const(NewTensor(2, 7))) }, "nn.LayerNorm(8): input shape [2 7]"},
		{"attention-rank", func(tp *Tape) *Var {
			return NewMultiHeadSelfAttention(8, 2, false, 0, rng).Forward(tp.Const(NewTensor(4, 8)))
		}, "input shape [4 8], want [N T 8]"},
		{"attention-heads", func(tp *Tape) *Var {
			return NewMultiHeadSelfAttention(9, 2, false, 0, rng).Forward(tp.Const(NewTensor(1, 2, 9)))
		}, "heads must divide the hidden size"},
		{"attention-mask-len", func(tp *Tape) *Var {
			return NewMultiHeadSelfAttention(8, 2, false, 0, rng).ForwardMask(tp.Const(NewTensor(2, 3, 8)), []int32{1, 1})
		}, "mask has 2 entries for input shape [2 3 8]"},
		{"attention-mask-value", func(tp *Tape) *Var {
			return NewMultiHeadSelfAttention(8, 2, false, 0, rng).ForwardMask(tp.Const(NewTensor(1, 2, 8)), []int32{1, 2})
		}, "mask entry 1 (sample 0, position 1) is 2"},
		{"softmax-scalar", func(tp *Tape) *Var { return Softmax(tp.Const(&Tensor{Data: []float32{1}, Shape: []int{}})) }, "nn.Softmax: input shape []"},
		{"select-rows", func(tp *Tape) *Var { return SelectRows(tp.Const(NewTensor(3, 2)), []int{0, 3}) }, "index 3 at position 1 is outside [0, 3)"},
		{"ce-ignore-label", func(tp *Tape) *Var {
			return CrossEntropyIgnore(tp.Const(NewTensor(2, 3)), []int{-100, 3}, IgnoreIndex)
		}, "label 3 of row 1 outside [0, 3)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tp := NewTape()
			c.run(tp)
			err := tp.Err()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if !errors.Is(tp.Backward(tp.Const(NewTensor(1))), err) {
				t.Fatalf("Backward does not report the forward error")
			}
		})
	}
}

// ExampleMultiHeadSelfAttention runs BERT-style self-attention over a batch of two
// sequences, the second one padded after three tokens.
func ExampleMultiHeadSelfAttention() {
	rng := NewRand(0)
	attn := NewMultiHeadSelfAttention(16, 4, true, 0.1, rng)
	norm := NewLayerNorm(16, 1e-12)
	tape := NewTape()
	x := tape.Input(NewTensor(2, 5, 16))
	mask := []int32{1, 1, 1, 1, 1, 1, 1, 1, 0, 0}
	y := norm.Forward(Add(x, Gelu(attn.ForwardMask(x, mask))))
	fmt.Println(y.Shape(), tape.Err())
	for _, p := range Parameters(attn) {
		fmt.Print(p.Name, " ")
	}
	fmt.Println()
	// Output:
	// [2 5 16] <nil>
	// query.weight query.bias key.weight key.bias value.weight value.bias out.weight out.bias
}
