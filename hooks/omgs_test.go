package hooks

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/nn"
)

// lags, mgs and omgs run TopkA's step on every bucket: the conservation test holds and the
// outputs are bit-identical on every rank, for P = 2..16 and several densities.
func TestMergedTopKConservationAndConsistency(t *testing.T) {
	for _, hook := range []string{"lags", "mgs:threshold=100", "omgs"} {
		for p := 2; p <= 16; p++ {
			for _, density := range []float64{0.01, 0.1, 0.5} {
				runConserving(t, specWith(hook, fmt.Sprintf("density=%g", density)), p, 37*p+3)
			}
		}
	}
}

// Small tensors go dense (dense_below): in a bucket that mixes small and large tensors, the
// small ones come out as the exact average of g + ξ and keep no residual, the others take
// TopkA's step with k = density × their elements; the conservation test holds and the
// outputs are bit-identical, for P = 2..16 and several densities. A bucket of small tensors
// only is one dense all-reduce (a dense call in the phases).
func TestMergedTopKDenseBelow(t *testing.T) {
	sizes := []int{3, 40, 200, 7, 1, 64, 90} // dense_below=50: 3+40 and 7+1 dense, 51 elements
	const nDense = 51
	n := 0
	for _, s := range sizes {
		n += s
	}
	denseAt := func(i int) bool { return i < 43 || (i >= 243 && i < 251) }
	for _, hook := range []string{"lags", "mgs", "omgs"} {
		for p := 2; p <= 16; p++ {
			for _, density := range []float64{0.01, 0.1, 0.5} {
				spec := fmt.Sprintf("%s:density=%g,dense_below=50", hook, density)
				w := newWorld(t, p, spec)
				w.params = namedParams(sizes...)
				for it := range 3 {
					gs := grads(uint64(17*p+it), p, n)
					before := w.residuals(n)
					name := fmt.Sprintf("%s/P=%d/call %d", spec, p, it)
					outs := w.callConserving(t, name, name, gs)
					after := w.residuals(n)
					for i := range n {
						if !denseAt(i) {
							continue
						}
						want := 0.0
						for r := range p {
							want += float64(gs[r][i]) + float64(before[r][i])
							if after[r][i] != 0 {
								t.Fatalf("%s: rank %d keeps residual %g at dense position %d", name, r, after[r][i], i)
							}
						}
						want /= float64(p)
						if got := float64(outs[0][i]); math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
							t.Fatalf("%s: dense position %d = %g, want the average %g", name, i, got, want)
						}
					}
				}
				ph := merged(w.hooks[0]).Phases()
				if k := max(1, int(float64(n-nDense)*density)); len(ph) != 1 || ph[0].DenseElements != nDense || ph[0].K != k || ph[0].Dense {
					t.Fatalf("%s P=%d: phases %+v, want %d dense elements and k = %d", spec, p, ph, nDense, k)
				}
				w.close()
			}
		}
	}
	w := newWorld(t, 3, "lags:density=0.01,dense_below=50")
	w.params = namedParams(3, 40, 7)
	gs := grads(5, 3, 50)
	outs := w.callConserving(t, "all small", "all small", gs)
	for i := range 50 {
		want := (float64(gs[0][i]) + float64(gs[1][i]) + float64(gs[2][i])) / 3
		if math.Abs(float64(outs[0][i])-want) > 1e-5*(1+math.Abs(want)) {
			t.Fatalf("all small: position %d = %g, want %g", i, outs[0][i], want)
		}
	}
	if ph := merged(w.hooks[0]).Phases(); !ph[0].Dense || ph[0].K != 0 || ph[0].DenseElements != 50 {
		t.Fatalf("all small: phases %+v, want one dense call", ph)
	}
}

// specWith appends an option to a spec that may already have some.
func specWith(spec, opt string) string {
	if strings.Contains(spec, ":") {
		return spec + "," + opt
	}
	return spec + ":" + opt
}

