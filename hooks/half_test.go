package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
)

// memory gives the test harness (hookMemory) the inner hook's error-feedback Memory.
func (w *Wrapped16) memory() *Memory {
	if m, ok := w.Inner.(interface{ memory() *Memory }); ok {
		return m.memory()
	}
	return nil
}

// refRound is the float64 reference for rounding x to a binary format with p significand bits
// (the implicit one included), smallest normal exponent emin and largest finite value max:
// round to nearest, ties to even, in units of the ulp of x's binade (fixed at 2^(emin-p+1)
// below 2^emin), overflow to Inf. It shares no code or bit tricks with the converters.
func refRound(x float64, p, emin int, max float64) float64 {
	if x == 0 || math.IsInf(x, 0) {
		return x
	}
	a := math.Abs(x)
	_, e := math.Frexp(a) // a in [2^(e-1), 2^e)
	ex := e - 1
	if ex < emin {
		ex = emin
	}
	q := math.Ldexp(1, ex-p+1)
	r := math.RoundToEven(a/q) * q // a/q is exact: a power-of-two division of a float32
	if r > max {
		r = math.Inf(1)
	}
	return math.Copysign(r, x)
}

func refHalf(x float32) float64 { return refRound(float64(x), 11, -14, 65504) }
func refBF16(x float32) float64 {
	return refRound(float64(x), 8, -126, float64(math.Float32frombits(0x7f7f0000)))
}

// checkConversion compares one conversion with the reference, sign of zero included.
func checkConversion(t *testing.T, f Format16, x float32) {
	t.Helper()
	want := refHalf(x)
	if f == BF16 {
		want = refBF16(x)
	}
	got := float64(f.Round(x))
	if got != want || math.Signbit(got) != math.Signbit(want) {
		t.Fatalf("%v: %v (bits %#08x) rounds to %v (bits %#04x), want %v", f, x, math.Float32bits(x), got, f.Encode(x), want)
	}
}

// Every one of the 65536 16-bit values decodes to float32 and encodes back to itself (NaNs:
// to a quiet NaN of the same sign and payload).
func TestHalfRoundTripAll65536(t *testing.T) {
	for _, f := range []Format16{FP16, BF16} {
		quiet := map[Format16]uint16{FP16: 0x0200, BF16: 0x0040}[f]
		for h := range 1 << 16 {
			x := f.Decode(uint16(h))
			back := f.Encode(x)
			if x != x {
				if back|quiet != uint16(h)|quiet || f.Decode(back) == f.Decode(back) {
					t.Fatalf("%v: NaN %#04x came back as %#04x", f, h, back)
				}
				continue
			}
			if back != uint16(h) {
				t.Fatalf("%v: %#04x decodes to %v, which encodes to %#04x", f, h, x, back)
			}
			if want := refHalf(x); f == FP16 && float64(x) != want {
				t.Fatalf("fp16 %#04x decodes to %v, not a binary16 value", h, x)
			}
		}
	}
}

// Conversions round to nearest, ties to even, exactly as the float64 reference: at every
// rounding boundary (the midpoint between every pair of adjacent 16-bit values, and the float32
// values just below and above it) and on random float32 bit patterns of every exponent.
func TestHalfConversionMatchesReference(t *testing.T) {
	for _, f := range []Format16{FP16, BF16} {
		for h := range 1<<15 - 1 { // non-negative finite values and their successors (the last: Inf)
			lo, hi := f.Decode(uint16(h)), f.Decode(uint16(h+1))
			if lo != lo || hi != hi {
				continue
			}
			mid := float32((float64(lo) + float64(hi)) / 2) // exact: 12 or 9 significant bits
			if math.IsInf(float64(hi), 0) {
				// The overflow threshold: half an ulp above the largest finite value.
				mid = map[Format16]float32{FP16: 65520, BF16: math.Float32frombits(0x7f7f8000)}[f]
			}
			for _, x := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))), lo} {
				checkConversion(t, f, x)
				checkConversion(t, f, -x)
			}
		}
		rng := rand.New(rand.NewPCG(1, uint64(f)))
		for range 200000 {
			x := math.Float32frombits(rng.Uint32())
			if x != x {
				continue
			}
			checkConversion(t, f, x)
		}
		for e := range 255 { // every exponent, random fractions
			for range 64 {
				x := math.Float32frombits(uint32(e)<<23 | rng.Uint32()&0x807fffff)
				checkConversion(t, f, x)
			}
		}
	}
}

