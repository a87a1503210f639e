package optim

// Goldens: testdata/goldens/adam.json from scripts/gen_optim_goldens.py (torch.optim.Adam and
// AdamW, trajectories in float64):
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_optim_goldens.py testdata/goldens

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
	"github.com/spargo-dl/spargo/nn"
)

func TestAdamMatchesTorch(t *testing.T) {
	f := golden.MustLoad(t, "adam")
	if len(f.Cases) < 10 {
		t.Fatalf("adam.json has %d cases", len(f.Cases))
	}
	for i := range f.Cases {
		c := &f.Cases[i]
		t.Run(c.Name, func(t *testing.T) {
			names := []string{"a", "b"}
			params := map[string]*nn.Param{}
			for _, n := range names {
				p := nn.NewParam(n, c.Params[n].Shape...)
				copy(p.Value.Data, c.Params[n].Data)
				params[n] = p
			}
			betas := c.Config["betas"].([]any)
			cfg := AdamConfig{LR: c.Float("lr"), Betas: [2]float64{betas[0].(float64), betas[1].(float64)}, Eps: c.Float("eps"),
				WeightDecay: c.Float("weight_decay"), AMSGrad: c.Bool("amsgrad"), Maximize: c.Bool("maximize"),
				Decoupled: c.Str("optimizer") == "adamw"}
			groups := []ParamGroup{{Params: []*nn.Param{params["a"], params["b"]}, WeightDecay: cfg.WeightDecay}}
			if gw, ok := c.Config["group_weight_decay"].(map[string]any); ok {
				groups = nil
				for _, n := range names { // one group per parameter, as the script
					groups = append(groups, ParamGroup{Params: []*nn.Param{params[n]}, WeightDecay: gw[n].(float64)})
				}
			}
			opt, err := NewAdamGroups(groups, cfg)
			if err != nil {
				t.Fatal(err)
			}
			lrs, _ := c.Config["lr_per_step"].([]any)
			for step := 0; step < c.Int("steps"); step++ {
				if lrs != nil {
					opt.SetLR(lrs[step].(float64))
				}
				for _, n := range names {
					p := params[n]
					if c.Str("grad_rule") == "0.5p+noise" {
						noise := c.NoisePerStep[n][step]
						for j := range p.Grad.Data {
							p.Grad.Data[j] = 0.5*p.Value.Data[j] + noise[j]
						}
					} else {
						copy(p.Grad.Data, c.GradsPerStep[n][step])
					}
				}
				opt.Step()
				for _, n := range names {
					want := c.ParamsPerStep[n][step]
					for j, v := range params[n].Value.Data {
						if d := math.Abs(float64(v) - float64(want[j])); d > 2e-6*(1+math.Abs(float64(want[j]))) {
							t.Fatalf("step %d: %s[%d] = %.9g, torch %.9g (diff %.3g)", step+1, n, j, v, want[j], d)
						}
					}
				}
			}
			if opt.Steps() != int64(c.Int("steps")) {
				t.Errorf("Steps() = %d", opt.Steps())
			}
		})
	}
}

