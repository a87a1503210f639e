package nn

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// LSTM is PyTorch's nn.LSTM (unidirectional, with biases, batch_first=False): a stack of
// NumLayers layers, each computing for t = 0 … T−1
//
//	i, f, g, o = σ, σ, tanh, σ of (x_t·W_ihᵀ + b_ih + h_{t−1}·W_hhᵀ + b_hh), split in that order
//	c_t = f·c_{t−1} + i·g,   h_t = o·tanh(c_t)
//
// on the input x of shape [T, N, In] (sequence first, as PyTorch's word_language_model
// feeds it); the output is every h_t of the last layer, [T, N, Hidden]. Between layers
// (not after the last) dropout with probability Dropout is applied in training mode.
//
// Parameters are named as PyTorch's (weight_ih_l0 [4·Hidden, In], weight_hh_l0
// [4·Hidden, Hidden], bias_ih_l0, bias_hh_l0, then _l1, …), so state dicts map 1:1, and
// initialised as PyTorch's: every one from U(−1/√Hidden, 1/√Hidden).
//
// The hidden state carried between calls (truncated back-propagation through time) is an
// LSTMState: Run starts from it and overwrites it with the final state. It enters the
// graph as a constant, so no gradient flows into the previous window: PyTorch's
// repackage_hidden (detach) is built in.
//
// Each layer is one op on the tape: one Sgemm projects the inputs of all T steps, then per
// step one Sgemm adds the recurrent product (W_hh packed once for all steps, kernels.PackB)
// and one fused kernel applies the gates (internal/kernels' LSTMCellForward); backward
// mirrors it and ends with one Sgemm for each weight gradient. The layer's parameters are
// ready for the grad-ready hooks (DDP's buckets) as soon as its backward has run, while the
// layers below still compute.
type LSTM struct {
	In, Hidden, NumLayers int
	// Dropout is the probability of the dropout between layers (PyTorch's dropout argument).
	Dropout float64
	Layers  []LSTMLayer

	drop *Dropout
}

// LSTMLayer holds one layer's parameters.
type LSTMLayer struct {
	WeightIH, WeightHH, BiasIH, BiasHH *Param
}

var (
	_ ParamOwner     = (*LSTM)(nil)
	_ TrainingSetter = (*LSTM)(nil)
	_ RandOwner      = (*LSTM)(nil)
)

// NewLSTM returns an LSTM of numLayers layers (input size in, hidden size hidden) with
// PyTorch's initialisation drawn from rng, in training mode. dropout is the probability of
// the dropout between layers; its masks come from the layer's own generator, seeded from rng.
func NewLSTM(in, hidden, numLayers int, dropout float64, rng *rand.Rand) (*LSTM, error) {
	if in < 1 || hidden < 1 || numLayers < 1 {
		return nil, fmt.Errorf("nn.NewLSTM: input size %d, hidden size %d, layers %d: all must be at least 1", in, hidden, numLayers)
	}
	if !(dropout >= 0 && dropout < 1) {
		return nil, fmt.Errorf("nn.NewLSTM: dropout %v outside [0, 1)", dropout)
	}
	l := &LSTM{In: in, Hidden: hidden, NumLayers: numLayers, Dropout: dropout}
	bound := 1 / math.Sqrt(float64(hidden))
	for k := 0; k < numLayers; k++ {
		inK := in
		if k > 0 {
			inK = hidden
		}
		ly := LSTMLayer{
			WeightIH: NewParam(fmt.Sprintf("weight_ih_l%d", k), 4*hidden, inK),
			WeightHH: NewParam(fmt.Sprintf("weight_hh_l%d", k), 4*hidden, hidden),
			BiasIH:   NewParam(fmt.Sprintf("bias_ih_l%d", k), 4*hidden),
			BiasHH:   NewParam(fmt.Sprintf("bias_hh_l%d", k), 4*hidden),
		}
		// PyTorch's reset_parameters: every weight from U(−1/√H, 1/√H), in registration order.
		for _, p := range []*Param{ly.WeightIH, ly.WeightHH, ly.BiasIH, ly.BiasHH} {
			Uniform(p.Value.Data, bound, rng)
		}
		l.Layers = append(l.Layers, ly)
	}
	l.drop = NewDropout(dropout, rng)
	return l, nil
}

