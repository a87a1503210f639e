package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// psgdBucket is a ddp.Bucket with parameters, so PowerSGD sees matrices.
type psgdBucket struct {
	flat   []float32
	params []*nn.Param
	offs   []int
}

func (b *psgdBucket) Index() int          { return 0 }
func (b *psgdBucket) Iteration() int64    { return 0 }
func (b *psgdBucket) IsLast() bool        { return true }
func (b *psgdBucket) Flat() []float32     { return b.flat }
func (b *psgdBucket) Params() []*nn.Param { return b.params }
func (b *psgdBucket) Offsets() []int      { return b.offs }
func (b *psgdBucket) Tag() uint32         { return 1 << 16 }

// psgdWorld is P ranks, each with its own hook, calling one bucket of parameters of the given
// shapes.
type psgdWorld struct {
	groups []comm.Group
	hooks  []ddp.CommHook
	params []*nn.Param
	offs   []int
	n      int
}

func newPSGDWorld(t testing.TB, p int, spec string, shapes [][]int) *psgdWorld {
	t.Helper()
	base := newWorld(t, p, spec)
	w := &psgdWorld{groups: base.groups, hooks: base.hooks}
	for i, s := range shapes {
		prm := nn.NewParam(fmt.Sprintf("p%d", i), s...)
		w.params = append(w.params, prm)
		w.offs = append(w.offs, w.n)
		w.n += prm.Len()
	}
	return w
}

// call runs every rank's hook once on grads[r] (copied) and returns the outputs and each
// rank's traffic during the call.
func (w *psgdWorld) call(t testing.TB, grads [][]float32) ([][]float32, []comm.Stats) {
	t.Helper()
	outs, stats, err := w.try(grads)
	if err != nil {
		t.Fatal(err)
	}
	return outs, stats
}

func (w *psgdWorld) try(grads [][]float32) ([][]float32, []comm.Stats, error) {
	outs := make([][]float32, len(w.groups))
	stats, err := onEveryRank(w.groups, 30*time.Second, func(ctx context.Context, r int) error {
		b := &psgdBucket{flat: slices.Clone(grads[r]), params: w.params, offs: w.offs}
		res, err := w.hooks[r].Run(ctx, w.groups[r], b).Wait()
		outs[r] = slices.Clone(res)
		return err
	})
	return outs, stats, err
}

// errors returns every rank's error-feedback memory (zeros before the first call).
func (w *psgdWorld) errors() [][]float32 {
	es := make([][]float32, len(w.hooks))
	for r := range w.hooks {
		es[r] = (&world{hooks: w.hooks}).residual(r, 0, w.n)
	}
	return es
}

func powerOf(t testing.TB, h ddp.CommHook) *PowerSGD {
	t.Helper()
	if w, ok := h.(*Wrapped16); ok {
		h = w.Inner
	}
	ps, ok := h.(*PowerSGD)
	if !ok {
		t.Fatalf("%T is not PowerSGD", h)
	}
	return ps
}

var psgdShapes = [][]int{{8, 3, 3, 3}, {8}, {6, 20}, {3, 4}}

// With rank >= min(rows, cols) for every matrix (and every tensor compressed), one power
// iteration spans the summed matrix's columns: the output equals all-reduce's average of the
// inputs (gradient plus error) within 1e-4, on every call.
func TestPowerSGDFullRankIsExact(t *testing.T) {
	shapes := [][]int{{5, 7}, {9, 4}, {6}, {3, 3, 2}, {4, 1, 1}}
	for _, p := range []int{2, 3, 5} {
		w := newPSGDWorld(t, p, "powersgd:rank=9,start_iter=0,min_compression_rate=0", shapes)
		for call := range 3 {
			gs := grads(uint64(100*p+call), p, w.n)
			before := w.errors()
			outs, _ := w.call(t, gs)
			checkIdentical(t, "full rank", outs)
			for i := range w.n {
				var mean float64
				for r := range p {
					mean += float64(gs[r][i]) + float64(before[r][i])
				}
				mean /= float64(p)
				if d := math.Abs(float64(outs[0][i]) - mean); !(d <= 1e-4) {
					t.Fatalf("P=%d call %d element %d: %v, all-reduce average %v (|diff| %g)", p, call, i, outs[0][i], mean, d)
				}
			}
			if _, before, after := powerOf(t, w.hooks[0]).CompressionStats(); before != int64((call+1)*w.n) || after <= before {
				t.Fatalf("P=%d: compression stats %d → %d: every tensor should have been compressed (at rank 9 that costs more)", p, before, after)
			}
		}
	}
}

