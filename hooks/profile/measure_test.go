package profile

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/bits"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/nn"
)

// slowGroup is a comm.Group whose every message costs perMessage + perByte·len(payload)
// before it leaves: an imposed α-β network. Messages to one rank leave one at a time, in the
// order they were posted (a link), so per-(destination, tag) FIFO order is kept.
type slowGroup struct {
	comm.Group
	perMessage, perByte time.Duration
	links               []chan func()
}

func newSlowGroups(t *testing.T, p int, perMessage, perByte time.Duration) []comm.Group {
	t.Helper()
	inner, err := comm.NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]comm.Group, p)
	for r, g := range inner {
		s := &slowGroup{Group: g, perMessage: perMessage, perByte: perByte, links: make([]chan func(), p)}
		for to := range s.links {
			s.links[to] = make(chan func(), 64)
			go func() {
				for job := range s.links[to] {
					job()
				}
			}()
		}
		t.Cleanup(func() {
			for _, l := range s.links {
				close(l)
			}
		})
		out[r] = s
	}
	return out
}

func (s *slowGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *comm.Request {
	done := make(chan struct{})
	var n int
	var err error
	s.links[to] <- func() {
		time.Sleep(s.perMessage + time.Duration(len(payload))*s.perByte)
		n, err = s.Group.Isend(ctx, to, tag, payload).Wait()
		close(done)
	}
	return comm.GoRequest(func() (int, error) { <-done; return n, err })
}

func (s *slowGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	_, err := s.Isend(ctx, to, tag, payload).Wait()
	return err
}

// mlp is a model of 2·layers tensors without buffers, plus an unused "spare" layer when asked.
type mlp struct {
	net   *nn.Sequential
	spare *nn.Linear
}

func (m *mlp) Forward(x *nn.Var) *nn.Var { return m.net.Forward(x) }
func (m *mlp) Children() []nn.Child {
	cs := []nn.Child{{Name: "net", Module: m.net}}
	if m.spare != nil {
		cs = append(cs, nn.Child{Name: "spare", Module: m.spare})
	}
	return cs
}

func newMLP(seed uint64, layers, width int, spare bool) *mlp {
	rng := nn.NewRand(seed)
	var mods []nn.Module
	for i := range layers {
		in, out := width, width
		if i == 0 {
			in = 12
		}
		if i == layers-1 {
			out = 5
		}
		mods = append(mods, nn.NewLinear(in, out, true, rng))
		if i < layers-1 {
			mods = append(mods, nn.ReLU{})
		}
	}
	m := &mlp{net: nn.NewSequential(mods...)}
	if spare {
		m.spare = nn.NewLinear(3, 3, true, rng)
	}
	nn.Parameters(m)
	return m
}

// mlpStep returns a Step on random batches of model.
func mlpStep(model nn.Module, seed uint64) Step {
	tape := nn.NewTape()
	rng := nn.NewRand(seed)
	return func(backward func(*nn.Var) error) error {
		x := nn.NewTensor(8, 12)
		for i := range x.Data {
			x.Data[i] = float32(rng.NormFloat64())
		}
		y := make([]int, 8)
		for i := range y {
			y[i] = rng.IntN(5)
		}
		tape.Reset()
		return backward(nn.CrossEntropy(model.Forward(tape.Const(x)), y))
	}
}

// measureAll runs Measure on every rank of groups and returns the profiles.
func measureAll(t *testing.T, groups []comm.Group, fn func(r int, g comm.Group) (*Profile, error)) []*Profile {
	t.Helper()
	profs := make([]*Profile, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() { profs[r], errs[r] = fn(r, g) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := 1; r < len(profs); r++ {
		if !reflect.DeepEqual(profs[r], profs[0]) {
			t.Fatalf("rank %d's profile differs from rank 0's:\n%+v\n%+v", r, profs[r], profs[0])
		}
	}
	return profs
}

// The all-gather fit recovers an imposed network: each message costs α0 + δ·bytes. Bruck's
// all-gather of b bytes per rank takes ceil(log2 P) rounds in which a rank sends (P-1)·b bytes
// in all, so the fit must give α ≈ ceil(log2 P)·α0 and β ≈ (P-1)·δ.
func TestProfileAllGatherFitRecoversImposedNetwork(t *testing.T) {
	// Costs well above the scheduling noise of a loaded machine (a sleep there overshoots by
	// a millisecond or more).
	const alpha0, delta = 10 * time.Millisecond, 2 * time.Microsecond
	for _, p := range []int{3, 4} {
		groups := newSlowGroups(t, p, alpha0, delta)
		profs := measureAll(t, groups, func(r int, g comm.Group) (*Profile, error) {
			m := newMLP(1, 2, 8, false)
			return Measure(context.Background(), m, g, mlpStep(m, uint64(r)), Options{
				Warmup: 1, Iterations: 1, Repeats: 3, TopKSizes: []int{256, 1024}, AllGatherBytes: []int{2048, 8192, 32768},
				AllReduceBytes: []int{64, 4096}})
		})
		// The all-reduce is timed too: every algorithm takes one round at least, so α0 bounds
		// its α from below.
		if ar := profs[0].AllReduce; len(ar.Samples) != 2 || ar.Alpha+ar.Beta*64 < alpha0.Seconds() {
			t.Errorf("P=%d: all-reduce %+v, want 2 samples and at least α0 = %v at 64 bytes", p, ar, alpha0)
		}
		ag := profs[0].AllGather
		wantA, wantB := float64(bits.Len(uint(p-1)))*alpha0.Seconds(), float64(p-1)*delta.Seconds()
		t.Logf("P=%d: α = %.3g s (imposed %.3g), β = %.3g s/byte (imposed %.3g), max fit error %.1f%%; %v", p, ag.Alpha, wantA, ag.Beta, wantB, 100*ag.MaxRelErr, ag.Samples)
		if math.Abs(ag.Beta/wantB-1) > 0.15 {
			t.Errorf("P=%d: β = %.4g s/byte, imposed (P-1)·δ = %.4g", p, ag.Beta, wantB)
		}
		if ag.Alpha < 0.8*wantA || ag.Alpha > 2*wantA { // scheduling delays add to α
			t.Errorf("P=%d: α = %.4g s, imposed ceil(log2 P)·α0 = %.4g", p, ag.Alpha, wantA)
		}
	}
}

// The top-k fit recovers a synthetic selection cost γ0·n·log2 n, and every rank gets rank 0's
// fit although rank 1's selection is three times slower.
func TestProfileTopKFitRecoversSyntheticCost(t *testing.T) {
	const gamma0 = 400e-9 // 9 ms at the smallest size: well above a loaded machine's sleep overshoot
	groups, err := comm.NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	profs := measureAll(t, groups, func(r int, g comm.Group) (*Profile, error) {
		gamma := gamma0 * float64(1+2*r)
		synthetic := func(idx []int32, x []float32, k int) []int32 {
			n := float64(len(x))
			time.Sleep(time.Duration(gamma * n * math.Log2(n) * float64(time.Second)))
			return append(idx[:0], make([]int32, k)...)
		}
		m := newMLP(1, 2, 8, false)
		return Measure(context.Background(), m, g, mlpStep(m, uint64(r)), Options{
			Warmup: 1, Iterations: 1, Repeats: 3, TopK: synthetic, TopKSizes: []int{2048, 8192, 32768}, AllGatherBytes: []int{8, 64}})
	})
	tk := profs[0].TopK
	t.Logf("γ = %.4g s (imposed %.4g), max fit error %.1f%%, %v", tk.Gamma, gamma0, 100*tk.MaxRelErr, tk.Samples)
	if math.Abs(tk.Gamma/gamma0-1) > 0.15 {
		t.Errorf("γ = %.4g, imposed %.4g (rank 1's is %.4g: rank 0's must win)", tk.Gamma, gamma0, 3*gamma0)
	}
	if tk.Density != DefaultDensity || len(tk.Samples) != 3 {
		t.Errorf("density %v, %d samples", tk.Density, len(tk.Samples))
	}
}

// fakeClock advances only when told to.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// Per-parameter backward times are the averaged ready stamps of the measured steps: a
// grad-ready hook registered before the profiler's advances a fake clock by a known cost per
// parameter, so ParamBackward must equal the running sums exactly. Warm-up steps cost ten
// times more and must not count; rank 1's costs differ and must not count either (rank 0's
// numbers are broadcast); the unused parameter is ready when backward returns.
func TestProfileBackwardTimesAreRank0Averages(t *testing.T) {
	const warmup, iters = 2, 3
	const forward = 7 * time.Millisecond
	groups, err := comm.NewLocal(3)
	if err != nil {
		t.Fatal(err)
	}
	var want []time.Duration // rank 0's expected ParamBackward
	var wantBackward time.Duration
	var unused []string
	profs := measureAll(t, groups, func(r int, g comm.Group) (*Profile, error) {
		m := newMLP(1, 3, 6, true)
		params := nn.Parameters(m)
		index := map[*nn.Param]int{}
		for i, p := range params {
			index[p] = i
		}
		clk := &fakeClock{now: time.Unix(0, 0)}
		sums := make([]time.Duration, len(params))
		var backward time.Duration
		step := 0
		tape := nn.NewTape()
		run := func(bw func(*nn.Var) error) error {
			measured := step >= warmup
			step++
			scale := time.Duration(1)
			if !measured {
				scale = 10
			}
			x := nn.NewTensor(4, 12)
			tape.Reset()
			loss := nn.CrossEntropy(m.Forward(tape.Const(x)), []int{0, 1, 2, 3})
			clk.Advance(forward)
			start := clk.Now()
			stamps := make([]time.Duration, len(params))
			h := tape.OnGradReady(func(p *nn.Param) {
				i := index[p]
				clk.Advance(scale * time.Duration((i+1)*(r+1)) * 100 * time.Microsecond)
				stamps[i] = clk.Now().Sub(start)
			})
			defer h.Remove()
			if err := bw(loss); err != nil {
				return err
			}
			if measured {
				end := clk.Now().Sub(start)
				backward += end
				for i, p := range params {
					if strings.HasPrefix(p.Name, "spare.") {
						stamps[i] = end
					}
					sums[i] += stamps[i]
				}
			}
			return nil
		}
		prof, err := Measure(context.Background(), m, g, run, Options{Warmup: warmup, Iterations: iters, Repeats: 1,
			TopKSizes: []int{64, 256}, AllGatherBytes: []int{8, 64}, clock: clk.Now})
		if r == 0 {
			want = make([]time.Duration, len(params))
			for i := range sums {
				want[i] = sums[i] / iters
			}
			wantBackward = backward / iters
			for _, p := range params {
				if strings.HasPrefix(p.Name, "spare.") {
					unused = append(unused, p.Name)
				}
			}
		}
		return prof, err
	})
	p := profs[0]
	if !slices.Equal(p.ParamBackward, want) {
		t.Errorf("ParamBackward = %v, want rank 0's measured averages %v", p.ParamBackward, want)
	}
	if p.Forward != forward || p.Backward != wantBackward {
		t.Errorf("forward %v backward %v, want %v and %v", p.Forward, p.Backward, forward, wantBackward)
	}
	if !slices.Equal(p.Unused, unused) || len(unused) != 2 {
		t.Errorf("unused %v, want %v", p.Unused, unused)
	}
	if p.P != 3 || p.Warmup != warmup || p.Iterations != iters || len(p.Params) != 8 {
		t.Errorf("P %d, warm-up %d, iterations %d, %d params", p.P, p.Warmup, p.Iterations, len(p.Params))
	}
	// Backward order: the tape runs the last layer first.
	order := p.Order()
	if got := p.Params[order[0]]; !strings.HasPrefix(got, "net.4.") {
		t.Errorf("first ready %s, want the last layer's (order %v)", got, order)
	}
	tb := p.LayerBackward(order)
	var total time.Duration
	for j, d := range tb {
		total += d
		if total != p.ParamBackward[order[j]] {
			t.Fatalf("LayerBackward %v does not add up to the ready times at %d", tb, j)
		}
	}
}

// Measure leaves the parameters, gradients and buffers as it found them.
func TestProfileLeavesModelUnchanged(t *testing.T) {
	groups, err := comm.NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	measureAll(t, groups, func(r int, g comm.Group) (*Profile, error) {
		rng := nn.NewRand(3)
		m := nn.NewSequential(nn.NewConv2d(3, 4, 3, 1, 1, false, rng), nn.NewBatchNorm2d(4), nn.ReLU{}, nn.AvgPool2d{Kernel: 8}, nn.Flatten{}, nn.NewLinear(4, 5, true, rng))
		params, bufs := nn.Parameters(m), nn.Buffers(m)
		for i, p := range params {
			for j := range p.Grad.Data {
				p.Grad.Data[j] = float32(i + j)
			}
		}
		snap := func() [][]float32 {
			var s [][]float32
			for _, p := range params {
				s = append(s, slices.Clone(p.Value.Data), slices.Clone(p.Grad.Data))
			}
			for _, b := range bufs {
				s = append(s, slices.Clone(b.Value.Data))
			}
			return s
		}
		before := snap()
		tape := nn.NewTape()
		step := func(bw func(*nn.Var) error) error {
			x, rng := nn.NewTensor(4, 3, 8, 8), nn.NewRand(uint64(r))
			for i := range x.Data {
				x.Data[i] = float32(rng.NormFloat64())
			}
			tape.Reset()
			return bw(nn.CrossEntropy(m.Forward(tape.Const(x)), []int{0, 1, 2, 3}))
		}
		prof, err := Measure(context.Background(), m, g, step, Options{Warmup: 1, Iterations: 2, Repeats: 1,
			TopKSizes: []int{64, 256}, AllGatherBytes: []int{8, 64}})
		if err == nil && !reflect.DeepEqual(snap(), before) {
			err = fmt.Errorf("the model's parameters, gradients or buffers changed")
		}
		return prof, err
	})
}

// A rank whose step fails makes every rank return an error that names it, without a hang.
func TestProfileStepErrorsReachEveryRank(t *testing.T) {
	groups, err := comm.NewLocal(3)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			m := newMLP(1, 2, 4, false)
			step := mlpStep(m, 1)
			if r == 1 {
				step = func(func(*nn.Var) error) error { return nil } // never calls backward
			}
			_, errs[r] = Measure(ctx, m, g, step, Options{Warmup: 1, Iterations: 1, Repeats: 1, TopKSizes: []int{64}, AllGatherBytes: []int{8, 64}})
		})
	}
	wg.Wait()
	for r, err := range errs {
		want := "rank 1 failed"
		if r == 1 {
			want = "step 1 returned without calling backward"
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rank %d: %v, want an error containing %q", r, err, want)
		}
	}
}

