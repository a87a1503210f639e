package nn

// PyTorch goldens: testdata/goldens/lstm.json, written by
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_lstm_goldens.py testdata/goldens

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
)

func TestGoldenLSTM(t *testing.T) {
	f := golden.MustLoad(t, "lstm")
	for i := range f.Cases {
		c := &f.Cases[i]
		if c.Op != "lstm" {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			layers, hid := c.Int("num_layers"), c.Int("hidden_size")
			l, err := NewLSTM(c.Int("input_size"), hid, layers, 0, NewRand(0))
			if err != nil {
				t.Fatal(err)
			}
			ps := map[string]*Param{}
			for _, p := range Parameters(l) {
				ps[p.Name] = p
			}
			if len(ps) != len(c.Params) {
				t.Fatalf("%d parameters, golden has %d", len(ps), len(c.Params))
			}
			for name, a := range c.Params {
				p, ok := ps[name]
				if !ok || !sameShape(p.Value.Shape, a.Shape) {
					t.Fatalf("golden parameter %q %v: not in the layer with that shape", name, a.Shape)
				}
				copy(p.Value.Data, a.Data)
			}
			x := tensorOf(c.Inputs["x"])
			st := l.NewLSTMState(x.Shape[1])
			if c.Bool("with_state") {
				copy(st.H, c.Inputs["h0"].Data)
				copy(st.C, c.Inputs["c0"].Data)
			}
			tape := NewTape()
			xv := tape.Input(x)
			y := l.Run(xv, st)
			if err := tape.Err(); err != nil {
				t.Fatal(err)
			}
			golden.AssertArrayClose(t, "y", y.Value.Shape, y.Value.Data, c.Outputs["y"], goldenAtol, goldenRtol)
			golden.AssertArrayClose(t, "h_n", []int{layers, x.Shape[1], hid}, st.H, c.Outputs["h_n"], goldenAtol, goldenRtol)
			golden.AssertArrayClose(t, "c_n", []int{layers, x.Shape[1], hid}, st.C, c.Outputs["c_n"], goldenAtol, goldenRtol)
			if err := tape.BackwardFrom(y, c.Upstream.Data); err != nil {
				t.Fatal(err)
			}
			golden.AssertArrayClose(t, "grad x", x.Shape, xv.Grad.Data, c.Grads["x"], goldenAtol, goldenRtol)
			for name, p := range ps {
				golden.AssertArrayClose(t, "grad "+name, p.Grad.Shape, p.Grad.Data, c.Grads[name], goldenAtol, goldenRtol)
			}
		})
	}
}

func TestLSTMFiniteDifferences(t *testing.T) {
	rng := NewRand(3)
	l, err := NewLSTM(3, 4, 2, 0, rng)
	if err != nil {
		t.Fatal(err)
	}
	// Larger weights than the default init make the gates' nonlinearity matter.
	for _, p := range Parameters(l) {
		Uniform(p.Value.Data, 1, rng)
	}
	gradCheck(t, "lstm", l, randTensor(rng, 5, 2, 3), 1e-2, 2e-2)
}

func TestLSTMParamsAndHooks(t *testing.T) {
	l, err := NewLSTM(6, 5, 3, 0.5, NewRand(1))
	if err != nil {
		t.Fatal(err)
	}
	ps := Parameters(l)
	var names []string
	for _, p := range ps {
		names = append(names, fmt.Sprintf("%s%v", p.Name, p.Value.Shape))
		bound := float32(1 / math.Sqrt(5))
		for _, v := range p.Value.Data {
			if v < -bound || v > bound {
				t.Fatalf("%s: %v outside U(±1/√H)", p.Name, v)
			}
		}
	}
	want := "weight_ih_l0[20 6] weight_hh_l0[20 5] bias_ih_l0[20] bias_hh_l0[20] weight_ih_l1[20 5] weight_hh_l1[20 5] bias_ih_l1[20] bias_hh_l1[20] " +
		"weight_ih_l2[20 5] weight_hh_l2[20 5] bias_ih_l2[20] bias_hh_l2[20]"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("parameters\n%s\nwant\n%s", got, want)
	}
	// Every parameter's grad-ready hook fires once, the top layer's first (its backward runs
	// first), and only after its gradient is final.
	tape := NewTape()
	var ready []string
	tape.OnGradReady(func(p *Param) { ready = append(ready, p.Name) })
	y := l.Forward(tape.Input(randTensor(NewRand(2), 4, 3, 6)))
	if err := tape.BackwardFrom(y, make([]float32, y.Value.Len())); err != nil {
		t.Fatal(err)
	}
	if len(ready) != len(ps) || !strings.HasSuffix(ready[0], "_l2") || !strings.HasSuffix(ready[len(ready)-1], "_l0") {
		t.Fatalf("grad-ready order %v", ready)
	}
}

