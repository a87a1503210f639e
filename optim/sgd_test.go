package optim

// Goldens: testdata/goldens/sgd.json from scripts/gen_goldens.py (torch.optim.SGD,
// trajectories in float64).

import (
	"math"
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
	"github.com/spargo-dl/spargo/nn"
)

func TestSGDMatchesTorch(t *testing.T) {
	f := golden.MustLoad(t, "sgd")
	for i := range f.Cases {
		c := &f.Cases[i]
		t.Run(c.Name, func(t *testing.T) {
			names := []string{"a", "b"}
			var params []*nn.Param
			for _, n := range names {
				p := nn.NewParam(n, c.Params[n].Shape...)
				copy(p.Value.Data, c.Params[n].Data)
				params = append(params, p)
			}
			opt, err := NewSGD(params, SGDConfig{LR: c.Float("lr"), Momentum: c.Float("momentum"),
				Dampening: c.Float("dampening"), Nesterov: c.Bool("nesterov"), WeightDecay: c.Float("weight_decay")})
			if err != nil {
				t.Fatal(err)
			}
			pdep := c.Str("grad_rule") == "0.5p+noise"
			for step := 0; step < c.Int("steps"); step++ {
				for k, p := range params {
					if pdep {
						// The gradient depends on the current parameter: ordering bugs show.
						noise := c.NoisePerStep[names[k]][step]
						for j := range p.Grad.Data {
							p.Grad.Data[j] = 0.5*p.Value.Data[j] + noise[j]
						}
					} else {
						copy(p.Grad.Data, c.GradsPerStep[names[k]][step])
					}
				}
				opt.Step()
				for k, p := range params {
					want := c.ParamsPerStep[names[k]][step]
					for j, v := range p.Value.Data {
						if d := math.Abs(float64(v) - float64(want[j])); d > 1e-6 {
							t.Fatalf("step %d: %s[%d] = %.9g, torch %.9g (diff %.3g)", step+1, names[k], j, v, want[j], d)
						}
					}
				}
			}
		})
	}
}

func TestSGDRejectsBadConfig(t *testing.T) {
	p := []*nn.Param{nn.NewParam("w", 2)}
	for _, cfg := range []SGDConfig{{LR: -1}, {LR: 0.1, Momentum: -0.5}, {LR: 0.1, Nesterov: true},
		{LR: 0.1, Momentum: 0.9, Dampening: 0.1, Nesterov: true}, {LR: 0.1, WeightDecay: -1}} {
		if _, err := NewSGD(p, cfg); err == nil {
			t.Errorf("NewSGD(%+v) accepted", cfg)
		}
	}
}

func TestSGDStateRoundTrip(t *testing.T) {
	p := nn.NewParam("w", 3)
	p.Value.Data[0] = 1
	p.Grad.Data[0] = 0.5
	opt, _ := NewSGD([]*nn.Param{p}, SGDConfig{LR: 0.1, Momentum: 0.9})
	opt.Step()
	st := opt.State()
	opt2, _ := NewSGD([]*nn.Param{p}, SGDConfig{LR: 0.1, Momentum: 0.9})
	if err := opt2.LoadState(st); err != nil {
		t.Fatal(err)
	}
	if err := opt2.LoadState(map[string][]float32{"w": {1}}); err == nil {
		t.Fatal("LoadState accepted a buffer of the wrong size")
	}
}

func TestWarmupStep(t *testing.T) {
	s := WarmupStep{Base: 0.4, WarmupFrom: 0.1, WarmupEpochs: 2, Milestones: []int{5, 8}, Gamma: 0.1}
	cases := []struct {
		epoch, step int
		want        float64
	}{
		{0, 0, 0.1}, {0, 5, 0.175}, {1, 0, 0.25}, {1, 9, 0.385}, {2, 0, 0.4}, {4, 3, 0.4}, {5, 0, 0.04}, {8, 0, 0.004},
	}
	for _, c := range cases {
		if got := s.LR(c.epoch, c.step, 10); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("LR(epoch %d, step %d) = %v, want %v", c.epoch, c.step, got, c.want)
		}
	}
	if Constant(0.3).LR(7, 1, 1) != 0.3 {
		t.Error("Constant")
	}
}

