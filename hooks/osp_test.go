package hooks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// ospRank is what one rank's training loop sees in an OSP test.
type ospRank struct {
	ctx  context.Context // cancelled when any rank fails
	r    int
	g    comm.Group
	dp   *ddp.DDP
	hook ddp.CommHook
	opt  *optim.SGD
	tape *nn.Tape
}

// ospTrain runs a DDP training of tinyNet-sized models on p in-process ranks with the hook
// of spec, the loop a user writes for late results: SetCorrector, Forward, Backward, Flush
// on the last step, Step. Callbacks (any may be nil) see each rank: setup after the optimizer
// exists, afterBackward before Flush and Step, afterStep at the end of each step.
type ospTrain struct {
	spec          string
	p, steps      int
	sgd           optim.SGDConfig
	model         func(r int) nn.Module
	group         func(g comm.Group) comm.Group
	noFlush       bool
	endEpochEvery int
	setup         func(x *ospRank) error
	afterBackward func(x *ospRank, step int) error
	afterStep     func(x *ospRank, step int) error
}

func (c ospTrain) run(t *testing.T) {
	t.Helper()
	groups := commtest.Groups(t, c.p)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	errs := make([]error, c.p)
	var wg sync.WaitGroup
	for r := range c.p {
		wg.Go(func() {
			errs[r] = func() error {
				g := groups[r]
				if c.group != nil {
					g = c.group(g)
				}
				h, err := Parse(c.spec)
				if err != nil {
					return err
				}
				model := tinyNet(uint64(1 + r))
				if c.model != nil {
					model = c.model(r)
				}
				dp, err := ddp.New(ctx, model, g, ddp.WithCommHook(h), ddp.WithBucketCap(2048, 8192))
				if err != nil {
					return err
				}
				opt, err := optim.NewSGD(dp.Parameters(), c.sgd)
				if err != nil {
					return err
				}
				dp.SetCorrector(opt)
				x := &ospRank{ctx: ctx, r: r, g: g, dp: dp, hook: h, opt: opt, tape: nn.NewTape()}
				if c.setup != nil {
					if err := c.setup(x); err != nil {
						return err
					}
				}
				for s := range c.steps {
					xb, yb := syntheticBatch(uint64(100*s+r), 4)
					x.tape.Reset()
					opt.ZeroGrad()
					loss := nn.CrossEntropy(dp.Forward(x.tape.Const(xb)), yb)
					if l := loss.Item(); math.IsNaN(float64(l)) || math.IsInf(float64(l), 0) {
						return fmt.Errorf("step %d: loss %v", s, l)
					}
					if err := dp.Backward(ctx, loss); err != nil {
						return fmt.Errorf("step %d: %w", s, err)
					}
					if c.afterBackward != nil {
						if err := c.afterBackward(x, s); err != nil {
							return fmt.Errorf("step %d: %w", s, err)
						}
					}
					if s == c.steps-1 && !c.noFlush {
						if err := dp.Flush(ctx); err != nil {
							return err
						}
					}
					opt.Step()
					if c.afterStep != nil {
						if err := c.afterStep(x, s); err != nil {
							return fmt.Errorf("step %d: %w", s, err)
						}
					}
					if c.endEpochEvery > 0 && (s+1)%c.endEpochEvery == 0 {
						if _, err := dp.EndEpoch(ctx); err != nil {
							return err
						}
					}
				}
				return nil
			}()
			if errs[r] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// hashes records every rank's parameter hash after every step.
func hashes(p int) ([][]uint64, func(x *ospRank, step int) error) {
	hs := make([][]uint64, p)
	return hs, func(x *ospRank, _ int) error {
		hs[x.r] = append(hs[x.r], paramHash(x.dp.Parameters()))
		return nil
	}
}

// With S(G^u) = 0 OSP is the allreduce hook, bit for bit, step after step: budget=0, and
// budget=auto whether or not epochs end (U_max = 0, or no EndEpoch so epoch 1 never ends).
func TestOSPZeroBudgetIsAllreduce(t *testing.T) {
	const p, steps = 3, 6
	sgd := optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4}
	want, rec := hashes(p)
	ospTrain{spec: "allreduce", p: p, steps: steps, sgd: sgd, afterStep: rec}.run(t)
	for _, c := range []struct {
		spec  string
		every int
	}{{"osp:budget=0", 0}, {"osp", 0}, {"osp:umax=0", 2}} {
		got, rec := hashes(p)
		ospTrain{spec: c.spec, p: p, steps: steps, sgd: sgd, endEpochEvery: c.every, afterStep: rec,
			afterBackward: func(x *ospRank, _ int) error {
				if d := x.dp.Stats().Deferred; d != 0 {
					return fmt.Errorf("%d elements deferred with a zero budget", d)
				}
				return nil
			}}.run(t)
		for r := range p {
			if !slices.Equal(got[r], want[r]) {
				t.Fatalf("%s (EndEpoch every %d steps): rank %d's parameters differ from allreduce's", c.spec, c.every, r)
			}
		}
	}
}

// Replica consistency (docs/ALGORITHMS.md §0) with deferral and LGP on: after every step the true
// parameters are bit-identical on every rank, while the forwards run on per-rank
// LGP-corrected values (which differ between ranks).
func TestOSPReplicaConsistency(t *testing.T) {
	const steps = 5
	for _, p := range []int{2, 3, 4, 5, 8} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			hs, rec := hashes(p)
			working := make([][]uint64, p)
			ospTrain{spec: "osp:budget=0.5", p: p, steps: steps, sgd: optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4},
				afterBackward: func(x *ospRank, s int) error {
					if d := x.dp.Stats().Deferred; (s > 0) != (d > 0) {
						return fmt.Errorf("%d elements deferred", d)
					}
					return nil
				},
				afterStep: func(x *ospRank, s int) error {
					if err := rec(x, s); err != nil {
						return err
					}
					// The next training forward's values: true + this rank's LGP offset.
					x.tape.Reset()
					x.dp.Forward(x.tape.Const(nn.NewTensor(1, 3, 8, 8)))
					working[x.r] = append(working[x.r], paramHash(x.dp.Parameters()))
					return nil
				}}.run(t)
			for s := range steps {
				for r := 1; r < p; r++ {
					if hs[r][s] != hs[0][s] {
						t.Fatalf("step %d: rank %d's true parameters differ from rank 0's", s+1, r)
					}
				}
			}
			if working[1][1] == working[0][1] {
				t.Fatal("the LGP-corrected values of ranks 0 and 1 are identical: no local correction was applied")
			}
		})
	}
}

