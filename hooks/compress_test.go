package hooks

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
)

// compressedSpecs are the compressed family's hooks as the tests run them (small densities
// and thresholds that keep some entries of the test gradients; efsignsgd and onebit on DDP's
// buckets, efsignsgd with a scale per tensor, so that DDP runs them on several buckets of
// several tensors).
var compressedSpecs = map[string]string{
	"dgc":       "dgc:density=0.05,warmup=1",
	"qsgd":      "qsgd:levels=15,chunk=64",
	"terngrad":  "terngrad",
	"signsgd":   "signsgd",
	"signum":    "signum",
	"efsignsgd": "efsignsgd:buckets=ddp,scale=tensor",
	"onebit":    "onebit:buckets=ddp",
	"randomk":   "randomk:density=0.05",
	"threshold": "threshold:v=2",
	"natural":   "natural",
	"8bit":      "8bit",
}

// The exact-resume test of every registered hook (resume_test.go) runs them too.
func init() {
	for name, spec := range compressedSpecs {
		resumeSpecs[name] = spec
	}
}

// Words received per call equal CostFormula on the busiest rank, for P = 2…8, and every rank
// gets the same bits; threshold's, whose length depends on the values, equal 2(Σ_s k_s − k_r)
// + P-1 on every rank, k_s counted from the gradients.
func TestCompressedWordsMatchFormula(t *testing.T) {
	for name, spec := range compressedSpecs {
		for p := 2; p <= 8; p++ {
			n := 997 + 13*p // no multiple of P, of 32 or of the chunks
			w := newWorld(t, p, spec)
			var outs [][]float32
			for call := range 6 { // past dgc's warm-up
				gs := grads(uint64(7*p+call), p, n)
				out, stats := w.call(t, 0, gs)
				outs = out
				checkIdentical(t, fmt.Sprintf("%s P=%d call %d", spec, p, call), out)
				if name == "threshold" {
					checkThresholdWords(t, w, p, n, gs, stats)
					continue
				}
				if name == "dgc" && call < 4 {
					continue
				}
				expr, want, ok := CostFormula(w.hooks[0], n, p)
				_, got := maxStats(stats)
				if !ok || float64(got) != want {
					t.Fatalf("%s P=%d n=%d call %d: busiest rank received %d words, formula %s = %v (ok %v)", spec, p, n, call, got, expr, want, ok)
				}
			}
			if nnz(outs[0]) == 0 {
				t.Fatalf("%s P=%d: the result is all zeros", spec, p)
			}
			w.close()
		}
	}
}

// checkThresholdWords checks threshold's words on the first call of a world (zero residuals).
func checkThresholdWords(t *testing.T, w *world, p, n int, gs [][]float32, stats []comm.Stats) {
	t.Helper()
	if hookMemory(w.hooks[0]).buckets[0].Calls != 1 {
		return // later calls add residuals the test does not track
	}
	ks := make([]int64, p)
	var total int64
	for r := range p {
		for _, v := range gs[r] {
			if math.Abs(float64(v)) >= 2 {
				ks[r]++
			}
		}
		total += ks[r]
	}
	for r, s := range stats {
		if want := 2*(total-ks[r]) + int64(p-1); s.BytesRecv != 4*want {
			t.Fatalf("threshold P=%d rank %d: %d words, want 2(Σk − k_r) + P-1 = %d", p, r, s.BytesRecv/4, want)
		}
	}
}

// The hooks with exact error feedback conserve: P·output + Σ ξ' = Σ (g + ξ).
func TestCompressedConservation(t *testing.T) {
	for _, spec := range []string{"efsignsgd", "threshold:v=1", "randomk:density=0.1", "dgc:momentum=0,density=0.05", "dgc:momentum=0,density=0.05,warmup=1"} {
		for p := 2; p <= 5; p++ {
			runConserving(t, spec, p, 301+p)
		}
	}
}

