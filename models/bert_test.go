package models

// Goldens: the bert_layer case of testdata/goldens/transformer.json, written by
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_bert_goldens.py testdata/goldens
//
// The script generates the weights (HF names) and the input; the test loads them by name,
// so a missing or misnamed parameter fails here. The whole BertForPreTraining is compared
// with PyTorch through the weights spargo exports (bert_parity_test.go).

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
	"github.com/spargo-dl/spargo/nn"
)

func int32sOf(a golden.Array) []int32 {
	out := make([]int32, len(a.Data))
	for i, v := range a.Ints() {
		out[i] = int32(v)
	}
	return out
}

// loadParams copies every golden parameter into the model's parameter of that name and
// checks that the model has no other parameters.
func loadParams(t *testing.T, ps []*nn.Param, want map[string]golden.Array) map[string]*nn.Param {
	t.Helper()
	byName := map[string]*nn.Param{}
	for _, p := range ps {
		byName[p.Name] = p
		if _, ok := want[p.Name]; !ok {
			t.Errorf("parameter %s is not in the PyTorch state dict", p.Name)
		}
		p.Grad.Zero()
	}
	for name, a := range want {
		p, ok := byName[name]
		if !ok {
			t.Fatalf("PyTorch parameter %s has no counterpart", name)
		}
		if fmt.Sprint(p.Value.Shape) != fmt.Sprint(a.Shape) {
			t.Fatalf("%s: shape %v, PyTorch %v", name, p.Value.Shape, a.Shape)
		}
		copy(p.Value.Data, a.Data)
	}
	return byName
}

func TestBertParameterCounts(t *testing.T) {
	cfg, err := BertPreset("base")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		noNSP bool
		want  int
	}{{false, 110_106_428}, {true, 109_514_298}} {
		cfg.NoPoolerNSP = c.noNSP
		m, err := NewBertForPreTraining(cfg, nn.NewRand(0))
		if err != nil {
			t.Fatal(err)
		}
		ps := nn.Parameters(m)
		if got := nn.NumParams(ps); got != c.want {
			t.Errorf("base (NoPoolerNSP=%v): %d parameters, want %d", c.noNSP, got, c.want)
		}
		wantTensors := 5 + 16*12 + 1 + 4
		if !c.noNSP {
			wantTensors += 4
		}
		if len(ps) != wantTensors {
			t.Errorf("base (NoPoolerNSP=%v): %d parameter tensors, want %d", c.noNSP, len(ps), wantTensors)
		}
	}
}

// The decoder is the word-embedding table itself: listed once, updated through both
// uses, and its grad-ready hook fires once, after the embedding lookup's backward.
func TestBertTiedDecoder(t *testing.T) {
	cfg := tinyTestConfig()
	m, err := NewBertForPreTraining(cfg, nn.NewRand(1))
	if err != nil {
		t.Fatal(err)
	}
	word := m.Bert.Embeddings.Word.Weight
	if m.Cls.Predictions.DecoderWeight() != word {
		t.Fatal("decoder weight is not the word-embedding parameter")
	}
	ps := nn.Parameters(m)
	n := 0
	for _, p := range ps {
		if p == word {
			n++
			if p.Name != "bert.embeddings.word_embeddings.weight" {
				t.Fatalf("tied weight named %q", p.Name)
			}
		}
		if strings.Contains(p.Name, "decoder") {
			t.Fatalf("parameter %s: the decoder must not own a parameter", p.Name)
		}
	}
	if n != 1 {
		t.Fatalf("word embeddings listed %d times", n)
	}
	// HF initialisation: padding row 0, biases 0, LayerNorm 1/0, weights N(0, 0.02²).
	h := cfg.Hidden
	for _, v := range word.Value.Data[:h] {
		if v != 0 {
			t.Fatal("padding row of the word embeddings is not zero")
		}
	}
	var ss float64
	for _, v := range word.Value.Data[h:] {
		ss += float64(v) * float64(v)
	}
	if std := math.Sqrt(ss / float64(len(word.Value.Data)-h)); math.Abs(std-0.02) > 0.002 {
		t.Fatalf("word embedding std %v, want 0.02", std)
	}
	for _, p := range ps {
		switch {
		case strings.HasSuffix(p.Name, "LayerNorm.weight"):
			for _, v := range p.Value.Data {
				if v != 1 {
					t.Fatalf("%s not initialised to 1", p.Name)
				}
			}
		case strings.HasSuffix(p.Name, "bias"):
			for _, v := range p.Value.Data {
				if v != 0 {
					t.Fatalf("%s not initialised to 0", p.Name)
				}
			}
		}
	}
	tape := nn.NewTape()
	fired := map[string]int{}
	var order []string
	tape.OnGradReady(func(p *nn.Param) { fired[p.Name]++; order = append(order, p.Name) })
	ids := []int32{2, 5, 7, 0, 3, 3, 1, 0}
	mlm, nsp := m.ForwardPreTraining(tape, ids, nil, []int32{1, 1, 1, 0, 1, 1, 1, 0}, 2, 4)
	loss := m.Loss(mlm, nsp, []int{-100, 4, -100, -100, 9, -100, -100, -100}, []int{0, 1})
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if fired[p.Name] != 1 {
			t.Errorf("grad-ready hook fired %d times for %s", fired[p.Name], p.Name)
		}
	}
	if order[len(order)-1] != word.Name && order[len(order)-2] != word.Name && order[len(order)-3] != word.Name {
		t.Errorf("word embeddings ready before the last embedding ops ran: order %v", order)
	}
}