// Nothing lost, nothing applied twice: with momentum 0, no weight decay and a constant rate,
// after every step k the true parameters are W_0 − lr·Σ_{t≤k} G_t except for the gradients
// still pending (deferred at step k), which arrive exactly one step later; after the last
// step (flushed) the total update is −lr times the sum of every global gradient of the run,
// as a dense run applies its gradients. G_t is the mean of the ranks' local gradients,
// captured from the tape and summed here in float64.
func TestOSPAppliesEveryGlobalGradientOnce(t *testing.T) {
	const p, steps, lr = 4, 8, 0.05
	var mu sync.Mutex
	localSum := map[string][]float64{} // Σ_r local gradient of the running step, by name
	applied := map[string][]float64{}  // −lr · Σ_t G_t so far
	lastStep := map[string][]float64{} // −lr · G of the running step
	var w0 map[string][]float32
	var sawPending bool
	ospTrain{spec: "osp:budget=0.5", p: p, steps: steps, sgd: optim.SGDConfig{LR: lr},
		setup: func(x *ospRank) error {
			mu.Lock()
			defer mu.Unlock()
			if x.r == 0 {
				w0 = map[string][]float32{}
				for _, q := range x.dp.Parameters() {
					w0[q.Name] = slices.Clone(q.Value.Data)
				}
			}
			x.tape.OnGradReady(func(q *nn.Param) {
				mu.Lock()
				defer mu.Unlock()
				s := localSum[q.Name]
				if s == nil {
					s = make([]float64, q.Len())
					localSum[q.Name] = s
				}
				for j, v := range q.Grad.Data {
					s[j] += float64(v)
				}
			})
			return nil
		},
		afterBackward: func(x *ospRank, s int) error {
			// Every rank has run this step's backward only when all have reached the barrier.
			if err := comm.Barrier(x.ctx, x.g, 900); err != nil {
				return err
			}
			if x.r == 0 {
				mu.Lock()
				for name, v := range localSum {
					a, c := applied[name], lastStep[name]
					if a == nil {
						a, c = make([]float64, len(v)), make([]float64, len(v))
						applied[name], lastStep[name] = a, c
					}
					for j := range v {
						c[j] = -lr * v[j] / p
						a[j] += c[j]
						v[j] = 0
					}
				}
				mu.Unlock()
			}
			return comm.Barrier(x.ctx, x.g, 901)
		},
		afterStep: func(x *ospRank, s int) error {
			if x.r != 0 {
				return nil
			}
			pending := x.dp.Pending()
			sawPending = sawPending || len(pending) > 0
			// The global gradient of a pending parameter (deferred at this step) is the part of
			// this step's mean not yet applied; the rest of Σ must be in the true values.
			mu.Lock()
			defer mu.Unlock()
			var worst, worstPending float64
			for _, q := range x.dp.Parameters() {
				a := applied[q.Name]
				var last []float64
				if slices.Contains(pending, q) {
					last = lastStep[q.Name]
				}
				for j, v := range q.Value.Data {
					want := float64(w0[q.Name][j]) + a[j]
					if last != nil {
						want -= last[j]
						worstPending = max(worstPending, math.Abs(last[j]))
					}
					worst = max(worst, math.Abs(float64(v)-want)/(1e-6+math.Abs(want)))
				}
			}
			if worst > 2e-5 {
				return fmt.Errorf("true parameters off the applied-once oracle by %.3g (relative)", worst)
			}
			if len(pending) > 0 && worstPending < 1e-4 {
				return fmt.Errorf("the pending updates (largest %.3g) are too small for this test to see a lost gradient", worstPending)
			}
			return nil
		},
	}.run(t)
	if !sawPending {
		t.Fatal("no step had a deferred parameter")
	}
}