// The conservation test of docs/ALGORITHMS.md §0 (summed input = P·output + summed new errors) for
// P in {2, 3, 4, 5, 8}, ranks 1 and 2, over several calls (dense, then compressed with warm
// start), and replica consistency of the outputs.
func TestPowerSGDConservation(t *testing.T) {
	for _, spec := range []string{"powersgd:rank=1,start_iter=1", "powersgd:rank=2,start_iter=0", "powersgd:rank=2,start_iter=0,warm_start=false,seed=3"} {
		for _, p := range []int{2, 3, 4, 5, 8} {
			w := newPSGDWorld(t, p, spec, psgdShapes)
			for call := range 4 {
				what := fmt.Sprintf("%s/P=%d/call %d", spec, p, call)
				gs := grads(uint64(7*p+call), p, w.n)
				before := w.errors()
				outs, _ := w.call(t, gs)
				checkIdentical(t, what, outs)
				checkConservation(t, what, gs, before, w.errors(), outs[0])
				// The uncompressed tensors ([8] and [3,4]) are averaged.
				pl, err := powerOf(t, w.hooks[0]).plan(&psgdBucket{flat: make([]float32, w.n), params: w.params, offs: w.offs})
				if err != nil || len(pl.spans) != 2 {
					t.Fatalf("%s: plan %v, %v", what, pl.spans, err)
				}
				for _, sp := range pl.spans {
					for i := sp[0]; i < sp[0]+sp[1]; i++ {
						var mean float64
						for r := range p {
							mean += float64(gs[r][i]) + float64(before[r][i])
						}
						mean /= float64(p)
						if math.Abs(float64(outs[0][i])-mean) > 1e-6*(1+math.Abs(mean)) {
							t.Fatalf("%s: uncompressed element %d = %v, average %v", what, i, outs[0][i], mean)
						}
					}
				}
				if call >= 1 {
					// A compressed call: the rank-r output is not the average.
					var diff float64
					for i := range w.n {
						var mean float64
						for r := range p {
							mean += float64(gs[r][i]) + float64(before[r][i])
						}
						diff = max(diff, math.Abs(mean/float64(p)-float64(outs[0][i])))
					}
					if diff < 1e-3 {
						t.Fatalf("%s: output equals the average (max diff %g): nothing was compressed", what, diff)
					}
				}
			}
			commtest.Close(w.groups)
		}
	}
}

func checkOrthonormal(t *testing.T, what string, a []float32, rows, cols int) {
	t.Helper()
	for i := range cols {
		for j := range cols {
			var dot float64
			for k := range rows {
				dot += float64(a[k*cols+i]) * float64(a[k*cols+j])
			}
			want := 0.0
			if i == j {
				want = 1
			}
			if math.Abs(dot-want) > 1e-5 {
				t.Fatalf("%s: column %d · column %d = %v, want %v", what, i, j, dot, want)
			}
		}
	}
}

// Gram-Schmidt gives orthonormal columns spanning the same space (each original column is a
// combination of the first ones of the result); a zero column stays zero (no NaN); epsilon
// shrinks the norms below 1. Inside the hook, every P is orthonormal after a call.
func TestPowerSGDOrthogonalize(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, sz := range [][2]int{{1, 1}, {7, 1}, {7, 2}, {30, 4}, {12, 12}} {
		rows, cols := sz[0], sz[1]
		a := make([]float32, rows*cols)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		q := slices.Clone(a)
		orthogonalize(q, rows, cols, 0)
		what := fmt.Sprintf("%dx%d", rows, cols)
		checkOrthonormal(t, what, q, rows, cols)
		for j := range cols { // column j of a minus its projection on q's columns 0..j is zero
			for k := range rows {
				res := float64(a[k*cols+j])
				for i := 0; i <= j; i++ {
					var dot float64
					for l := range rows {
						dot += float64(q[l*cols+i]) * float64(a[l*cols+j])
					}
					res -= dot * float64(q[k*cols+i])
				}
				if math.Abs(res) > 1e-4 {
					t.Fatalf("%s: column %d is not in the span of the first %d orthonormal columns (residual %g)", what, j, j+1, res)
				}
			}
		}
	}
	z := []float32{1, 0, 2, 0, 3, 0} // 3×2, second column zero
	orthogonalize(z, 3, 2, 0)
	if z[1] != 0 || z[3] != 0 || z[5] != 0 || math.Abs(float64(z[0]*z[0]+z[2]*z[2]+z[4]*z[4])-1) > 1e-6 {
		t.Fatalf("zero column: %v", z)
	}
	e := []float32{3, 4}
	orthogonalize(e, 2, 1, 1)
	if e[0] != 0.5 || e[1] != float32(4.0/6) {
		t.Fatalf("epsilon 1: %v, want [3 4]/(5+1)", e)
	}

	w := newPSGDWorld(t, 3, "powersgd:rank=2,start_iter=0", psgdShapes)
	for call := range 2 {
		w.call(t, grads(uint64(call), 3, w.n))
		h := powerOf(t, w.hooks[1])
		pl, err := h.plan(&psgdBucket{flat: make([]float32, w.n), params: w.params, offs: w.offs})
		if err != nil {
			t.Fatal(err)
		}
		if len(pl.matrices) != 2 {
			t.Fatalf("%d compressed matrices, want 2 ([8,27] and [6,20]; [3,4] is not worth it)", len(pl.matrices))
		}
		for _, m := range pl.matrices {
			checkOrthonormal(t, fmt.Sprintf("P of the %dx%d matrix", m.rows, m.cols), h.buckets[0].p[m.pOff:m.pOff+m.rows*m.r], m.rows, m.r)
		}
	}
}