// OwnParams returns the parameters in PyTorch's order: weight_ih_l0, weight_hh_l0,
// bias_ih_l0, bias_hh_l0, weight_ih_l1, ….
func (l *LSTM) OwnParams() []*Param {
	ps := make([]*Param, 0, 4*len(l.Layers))
	for _, ly := range l.Layers {
		ps = append(ps, ly.WeightIH, ly.WeightHH, ly.BiasIH, ly.BiasHH)
	}
	return ps
}

// SetTraining switches the dropout between layers on (true) or off.
func (l *LSTM) SetTraining(training bool) { l.drop.SetTraining(training) }

// RandSource returns the generator of the between-layer dropout masks (RandOwner).
func (l *LSTM) RandSource() *rand.PCG { return l.drop.RandSource() }

// String describes the layer for Summary.
func (l *LSTM) String() string {
	return fmt.Sprintf("LSTM(%d, %d, num_layers=%d, dropout=%v)", l.In, l.Hidden, l.NumLayers, l.Dropout)
}

// LSTMState is the hidden state (h, c) of an LSTM between calls: H and C are
// [NumLayers, Batch, Hidden], row-major, as PyTorch's (h_n, c_n).
type LSTMState struct {
	Layers, Batch, Hidden int
	H, C                  []float32
}

// NewLSTMState returns a zero state for l and a batch of n sequences.
func (l *LSTM) NewLSTMState(n int) *LSTMState {
	k := l.NumLayers * n * l.Hidden
	return &LSTMState{Layers: l.NumLayers, Batch: n, Hidden: l.Hidden, H: make([]float32, k), C: make([]float32, k)}
}

// Zero resets the state to zeros (the start of a sequence).
func (s *LSTMState) Zero() {
	clear(s.H)
	clear(s.C)
}

// Forward runs the LSTM on x [T, N, In] from the zero state and returns [T, N, Hidden].
func (l *LSTM) Forward(x *Var) *Var { return l.Run(x, nil) }

// Run runs the LSTM on x [T, N, In] starting from st (nil: zeros) and returns the last
// layer's outputs [T, N, Hidden]. When st is not nil, Run overwrites it with the final
// state (h_T, c_T) of every layer: pass it to the next call to carry the state over the
// next window. The state is read as a constant (no gradient flows into it) and written
// while the forward runs, so the returned Var's backward does not depend on it.
func (l *LSTM) Run(x *Var, st *LSTMState) *Var {
	t := x.tape
	s := x.Value.Shape
	if x.broken {
		return t.fail([]int{1, 1, l.Hidden}, nil)
	}
	if len(s) != 3 || s[2] != l.In || s[0] < 1 || s[1] < 1 {
		return t.failf([]int{1, 1, l.Hidden}, "nn.LSTM(%d, %d): input shape %v, want [T N %d] (sequence first)", l.In, l.Hidden, s, l.In)
	}
	steps, n := s[0], s[1]
	if st != nil && (st.Layers != l.NumLayers || st.Batch != n || st.Hidden != l.Hidden ||
		len(st.H) != l.NumLayers*n*l.Hidden || len(st.C) != len(st.H)) {
		return t.failf([]int{steps, n, l.Hidden}, "nn.LSTM(%d, %d): state [%d %d %d] (h %d, c %d values) for %d layers, batch %d: want [%d %d %d]",
			l.In, l.Hidden, st.Layers, st.Batch, st.Hidden, len(st.H), len(st.C), l.NumLayers, n, l.NumLayers, n, l.Hidden)
	}
	y := x
	for k := range l.Layers {
		if k > 0 {
			y = l.drop.Forward(y)
		}
		var h0, c0 []float32
		if st != nil {
			off := k * n * l.Hidden
			h0, c0 = st.H[off:off+n*l.Hidden], st.C[off:off+n*l.Hidden]
		}
		y = l.layer(&l.Layers[k], y, steps, n, h0, c0)
	}
	return y
}