// Run with a state equals one run over the concatenated sequence; the state carries no
// gradient into the previous window.
func TestLSTMStateCarry(t *testing.T) {
	rng := NewRand(4)
	l, err := NewLSTM(3, 4, 2, 0, rng)
	if err != nil {
		t.Fatal(err)
	}
	x := randTensor(rng, 6, 2, 3)
	whole := NewTape()
	yAll := l.Forward(whole.Const(x))
	st := l.NewLSTMState(2)
	var parts []float32
	for w := 0; w < 3; w++ {
		tape := NewTape()
		part := &Tensor{Data: x.Data[w*2*2*3 : (w+1)*2*2*3], Shape: []int{2, 2, 3}}
		parts = append(parts, l.Run(tape.Const(part), st).Value.Data...)
	}
	for i, v := range yAll.Value.Data {
		if math.Abs(float64(v-parts[i])) > 1e-6 {
			t.Fatalf("windowed output %d = %v, whole sequence %v", i, parts[i], v)
		}
	}
	for i, v := range yAll.Value.Data[len(yAll.Value.Data)-2*4:] {
		if st.H[4*2*1+i] != v {
			t.Fatalf("final h of the last layer differs from the last output at %d", i)
		}
	}
}

func TestLSTMBadInput(t *testing.T) {
	l, err := NewLSTM(3, 4, 1, 0, NewRand(0))
	if err != nil {
		t.Fatal(err)
	}
	tape := NewTape()
	l.Forward(tape.Const(NewTensor(2, 5)))
	if err := tape.Err(); err == nil || !strings.Contains(err.Error(), "want [T N 3]") {
		t.Fatalf("bad shape: %v", err)
	}
	tape = NewTape()
	l.Run(tape.Const(NewTensor(2, 5, 3)), l.NewLSTMState(4))
	if err := tape.Err(); err == nil || !strings.Contains(err.Error(), "batch 5") {
		t.Fatalf("bad state: %v", err)
	}
	if _, err := NewLSTM(3, 0, 1, 0, NewRand(0)); err == nil {
		t.Fatal("hidden size 0 accepted")
	}
	if _, err := NewLSTM(3, 4, 1, 1, NewRand(0)); err == nil {
		t.Fatal("dropout 1 accepted")
	}
}

// A training loop over the same shapes reaches a steady state without allocating tensor
// memory from the second step on.
func TestLSTMPooledSteadyState(t *testing.T) {
	rng := NewRand(5)
	l, err := NewLSTM(8, 16, 2, 0.3, rng)
	if err != nil {
		t.Fatal(err)
	}
	x := randTensor(rng, 7, 4, 8)
	st := l.NewLSTMState(4)
	tape := NewTape()
	step := func() {
		tape.Reset()
		y := l.Run(tape.Const(x), st)
		if err := tape.BackwardFrom(y, y.Value.Data); err != nil {
			t.Fatal(err)
		}
	}
	step()
	before := tape.Stats.BufferAllocs
	for range 3 {
		step()
	}
	if tape.Stats.BufferAllocs != before {
		t.Fatalf("%d buffer allocations after the first step", tape.Stats.BufferAllocs-before)
	}
	if a := testing.AllocsPerRun(5, step); a > 80 {
		t.Fatalf("%.0f allocations per step, want a few per op (closures, shapes), none per time step", a)
	}
}

// ExampleLSTM trains over consecutive bptt windows, carrying the hidden state from one to the
// next without gradient (truncated back-propagation through time).
func ExampleLSTM() {
	rng := NewRand(0)
	lstm, _ := NewLSTM(8, 16, 2, 0.2, rng) // input 8, hidden 16, 2 layers, dropout between them
	state := lstm.NewLSTMState(4)          // batch of 4 columns
	tape := NewTape()
	for window := 0; window < 3; window++ {
		tape.Reset()
		y := lstm.Run(tape.Const(NewTensor(5, 4, 8)), state) // [T=5, N=4, 8] → [5, 4, 16]
		if err := tape.BackwardFrom(y, y.Value.Data); err != nil {
			fmt.Println(err)
		}
	}
	for _, p := range Parameters(lstm)[:4] {
		fmt.Print(p.Name, p.Value.Shape, " ")
	}
	fmt.Println(len(state.H))
	// Output: weight_ih_l0[64 8] weight_hh_l0[64 16] bias_ih_l0[64] bias_hh_l0[64] 128
}