// The split follows PGP (docs/ALGORITHMS.md §7): at every iteration t ≥ 1 the deferred layers are
// exactly the greedy fill of S(G^u) from the least important, with I_l = Σ|Ĝ_l·W_l| where W is
// the true value after the last step and Ĝ_l the last global gradient already applied to l
// (G_{t-1}, or G_{t-2} for a layer deferred at t-1). The test computes Ĝ in float64 from the
// captured local gradients and reads the deferred sets from dp.Pending.
func TestOSPDefersTheLeastImportantLayers(t *testing.T) {
	const p, steps, frac = 3, 7, 0.4
	local := make([]map[string][]float32, p) // per rank: this step's local gradients by name
	ghat := map[string][]float64{}
	foldAt := map[int]map[string][]float64{} // decision → G of the layers deferred two steps before
	var trueW map[string][]float32
	checked := 0
	snapshot := func(ps []*nn.Param) map[string][]float32 {
		m := map[string][]float32{}
		for _, q := range ps {
			m[q.Name] = slices.Clone(q.Value.Data)
		}
		return m
	}
	ospTrain{spec: fmt.Sprintf("osp:budget=%g", frac), p: p, steps: steps, noFlush: true,
		sgd: optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4},
		setup: func(x *ospRank) error {
			local[x.r] = map[string][]float32{}
			x.tape.OnGradReady(func(q *nn.Param) { local[x.r][q.Name] = slices.Clone(q.Grad.Data) })
			if x.r == 0 {
				trueW = snapshot(x.dp.Parameters())
			}
			return nil
		},
		afterBackward: func(x *ospRank, s int) error {
			if err := comm.Barrier(x.ctx, x.g, 900); err != nil {
				return err
			}
			if x.r == 0 {
				var order []*nn.Param // layers in plan order, as the hook numbers them
				for _, group := range x.dp.Plan() {
					for _, i := range group {
						order = append(order, x.dp.Parameters()[i])
					}
				}
				pending := map[string]bool{}
				for _, q := range x.dp.Pending() {
					pending[q.Name] = true
				}
				for name, v := range foldAt[s] {
					ghat[name] = v
				}
				if s >= 1 {
					type ranked struct {
						name string
						imp  float64
						n    int
					}
					var cand []ranked
					for _, q := range order {
						var imp float64
						for j, gv := range ghat[q.Name] {
							imp += math.Abs(gv * float64(trueW[q.Name][j]))
						}
						cand = append(cand, ranked{q.Name, imp, q.Len()})
					}
					slices.SortStableFunc(cand, func(a, b ranked) int {
						switch {
						case a.imp < b.imp:
							return -1
						case a.imp > b.imp:
							return 1
						}
						return 0
					})
					left := int(min(frac, OSPCap) * float64(nn.NumParams(order)))
					want := map[string]bool{}
					for _, c := range cand {
						if c.n <= left {
							want[c.name] = true
							left -= c.n
						}
					}
					if fmt.Sprint(want) != fmt.Sprint(pending) {
						return fmt.Errorf("deferred %v, PGP's greedy split is %v (importance order %v)", pending, want, cand)
					}
					checked++
				}
				// This step's global gradient: applied now for the routine layers, folded into Ĝ
				// two decisions later for the deferred ones.
				next := map[string][]float64{}
				for name, v0 := range local[0] {
					G := make([]float64, len(v0))
					for r := range p {
						for j, v := range local[r][name] {
							G[j] += float64(v) / p
						}
					}
					if pending[name] {
						next[name] = G
					} else {
						ghat[name] = G
					}
				}
				foldAt[s+2] = next
			}
			return comm.Barrier(x.ctx, x.g, 901)
		},
		afterStep: func(x *ospRank, s int) error {
			if x.r == 0 {
				trueW = snapshot(x.dp.Parameters())
			}
			return nil
		},
	}.run(t)
	if checked != steps-1 {
		t.Fatalf("checked %d splits", checked)
	}
}

