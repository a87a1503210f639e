package hooks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// testBucket is a ddp.Bucket without parameters, for driving hooks directly.
type testBucket struct {
	idx  int
	iter int64
	last bool
	flat []float32
	// params and offsets, when set, describe the tensors in flat (world.params).
	params  []*nn.Param
	offsets []int
}

func (b *testBucket) Index() int          { return b.idx }
func (b *testBucket) Iteration() int64    { return b.iter }
func (b *testBucket) IsLast() bool        { return b.last }
func (b *testBucket) Flat() []float32     { return b.flat }
func (b *testBucket) Params() []*nn.Param { return b.params }
func (b *testBucket) Offsets() []int      { return b.offsets }
func (b *testBucket) Tag() uint32         { return 1<<16 + uint32(b.idx)*ddp.TagsPerBucket }

// world is P in-process ranks, each with its own hook instance.
type world struct {
	groups []comm.Group
	hooks  []ddp.CommHook
	// params, when set, are the tensors every bucket is made of (in flat order); buckets
	// list no parameters otherwise.
	params []*nn.Param
}

func newWorld(t testing.TB, p int, spec string) *world {
	t.Helper()
	return newWorldOn(t, commtest.Groups(t, p), spec)
}

// close releases the world's ranks (a world that shares them, restoredWorld's, ends with it).
func (w *world) close() { commtest.Close(w.groups) }

// newWorldOn is newWorld on the given ranks.
func newWorldOn(t testing.TB, groups []comm.Group, spec string) *world {
	t.Helper()
	w := &world{groups: groups}
	for range groups {
		h, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		w.hooks = append(w.hooks, h)
	}
	return w
}

// restoredWorld returns a world of spec on a's ranks (the worlds run one after the other)
// whose hooks have loaded the states of a's hooks, after checking that every state has
// keys; it returns the states too.
func restoredWorld(t testing.TB, a *world, spec string, keys []string) (*world, []map[string][]float32) {
	t.Helper()
	p := len(a.groups)
	b := newWorldOn(t, a.groups, spec)
	states := make([]map[string][]float32, p)
	for r := range p {
		st, err := a.hooks[r].(ddp.Stateful).State()
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range keys {
			if _, ok := st[key]; !ok {
				t.Fatalf("rank %d: state lacks %s (has %d keys)", r, key, len(st))
			}
		}
		states[r] = st
		if err := b.hooks[r].(ddp.Stateful).LoadState(st); err != nil {
			t.Fatal(err)
		}
	}
	return b, states
}

// call runs one call of every rank's hook on bucket idx with grads[r] (copied) and returns
// the outputs and each rank's traffic during the call.
func (w *world) call(t testing.TB, idx int, grads [][]float32) ([][]float32, []comm.Stats) {
	t.Helper()
	outs, stats, err := w.try(idx, grads)
	if err != nil {
		t.Fatal(err)
	}
	return outs, stats
}

func (w *world) try(idx int, grads [][]float32) ([][]float32, []comm.Stats, error) {
	outs := make([][]float32, len(w.groups))
	stats, err := onEveryRank(w.groups, 60*time.Second, func(ctx context.Context, r int) error {
		b := &testBucket{idx: idx, last: true, flat: slices.Clone(grads[r]), params: w.params}
		for off, p := 0, 0; p < len(w.params); p++ {
			b.offsets = append(b.offsets, off)
			off += w.params[p].Len()
		}
		res, err := w.hooks[r].Run(ctx, w.groups[r], b).Wait()
		if err != nil {
			return err
		}
		outs[r] = slices.Clone(res)
		if len(res) != len(grads[r]) {
			return fmt.Errorf("%d values for a bucket of %d", len(res), len(grads[r]))
		}
		return nil
	})
	return outs, stats, err
}

// onEveryRank runs f for every rank at once, each in its own goroutine, under one context that
// ends after timeout. It returns each rank's traffic during f and the errors of the ranks
// that failed, each marked with its rank.
func onEveryRank(groups []comm.Group, timeout time.Duration, f func(ctx context.Context, r int) error) ([]comm.Stats, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stats := make([]comm.Stats, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r := range groups {
		wg.Go(func() {
			before := groups[r].Counters().Snapshot()
			if err := f(ctx, r); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
			}
			stats[r] = groups[r].Counters().Snapshot().Sub(before)
		})
	}
	wg.Wait()
	return stats, errors.Join(errs...)
}

// smallBuckets are DDP bucket caps in bytes (first bucket, the others) that split tinyNet
// into several buckets.
var smallBuckets = [2]int{2048, 8192}