// countingAllReduce records the length of every all-reduce a hook makes.
type countingAllReduce struct {
	mu   sync.Mutex
	lens []int
}

func (c *countingAllReduce) fn(ctx context.Context, g comm.Group, tag uint32, buf []float32) error {
	if g.Rank() == 0 {
		c.mu.Lock()
		c.lens = append(c.lens, len(buf))
		c.mu.Unlock()
	}
	return AllReduce32(ctx, g, tag, buf)
}

func (c *countingAllReduce) take() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lens
	c.lens = nil
	return l
}

// The first start_iter calls are plain averages with no error; then exactly three all-reduces
// of the predicted sizes: the uncompressed tensors ([8] and [3,4]: 20), the Ps (8·2 + 6·2 =
// 28) and the Qs (27·2 + 20·2 = 94). Without error feedback no error is kept; without warm
// start no Q is kept.
func TestPowerSGDStartIterAndTraffic(t *testing.T) {
	const p = 3
	w := newPSGDWorld(t, p, "powersgd:rank=2,start_iter=2", psgdShapes)
	var c countingAllReduce
	for _, h := range w.hooks {
		h.(DenseAllReducer).SetAllReduce(c.fn)
	}
	for call := range 4 {
		gs := grads(uint64(call), p, w.n)
		outs, _ := w.call(t, gs)
		lens := c.take()
		if call < 2 {
			for i := range w.n {
				var mean float64
				for r := range p {
					mean += float64(gs[r][i])
				}
				mean /= p
				if math.Abs(float64(outs[0][i])-mean) > 1e-6*(1+math.Abs(mean)) {
					t.Fatalf("call %d (before start_iter): element %d = %v, mean %v", call, i, outs[0][i], mean)
				}
			}
			if !slices.Equal(lens, []int{w.n}) || slices.ContainsFunc(w.errors()[0], func(x float32) bool { return x != 0 }) {
				t.Fatalf("call %d (before start_iter): all-reduces %v (want [%d]) or a non-zero error", call, lens, w.n)
			}
			continue
		}
		if !slices.Equal(lens, []int{20, 28, 94}) {
			t.Fatalf("call %d: all-reduces of %v elements, want [20 28 94]", call, lens)
		}
	}
	rate, before, after := powerOf(t, w.hooks[0]).CompressionStats()
	if before != 2*356 || after != 2*(20+35*2+26*2) {
		t.Fatalf("compression stats %v %d %d", rate, before, after)
	}

	cold := newPSGDWorld(t, 2, "powersgd:rank=1,start_iter=0,use_error_feedback=false,warm_start=false", psgdShapes)
	for call := range 2 {
		cold.call(t, grads(uint64(call), 2, cold.n))
	}
	if slices.ContainsFunc(cold.errors()[1], func(x float32) bool { return x != 0 }) {
		t.Fatal("use_error_feedback=false kept an error")
	}
	st, err := cold.hooks[0].(ddp.Stateful).State()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st["powersgd.bucket0.q"]; ok {
		t.Fatal("warm_start=false kept a Q")
	}
}