func TestHalfSpecialValues(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, c := range []struct {
		f    Format16
		x    float32
		want uint16
	}{
		{FP16, 65504, 0x7bff}, {FP16, 65519.996, 0x7bff}, {FP16, 65520, 0x7c00}, {FP16, -70000, 0xfc00},
		{FP16, inf, 0x7c00}, {FP16, -inf, 0xfc00}, {FP16, 0x1p-24, 0x0001}, {FP16, 0x1p-25, 0x0000},
		{FP16, 0x1.000002p-25, 0x0001}, {FP16, 0x1.8p-24, 0x0002}, {FP16, -0x1p-14, 0x8400},
		{FP16, 0x1.ffep-15, 0x0400}, {FP16, 0x1.ffcp-15, 0x0400}, {FP16, 0x1.ff8p-15, 0x03ff}, {FP16, float32(math.Copysign(0, -1)), 0x8000}, {FP16, 1, 0x3c00},
		{BF16, 1, 0x3f80}, {BF16, math.MaxFloat32, 0x7f80}, {BF16, -inf, 0xff80},
		{BF16, 0x1.01p0, 0x3f80}, {BF16, 0x1.03p0, 0x3f82}, {BF16, 0x1p-149, 0x0000}, {BF16, 0x1p-133, 0x0001},
	} {
		if got := c.f.Encode(c.x); got != c.want {
			t.Errorf("%v.Encode(%v) = %#04x, want %#04x", c.f, c.x, got, c.want)
		}
	}
	for _, f := range []Format16{FP16, BF16} {
		for _, nan := range []uint32{0x7fc00000, 0xffc00001, 0x7f800001, 0xff800001} {
			x := math.Float32frombits(nan)
			got := f.Decode(f.Encode(x))
			if got == got || math.Signbit(float64(got)) != (nan>>31 == 1) {
				t.Errorf("%v: NaN %#08x became %v (bits %#04x)", f, nan, got, f.Encode(x))
			}
		}
	}
}