// layer runs one layer on x [T, N, in] from (h0, c0) (nil: zeros), which it overwrites with
// the final state.
func (l *LSTM) layer(ly *LSTMLayer, x *Var, steps, n int, h0, c0 []float32) *Var {
	t := x.tape
	hd, in := l.Hidden, ly.WeightIH.Value.Shape[1]
	g4 := 4 * hd
	rows := steps * n
	wih, whh, bih, bhh := t.Param(ly.WeightIH), t.Param(ly.WeightHH), t.Param(ly.BiasIH), t.Param(ly.BiasHH)
	y := t.newVar(t.tensor([]int{steps, n, hd}), false)
	gates := t.buf(rows * g4) // pre-activations, then the activations backward needs
	cells := t.buf(rows * hd) // c_t of every step
	tcs := t.buf(rows * hd)   // tanh(c_t)
	var hInit, cInit []float32
	if h0 != nil {
		// The initial state is kept for backward: the caller's buffer changes below.
		hInit, cInit = t.buf(n*hd), t.buf(n*hd)
		copy(hInit, h0)
		copy(cInit, c0)
	}
	// The summed bias in every row, then the input projection of all steps at once.
	bias := gates[:g4]
	kernels.Add(bias, bih.Value.Data, bhh.Value.Data)
	for r := 1; r < rows; r++ {
		copy(gates[r*g4:(r+1)*g4], bias)
	}
	kernels.Sgemm(false, true, rows, g4, in, 1, x.Value.Data, in, wih.Value.Data, in, 1, gates, g4)
	yd := y.Value.Data
	// W_hhᵀ multiplies the hidden state of every step: packed once for all of them.
	whhT := kernels.PackB(true, hd, g4, whh.Value.Data, hd)
	for s := 0; s < steps; s++ {
		g := gates[s*n*g4 : (s+1)*n*g4]
		var hPrev, cPrev []float32
		if s > 0 {
			hPrev, cPrev = yd[(s-1)*n*hd:s*n*hd], cells[(s-1)*n*hd:s*n*hd]
		} else if hInit != nil {
			hPrev, cPrev = hInit, cInit
		}
		if hPrev != nil {
			kernels.SgemmPackedB(false, n, 1, hPrev, hd, &whhT, 1, g, g4)
		}
		kernels.LSTMCellForward(g, cPrev, cells[s*n*hd:(s+1)*n*hd], tcs[s*n*hd:(s+1)*n*hd], yd[s*n*hd:(s+1)*n*hd], hd, n, hd)
	}
	whhT.Release()
	if h0 != nil {
		copy(h0, yd[(steps-1)*n*hd:])
		copy(c0, cells[(steps-1)*n*hd:])
	}
	t.record(y, func(dy []float32) {
		dGates := t.buf(rows * g4)
		dc := t.buf(n * hd)
		clear(dc)
		var dhRec []float32
		whhP := kernels.PackB(false, g4, hd, whh.Value.Data, hd) // W_hh for every step's dh
		for s := steps - 1; s >= 0; s-- {
			var cPrev []float32
			if s > 0 {
				cPrev = cells[(s-1)*n*hd : s*n*hd]
			} else {
				cPrev = cInit
			}
			dg := dGates[s*n*g4 : (s+1)*n*g4]
			kernels.LSTMCellBackward(dg, gates[s*n*g4:(s+1)*n*g4], cPrev, tcs[s*n*hd:(s+1)*n*hd], dy[s*n*hd:(s+1)*n*hd], hd, dhRec, dc, n, hd)
			if s > 0 { // the gradient reaching h_{s−1} (none for the constant initial state)
				if dhRec == nil {
					dhRec = t.buf(n * hd)
				}
				kernels.SgemmPackedB(false, n, 1, dg, g4, &whhP, 0, dhRec, hd)
			}
		}
		whhP.Release()
		// dW_hh += Σ_s dG_sᵀ·h_{s−1}; dW_ih += dGᵀ·x; db += Σ rows of dG; dx = dG·W_ih.
		if steps > 1 {
			kernels.Sgemm(true, false, g4, hd, (steps-1)*n, 1, dGates[n*g4:], g4, yd, hd, 1, whh.grad(), hd)
		}
		if hInit != nil {
			kernels.Sgemm(true, false, g4, hd, n, 1, dGates[:n*g4], g4, hInit, hd, 1, whh.grad(), hd)
		} else {
			whh.grad() // a parameter the forward read gets a gradient, zero or not
		}
		kernels.Sgemm(true, false, g4, in, rows, 1, dGates, g4, x.Value.Data, in, 1, wih.grad(), in)
		// Both biases get the same gradient, the column sums of dG.
		db := t.buf(g4)
		clear(db)
		for r := 0; r < rows; r++ {
			kernels.Axpy(1, dGates[r*g4:(r+1)*g4], db)
		}
		kernels.Axpy(1, db, bih.grad())
		kernels.Axpy(1, db, bhh.grad())
		if x.needsGrad {
			dx, fresh := x.gradOverwrite()
			beta := float32(1)
			if fresh {
				beta = 0
			}
			kernels.Sgemm(false, false, rows, in, g4, 1, dGates, g4, wih.Value.Data, in, beta, dx, in)
		}
	}, x, wih, whh, bih, bhh)
	return y
}