// ddpTraining says how trainDDP trains; a zero field takes the default its comment names.
type ddpTraining struct {
	groups    []comm.Group                               // the ranks' transport; nil: commtest.Groups(t, p)
	bucketCap [2]int                                     // ddp.WithBucketCap(first, others); zero: the hook's plan or DDP's caps
	profile   bool                                       // every rank first measures a profile (quickProfile) and hands it to DDP
	sgd       optim.SGDConfig                            // zero: LR 0.05, momentum 0.9, weight decay 5e-4
	anyLoss   bool                                       // do not fail on a NaN or infinite loss
	model     func(r int) nn.Module                      // rank r's initial model; nil: tinyNet(1+r) (DDP broadcasts rank 0's)
	batch     func(r, s int) (*nn.Tensor, []int)         // rank r's batch at step s; nil: syntheticBatch(100s+r, 4)
	timeout   time.Duration                              // for the whole training; zero: 60 s
	setup     func(r int, h ddp.CommHook, tape *nn.Tape) // called once the hook is parsed, before DDP starts
	step      func(r, s int, dp *ddp.DDP, loss float32)  // called after every optimizer step
	check     func(dp *ddp.DDP) error                    // called on every rank after the last step
	// profiles[r], when profile is set: rank r's profile, measured by the first run that finds
	// it nil and reused by the next (runs that must plan the same buckets)
	profiles []*profile.Profile
	// begin is called on every rank once DDP and the optimizer exist, before the first step
	// (restore a checkpoint); end after the last step (save one)
	begin, end func(ctx context.Context, r int, model nn.Module, dp *ddp.DDP, opt *optim.SGD) error
	lgp        bool // the optimizer is DDP's Corrector (LGP for hooks that defer, osp)
	firstStep  int  // the first step's number s (for batch): a resumed run continues the numbering
}

// ddpTrained is what trainDDP leaves: per rank, the parameter hash after every step
// (hashes[r][s]), the DDP and the hook.
type ddpTrained struct {
	hashes [][]uint64
	dps    []*ddp.DDP
	hooks  []ddp.CommHook
}