func tinyTestConfig() BertConfig {
	return BertConfig{VocabSize: 20, Hidden: 8, Layers: 2, Heads: 2, Intermediate: 16, MaxPositions: 6,
		TypeVocabSize: 2, HiddenDropout: 0.1, AttentionDropout: 0.1, LayerNormEps: 1e-12, InitRange: 0.02}
}

// One whole BERT layer with a padding mask against PyTorch.
func TestGoldenBertLayer(t *testing.T) {
	c, err := golden.MustLoad(t, "transformer").Case("bert_layer_h16_mask")
	if err != nil {
		t.Fatal(err)
	}
	cfg := BertConfig{VocabSize: 1, Hidden: c.Int("hidden"), Layers: 1, Heads: c.Int("heads"), Intermediate: c.Int("intermediate"),
		MaxPositions: 1, TypeVocabSize: 1, LayerNormEps: c.Float("eps"), InitRange: 0.02}
	l, err := NewBertLayer(cfg, nn.NewRand(0))
	if err != nil {
		t.Fatal(err)
	}
	ps := loadParams(t, nn.Parameters(l), c.Params)
	tape := nn.NewTape()
	xa := c.Inputs["x"]
	x := tape.Input(&nn.Tensor{Data: append([]float32(nil), xa.Data...), Shape: xa.Shape})
	y := l.ForwardMask(x, int32sOf(c.Inputs["mask"]))
	if err := tape.BackwardFrom(y, c.Upstream.Data); err != nil {
		t.Fatal(err)
	}
	golden.AssertArrayClose(t, "output", y.Shape(), y.Value.Data, c.Outputs["y"], 1e-5, 1e-4)
	golden.AssertArrayClose(t, "grad x", x.Shape(), x.Grad.Data, c.Grads["x"], 1e-5, 1e-4)
	for name, want := range c.Grads {
		if name != "x" {
			golden.AssertArrayClose(t, "grad "+name, ps[name].Grad.Shape, ps[name].Grad.Data, want, 1e-5, 1e-4)
		}
	}
}

// Finite differences through a whole tiny BertForPreTraining loss (dropout off): a
// sample of every parameter's elements.
func TestBertGradientsFiniteDifferences(t *testing.T) {
	cfg := tinyTestConfig()
	cfg.HiddenDropout, cfg.AttentionDropout, cfg.InitRange = 0, 0, 0.3
	m, err := NewBertForPreTraining(cfg, nn.NewRand(2))
	if err != nil {
		t.Fatal(err)
	}
	checkBertGradients(t, m, nil)
}