// icsGate holds this rank's ICS messages (tag offset ospTagICS of a bucket's tags) until open
// is closed, or 20 s have passed (then it records the timeout and lets them go).
type icsGate struct {
	comm.Group
	open     <-chan struct{}
	timedOut *atomic.Bool
}

func isICSTag(tag uint32) bool {
	return tag >= 1<<16 && (tag-1<<16)%ddp.TagsPerBucket == ospTagICS
}

func (g icsGate) wait() {
	select {
	case <-g.open:
	case <-time.After(20 * time.Second):
		g.timedOut.Store(true)
	}
}

func (g icsGate) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	if isICSTag(tag) {
		g.wait()
	}
	return g.Group.Send(ctx, to, tag, payload)
}

func (g icsGate) Isend(ctx context.Context, to int, tag uint32, payload []byte) *comm.Request {
	if !isICSTag(tag) {
		return g.Group.Isend(ctx, to, tag, payload)
	}
	return comm.GoRequest(func() (int, error) {
		g.wait()
		return g.Group.Isend(ctx, to, tag, payload).Wait()
	})
}

// gatedNet runs gate at the start of every forward, then the wrapped model.
type gatedNet struct {
	net  nn.Module
	gate func()
}

func (m *gatedNet) Children() []nn.Child { return []nn.Child{{Name: "net", Module: m.net}} }
func (m *gatedNet) Forward(x *nn.Var) *nn.Var {
	m.gate()
	return m.net.Forward(x)
}

