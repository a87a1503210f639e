package golden

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadAll loads every golden file and checks its shapes (Load validates
// them) and a few schema invariants the layer tests rely on.
func TestLoadAll(t *testing.T) {
	dir := filepath.Dir(Path("x.json"))
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		n++
		f, err := Load(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Error(err)
			continue
		}
		if !strings.HasPrefix(f.TorchVersion, "1.13") {
			t.Errorf("%s: torch_version %q", e.Name(), f.TorchVersion)
		}
		if len(f.Cases) == 0 {
			t.Errorf("%s: no cases", e.Name())
		}
		seen := map[string]bool{}
		for i := range f.Cases {
			c := &f.Cases[i]
			if seen[c.Name] {
				t.Errorf("%s: duplicate case %q", e.Name(), c.Name)
			}
			seen[c.Name] = true
			if got, err := f.Case(c.Name); err != nil || got != c {
				t.Errorf("%s: Case(%q) = %v, %v", e.Name(), c.Name, got, err)
			}
			for group, m := range map[string]map[string]Array{"inputs": c.Inputs, "params": c.Params, "outputs": c.Outputs, "grads": c.Grads} {
				for k, a := range m {
					for j, v := range a.Data {
						if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
							t.Errorf("%s %s %s[%s][%d] = %v", e.Name(), c.Name, group, k, j, v)
							break
						}
					}
				}
			}
			switch {
			case c.Op == "lr_schedule": // scripts/gen_optim_goldens.py: rates per unit in config
				lrs, ok := c.Config["lrs"].([]any)
				if !ok || len(lrs) == 0 || len(lrs) != c.Int("n") {
					t.Errorf("%s %s: config lrs has %d rates, n is %v", e.Name(), c.Name, len(lrs), c.Config["n"])
				}
			case c.Op == "sgd" || c.Op == "adam":
				for k := range c.Params {
					if len(c.GradsPerStep[k]) == 0 || len(c.GradsPerStep[k]) != len(c.ParamsPerStep[k]) {
						t.Errorf("%s %s: param %q has %d grad steps and %d param steps", e.Name(), c.Name, k, len(c.GradsPerStep[k]), len(c.ParamsPerStep[k]))
					}
				}
			case c.Upstream != nil:
				y, ok := c.Outputs["y"]
				if !ok || !sameShape(y.Shape, c.Upstream.Shape) {
					t.Errorf("%s %s: upstream shape %v vs output %v", e.Name(), c.Name, c.Upstream.Shape, y.Shape)
				}
				if x, ok := c.Inputs["x"]; !ok || !sameShape(x.Shape, c.Grads["x"].Shape) {
					t.Errorf("%s %s: grad x shape does not match input x", e.Name(), c.Name)
				}
				for k, p := range c.Params {
					if !sameShape(p.Shape, c.Grads[k].Shape) {
						t.Errorf("%s %s: grad %q shape %v, param %v", e.Name(), c.Name, k, c.Grads[k].Shape, p.Shape)
					}
				}
			default:
				if l, ok := c.Outputs["loss"]; !ok || len(l.Shape) != 0 || len(l.Data) != 1 {
					t.Errorf("%s %s: no upstream and no scalar loss", e.Name(), c.Name)
				}
			}
		}
	}
	if n < 8 {
		t.Errorf("found %d golden files in %s, want at least 8", n, dir)
	}
}

func TestConfigAccessors(t *testing.T) {
	f := MustLoad(t, "conv2d")
	c, err := f.Case("conv2d_k3_s2_p0_nobias")
	if err != nil {
		t.Fatal(err)
	}
	if c.Int("kernel") != 3 || c.Int("stride") != 2 || c.Bool("bias") || c.Float("padding") != 0 {
		t.Errorf("config = %v", c.Config)
	}
	if _, err := f.Case("nope"); err == nil {
		t.Error("Case(nope) did not fail")
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "missing_key") {
			t.Errorf("recover = %v", r)
		}
	}()
	c.Int("missing_key")
}

func TestAssertClose(t *testing.T) {
	if d := MaxAbsDiff([]float32{1, 2, 3}, []float32{1, 2.5, 2}); d != 1 {
		t.Errorf("MaxAbsDiff = %v", d)
	}
	if !math.IsInf(MaxAbsDiff([]float32{1}, nil), 1) {
		t.Error("MaxAbsDiff of different lengths is not +Inf")
	}
	if msg := closeMsg([]float32{1, 2}, []float32{1, 2.0000001}, 1e-6, 0); msg != "" {
		t.Error(msg)
	}
	msg := closeMsg([]float32{1, 2, 5}, []float32{1, 3, 5.5}, 1e-3, 1e-3)
	if !strings.Contains(msg, "2 of 3") || !strings.Contains(msg, "first at [1]") || !strings.Contains(msg, "max diff 1 at [1]") {
		t.Errorf("msg = %q", msg)
	}
	nan := float32(math.NaN())
	if closeMsg([]float32{nan}, []float32{0}, 1, 1) == "" {
		t.Error("NaN passed")
	}
}