func TestAdamRejectsBadConfig(t *testing.T) {
	p := []*nn.Param{nn.NewParam("w", 2)}
	for _, tc := range []struct {
		cfg  AdamConfig
		want string
	}{
		{AdamConfig{LR: -1}, "learning rate"},
		{AdamConfig{LR: math.NaN()}, "learning rate"},
		{AdamConfig{LR: 0.1, Eps: -1}, "eps"},
		{AdamConfig{LR: 0.1, Betas: [2]float64{1, 0.999}}, "beta1"},
		{AdamConfig{LR: 0.1, Betas: [2]float64{0.9, -0.1}}, "beta2"},
		{AdamConfig{LR: 0.1, WeightDecay: -1, Decoupled: true}, "AdamW: group 0: invalid weight decay"},
	} {
		if _, err := NewAdam(p, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewAdam(%+v) = %v, want an error about %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := NewAdamGroups([]ParamGroup{{Params: p}, {Params: p}}, AdamConfig{LR: 0.1}); err == nil ||
		!strings.Contains(err.Error(), `parameter w is in group 0 and group 1`) {
		t.Errorf("a parameter in two groups: %v", err)
	}
	if _, err := NewAdam([]*nn.Param{nil}, AdamConfig{LR: 0.1}); err == nil || !strings.Contains(err.Error(), "<nil>") {
		t.Errorf("a nil parameter: %v", err)
	}
	o, err := NewAdam(p, AdamConfig{LR: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	if c := o.Config(); c.Betas != [2]float64{0.9, 0.999} || c.Eps != 1e-8 || c.Decoupled {
		t.Errorf("defaults: %+v", c)
	}
	if w, _ := NewAdamW(p, AdamConfig{LR: 0.1}); !w.Config().Decoupled {
		t.Error("NewAdamW is not decoupled")
	}
}

// A restored optimizer continues bit-identically: 8 steps in one run, versus 4 steps, State,
// a fresh optimizer on a copy of the parameters, LoadState, 4 more steps.
func TestAdamStateRoundTrip(t *testing.T) {
	for _, cfg := range []AdamConfig{{LR: 0.01, WeightDecay: 0.1}, {LR: 0.02, WeightDecay: 0.3, Decoupled: true, AMSGrad: true}} {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			rng := nn.NewRand(3)
			shapes := map[string][]int{"fc.weight": {4, 5}, "fc.bias": {5}}
			order := []string{"fc.weight", "fc.bias"}
			init := map[string][]float32{}
			grads := map[string][][]float32{}
			for _, n := range order {
				size := 1
				for _, d := range shapes[n] {
					size *= d
				}
				init[n] = randVec(rng, size)
				for range 8 {
					grads[n] = append(grads[n], randVec(rng, size))
				}
			}
			mk := func(values map[string][]float32) ([]*nn.Param, *Adam) {
				var ps []*nn.Param
				for _, n := range order {
					p := nn.NewParam(n, shapes[n]...)
					copy(p.Value.Data, values[n])
					ps = append(ps, p)
				}
				o, err := NewAdamGroups(NoDecayGroups(ps, cfg.WeightDecay), cfg)
				if err != nil {
					t.Fatal(err)
				}
				return ps, o
			}
			run := func(o *Adam, ps []*nn.Param, from, to int) {
				for s := from; s < to; s++ {
					for _, p := range ps {
						copy(p.Grad.Data, grads[p.Name][s])
					}
					o.SetLR(cfg.LR * float64(s+1))
					o.Step()
				}
			}
			ref, refOpt := mk(init)
			run(refOpt, ref, 0, 8)

			first, firstOpt := mk(init)
			run(firstOpt, first, 0, 4)
			st := firstOpt.State()
			saved := map[string][]float32{}
			for _, p := range first {
				saved[p.Name] = append([]float32(nil), p.Value.Data...)
			}
			run(firstOpt, first, 4, 5) // State is a copy: stepping on must not change it
			resumed, resumedOpt := mk(saved)
			if err := resumedOpt.LoadState(st); err != nil {
				t.Fatal(err)
			}
			if resumedOpt.Steps() != 4 {
				t.Fatalf("restored step count %d, want 4", resumedOpt.Steps())
			}
			run(resumedOpt, resumed, 4, 8)
			for k, p := range resumed {
				for j, v := range p.Value.Data {
					if math.Float32bits(v) != math.Float32bits(ref[k].Value.Data[j]) {
						t.Fatalf("%s[%d] = %v after resuming, %v without a break", p.Name, j, v, ref[k].Value.Data[j])
					}
				}
			}
		})
	}
}

func randVec(rng interface{ NormFloat64() float64 }, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func TestAdamLoadStateErrors(t *testing.T) {
	p := nn.NewParam("w", 3)
	p.Grad.Data[0] = 1
	o, _ := NewAdam([]*nn.Param{p}, AdamConfig{LR: 0.1, AMSGrad: true})
	if len(o.State()) != 0 {
		t.Fatal("state before the first step is not empty")
	}
	o.Step()
	good := o.State()
	if len(good) != 4 {
		t.Fatalf("state keys: %v", good)
	}
	with := func(k string, v []float32) map[string][]float32 {
		st := map[string][]float32{}
		for kk, vv := range good {
			st[kk] = vv
		}
		if v == nil {
			delete(st, k)
		} else {
			st[k] = v
		}
		return st
	}
	for _, tc := range []struct {
		st   map[string][]float32
		want string
	}{
		{with("adam:step", nil), `no "adam:step" entry`},
		{with("adam:step", []float32{0, 1.5}), "is not a step count"},
		{with("adam:step", []float32{0, 0}), "is not a step count"},
		{with("exp_avg_sq:w", nil), `no "exp_avg_sq:w" entry for parameter w`},
		{with("max_exp_avg_sq:w", []float32{1}), `"max_exp_avg_sq:w" has 1 elements, parameter w has 3`},
		{with("exp_avg:other", []float32{1}), `"exp_avg:other" belongs to no parameter`},
	} {
		fresh, _ := NewAdam([]*nn.Param{p}, AdamConfig{LR: 0.1, AMSGrad: true})
		if err := fresh.LoadState(tc.st); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadState: %v, want an error containing %q", err, tc.want)
		}
		if fresh.Steps() != 0 {
			t.Error("a failed LoadState changed the optimizer")
		}
	}
	big := with("adam:step", []float32{3, 5})
	if err := o.LoadState(big); err != nil || o.Steps() != 3<<24+5 {
		t.Fatalf("step count hi/lo: %v, %d", err, o.Steps())
	}
	if err := o.LoadState(nil); err != nil || o.Steps() != 0 || len(o.State()) != 0 {
		t.Fatalf("LoadState(nil) did not reset: %v", err)
	}
}

func TestNoDecay(t *testing.T) {
	for name, want := range map[string]bool{
		"encoder.0.attention.self.query.bias": true, "encoder.0.LayerNorm.weight": true, "encoder.0.LayerNorm.bias": true,
		"ln.layer_norm.weight": true, "final_norm.weight": true, "attn.in_proj_bias": true, "bias": true,
		"encoder.0.attention.self.query.weight": false, "embeddings.word_embeddings.weight": false,
		"features.3.weight": false, "bias_net.weight": false,
	} {
		if NoDecay(name) != want {
			t.Errorf("NoDecay(%q) = %v, want %v", name, !want, want)
		}
	}
	ps := []*nn.Param{nn.NewParam("fc.weight", 1), nn.NewParam("fc.bias", 1), nn.NewParam("LayerNorm.weight", 1), nn.NewParam("out.weight", 1)}
	g := NoDecayGroups(ps, 0.01)
	if len(g) != 2 || g[0].WeightDecay != 0.01 || g[1].WeightDecay != 0 || len(g[0].Params) != 2 || len(g[1].Params) != 2 ||
		g[0].Params[1].Name != "out.weight" || g[1].Params[0].Name != "fc.bias" {
		t.Errorf("NoDecayGroups: %+v", g)
	}
}