func testProfile() *Profile {
	return &Profile{P: 4, Params: []string{"a.weight", "a.bias", "b.weight"}, Sizes: []int{600, 20, 3000},
		ParamBackward: []time.Duration{3 * time.Millisecond, 2 * time.Millisecond, 1 * time.Millisecond},
		Forward:       4 * time.Millisecond, Backward: 3500 * time.Microsecond, Warmup: 5, Iterations: 50,
		TopK:      TopKCost{Gamma: 1.5e-9, Density: 0.01, Samples: []CostSample{{256, 2e-6}, {1024, 1e-5}}, MaxRelErr: 0.1},
		AllGather: AllGatherCost{Alpha: 3e-5, Beta: 1e-9, Samples: []CostSample{{8, 3e-5}, {800, 3.1e-5}}, MaxRelErr: 0.05},
		AllReduce: AllReduceCost{Alpha: 2e-5, Beta: 2e-9, Samples: []CostSample{{64, 2e-5}, {4096, 2.8e-5}}, MaxRelErr: 0.02}}
}

// A profile survives Save and Load exactly, prints a summary with %v and one line per
// parameter with %+v, and a broken file is refused with the reason.
func TestProfileSaveLoadAndFormat(t *testing.T) {
	p := testProfile()
	path := filepath.Join(t.TempDir(), "vgg.profile.json")
	if err := p.Save(path); err != nil {
		t.Fatal(err)
	}
	q, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p, q) {
		t.Fatalf("loaded %+v, saved %+v", q, p)
	}
	short, long := fmt.Sprint(p), fmt.Sprintf("%+v", p)
	for _, want := range []string{"3 parameters (3620 elements), P=4", "1.5 ns · n·log2 n", "α = 30µs", "β = 1 ns/byte", "all-reduce: α = 20µs, β = 2 ns/byte"} {
		if !strings.Contains(short, want) {
			t.Errorf("%%v lacks %q:\n%s", want, short)
		}
	}
	if strings.Contains(short, "b.weight") || !strings.Contains(long, "b.weight") || strings.Index(long, "b.weight") > strings.Index(long, "a.weight") {
		t.Errorf("%%+v should list the parameters in backward order (b.weight first), %%v not:\n%s\n%s", short, long)
	}
	if p.String() != short {
		t.Errorf("String() = %q, %%v = %q", p.String(), short)
	}
	for _, bad := range []string{`{"p": 4, "nope": 1}`, `{"p": 0}`, `{"p": 2, "params": ["a"], "sizes": [1], "param_backward_ns": [1], "topk": {"density": 0}}`} {
		if _, err := Read(strings.NewReader(bad)); err == nil {
			t.Errorf("Read(%s) accepted it", bad)
		}
	}
	var buf bytes.Buffer
	if err := p.WriteJSON(&buf); err != nil || !strings.Contains(buf.String(), `"beta_s_per_byte": 1e-9`) {
		t.Errorf("JSON %s, %v", buf.String(), err)
	}
}