// trainDDP runs steps of DDP training (SGD, cross-entropy) with the hook of spec on p
// in-process ranks, as o says, and fails the test if any rank fails.
func trainDDP(t testing.TB, spec string, p, steps int, o ddpTraining) ddpTrained {
	t.Helper()
	groups := o.groups
	if groups == nil {
		groups = commtest.Groups(t, p)
		defer commtest.Close(groups)
	}
	if o.sgd == (optim.SGDConfig{}) {
		o.sgd = optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4}
	}
	if o.model == nil {
		o.model = func(r int) nn.Module { return tinyNet(uint64(1 + r)) }
	}
	if o.batch == nil {
		o.batch = func(r, s int) (*nn.Tensor, []int) { return syntheticBatch(uint64(100*s+r), 4) }
	}
	if o.timeout == 0 {
		o.timeout = 60 * time.Second
	}
	res := ddpTrained{hashes: make([][]uint64, p), dps: make([]*ddp.DDP, p), hooks: make([]ddp.CommHook, p)}
	_, err := onEveryRank(groups, o.timeout, func(ctx context.Context, r int) error {
		h, err := Parse(spec)
		if err != nil {
			return err
		}
		res.hooks[r] = h
		tape := nn.NewTape()
		if o.setup != nil {
			o.setup(r, h, tape)
		}
		model := o.model(r)
		opts := []ddp.Option{ddp.WithCommHook(h)}
		if o.bucketCap != [2]int{} {
			opts = append(opts, ddp.WithBucketCap(o.bucketCap[0], o.bucketCap[1]))
		}
		if o.profile && o.profiles != nil && o.profiles[r] != nil {
			setProfile(h, o.profiles[r])
		} else if o.profile {
			po := quickProfile
			if pp, ok := h.(ProfiledPlanner); ok {
				po.Density = pp.ProfileOptions().Density
			}
			prof, err := profile.Measure(ctx, model, groups[r], profileStep(model, uint64(50+r)), po)
			if err != nil {
				return err
			}
			setProfile(h, prof)
			if o.profiles != nil {
				o.profiles[r] = prof
			}
		}
		dp, err := ddp.New(ctx, model, groups[r], opts...)
		if err != nil {
			return err
		}
		res.dps[r] = dp
		opt, _ := optim.NewSGD(dp.Parameters(), o.sgd)
		if o.lgp {
			dp.SetCorrector(opt)
		}
		if o.begin != nil {
			if err := o.begin(ctx, r, model, dp, opt); err != nil {
				return err
			}
		}
		for s := o.firstStep; s < o.firstStep+steps; s++ {
			x, y := o.batch(r, s)
			tape.Reset()
			opt.ZeroGrad()
			loss := nn.CrossEntropy(dp.Forward(tape.Const(x)), y)
			l := loss.Item()
			if !o.anyLoss && (math.IsNaN(float64(l)) || math.IsInf(float64(l), 0)) {
				return fmt.Errorf("step %d: loss %v", s, l)
			}
			if err := dp.Backward(ctx, loss); err != nil {
				return err
			}
			opt.Step()
			res.hashes[r] = append(res.hashes[r], paramHash(dp.Parameters()))
			if o.step != nil {
				o.step(r, s, dp, l)
			}
		}
		if o.end != nil {
			if err := o.end(ctx, r, model, dp, opt); err != nil {
				return err
			}
		}
		if o.check != nil {
			return o.check(dp)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s P=%d %v", spec, p, err)
	}
	return res
}

// severalBuckets is a ddpTraining check: the model must be split into several buckets.
func severalBuckets(dp *ddp.DDP) error {
	if len(dp.Plan()) < 2 {
		return fmt.Errorf("want several buckets, got %d", len(dp.Plan()))
	}
	return nil
}

// checkReplicasAgree requires every rank's parameters to equal rank 0's after every step
// (docs/ALGORITHMS.md §0); prefix starts the failure message.
func checkReplicasAgree(t testing.TB, prefix string, hashes [][]uint64) {
	t.Helper()
	for s := range hashes[0] {
		for r := 1; r < len(hashes); r++ {
			if hashes[r][s] != hashes[0][s] {
				t.Fatalf("%sstep %d: rank %d's parameters differ from rank 0's", prefix, s+1, r)
			}
		}
	}
}

// residual returns rank r's residual of bucket idx (a copy), or zeros before the first call.
func (w *world) residual(r, idx, n int) []float32 {
	m := hookMemory(w.hooks[r])
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.buckets[idx]; ok {
		return slices.Clone(s.Residual)
	}
	return make([]float32, n)
}

// callConserving is call on bucket 0 that also requires the outputs to be identical on every
// rank (the failure message starts with what) and the conservation test to hold (whatCall).
func (w *world) callConserving(t testing.TB, what, whatCall string, gs [][]float32) [][]float32 {
	t.Helper()
	n := len(gs[0])
	before := w.residuals(n)
	outs, _ := w.call(t, 0, gs)
	after := w.residuals(n)
	checkIdentical(t, what, outs)
	checkConservation(t, whatCall, gs, before, after, outs[0])
	return outs
}

// residuals returns every rank's residual of bucket 0 of n elements (copies).
func (w *world) residuals(n int) [][]float32 {
	rs := make([][]float32, len(w.hooks))
	for r := range rs {
		rs[r] = w.residual(r, 0, n)
	}
	return rs
}

func hookMemory(h ddp.CommHook) *Memory {
	m, ok := h.(interface{ memory() *Memory })
	if !ok {
		panic(fmt.Sprintf("no memory in %T", h))
	}
	return m.memory()
}

// setProfile gives h, a hook that plans from a profile (lags, mgs, omgs), its profile.
func setProfile(h ddp.CommHook, prof *profile.Profile) {
	h.(interface{ SetProfile(*profile.Profile) }).SetProfile(prof)
}

// heavyTailed returns rank r's gradient: Student-t-like values (a normal over the square root
// of a uniform), so a few entries dominate as in real gradients; every entry is non-zero.
func heavyTailed(seed uint64, r, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	v := make([]float32, n)
	for i := range v {
		x := float32(rng.NormFloat64() / math.Sqrt(rng.Float64()+1e-3))
		if x == 0 {
			x = 1e-3
		}
		v[i] = x
	}
	return v
}

func grads(seed uint64, p, n int) [][]float32 {
	gs := make([][]float32, p)
	for r := range gs {
		gs[r] = heavyTailed(seed, r, n)
	}
	return gs
}

// checkConservation is the test of docs/ALGORITHMS.md §0: with T = Σ_r (g_r + ξ_r) before the call,
// S = P·output and ξ'_r after, S + Σ ξ'_r = T elementwise up to float rounding.
func checkConservation(t testing.TB, what string, gs, before, after [][]float32, out []float32) {
	t.Helper()
	p := len(gs)
	for i := range out {
		var tsum, abs float64
		for r := range p {
			x := float64(gs[r][i]) + float64(before[r][i])
			tsum += x
			abs += math.Abs(float64(gs[r][i])) + math.Abs(float64(before[r][i]))
		}
		s := float64(out[i]) * float64(p)
		got := s
		for r := range p {
			got += float64(after[r][i])
			abs += math.Abs(float64(after[r][i]))
		}
		abs += math.Abs(s)
		if tol := 4 * float64(p) * 6e-8 * abs; math.Abs(got-tsum) > tol {
			t.Fatalf("%s: element %d: S + Σξ' = %v, T = %v (S = %v; tolerance %g): a contribution was lost or counted twice", what, i, got, tsum, s, tol)
		}
	}
}

// checkIdentical requires bit-identical outputs on every rank.
func checkIdentical(t testing.TB, what string, outs [][]float32) {
	t.Helper()
	for r := 1; r < len(outs); r++ {
		for i := range outs[0] {
			if math.Float32bits(outs[r][i]) != math.Float32bits(outs[0][i]) {
				t.Fatalf("%s: rank %d element %d = %v, rank 0 has %v: replicas differ", what, r, i, outs[r][i], outs[0][i])
			}
		}
	}
}

func maxStats(stats []comm.Stats) (rounds, wordsRecv int64) {
	for _, s := range stats {
		rounds = max(rounds, s.Rounds)
		wordsRecv = max(wordsRecv, s.BytesRecv/4)
	}
	return rounds, wordsRecv
}

func ceilLog2(p int) int {
	l := 0
	for 1<<l < p {
		l++
	}
	return l
}

func nnz(v []float32) int {
	c := 0
	for _, x := range v {
		if x != 0 {
			c++
		}
	}
	return c
}