// checkBertGradients compares m's BertForPreTraining-loss gradients with central finite
// differences on a sample of every parameter's elements, after giving the LayerNorm
// parameters and biases random values (so that none sits at its initial 0 or 1).
// beforeForward, when not nil, runs before every forward (to restore dropout generators).
func checkBertGradients(t *testing.T, m *BertForPreTraining, beforeForward func()) {
	t.Helper()
	rng := nn.NewRand(3)
	ps := nn.Parameters(m)
	for _, p := range ps {
		if strings.Contains(p.Name, "LayerNorm") || strings.HasSuffix(p.Name, "bias") {
			nn.Normal(p.Value.Data, 0.3, rng)
		}
	}
	ids := []int32{2, 5, 7, 0, 3, 3, 1, 19, 4, 4, 0, 0}
	types := []int32{0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0}
	mask := []int32{1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0}
	mlmLabels := []int{-100, 4, -100, -100, 9, -100, 0, -100, 3, -100, -100, -100}
	nspLabels := []int{0, 1, 1}
	lossOf := func(tape *nn.Tape) *nn.Var {
		if beforeForward != nil {
			beforeForward()
		}
		mlm, nsp := m.ForwardPreTraining(tape, ids, types, mask, 3, 4)
		return m.Loss(mlm, nsp, mlmLabels, nspLabels)
	}
	nn.ZeroGrad(ps)
	tape := nn.NewTape()
	if err := tape.Backward(lossOf(tape)); err != nil {
		t.Fatal(err)
	}
	f := func() float64 { return float64(lossOf(nn.NewTape()).Item()) }
	const eps = 1e-2
	for _, p := range ps {
		step := max(1, p.Len()/6)
		for i := 0; i < p.Len(); i += step {
			o := p.Value.Data[i]
			p.Value.Data[i] = o + eps
			lp := f()
			p.Value.Data[i] = o - eps
			lm := f()
			p.Value.Data[i] = o
			num := (lp - lm) / (2 * eps)
			if got := float64(p.Grad.Data[i]); math.Abs(num-got) > 2e-2*(1e-2+math.Abs(num)) {
				t.Errorf("d loss/d %s[%d] = %.6g, finite difference %.6g", p.Name, i, got, num)
			}
		}
	}
}

func TestBertBadInput(t *testing.T) {
	m, err := NewBertForPreTraining(tinyTestConfig(), nn.NewRand(4))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name             string
		ids, types, mask []int32
		n, seq           int
		want             string
	}{
		{"ids-length", []int32{1, 2, 3}, nil, nil, 2, 2, "3 input ids for batch 2 × sequence 2"},
		{"mask-length", []int32{1, 2, 3, 4}, nil, []int32{1}, 2, 2, "1 attention mask for batch 2 × sequence 2"},
		{"too-long", make([]int32, 7), nil, nil, 1, 7, "sequence length 7 exceeds the 6 position embeddings"},
		{"id-range", []int32{1, 20}, nil, nil, 1, 2, "id 20 at position 1 is outside [0, 20)"},
		{"type-range", []int32{1, 2}, []int32{0, 2}, nil, 1, 2, "id 2 at position 1 is outside [0, 2)"},
		{"mask-value", []int32{1, 2}, nil, []int32{1, 5}, 1, 2, "mask entry 1 (sample 0, position 1) is 5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tape := nn.NewTape()
			mlm, nsp := m.ForwardPreTraining(tape, c.ids, c.types, c.mask, c.n, c.seq)
			loss := m.Loss(mlm, nsp, make([]int, c.n*c.seq), make([]int, c.n))
			if err := tape.Backward(loss); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := BertPreset("huge"); err == nil {
		t.Fatal("unknown preset accepted")
	}
	bad := tinyTestConfig()
	bad.Heads = 3
	if _, err := NewBertForPreTraining(bad, nn.NewRand(0)); err == nil || !strings.Contains(err.Error(), "3 heads do not divide hidden size 8") {
		t.Fatalf("config error %v", err)
	}
}

// ExampleNewBertForPreTraining builds BERT-tiny, runs one masked-LM + NSP step on a
// padded batch of two sequences and lists a few parameter names.
func ExampleNewBertForPreTraining() {
	cfg, _ := BertPreset("tiny")
	model, err := NewBertForPreTraining(cfg, nn.NewRand(0))
	if err != nil {
		panic(err)
	}
	ids := []int32{101, 7592, 103, 102, 101, 2088, 102, 0} // [CLS] hello [MASK] [SEP] | [CLS] world [SEP] [PAD]
	types := []int32{0, 0, 0, 0, 0, 0, 0, 0}
	mask := []int32{1, 1, 1, 1, 1, 1, 1, 0}
	mlmLabels := []int{-100, -100, 2088, -100, -100, -100, -100, -100}
	tape := nn.NewTape()
	mlm, nsp := model.ForwardPreTraining(tape, ids, types, mask, 2, 4)
	loss := model.Loss(mlm, nsp, mlmLabels, []int{0, 1})
	if err := tape.Backward(loss); err != nil {
		panic(err)
	}
	ps := nn.Parameters(model)
	fmt.Println(mlm.Shape(), nsp.Shape(), loss.Item() > 0)
	fmt.Println(ps[0].Name, ps[len(ps)-1].Name, nn.NumParams(ps))
	// Output:
	// [8 30522] [2 2] true
	// bert.embeddings.word_embeddings.weight cls.seq_relationship.bias 4433468
}
