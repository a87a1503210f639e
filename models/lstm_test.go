package models

// PyTorch goldens: testdata/goldens/lstm.json, written by
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_lstm_goldens.py testdata/goldens

import (
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
	"github.com/spargo-dl/spargo/nn"
)

func TestLSTMParamCounts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params int
	}{
		{"lstm-ptb", 66034000}, // SparDL's LSTM-PTB (issue 10's table)
		{"lstm-imdb", 2561052},
		{"lstm-ptb-small", 10000*200 + 2*(4*200*400+2*800) + 200*10000 + 10000},
		{"lstm-ptb-medium", 10000*650 + 2*(4*650*1300+2*2600) + 650*10000 + 10000},
	} {
		m, err := New(tc.name, nn.NewRand(0))
		if err != nil {
			t.Fatal(err)
		}
		if n := nn.NumParams(nn.Parameters(m)); n != tc.params {
			t.Errorf("%s: %d parameters, want %d", tc.name, n, tc.params)
		}
	}
	m, _ := New("lstm-ptb-small", nn.NewRand(0))
	var names []string
	for _, p := range nn.Parameters(m) {
		names = append(names, p.Name)
	}
	want := "encoder.weight rnn.weight_ih_l0 rnn.weight_hh_l0 rnn.bias_ih_l0 rnn.bias_hh_l0 rnn.weight_ih_l1 rnn.weight_hh_l1 rnn.bias_ih_l1 rnn.bias_hh_l1 decoder.weight decoder.bias"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("names %s, want %s (word_language_model's)", got, want)
	}
	if _, err := LSTMLMPreset("ptb-large"); err == nil {
		t.Fatal("unknown preset accepted")
	}
}

// Two bptt windows with the hidden state carried (and detached) between them: the second
// window's loss, gradients and final state match PyTorch's word_language_model.
func TestGoldenLSTMLM(t *testing.T) {
	c, err := golden.MustLoad(t, "lstm").Case("lm_2layer_two_windows")
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewLSTMLM(LSTMLMConfig{Vocab: c.Int("vocab"), Embed: c.Int("embed"), Hidden: c.Int("hidden"), Layers: c.Int("layers")}, nn.NewRand(0))
	if err != nil {
		t.Fatal(err)
	}
	ps := map[string]*nn.Param{}
	for _, p := range nn.Parameters(m) {
		ps[p.Name] = p
		a, ok := c.Params[p.Name]
		if !ok {
			t.Fatalf("%s not in the golden", p.Name)
		}
		copy(p.Value.Data, a.Data)
	}
	bptt, n := c.Int("bptt"), c.Int("batch")
	ids := c.Inputs["ids"].Data
	m.State = m.NewState(n)
	var tape *nn.Tape
	var loss *nn.Var
	for w := 0; w < 2; w++ {
		tape = nn.NewTape()
		x := &nn.Tensor{Data: ids[w*bptt*n : (w+1)*bptt*n], Shape: []int{bptt, n}}
		labels := make([]int, bptt*n)
		for i := range labels {
			labels[i] = int(ids[(w*bptt+1)*n+i])
		}
		nn.ZeroGrad(nn.Parameters(m))
		loss = nn.CrossEntropy(m.Forward(tape.Const(x)), labels)
		if err := tape.Err(); err != nil {
			t.Fatal(err)
		}
		if w == 0 {
			golden.AssertClose(t, "loss window 1", loss.Value.Data, c.Outputs["loss_window1"].Data, 1e-5, 1e-4)
		}
	}
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	golden.AssertClose(t, "loss", loss.Value.Data, c.Outputs["loss"].Data, 1e-5, 1e-4)
	golden.AssertClose(t, "h_n", m.State.H, c.Outputs["h_n"].Data, 1e-5, 1e-4)
	golden.AssertClose(t, "c_n", m.State.C, c.Outputs["c_n"].Data, 1e-5, 1e-4)
	for name, p := range ps {
		golden.AssertArrayClose(t, "grad "+name, p.Grad.Shape, p.Grad.Data, c.Grads[name], 1e-5, 1e-3)
	}
}

func TestLSTMClassifier(t *testing.T) {
	m, err := NewLSTMClassifier(LSTMClassifierConfig{Vocab: 20, Embed: 4, Hidden: 5, Layers: 1, Classes: 2}, nn.NewRand(1))
	if err != nil {
		t.Fatal(err)
	}
	// Two reviews of 6 slots, lengths 3 and 6: the padded one's logits equal those of its
	// unpadded 3 tokens alone.
	ids := []int32{5, 6, 7, 0, 0, 0, 1, 2, 3, 4, 5, 6}
	tape := nn.NewTape()
	x, err := SequenceFirst(tape, ids, 2, 6)
	if err != nil {
		t.Fatal(err)
	}
	m.Lengths = []int{3, 6}
	logits := m.Forward(tape.Const(x))
	if err := tape.Backward(nn.CrossEntropy(logits, []int{1, 0})); err != nil {
		t.Fatal(err)
	}
	m.Lengths = nil
	alone := m.Forward(nn.NewTape().Const(&nn.Tensor{Data: []float32{5, 6, 7}, Shape: []int{3, 1}}))
	for j := 0; j < 2; j++ {
		if d := logits.Value.Data[j] - alone.Value.Data[j]; d > 1e-6 || d < -1e-6 {
			t.Fatalf("padded review logits %v, alone %v", logits.Value.Data[:2], alone.Value.Data)
		}
	}
	if _, err := SequenceFirst(tape, ids[:5], 2, 6); err == nil {
		t.Fatal("short ids accepted")
	}
	tape = nn.NewTape()
	m.Lengths = []int{3}
	m.Forward(tape.Const(x))
	if tape.Err() == nil {
		t.Fatal("short ids accepted")
	}
}