// The conversions agree with numpy's float16 cast and torch's bfloat16 cast on the golden
// bit patterns (scripts/torch_half_golden.py).
func TestHalfGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/half_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Float32 []uint32 `json:"float32_bits"`
		FP16    []uint16 `json:"fp16_bits"`
		BF16    []uint16 `json:"bf16_bits"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Float32) < 1000 || len(g.FP16) != len(g.Float32) || len(g.BF16) != len(g.Float32) {
		t.Fatalf("golden file has %d/%d/%d entries", len(g.Float32), len(g.FP16), len(g.BF16))
	}
	for i, b := range g.Float32 {
		x := math.Float32frombits(b)
		if got := Float32ToHalf(x); got != g.FP16[i] {
			t.Errorf("Float32ToHalf(%v = %#08x) = %#04x, numpy %#04x", x, b, got, g.FP16[i])
		}
		if got := Float32ToBFloat16(x); got != g.BF16[i] {
			t.Errorf("Float32ToBFloat16(%v = %#08x) = %#04x, torch %#04x", x, b, got, g.BF16[i])
		}
	}
}

// run16 runs AllReduce16 on P in-process ranks and returns each rank's result and traffic.
func run16(t *testing.T, f Format16, alg comm.Algorithm, in [][]uint16) ([][]uint16, []comm.Stats) {
	t.Helper()
	p := len(in)
	groups := commtest.Groups(t, p)
	defer commtest.Close(groups)
	outs := make([][]uint16, p)
	stats, err := onEveryRank(groups, 30*time.Second, func(ctx context.Context, r int) error {
		outs[r] = append([]uint16(nil), in[r]...)
		return AllReduce16(ctx, groups[r], 1<<16, outs[r], f, alg)
	})
	if err != nil {
		t.Fatal(err)
	}
	return outs, stats
}

// AllReduce16: every rank gets the same bits, within the documented bound of the exact sum
// of the decoded inputs; 16-bit words on the wire (2 bytes per element: the ring receives
// exactly 2·2n(P-1)/P bytes); and exact results where the 16-bit sums are exact.
func TestAllReduce16(t *testing.T) {
	for _, f := range []Format16{FP16, BF16} {
		for _, alg := range []comm.Algorithm{comm.Ring, comm.Rabenseifner, comm.RecursiveDoubling, comm.Auto} {
			for _, p := range []int{2, 3, 4, 5, 8} {
				for _, n := range []int{1, 7, 1000, 3001} {
					rng := rand.New(rand.NewPCG(uint64(p), uint64(n)))
					in := make([][]uint16, p)
					ints := make([][]uint16, p)
					for r := range p {
						in[r], ints[r] = make([]uint16, n), make([]uint16, n)
						for i := range n {
							// Magnitudes from fp16's subnormals to 1000 (8 of them sum below 65504).
							x := rng.NormFloat64() * math.Exp(2*rng.NormFloat64())
							in[r][i] = f.Encode(float32(max(-1000, min(1000, x))))
							ints[r][i] = f.Encode(float32(rng.IntN(61) - 30))
						}
					}
					what := fmt.Sprintf("%v/%v/P=%d/n=%d", f, alg, p, n)
					outs, stats := run16(t, f, alg, in)
					for r := 1; r < p; r++ {
						for i := range n {
							if outs[r][i] != outs[0][i] {
								t.Fatalf("%s: rank %d element %d = %#04x, rank 0 has %#04x", what, r, i, outs[r][i], outs[0][i])
							}
						}
					}
					u := f.UnitRoundoff() + 0x1p-24
					for i := range n {
						var sum, abs float64
						for r := range p {
							x := float64(f.Decode(in[r][i]))
							sum += x
							abs += math.Abs(x)
						}
						bound := 1.01*float64(p-1)*u*abs + float64(p-1)*f.Underflow()
						if got := float64(f.Decode(outs[0][i])); !(math.Abs(got-sum) <= bound) {
							t.Fatalf("%s: element %d = %v, exact sum %v, bound %g", what, i, got, sum, bound)
						}
					}
					if alg == comm.Ring && n%p == 0 {
						for r, s := range stats {
							if want := int64(2 * 2 * n * (p - 1) / p); s.BytesRecv != want || s.Rounds != int64(2*(p-1)) {
								t.Fatalf("%s: rank %d received %d bytes in %d rounds, want %d bytes (2 per element) in %d", what, r, s.BytesRecv, s.Rounds, want, 2*(p-1))
							}
						}
					}
					// Integers up to 30·8 are exact in both formats, and so is every partial sum.
					outs, _ = run16(t, f, alg, ints)
					for i := range n {
						var sum float32
						for r := range p {
							sum += f.Decode(ints[r][i])
						}
						if got := f.Decode(outs[0][i]); got != sum {
							t.Fatalf("%s: integer element %d = %v, want exactly %v", what, i, got, sum)
						}
					}
				}
			}
		}
	}
}

// Every rank gets the same bits even from random 16-bit patterns, NaNs with different payloads
// among them: partners of an exchange add the same operands in the same order (the lower
// rank's first), so the payload a NaN sum keeps is the same everywhere.
func TestAllReduce16SameBitsWithNaNs(t *testing.T) {
	for _, f := range []Format16{FP16, BF16} {
		for _, alg := range []comm.Algorithm{comm.Ring, comm.Rabenseifner, comm.RecursiveDoubling} {
			for _, p := range []int{2, 3, 4, 5, 8} {
				const n = 3001
				rng := rand.New(rand.NewPCG(uint64(p), uint64(alg)))
				in := make([][]uint16, p)
				for r := range in {
					in[r] = make([]uint16, n)
					for i := range in[r] {
						in[r][i] = uint16(rng.Uint32())
					}
				}
				outs, _ := run16(t, f, alg, in)
				for r := 1; r < p; r++ {
					for i := range n {
						if outs[r][i] != outs[0][i] {
							t.Fatalf("%v/%v/P=%d: rank %d element %d = %#04x, rank 0 has %#04x", f, alg, p, r, i, outs[r][i], outs[0][i])
						}
					}
				}
			}
		}
	}
}

func TestAllReduce16Errors(t *testing.T) {
	groups := commtest.Groups(t, 1)
	if err := AllReduce16(context.Background(), groups[0], 1, []uint16{1}, Format16(9), comm.Ring); err == nil || !strings.Contains(err.Error(), "unknown 16-bit format") {
		t.Errorf("bad format: %v", err)
	}
	if err := AllReduce16(context.Background(), groups[0], 1, []uint16{1}, FP16, comm.Bruck); err == nil || !strings.Contains(err.Error(), "not an all-reduce algorithm") {
		t.Errorf("bad algorithm: %v", err)
	}
	// Ranks that disagree on the length get an error, not a hang or a wrong sum.
	groups = commtest.Groups(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { errs[r] = AllReduce16(ctx, groups[r], 1, make([]uint16, 2000+r), BF16, comm.RecursiveDoubling) })
	}
	wg.Wait()
	if errs[0] == nil && errs[1] == nil {
		t.Error("ranks with 2000 and 2001 elements: no error")
	}
}

// The fp16 and bf16 hooks: the average of P ranks' gradients within the documented bound
// (one rounding of each g/P, at most P-1 rounded additions), bit-identical on every rank, in
// half the bytes of the float32 all-reduce with the same algorithm.
func TestCompress16Hooks(t *testing.T) {
	const n = 2000
	for _, f := range []Format16{FP16, BF16} {
		for _, p := range []int{2, 3, 4, 5, 8} {
			gs := grads(uint64(p), p, n)
			w := newWorld(t, p, f.String()+":algorithm=ring")
			outs, stats := w.call(t, 0, gs)
			what := fmt.Sprintf("%v/P=%d", f, p)
			checkIdentical(t, what, outs)
			u := f.UnitRoundoff() + 0x1p-24
			for i := range n {
				var sum, abs float64
				for r := range p {
					sum += float64(gs[r][i])
					abs += math.Abs(float64(gs[r][i]))
				}
				mean, s := sum/float64(p), abs/float64(p)
				bound := 1.01*float64(p)*u*s + float64(2*p)*f.Underflow()
				if got := float64(outs[0][i]); !(math.Abs(got-mean) <= bound) {
					t.Fatalf("%s: element %d = %v, mean %v, bound %g", what, i, got, mean, bound)
				}
				if f.Round(outs[0][i]) != outs[0][i] {
					t.Fatalf("%s: element %d = %v is not a %v value", what, i, outs[0][i], f)
				}
			}
			dense := newWorld(t, p, "allreduce:algorithm=ring")
			_, dstats := dense.call(t, 0, gs)
			for r := range p {
				if 2*stats[r].BytesRecv != dstats[r].BytesRecv || stats[r].Rounds != dstats[r].Rounds {
					t.Fatalf("%s: rank %d: %d bytes in %d rounds; allreduce %d bytes in %d rounds: want half the bytes, same rounds",
						what, r, stats[r].BytesRecv, stats[r].Rounds, dstats[r].BytesRecv, dstats[r].Rounds)
				}
			}
			w.close()
			dense.close()
		}
	}
	// Like PyTorch, the hook divides before the sum: 8 ranks of 30000 average to 30000 in
	// fp16, where a sum would overflow.
	gs := make([][]float32, 8)
	for r := range gs {
		gs[r] = []float32{30000, -30000, 1}
	}
	outs, _ := newWorld(t, 8, "fp16").call(t, 0, gs)
	if outs[0][0] != 30000 || outs[0][1] != -30000 || outs[0][2] != 1 {
		t.Errorf("fp16 average of 8×[30000 -30000 1] = %v", outs[0])
	}
}

// noop returns the local gradient, undivided, and sends nothing.
func TestNoop(t *testing.T) {
	gs := grads(3, 3, 100)
	w := newWorld(t, 3, "noop")
	outs, stats := w.call(t, 0, gs)
	for r := range outs {
		for i := range outs[r] {
			if math.Float32bits(outs[r][i]) != math.Float32bits(gs[r][i]) {
				t.Fatalf("rank %d element %d = %v, want its own gradient %v", r, i, outs[r][i], gs[r][i])
			}
		}
		if stats[r].BytesSent != 0 || stats[r].Rounds != 0 {
			t.Fatalf("rank %d communicated: %+v", r, stats[r])
		}
	}
	if _, err := Parse("noop:x=1"); err == nil || !strings.Contains(err.Error(), "noop takes no options") {
		t.Errorf("noop:x=1: %v", err)
	}
	if !strings.Contains(Help(), "does NOT train correctly") {
		t.Error("noop's help does not warn that it does not train")
	}
}

// The wrapper spec: "fp16+SPEC" wraps SPEC's hook with SPEC's options; old specs parse as before.
func TestParseWrappers(t *testing.T) {
	h, err := Parse("fp16+powersgd:rank=4,start_iter=10")
	if err != nil {
		t.Fatal(err)
	}
	w, ok := h.(*Wrapped16)
	if !ok || w.Format != FP16 || w.Name() != "fp16+powersgd" {
		t.Fatalf("fp16+powersgd: %T %v", h, h.Name())
	}
	if ps := w.Inner.(*PowerSGD); ps.Rank != 4 || ps.StartIter != 10 || ps.allReduce == nil {
		t.Fatalf("inner powersgd: rank %d, start %d, 16-bit all-reduce set: %v", ps.Rank, ps.StartIter, ps.allReduce != nil)
	}
	h, err = Parse(" bf16+allreduce:algorithm=ring")
	if c, ok := h.(*Compress16); err != nil || !ok || c.Format != BF16 || c.Algorithm != comm.Ring {
		t.Fatalf("bf16+allreduce:algorithm=ring = %#v, %v; want the bf16 hook with the ring", h, err)
	}
	if h, err := Parse("bf16+topka:density=0.1"); err != nil || h.Name() != "bf16+topka" {
		t.Fatalf("bf16+topka: %v %v", h, err)
	}
	if h, err := Parse("fp16:algorithm=ring"); err != nil || h.(*Compress16).Algorithm != comm.Ring {
		t.Fatalf("fp16:algorithm=ring: %v %v", h, err)
	}
	for spec, want := range map[string]string{
		"noop+allreduce":             "noop in \"noop+allreduce\" cannot wrap another hook (wrappers: bf16, fp16)",
		"fp16+nope":                  `unknown hook "nope"`,
		"fp17+allreduce":             `unknown hook "fp17"`,
		"fp16+bf16":                  "cannot wrap the 16-bit hook bf16",
		"fp16+powersgd:bogus=1":      `powersgd has no option "bogus"`,
		"fp16+powersgd:rank=0":       "option rank=0, want >= 1",
		"bf16+powersgd:warm_start=x": `option warm_start="x" is not true or false`,
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", spec, err, want)
		}
	}
	if !strings.Contains(Help(), "fp16+SPEC") {
		t.Error("Help does not show the wrapper syntax")
	}
}

// The wrapper: its input and output are 16-bit values; around powersgd every message is
// 16-bit (half the bytes, same rounds); around a sparse hook the messages are unchanged.
func TestWrapped16(t *testing.T) {
	const p = 4
	shapes := [][]int{{8, 3, 3, 3}, {8}, {6, 20}, {3, 4}}
	for _, f := range []Format16{FP16, BF16} {
		for _, c := range []struct{ inner, wrapped string }{
			{"powersgd:rank=2,start_iter=1", f.String() + "+powersgd:rank=2,start_iter=1"},
		} {
			plain, wrapped := newPSGDWorld(t, p, c.inner, shapes), newPSGDWorld(t, p, c.wrapped, shapes)
			for call := range 3 {
				gs := grads(uint64(10+call), p, plain.n)
				pouts, pstats := plain.call(t, gs)
				wouts, wstats := wrapped.call(t, gs)
				checkIdentical(t, c.wrapped, wouts)
				for r := range p {
					if 2*wstats[r].BytesRecv != pstats[r].BytesRecv || wstats[r].Rounds != pstats[r].Rounds {
						t.Fatalf("%s call %d rank %d: %d bytes in %d rounds; unwrapped %d bytes in %d rounds", c.wrapped, call, r, wstats[r].BytesRecv, wstats[r].Rounds, pstats[r].BytesRecv, pstats[r].Rounds)
					}
				}
				for i, x := range wouts[0] {
					if f.Round(x) != x {
						t.Fatalf("%s: output %d = %v is not a %v value", c.wrapped, i, x, f)
					}
					// Before start_iter both are averages: equal up to 16-bit rounding. (After it
					// they are rank-2 approximations from slightly different inputs: the subspace
					// of a random matrix may turn, so they are not compared.)
					if tol := 4 * f.UnitRoundoff() * (math.Abs(float64(pouts[0][i])) + 1); call == 0 && math.Abs(float64(x-pouts[0][i])) > tol {
						t.Fatalf("%s call %d: output %d = %v, unwrapped %v", c.wrapped, call, i, x, pouts[0][i])
					}
				}
			}
		}
		// At full rank the wrapped powersgd still returns the average, up to 16-bit rounding.
		full := newPSGDWorld(t, p, f.String()+"+powersgd:rank=9,start_iter=0,min_compression_rate=0", psgdShapes)
		for call := range 2 {
			gs := grads(uint64(20+call), p, full.n)
			before := full.errors()
			outs, _ := full.call(t, gs)
			var scale float64
			means := make([]float64, full.n)
			for i := range full.n {
				for r := range p {
					means[i] += float64(f.Round(gs[r][i])) + float64(before[r][i])
				}
				means[i] /= p
				scale = max(scale, math.Abs(means[i]))
			}
			for i, m := range means {
				if tol := 32 * f.UnitRoundoff() * scale; math.Abs(float64(outs[0][i])-m) > tol {
					t.Fatalf("%v+powersgd at full rank, call %d: output %d = %v, average %v (tolerance %g)", f, call, i, outs[0][i], m, tol)
				}
			}
		}

		gs := grads(7, p, 3000)
		plain, wrapped := newWorld(t, p, "topka:density=0.05"), newWorld(t, p, f.String()+"+topka:density=0.05")
		_, pstats := plain.call(t, 0, gs)
		wouts, wstats := wrapped.call(t, 0, gs)
		for r := range p {
			if wstats[r].BytesRecv != pstats[r].BytesRecv {
				t.Fatalf("%v+topka: rank %d received %d bytes, unwrapped %d: a sparse hook's messages are not 16-bit", f, r, wstats[r].BytesRecv, pstats[r].BytesRecv)
			}
		}
		for i, x := range wouts[0] {
			if f.Round(x) != x {
				t.Fatalf("%v+topka: output %d = %v is not a %v value", f, i, x, f)
			}
		}
		// The wrapper saves and restores the inner hook's state.
		st, err := wrapped.hooks[0].(ddp.Stateful).State()
		if err != nil || len(st) == 0 {
			t.Fatalf("%v+topka State: %d keys, %v", f, len(st), err)
		}
		fresh, _ := Parse(f.String() + "+topka:density=0.05")
		if err := fresh.(ddp.Stateful).LoadState(st); err != nil {
			t.Fatal(err)
		}
	}
}