func TestProfileCheck(t *testing.T) {
	p := testProfile()
	mk := func(name string, n int) *nn.Param { q := nn.NewParam(name, n); q.Name = name; return q }
	good := []*nn.Param{mk("a.weight", 600), mk("a.bias", 20), mk("b.weight", 3000)}
	if err := p.Check(good); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(good[:2]); err == nil || !strings.Contains(err.Error(), "3 parameters") {
		t.Errorf("fewer parameters: %v", err)
	}
	bad := []*nn.Param{mk("a.weight", 600), mk("a.bias", 21), mk("b.weight", 3000)}
	if err := p.Check(bad); err == nil || !strings.Contains(err.Error(), "a.bias (20 elements), the model's a.bias (21 elements)") {
		t.Errorf("other size: %v", err)
	}
	if got := p.Order(); !slices.Equal(got, []int{2, 1, 0}) {
		t.Errorf("order %v", got)
	}
}

// The fits on exact data return the model they came from.
func TestProfileFitsExactData(t *testing.T) {
	var ss []CostSample
	for _, n := range []int{100, 1000, 10000} {
		ss = append(ss, CostSample{n, 2e-9 * float64(n) * math.Log2(float64(n))})
	}
	if g, e := fitGamma(ss); math.Abs(g/2e-9-1) > 1e-9 || e > 1e-9 {
		t.Errorf("γ = %v (err %v), want 2e-9", g, e)
	}
	ss = ss[:0]
	for _, b := range []int{8, 800, 80000} {
		ss = append(ss, CostSample{b, 5e-5 + 3e-9*float64(b)})
	}
	if a, b, e := fitAlphaBeta(ss); math.Abs(a/5e-5-1) > 1e-9 || math.Abs(b/3e-9-1) > 1e-9 || e > 1e-9 {
		t.Errorf("α = %v β = %v (err %v), want 5e-5 and 3e-9", a, b, e)
	}
	// Decreasing times would need a negative β: clamped to 0, α the weighted mean.
	if a, b, _ := fitAlphaBeta([]CostSample{{8, 2e-5}, {800, 1e-5}}); b != 0 || a <= 0 {
		t.Errorf("α = %v β = %v, want β = 0", a, b)
	}
}