// State and LoadState round-trip the error, the call counter and Q: hooks restored from a
// checkpoint continue bit-identically with the originals. Mismatched state is refused.
func TestPowerSGDStateRoundTrip(t *testing.T) {
	const p, spec = 3, "powersgd:rank=2,start_iter=1"
	a := newPSGDWorld(t, p, spec, psgdShapes)
	for call := range 3 {
		a.call(t, grads(uint64(call), p, a.n))
	}
	b := newPSGDWorld(t, p, spec, psgdShapes)
	for r := range p {
		st, err := a.hooks[r].(ddp.Stateful).State()
		if err != nil {
			t.Fatal(err)
		}
		if len(st["powersgd.bucket0.q"]) != 94 || len(st["powersgd.bucket0.residual"]) != a.n {
			t.Fatalf("rank %d: state has Q of %d and error of %d values", r, len(st["powersgd.bucket0.q"]), len(st["powersgd.bucket0.residual"]))
		}
		if err := b.hooks[r].(ddp.Stateful).LoadState(st); err != nil {
			t.Fatal(err)
		}
		again, _ := b.hooks[r].(ddp.Stateful).State() // restored, not yet run: saved again as it was
		if fmt.Sprint(again) != fmt.Sprint(st) {
			t.Fatalf("rank %d: state of a restored hook differs from the saved one", r)
		}
	}
	for call := 3; call < 5; call++ {
		gs := grads(uint64(call), p, a.n)
		outA, _ := a.call(t, gs)
		outB, _ := b.call(t, gs)
		for r := range p {
			if !slices.Equal(outA[r], outB[r]) {
				t.Fatalf("call %d rank %d: the restored hook's output differs", call, r)
			}
		}
		if fmt.Sprint(a.errors()) != fmt.Sprint(b.errors()) {
			t.Fatalf("call %d: the restored hook's errors differ", call)
		}
	}

	saved := make([]map[string][]float32, p)
	for r := range p {
		saved[r], _ = a.hooks[r].(ddp.Stateful).State()
	}
	bad := func(m map[string][]float32) []map[string][]float32 { return []map[string][]float32{m, m, m} }
	for _, c := range []struct {
		spec   string
		shapes [][]int
		st     []map[string][]float32
		want   string
	}{
		{"powersgd:rank=1,start_iter=1", psgdShapes, saved, "restored Q has 94 values, the bucket's matrices need 47"},
		{spec, [][]int{{8, 3, 3, 3}, {8}}, saved, "different bucket plan"},
		{spec, psgdShapes, bad(map[string][]float32{"powersgd.bucket0.q": {1}}), "bucket 0 has a Q but no meta entry"},
		{spec, psgdShapes, bad(map[string][]float32{"topka.bucket0.residual": {1}}), `key "topka.bucket0.residual" is not powersgd state`},
	} {
		w := newPSGDWorld(t, p, c.spec, c.shapes)
		var err error
		for r := range p {
			err = errors.Join(err, w.hooks[r].(ddp.Stateful).LoadState(c.st[r]))
		}
		if err == nil {
			_, _, err = w.try(grads(1, p, w.n))
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.spec, err, c.want)
		}
	}
}

// splitmixGradient is scripts/torch_powersgd_golden.py's input: element i of rank r at
// iteration it.
func splitmixGradient(r, it, n int) []float32 {
	g := make([]float32, n)
	for i := range g {
		z := uint64(i+1000*r+100000*it) + 0x9e3779b97f4a7c15
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		g[i] = float32(float64(z>>11)/(1<<53)*2 - 1)
	}
	return g
}

