package hooks

import (
	"math"
	"math/rand/v2"
	"testing"
)

// onebit's default scale (‖x‖₁/c) leaves an error smaller than the chunk, so its error
// feedback contracts, on every vector; DeepSpeed's ‖x‖₂/√c leaves one larger than the chunk
// once ρ = ‖x‖₁/(√c‖x‖₂) < 1/2, as on heavy-tailed gradients (the reason it did not train
// VGG-11). Both errors equal their closed forms.
func TestOnebitScaleContracts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 4096
	heavy := make([]float32, n) // a few large entries among many small: ρ ≈ 0.2
	for i := range heavy {
		heavy[i] = float32(rng.NormFloat64() * 1e-3)
		if i%64 == 0 {
			heavy[i] = float32(rng.NormFloat64())
		}
	}
	flat := make([]float32, n) // Gaussian: ρ ≈ 0.8
	for i := range flat {
		flat[i] = float32(rng.NormFloat64())
	}
	for _, tc := range []struct {
		name string
		x    []float32
	}{{"heavy-tailed", heavy}, {"gaussian", flat}} {
		var l1, l2 float64
		for _, v := range tc.x {
			l1 += math.Abs(float64(v))
			l2 += float64(v) * float64(v)
		}
		rho := l1 / math.Sqrt(n*l2)
		if (rho < 0.5) != (tc.name == "heavy-tailed") {
			t.Fatalf("%s: ρ = %.3f: the test's vectors are not what they should be", tc.name, rho)
		}
		for _, spec := range []string{"onebit", "onebit:scale=mean", "onebit:scale=rms"} {
			h, err := Parse(spec)
			if err != nil {
				t.Fatal(err)
			}
			comp := h.(*Compressed).Compressor
			c := CompressCall{Size: 1}
			got := make([]float32, n)
			if err := comp.Decompress(got, comp.Compress(nil, tc.x, c), c); err != nil {
				t.Fatal(err)
			}
			var e2 float64
			for i, v := range tc.x {
				d := float64(v) - float64(got[i])
				e2 += d * d
			}
			want := l2 - l1*l1/n // least squares
			if spec == "onebit:scale=rms" {
				want = 2 * l2 * (1 - rho)
			}
			if math.Abs(e2-want) > 1e-4*l2 {
				t.Errorf("%s on %s: error² %g, want %g", spec, tc.name, e2, want)
			}
			grows := e2 >= l2
			if wantGrow := spec == "onebit:scale=rms" && rho < 0.5; grows != wantGrow {
				t.Errorf("%s on %s (ρ = %.3f): error² %g against ‖x‖² %g; want it larger only with scale=rms and ρ < 1/2", spec, tc.name, rho, e2, l2)
			}
		}
	}
}