// profileStep is a ProfileStep on tinyNet's synthetic batches.
func profileStep(m nn.Module, seed uint64) profile.Step {
	tape := nn.NewTape()
	s := uint64(0)
	return func(backward func(*nn.Var) error) error {
		x, y := syntheticBatch(seed+s, 4)
		s++
		tape.Reset()
		return backward(nn.CrossEntropy(m.Forward(tape.Const(x)), y))
	}
}

// quickProfile is profile.Measure with few iterations and sizes, for tests.
var quickProfile = profile.Options{Warmup: 1, Iterations: 2, Repeats: 1, TopKSizes: []int{256, 4096}, AllGatherBytes: []int{8, 512}}

// Replica consistency (docs/ALGORITHMS.md §0) under DDP, with the hooks' own plans: lags without a
// profile (reverse declaration order) and with one (measured order), mgs, omgs on a measured
// profile with both planners and timelines; P in {2, 3, 4, 5, 8}.
func TestMergedTopKReplicaConsistencyUnderDDP(t *testing.T) {
	cases := []struct {
		spec    string
		profile bool
	}{
		{"lags:density=0.05,dense_below=0", false}, {"lags:density=0.05,dense_below=100,dense_warmup=1", true},
		{"mgs:density=0.05,threshold=300,dense_below=100", false},
		{"omgs:density=0.05,dense_below=100", true}, {"omgs:density=0.05,planner=paper,timeline=paper,dense_below=100", true},
		{"omgs:density=0.05,dense_below=0", true},
	}
	for _, c := range cases {
		for _, p := range []int{2, 3, 4, 5, 8} {
			tr := trainDDP(t, c.spec, p, 3, ddpTraining{profile: c.profile})
			dp := tr.dps[0]
			checkReplicasAgree(t, fmt.Sprintf("%s P=%d ", c.spec, p), tr.hashes)
			if strings.HasPrefix(c.spec, "lags") && len(dp.Plan()) != len(dp.Parameters()) {
				t.Fatalf("%s: %d buckets for %d tensors", c.spec, len(dp.Plan()), len(dp.Parameters()))
			}
			if strings.HasPrefix(c.spec, "mgs") && len(dp.Plan()) < 2 {
				t.Fatalf("%s: %d buckets, want several", c.spec, len(dp.Plan()))
			}
		}
	}
}

func namedParams(sizes ...int) []*nn.Param {
	ps := make([]*nn.Param, len(sizes))
	for i, n := range sizes {
		ps[i] = nn.NewParam("w", n)
		ps[i].Name = fmt.Sprintf("layer%d.weight", i)
	}
	return ps
}

func profileOf(ps []*nn.Param, ready ...time.Duration) *profile.Profile {
	p := &profile.Profile{P: 2, ParamBackward: ready, Forward: time.Millisecond, Backward: slices.Max(ready),
		TopK: profile.TopKCost{Gamma: 1e-9, Density: 0.01}, AllGather: profile.AllGatherCost{Alpha: 1e-4, Beta: 1e-9},
		AllReduce: profile.AllReduceCost{Alpha: 5e-5, Beta: 2e-9, Samples: []profile.CostSample{{Size: 64, Seconds: 5e-5}, {Size: 4096, Seconds: 6e-5}}}}
	for _, q := range ps {
		p.Params = append(p.Params, q.Name)
		p.Sizes = append(p.Sizes, q.Len())
	}
	return p
}