// PowerSGD against PyTorch's own powerSGD_hook (scripts/torch_powersgd_golden.py: two
// simulated ranks, start_powerSGD_iter=2, five iterations) started from the same random Qs:
// outputs of every iteration, final errors and final Q within 1e-5. The rank-4 case checks
// that spargo's Gram-Schmidt gives PyTorch's QR results (Q compared up to column signs).
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_powersgd_golden.py hooks/testdata/powersgd_golden.json
func TestPowerSGDGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/powersgd_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Shapes  [][]int
		Configs []struct {
			Name               string
			Rank               int
			MinCompressionRate float64              `json:"min_compression_rate"`
			UseErrorFeedback   bool                 `json:"use_error_feedback"`
			WarmStart          bool                 `json:"warm_start"`
			Outputs            [][]float32          `json:"outputs"`
			QDraws             map[string][]float32 `json:"q_draws"`
			Errors             [][]float32          `json:"errors"`
			QFinal             []float32            `json:"q_final"`
			NumelBefore        int64                `json:"numel_before"`
			NumelAfter         int64                `json:"numel_after"`
		}
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	var hdr struct {
		World      int `json:"world"`
		StartIter  int `json:"start_iter"`
		Iterations int `json:"iterations"`
	}
	if err := json.Unmarshal(raw, &hdr); err != nil {
		t.Fatal(err)
	}
	if len(g.Configs) != 3 || hdr.World != 2 || hdr.Iterations != 5 {
		t.Fatalf("unexpected golden file: %d configs, world %d, %d iterations", len(g.Configs), hdr.World, hdr.Iterations)
	}
	near := func(what string, got, want []float32, tol float64) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d values, golden %d", what, len(got), len(want))
		}
		var worst float64
		defer func() { t.Logf("%s: max |diff| %g", what, worst) }()
		for i := range got {
			worst = max(worst, math.Abs(float64(got[i]-want[i])))
			if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*max(1, math.Abs(float64(want[i])))) {
				t.Fatalf("%s: element %d = %v, PyTorch %v (|diff| %g)", what, i, got[i], want[i], d)
			}
		}
	}
	for _, c := range g.Configs {
		spec := fmt.Sprintf("powersgd:rank=%d,start_iter=%d,min_compression_rate=%v,use_error_feedback=%v,warm_start=%v",
			c.Rank, hdr.StartIter, c.MinCompressionRate, c.UseErrorFeedback, c.WarmStart)
		w := newPSGDWorld(t, hdr.World, spec, g.Shapes)
		for _, h := range w.hooks {
			powerOf(t, h).randomQ = func(_ uint64, _ int, call int64, q []float32) {
				d, ok := c.QDraws[fmt.Sprint(call)]
				if !ok || len(d) != len(q) {
					t.Errorf("%s: call %d draws %d Q values, PyTorch drew %d", c.Name, call, len(q), len(d))
				}
				copy(q, d)
			}
		}
		for it := range hdr.Iterations {
			gs := make([][]float32, hdr.World)
			for r := range gs {
				gs[r] = splitmixGradient(r, it, w.n)
			}
			outs, _ := w.call(t, gs)
			checkIdentical(t, c.Name, outs)
			near(fmt.Sprintf("%s iteration %d output", c.Name, it), outs[0], c.Outputs[it], 1e-5)
		}
		if c.UseErrorFeedback {
			for r, e := range w.errors() {
				near(fmt.Sprintf("%s rank %d error", c.Name, r), e, c.Errors[r], 1e-5)
			}
		}
		h := powerOf(t, w.hooks[0])
		if c.WarmStart {
			q := slices.Clone(h.buckets[0].q)
			if c.Rank > 2 { // PyTorch's QR may flip columns: align the signs with the golden Q
				pl, _ := h.plan(&psgdBucket{flat: make([]float32, w.n), params: w.params, offs: w.offs})
				for _, m := range pl.matrices {
					for j := range m.r {
						var dot float64
						for k := range m.cols {
							dot += float64(q[m.qOff+k*m.r+j]) * float64(c.QFinal[m.qOff+k*m.r+j])
						}
						if dot < 0 {
							for k := range m.cols {
								q[m.qOff+k*m.r+j] = -q[m.qOff+k*m.r+j]
							}
						}
					}
				}
			}
			near(c.Name+" final Q", q, c.QFinal, 1e-5)
		}
		if _, before, after := h.CompressionStats(); before != c.NumelBefore || after != c.NumelAfter {
			t.Errorf("%s: compression stats %d → %d, PyTorch %d → %d", c.Name, before, after, c.NumelBefore, c.NumelAfter)
		}
	}
}

// Replica consistency (docs/ALGORITHMS.md §0) for PyTorch's built-in hooks: after every step of a
// DDP training with several buckets, all ranks hold bit-identical parameters, P in
// {2, 3, 4, 5, 8}. noop, which does not communicate, must not keep them identical.
func TestReplicaConsistencyBuiltinHooks(t *testing.T) {
	const steps = 4
	for _, spec := range []string{"fp16", "bf16", "powersgd:rank=2,start_iter=1", "powersgd:rank=1,start_iter=0,warm_start=false,use_error_feedback=false",
		"fp16+powersgd:rank=2,start_iter=1", "bf16+powersgd:rank=1,start_iter=2"} {
		for _, p := range []int{2, 3, 4, 5, 8} {
			t.Run(fmt.Sprintf("%s/P=%d", spec, p), func(t *testing.T) {
				tr := trainDDP(t, spec, p, steps, ddpTraining{bucketCap: smallBuckets, check: severalBuckets})
				if strings.Contains(spec, "powersgd") {
					if _, before, _ := powerOf(t, tr.hooks[0]).CompressionStats(); before == 0 {
						t.Fatal("PowerSGD never compressed")
					}
				}
				checkReplicasAgree(t, "", tr.hashes)
			})
		}
	}
	if tr := trainDDP(t, "noop", 2, 1, ddpTraining{bucketCap: smallBuckets, check: severalBuckets}); tr.hashes[0][0] == tr.hashes[1][0] {
		t.Error("noop kept the replicas identical although the ranks see different data")
	}
}