// onebit's two stages conserve with both residuals: Σ_r (g_r + ξ_r) + P·Σ_r s_r =
// P·output + Σ_r ξ'_r + P·Σ_r s'_r, s_r rank r's server residual (its chunk).
func TestOnebitConservesWithServerResidual(t *testing.T) {
	for p := 2; p <= 5; p++ {
		n := 203 + p
		w := newWorld(t, p, "onebit")
		for call := range 3 {
			gs := grads(uint64(p+call), p, n)
			before, sBefore := w.residuals(n), w.serverResiduals(n)
			outs, _ := w.call(t, 0, gs)
			checkIdentical(t, "onebit", outs)
			after, sAfter := w.residuals(n), w.serverResiduals(n)
			// fold P·s into the residuals: the harness's conservation test then applies
			for r := range p {
				for i := range n {
					before[r][i] += float32(p) * sBefore[r][i]
					after[r][i] += float32(p) * sAfter[r][i]
				}
			}
			checkConservation(t, fmt.Sprintf("onebit P=%d call %d", p, call), gs, before, after, outs[0])
			if call > 0 && nnz(sAfter[0]) == 0 {
				t.Fatalf("onebit P=%d: rank 0 keeps no server residual", p)
			}
		}
	}
}

// serverResiduals returns every rank's server residual of bucket 0 (zeros before it exists).
func (w *world) serverResiduals(n int) [][]float32 {
	out := make([][]float32, len(w.hooks))
	for r, h := range w.hooks {
		out[r] = make([]float32, n)
		if v, ok := h.(*Compressed).vectors().buckets[0]; ok {
			if s, ok := v.m[serverResidual]; ok {
				copy(out[r], s)
			}
		}
	}
	return out
}

// Replica identity under DDP training with several buckets, for every compressed hook.
func TestCompressedReplicasUnderDDP(t *testing.T) {
	for _, spec := range compressedSpecs {
		for _, p := range []int{2, 3, 5} {
			t.Run(fmt.Sprintf("%s/P=%d", spec, p), func(t *testing.T) {
				tr := trainDDP(t, spec, p, 3, ddpTraining{bucketCap: smallBuckets, anyLoss: true, check: severalBuckets})
				checkReplicasAgree(t, "", tr.hashes)
			})
		}
	}
}

// A hook restored from the state saved after k calls gives the same outputs as the hook that
// went on (residuals, momenta, server residuals, call counters: the generators' draws).
func TestCompressedResume(t *testing.T) {
	const p, n, k = 3, 500, 3
	for name, spec := range compressedSpecs {
		a := newWorld(t, p, spec)
		for call := range k {
			a.call(t, 0, grads(uint64(call), p, n))
		}
		b, states := restoredWorld(t, a, spec, []string{name + ".bucket0.meta"})
		if name == "dgc" || name == "signum" {
			if _, ok := states[0][name+".vec.bucket0.momentum"]; !ok {
				t.Fatalf("%s: the state lacks the momentum", spec)
			}
		}
		for call := k; call < k+2; call++ {
			gs := grads(uint64(call), p, n)
			want, _ := a.call(t, 0, gs)
			got, _ := b.call(t, 0, gs)
			for r := range p {
				if !slices.Equal(got[r], want[r]) {
					t.Fatalf("%s: call %d, rank %d: the restored hook's output differs", spec, call, r)
				}
			}
		}
	}
}