// The plans: lags one tensor per bucket in backward order (reverse declaration without a
// profile, the measured order with one), mgs merged until threshold elements (the
// reference's rule), omgs the exact planner's on the profile; omgs without a profile, or with
// one of another model, is an error that says what to do.
func TestMergedTopKPlans(t *testing.T) {
	ps := namedParams(100, 10, 5000, 20, 30)
	prof := profileOf(ps, 5*time.Millisecond, 4*time.Millisecond, 1*time.Millisecond, 2*time.Millisecond, 3*time.Millisecond)
	plan := func(spec string, prof *profile.Profile) [][]int {
		t.Helper()
		h, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		setProfile(h, prof)
		pl, err := h.(ddp.Planner).Plan(ps)
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	for _, c := range []struct {
		spec string
		prof *profile.Profile
		want [][]int
	}{
		{"lags", nil, [][]int{{4}, {3}, {2}, {1}, {0}}},
		{"lags", prof, [][]int{{2}, {3}, {4}, {1}, {0}}},
		{"mgs:threshold=45", nil, [][]int{{4, 3}, {2}, {1, 0}}},
		{"mgs:threshold=45", prof, [][]int{{2}, {3, 4}, {1, 0}}},
		{"mgs:threshold=1", nil, [][]int{{4}, {3}, {2}, {1}, {0}}},
	} {
		if got := plan(c.spec, c.prof); !slicesEqual2(got, c.want) {
			t.Errorf("%s (profile %v): plan %v, want %v", c.spec, c.prof != nil, got, c.want)
		}
	}
	// omgs: the exact planner's groups in the measured order.
	model := NewMergeModel(prof, prof.Order(), 0.01, DDPTimeline)
	groups, err := OptimalMerge(model)
	if err != nil {
		t.Fatal(err)
	}
	got := plan("omgs", prof)
	var lens []int
	for _, g := range got {
		lens = append(lens, len(g))
	}
	if !slices.Equal(lens, groups) || !slices.Equal(slices.Concat(got...), prof.Order()) {
		t.Errorf("omgs plan %v, want groups %v of order %v", got, groups, prof.Order())
	}
	for spec, want := range map[string]bool{"lags": false, "mgs": false, "omgs": true} {
		if _, ok := MustParse(spec).(ProfiledPlanner); ok != want {
			t.Errorf("%s is a ProfiledPlanner: %v, want %v (only omgs needs a profile)", spec, ok, want)
		}
	}
	h := MustParse("omgs")
	if _, err := h.(ddp.Planner).Plan(ps); err == nil || !strings.Contains(err.Error(), "profile.Measure") || !strings.Contains(err.Error(), "SetProfile") {
		t.Errorf("omgs without a profile: %v", err)
	}
	setProfile(h, prof)
	if _, err := h.(ddp.Planner).Plan(ps[:4]); err == nil || !strings.Contains(err.Error(), "does not fit the model") {
		t.Errorf("omgs with another model's profile: %v", err)
	}
	for spec, want := range map[string]string{
		"omgs:planner=paper":                "needs timeline=paper",
		"omgs:planner=greedy":               "want one of exact|paper",
		"omgs:timeline=gpu":                 "want one of ddp|paper",
		"mgs:threshold=0":                   "threshold=0",
		"lags:density=2":                    "density=2",
		"lags:threshold=3":                  "has no option",
		"mgs:dense_warmup=-1":               "dense_warmup=-1",
		"omgs:density=0.01,x=1":             "options: density, dense_warmup, dense_below, planner, timeline",
		"mgs:threshold=lots":                "not an integer",
		"omgs:planner=paper,timeline=paper": "",
	} {
		_, err := Parse(spec)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", spec, err, want)
		}
	}
	help := Help()
	for _, want := range []string{"lags\n", "mgs\n", "omgs\n", "threshold", "default 8192", "planner", "timeline"} {
		if !strings.Contains(help, want) {
			t.Errorf("Help() lacks %q", want)
		}
	}
}

func slicesEqual2(a, b [][]int) bool {
	return slices.EqualFunc(a, b, func(x, y []int) bool { return slices.Equal(x, y) })
}

