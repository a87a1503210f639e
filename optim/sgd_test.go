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