// LGP's difference is exact. The gradients G_t of a parameter are deferred at some steps, as
// ddp does: the applied gradient is A_t = [not deferred at t]·G_t + [deferred at t−1]·G_{t−1}.
// Before step t the optimizer hears Diverge(est_t) for a deferred step (a local estimate of
// G_t) and, for a step deferred before, Revise(G_{t−1} − est_{t−1}) and Diverge(−G_{t−1}).
// After the revisions its Offset is the difference between an SGD fed G_t at every step, with
// its weight decay taken from the true values (the dense-equivalent trajectory), and itself,
// for every setting; once the deferrals stop, the difference dies out (Offset nil).
func TestSGDLGPOffsetTracksTheDenseTrajectory(t *testing.T) {
	rng := nn.NewRand(7)
	rnd := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(scale * rng.NormFloat64())
		}
		return v
	}
	for _, cfg := range []SGDConfig{{LR: 0.1}, {LR: 0.1, WeightDecay: 0.01}, {LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4},
		{LR: 0.05, Momentum: 0.9, Dampening: 0.3}, {LR: 0.05, Momentum: 0.8, Nesterov: true, WeightDecay: 1e-3}} {
		const n, deferring = 16, 12
		w0 := rnd(n, 1)
		mk := func() (*nn.Param, *SGD) {
			p := nn.NewParam("w", n)
			copy(p.Value.Data, w0)
			o, _ := NewSGD([]*nn.Param{p}, cfg)
			return p, o
		}
		dense, denseOpt := mk()
		denseOpt.cfg.WeightDecay = 0 // added below, on the true values
		tru, truOpt := mk()
		var prevG, prevEst []float32 // the step before, when it was deferred
		checked := 0
		for step := 0; step < 400; step++ {
			if step > deferring && prevG == nil && truOpt.Offset(tru) == nil {
				break
			}
			G := rnd(n, 0.5)
			// Never the first step (with dampening its gradient weighs more: a deferral would
			// change its total), as ddp's hooks: iteration 0 is dense.
			deferred := step > 0 && step < deferring && step%4 != 3
			A := make([]float32, n)
			if !deferred {
				copy(A, G)
			}
			if prevG != nil {
				delta := make([]float32, n)
				for j := range delta {
					delta[j] = prevG[j] - prevEst[j]
					A[j] += prevG[j]
				}
				truOpt.Revise(tru, delta)
				// Revised: the offset now describes the dense run fed G at every past step.
				off := truOpt.Offset(tru)
				for j := range off {
					want := dense.Value.Data[j] - tru.Value.Data[j]
					if d := math.Abs(float64(off[j] - want)); d > 1e-5*(1+math.Abs(float64(dense.Value.Data[j]))) {
						t.Fatalf("%+v before step %d: element %d: offset %v, dense − true = %v", cfg, step, j, off[j], want)
					}
				}
				checked++
				neg := make([]float32, n)
				for j := range neg {
					neg[j] = -prevG[j]
				}
				truOpt.Diverge(tru, neg)
				prevG, prevEst = nil, nil
			}
			if deferred {
				est := rnd(n, 0.5)
				if !truOpt.Diverge(tru, est) {
					t.Fatal("Diverge refused its own parameter")
				}
				prevG, prevEst = G, est
			}
			for j := range G {
				dense.Grad.Data[j] = G[j] + float32(cfg.WeightDecay)*tru.Value.Data[j]
			}
			copy(tru.Grad.Data, A)
			denseOpt.Step()
			truOpt.Step()
		}
		if checked < deferring/2 {
			t.Fatalf("%+v: checked %d revisions", cfg, checked)
		}
		if truOpt.Offset(tru) != nil {
			t.Fatalf("%+v: the LGP difference did not die out", cfg)
		}
		if truOpt.Diverge(nn.NewParam("other", n), make([]float32, n)) {
			t.Fatal("Diverge accepted a parameter of another optimizer")
		}
	}
}