// Each compressor decodes what it encodes to within its quantisation: the exact cases hold
// exactly (powers of two for natural, ±1 signs, 8-bit levels), and the unbiased ones
// average to the input over many seeds.
func TestCompressorsRoundTrip(t *testing.T) {
	x := []float32{0.5, -0.25, 3, -1.5, 0, 1e-3, 7.75, -2}
	c := CompressCall{Size: 1}
	for _, tc := range []struct {
		comp Compressor
		tol  float64 // per element, relative to max|x|; 0: exact
		mean bool    // unbiased: check the mean over 4000 seeds instead
	}{
		{natural{}, 0.02, true},
		{qsgd{levels: 15, chunk: 3}, 0.02, true},
		{terngrad{}, 0.03, true},
		{minMax8{}, 1.0 / 510 * (7.75 + 2) / 7.75, false},
	} {
		got := make([]float32, len(x))
		draws := 1
		if tc.mean {
			draws = 4000
		}
		for s := range draws {
			c.Seed = uint64(s)
			msg := tc.comp.Compress(nil, x, c)
			if len(msg) != 4*tc.comp.Words(len(x)) {
				t.Fatalf("%T: %d bytes, Words says %d words", tc.comp, len(msg), tc.comp.Words(len(x)))
			}
			if err := tc.comp.Decompress(got, msg, c); err != nil {
				t.Fatal(err)
			}
		}
		for i := range x {
			if d := math.Abs(float64(got[i])/float64(draws) - float64(x[i])); d > tc.tol*7.75+1e-7 {
				t.Errorf("%T: element %d: decoded %v, input %v", tc.comp, i, got[i]/float32(draws), x[i])
			}
		}
		if err := tc.comp.Decompress(got, []byte{1, 2, 3}, c); err == nil || !strings.Contains(err.Error(), "words") {
			t.Errorf("%T: a truncated message gave %v, want an error naming its length", tc.comp, err)
		}
	}
	pow := []float32{0.5, -4, 1, 0, -0.125}
	got := make([]float32, len(pow))
	if err := (natural{}).Decompress(got, natural{}.Compress(nil, pow, c), c); err != nil || !slices.Equal(got, pow) {
		t.Errorf("natural: powers of two decode to %v (%v), want them unchanged", got, err)
	}
}

// Bad options are refused with the option's name.
func TestCompressedOptionErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"qsgd:levels=0":     "levels=0",
		"qsgd:chunk=-1":     "chunk=-1",
		"terngrad:clip=-1":  "clip=-1",
		"signum:beta=1":     "beta=1",
		"randomk:density=0": "density=0",
		"threshold:v=0":     "v=0",
		"dgc:momentum=1":    "momentum=1",
		"dgc:warmup=-2":     "warmup=-2",
		"dgc:density=2":     "density=2",
		"qsgd:levels=x":     `levels="x" is not an integer`,
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", spec, err, want)
		}
	}
}

// efsignsgd scales each tensor of the bucket by its own mean magnitude (scale=tensor) or the
// whole bucket by one (scale=bucket, the default): with P = 1 the output is the message's
// decoding, which shows the scales; the words received are (P-1)(⌈n/32⌉+T) and (P-1)(⌈n/32⌉+1);
// the error feedback conserves either way.
func TestEFSignSGDScalesPerTensor(t *testing.T) {
	sizes := []int{40, 7, 100} // tensors of very different magnitudes below
	n := 147
	for _, tc := range []struct {
		spec    string
		tensors int
	}{{"efsignsgd:scale=tensor", 3}, {"efsignsgd", 1}} {
		// the decoding on one rank: ±mean|G_t| per tensor t (or per bucket)
		one := newWorld(t, 1, tc.spec)
		one.params = namedParams(sizes...)
		g := heavyTailed(5, 0, n)
		for i := 40; i < 47; i++ {
			g[i] *= 1000
		}
		out, _ := one.call(t, 0, [][]float32{g})
		segs := []int{0, 40, 47, 147}
		if tc.tensors == 1 {
			segs = []int{0, 147}
		}
		for s := range len(segs) - 1 {
			want := meanAbs(g[segs[s]:segs[s+1]])
			for i := segs[s]; i < segs[s+1]; i++ {
				if math.Abs(float64(out[0][i])) != float64(want) || (out[0][i] < 0) != (g[i] < 0) {
					t.Fatalf("%s: element %d (part %d) = %v, want %v·sign(%v)", tc.spec, i, s, out[0][i], want, g[i])
				}
			}
		}
		for p := 2; p <= 4; p++ {
			w := newWorld(t, p, tc.spec)
			w.params = namedParams(sizes...)
			for it := range 3 {
				name := fmt.Sprintf("%s/P=%d/call %d", tc.spec, p, it)
				gs := grads(uint64(7*p+it), p, n)
				before := w.residuals(n)
				outs, stats := w.call(t, 0, gs)
				checkIdentical(t, name, outs)
				checkConservation(t, name, gs, before, w.residuals(n), outs[0])
				want := int64((p - 1) * ((n+31)/32 + tc.tensors))
				for r, s := range stats {
					if s.BytesRecv != 4*want {
						t.Fatalf("%s: rank %d received %d words, want (P-1)(⌈n/32⌉+%d) = %d", name, r, s.BytesRecv/4, tc.tensors, want)
					}
				}
			}
		}
	}
	if _, err := Parse("efsignsgd:scale=layer"); err == nil || !strings.Contains(err.Error(), "scale") || !strings.Contains(err.Error(), "tensor") {
		t.Errorf("efsignsgd:scale=layer: %v", err)
	}
}