// ICS overlaps the next iteration's compute: iteration 1's ICS messages are held back until
// iteration 2's forward has started (icsGate), and iteration 2's forward then waits, inside
// the model, until the hook's trace shows that whole ICS completed. A design that waited for
// the ICS before the next forward (for example inside Backward) would hold the first gate
// shut; one that communicated only after the next backward would hold the second: either
// times out and fails. No wall-clock speed is assumed; the timestamps are logged.
func TestOSPICSOverlapsTheNextForward(t *testing.T) {
	const p = 2
	type ranks struct {
		open              chan struct{}
		gateTimeout       atomic.Bool
		fwdTimeout        bool
		step              int
		deferred1         int
		fwdStart, icsSeen time.Time
		bwdEnd            time.Time
		trace             []ICSEvent
	}
	rk := make([]*ranks, p)
	for r := range rk {
		rk[r] = &ranks{open: make(chan struct{})}
	}
	hooksOf := make([]*OSP, p)
	t0 := time.Now()
	ospTrain{spec: "osp:budget=0.5", p: p, steps: 3, sgd: optim.SGDConfig{LR: 0.05, Momentum: 0.9},
		group: func(g comm.Group) comm.Group {
			return icsGate{Group: g, open: rk[g.Rank()].open, timedOut: &rk[g.Rank()].gateTimeout}
		},
		model: func(r int) nn.Module {
			x := rk[r]
			return &gatedNet{net: tinyNet(uint64(1 + r)), gate: func() {
				if x.step != 2 || hooksOf[r] == nil {
					return
				}
				x.fwdStart = time.Now()
				close(x.open)
				deadline := time.Now().Add(20 * time.Second)
				for time.Now().Before(deadline) {
					n, done := 0, true
					for _, ev := range hooksOf[r].Trace() {
						if ev.Iteration == 1 {
							n += ev.Elements
							done = done && !ev.End.IsZero()
						}
					}
					if n == x.deferred1 && done {
						x.icsSeen = time.Now()
						return
					}
					time.Sleep(time.Millisecond)
				}
				x.fwdTimeout = true
			}}
		},
		setup: func(x *ospRank) error {
			hooksOf[x.r] = x.hook.(*OSP)
			return nil
		},
		afterBackward: func(x *ospRank, s int) error {
			if s == 1 {
				rk[x.r].deferred1 = x.dp.Stats().Deferred
			}
			if s == 2 {
				rk[x.r].bwdEnd = time.Now()
				rk[x.r].trace = hooksOf[x.r].Trace()
			}
			rk[x.r].step = s + 1
			return nil
		},
	}.run(t)
	for r, x := range rk {
		if x.deferred1 == 0 {
			t.Fatalf("rank %d: iteration 1 deferred nothing", r)
		}
		if x.gateTimeout.Load() {
			t.Fatalf("rank %d: iteration 1's ICS was needed before iteration 2's forward started (the ICS did not overlap the next iteration)", r)
		}
		if x.fwdTimeout {
			t.Fatalf("rank %d: iteration 1's ICS did not complete during iteration 2's forward", r)
		}
		for _, ev := range x.trace {
			if ev.Iteration != 1 {
				continue
			}
			// The all-reduce cannot end before its sends passed the gate (fwdStart).
			if ev.End.Before(x.fwdStart) || ev.End.After(x.icsSeen) || !x.icsSeen.Before(x.bwdEnd) {
				t.Fatalf("rank %d: ICS %+v is not inside iteration 2's forward [%v, %v]", r, ev, x.fwdStart, x.icsSeen)
			}
			ms := func(tm time.Time) float64 { return float64(tm.Sub(t0).Microseconds()) / 1000 }
			t.Logf("rank %d: ICS of iteration 1, bucket %d (%d params, %d elements): queued %.2f ms, all-reduce %.2f..%.2f ms; "+
				"iteration 2: forward started %.2f ms, backward returned %.2f ms",
				r, ev.Bucket, ev.Params, ev.Elements, ms(ev.Queued), ms(ev.Start), ms(ev.End), ms(x.fwdStart), ms(x.bwdEnd))
		}
	}
}

// ospLoop runs steps [from, to) of the training loop on one rank, flushing after the
// backward of the steps in flush, and calls after (if not nil) after each step.
func ospLoop(ctx context.Context, r int, dp *ddp.DDP, opt *optim.SGD, tape *nn.Tape, from, to int, after func(int) error, flush ...int) error {
	for s := from; s < to; s++ {
		x, y := syntheticBatch(uint64(100*s+r), 4)
		tape.Reset()
		opt.ZeroGrad()
		if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		if slices.Contains(flush, s) {
			if err := dp.Flush(ctx); err != nil {
				return err
			}
		}
		opt.Step()
		if after != nil {
			if err := after(s); err != nil {
				return err
			}
		}
	}
	return nil
}

func eachRank(t *testing.T, p int, fn func(ctx context.Context, g comm.Group) error) {
	t.Helper()
	groups := commtest.Groups(t, p)
	eachRankOn(t, groups, fn)
}

// eachRankOn runs fn on every rank of groups at once (any transport) and fails the test with
// their errors; the first error cancels the others' context.
func eachRankOn(t *testing.T, groups []comm.Group, fn func(ctx context.Context, g comm.Group) error) {
	t.Helper()
	p := len(groups)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() {
			if errs[r] = fn(ctx, groups[r]); errs[r] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