// On its first call rank 0 logs the plan with the predicted iteration time next to TopK-SGD's
// and LAGS's (one line for the whole group of ranks), and the report agrees with the model.
func TestOMGSLogsPlanOnRank0(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil)))
	defer slog.SetDefault(old)
	tr := trainDDP(t, "omgs:density=0.05,timeline=paper", 3, 1, ddpTraining{profile: true})
	dp, h := tr.dps[0], tr.hooks[0]
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, "omgs: bucket plan"); n != 1 {
		t.Fatalf("%d plan lines, want 1 (rank 0's):\n%s", n, out)
	}
	for _, want := range []string{"groups=", "predicted_iteration=", "topk_sgd_single_group=", "lags_no_merging=", "paper_algorithm1=", "timeline=paper"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	rep := merged(h).Report()
	if len(rep.Groups) != len(dp.Plan()) || rep.Predicted <= 0 || rep.Predicted > rep.LAGS || rep.Predicted > rep.Single || rep.Predicted > rep.Paper {
		t.Errorf("report %+v: the optimum must not be slower than LAGS, TopK-SGD or Algorithm 1", rep)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Overlap is real: with backward slowed by 3 ms per tensor, the groups of lags, mgs and omgs
// are communicated while backward still runs, and each group's trace is in order (ready,
// hook called, selected, all-gathered, done).
func TestMergedTopKOverlapsBackward(t *testing.T) {
	for _, spec := range []string{"lags:density=0.05", "mgs:density=0.05,threshold=300", "omgs:density=0.05"} {
		slow := func(r int, h ddp.CommHook, tape *nn.Tape) {
			tape.OnGradReady(func(*nn.Param) { time.Sleep(3 * time.Millisecond) })
		}
		run := trainDDP(t, spec, 2, 2, ddpTraining{profile: strings.HasPrefix(spec, "omgs"), setup: slow})
		dp, h := run.dps[0], run.hooks[0]
		st := dp.Stats()
		tr := merged(h).Trace(st)
		if len(tr) != len(dp.Plan()) {
			t.Fatalf("%s: %d traces for %d buckets", spec, len(tr), len(dp.Plan()))
		}
		overlapped := 0
		for _, g := range tr {
			if !(g.Ready <= g.Start && g.Start <= g.Sparsified && g.Sparsified <= g.Sent && g.Sent <= g.Done) {
				t.Errorf("%s: bucket %d out of order: %+v", spec, g.Bucket, g)
			}
			if g.Done < st.BackwardEnd {
				overlapped++
			}
		}
		t.Logf("%s: %d of %d groups done before backward ended (%v); non-overlapped communication %v", spec, overlapped, len(tr), st.BackwardEnd, st.End-st.BackwardEnd)
		if len(tr) > 1 && overlapped == 0 {
			t.Errorf("%s: no group was communicated during backward: %+v", spec, tr)
		}
	}
}

// State: residuals and counters saved after two calls and restored into fresh hooks continue
// the run bit for bit (dense_warmup=1 makes the counter matter).
func TestMergedTopKStateContinues(t *testing.T) {
	const p, n = 3, 200
	for _, spec := range []string{"lags:density=0.05,dense_warmup=1", "mgs:density=0.05", "omgs:density=0.05"} {
		straight := newWorld(t, p, spec)
		resumed := newWorld(t, p, spec)
		for it := range 2 {
			gs := grads(uint64(it), p, n)
			straight.call(t, 0, gs)
			resumed.call(t, 0, gs)
		}
		fresh := newWorld(t, p, spec)
		for r := range p {
			st, err := resumed.hooks[r].(ddp.Stateful).State()
			if err != nil {
				t.Fatal(err)
			}
			if err := fresh.hooks[r].(ddp.Stateful).LoadState(st); err != nil {
				t.Fatal(err)
			}
		}
		fresh.groups = resumed.groups
		gs := grads(9, p, n)
		want, _ := straight.call(t, 0, gs)
		got, _ := fresh.call(t, 0, gs)
		for r := range p {
			if !slices.Equal(got[r], want[r]) || !slices.Equal(fresh.residual(r, 0, n), straight.residual(r, 0, n)) {
				t.Fatalf("%s rank %d: the restored hook's output or residual differs from the uninterrupted one", spec, r)
			}
		}
	}
}

// twinNet has two layers of the same shapes: plans that swap them have buckets of equal sizes.
func twinNet(seed uint64) nn.Module {
	rng := nn.NewRand(seed)
	m := nn.NewSequential(nn.Flatten{}, nn.NewLinear(192, 6, true, rng), nn.ReLU{}, nn.NewLinear(6, 6, true, rng), nn.ReLU{}, nn.NewLinear(6, 6, true, rng))
	nn.Parameters(m)
	return m
}

// State saved under one plan is refused under another: with buckets of other sizes (Memory's
// check), and with buckets of the same sizes holding other tensors (the plan's fingerprint).
// An omgs profile measured with another number of ranks is refused too.
func TestMergedTopKRefusesOtherPlans(t *testing.T) {
	const p = 2
	groups := commtest.Groups(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// step runs one DDP step of twinNet on every rank with the hooks and profiles given.
	step := func(hs []ddp.CommHook, prof *profile.Profile) []error {
		errs := make([]error, p)
		var wg sync.WaitGroup
		for r := range p {
			wg.Go(func() {
				errs[r] = func() error {
					if prof != nil {
						setProfile(hs[r], prof)
					}
					dp, err := ddp.New(ctx, twinNet(1), groups[r], ddp.WithCommHook(hs[r]))
					if err != nil {
						return err
					}
					tape := nn.NewTape()
					x, y := syntheticBatch(uint64(r), 2)
					return dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y))
				}()
			})
		}
		wg.Wait()
		return errs
	}
	parse := func(spec string) []ddp.CommHook {
		hs := make([]ddp.CommHook, p)
		for r := range hs {
			hs[r] = MustParse(spec)
		}
		return hs
	}
	restore := func(from, to []ddp.CommHook) {
		for r := range from {
			st, err := from[r].(ddp.Stateful).State()
			if err != nil {
				t.Fatal(err)
			}
			if err := to[r].(ddp.Stateful).LoadState(st); err != nil {
				t.Fatal(err)
			}
		}
	}
	params := nn.Parameters(twinNet(1))
	// Reverse declaration order is the lags plan without a profile; this profile's order
	// swaps the two 6x6 layers, keeping every bucket's size.
	ready := make([]time.Duration, len(params))
	for i := range ready {
		ready[i] = time.Duration(len(params)-i) * time.Millisecond
	}
	ready[2], ready[3], ready[4], ready[5] = ready[4], ready[5], ready[2], ready[3]
	swapped := profileOf(params, ready...)
	swapped.P = p

	first := parse("lags")
	for r, err := range step(first, nil) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	same := parse("lags")
	restore(first, same)
	for r, err := range step(same, nil) {
		if err != nil {
			t.Fatalf("restored under the same plan, rank %d: %v", r, err)
		}
	}
	perTensor := parse("mgs:threshold=1")
	for r, err := range step(perTensor, nil) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for _, c := range []struct {
		from []ddp.CommHook
		spec string
		prof *profile.Profile
		want string
	}{
		{first, "lags", swapped, "saved under a different bucket plan"},
		{perTensor, "mgs:threshold=100", nil, "state saved under a different bucket plan"},
	} {
		other := parse(c.spec)
		restore(c.from, other)
		for r, err := range step(other, c.prof) {
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: rank %d: %v, want an error containing %q", c.spec, r, err, c.want)
			}
		}
	}
	wrongP := profileOf(params, ready...)
	wrongP.P = 4
	for r, err := range step(parse("omgs"), wrongP) {
		if err == nil || !strings.Contains(err.Error(), "measured with 4 ranks, this group has 2") {
			t.Errorf("omgs with a P=4 profile on 2 ranks: rank %d: %v", r, err)
		}
	}
}

// merged returns the MergedTopK of a lags, mgs or omgs hook.
func merged(h ddp.CommHook) *MergedTopK {
	switch h := h.(type) {
	case *MergedTopK:
		return h
	case *OMGS:
		return &h.MergedTopK
	}
	panic(fmt.Sprintf("%T is not a merging hook", h))
}