// efsignsgd and onebit take the whole model as one bucket by default (the PyTorch yardsticks'
// vector, DeepSpeed's flattened buffer; DDP's buckets, each with its own scales, diverged on
// VGG-11), DDP's buckets with buckets=ddp.
func TestSignScalesPlanOneBucket(t *testing.T) {
	ps := namedParams(3, 5, 7)
	for spec, want := range map[string][][]int{"efsignsgd": {{2, 1, 0}}, "efsignsgd:buckets=ddp": nil, "qsgd": nil,
		"onebit": {{2, 1, 0}}, "onebit:buckets=ddp": nil} {
		h, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := h.(ddp.Planner).Plan(ps)
		if err != nil || !slices.EqualFunc(plan, want, slices.Equal) {
			t.Errorf("%s: plan %v (%v), want %v", spec, plan, err, want)
		}
	}
}

// terngrad ternarizes layer by layer (the paper's default): every decoded element of layer t
// is 0 or ±s_t with s_t the layer's largest clipped magnitude, the words received are
// (P-1)(⌈n/16⌉+T); with scale=bucket one s for the bucket and (P-1)(⌈n/16⌉+1).
func TestTernGradScalesPerLayer(t *testing.T) {
	sizes, n := []int{40, 7, 100}, 147
	segs := []int{0, 40, 47, 147}
	for spec, parts := range map[string]int{"terngrad:clip=0": 3, "terngrad:clip=0,scale=bucket": 1} {
		one := newWorld(t, 1, spec)
		one.params = namedParams(sizes...)
		g := heavyTailed(9, 0, n)
		for i := 40; i < 47; i++ {
			g[i] *= 1000
		}
		out, _ := one.call(t, 0, [][]float32{g})
		for j := range 3 {
			lo, hi := segs[j], segs[j+1]
			if parts == 1 {
				lo, hi = 0, n
			}
			var s float32
			for _, v := range g[lo:hi] {
				s = max(s, float32(math.Abs(float64(v))))
			}
			for i := segs[j]; i < segs[j+1]; i++ {
				if v := out[0][i]; v != 0 && (v != s && v != -s || (v < 0) != (g[i] < 0)) {
					t.Fatalf("%s: element %d = %v, want 0 or %v·sign(%v)", spec, i, v, s, g[i])
				}
			}
		}
		w := newWorld(t, 3, spec)
		w.params = namedParams(sizes...)
		_, stats := w.call(t, 0, grads(4, 3, n))
		for r, st := range stats {
			if want := int64(2 * ((n+15)/16 + parts)); st.BytesRecv != 4*want {
				t.Errorf("%s: rank %d received %d words, want (P-1)(⌈n/16⌉+%d) = %d", spec, r, st.BytesRecv/4, parts, want)
			}
		}
	}
}
