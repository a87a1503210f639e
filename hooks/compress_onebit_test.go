package hooks

import (
	"math"
	"math/rand/v2"
	"testing"
)

// onebit's default scale (‖x‖₁/c) leaves an error smaller than the chunk, so its error
// feedback contracts, on every vector; DeepSpeed's ‖x‖₂/√c leaves one larger than the chunk
// once ρ = ‖x‖₁/(√c‖x‖₂) < 1/2, as on heavy-tailed gradients. Both errors equal their closed
// forms. (With DDP's buckets neither scale trained VGG-11 at the convergence check's lr; with
// the whole model as one bucket, onebit's default now, mean does: BENCHMARKS.md.)
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

// On stationary heavy-tailed gradients (a hot direction on 2 % of the elements plus small
// noise, fresh each call), the error feedback of the sign compressors stays bounded, and their
// results are larger than the ranks' true mean: every element gets the scale's magnitude, in
// onebit twice (worker and server stage). The figures in BENCHMARKS.md ("The compressed family")
// are this test's log (go test -run TestSignCompressorsOutputNorm -v ./hooks).
func TestSignCompressorsOutputNorm(t *testing.T) {
	const p, n, calls = 4, 20000, 120
	norm := func(x []float32) float64 {
		var s float64
		for _, v := range x {
			s += float64(v) * float64(v)
		}
		return math.Sqrt(s)
	}
	outNorm := map[string]float64{}
	for _, spec := range []string{"onebit", "onebit:scale=rms", "efsignsgd:buckets=ddp"} {
		w := newWorld(t, p, spec)
		rng := rand.New(rand.NewPCG(1, 2))
		var mean, res60 float64
		for call := range calls {
			gs := make([][]float32, p)
			avg := make([]float32, n)
			for r := range gs {
				gs[r] = make([]float32, n)
				for i := range gs[r] {
					v := rng.NormFloat64() * 1e-3
					if i%50 == 0 {
						v = rng.NormFloat64() + 0.5
					}
					gs[r][i] = float32(v)
					avg[i] += float32(v) / p
				}
			}
			outs, _ := w.call(t, 0, gs)
			res := norm(w.residuals(n)[0])
			switch call {
			case calls / 2:
				res60 = res
			case calls - 1:
				outNorm[spec], mean = norm(outs[0]), norm(avg)
				t.Logf("%-22s call %d: |mean of g| %.1f, |result| %.1f, |residual of rank 0| %.1f (%.1f at call %d)", spec, call, mean, outNorm[spec], res, res60, calls/2)
				if res > 1.3*res60 { // a residual growing without bound would double
					t.Errorf("%s: the residual grew from %.1f to %.1f over the last %d calls", spec, res60, res, calls/2)
				}
				if outNorm[spec] < 2*mean {
					t.Errorf("%s: |result| %.1f, want the sign's inflation over |mean| %.1f", spec, outNorm[spec], mean)
				}
			}
		}
		w.close()
	}
	if outNorm["onebit"] < 1.5*outNorm["efsignsgd:buckets=ddp"] {
		t.Errorf("onebit's result %.1f is not larger than efsignsgd's %.1f: the two stages should add up", outNorm["onebit"], outNorm["efsignsgd:buckets=ddp"])
	}
}
