package ddp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// deferHook all-reduces every bucket whole, returns it now except for the parameters choose
// picks, whose averages it delivers late (optionally after gate). It records every
// iteration's averages and deferrals (rank 0's records are the test's oracle). The
// immediate result holds NaN at deferred parameters: DDP must not use it there.
type deferHook struct {
	choose func(iter int64, b Bucket) []int
	gate   func(iter int64) error

	mu       sync.Mutex
	avg      map[int64]map[*nn.Param][]float32
	deferred map[int64][]*nn.Param
}

func newDeferHook(choose func(int64, Bucket) []int) *deferHook {
	return &deferHook{choose: choose, avg: map[int64]map[*nn.Param][]float32{}, deferred: map[int64][]*nn.Param{}}
}

func (h *deferHook) Name() string { return "defer" }

func (h *deferHook) Run(ctx context.Context, g comm.Group, b Bucket) Future {
	res, err := AllReduceHook{}.Run(ctx, g, b).Wait()
	if err != nil {
		return Ready(nil, err)
	}
	it := b.Iteration()
	idx := h.choose(it, b)
	h.mu.Lock()
	if h.avg[it] == nil {
		h.avg[it] = map[*nn.Param][]float32{}
	}
	var late []float32
	for i, p := range b.Params() {
		v := res[b.Offsets()[i] : b.Offsets()[i]+p.Len()]
		h.avg[it][p] = slices.Clone(v)
		if slices.Contains(idx, i) {
			late = append(late, v...)
			h.deferred[it] = append(h.deferred[it], p)
			for j := range v {
				v[j] = float32(math.NaN())
			}
		}
	}
	h.mu.Unlock()
	if len(idx) == 0 {
		return Ready(res, nil)
	}
	return Defer(Ready(res, nil), Deferred{Params: idx, Result: gatedFuture{late, func() error {
		if h.gate != nil {
			return h.gate(it)
		}
		return nil
	}}, Correct: true})
}

// deferredAt returns the parameters deferred at iteration it.
func (h *deferHook) deferredAt(it int64) []*nn.Param {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deferred[it]
}

type gatedFuture struct {
	v    []float32
	gate func() error
}

func (f gatedFuture) Wait() ([]float32, error) {
	if err := f.gate(); err != nil {
		return nil, err
	}
	return f.v, nil
}

// everyOtherParam defers, from iteration 1 on, the bucket positions i with (iter+i) % 3 != 0:
// parameters move in and out of the deferred set, so every case (deferred twice in a row,
// deferred after not, not after deferred) occurs.
func everyOtherParam(iter int64, b Bucket) []int {
	if iter == 0 {
		return nil
	}
	var idx []int
	for i := range b.Params() {
		if (int(iter)+i)%3 != 0 {
			idx = append(idx, i)
		}
	}
	return idx
}

// The optimizer applies every global gradient exactly once, deferred ones one step late,
// with momentum and weight decay on the true values: after every step the true parameters
// equal, bit for bit, a single-process SGD replaying the shifted gradient sequence (a
// deferred parameter's gradient at step t is what arrived for it late, G_{t-1} or 0; step 3
// and the last step flush), and the ranks' true parameters are bit-identical. LGP: every training
// forward runs on the dense run's parameters (an SGD fed G_t at every step, weight decay
// taken from the true values), except that the newest deferred gradients are the rank's
// local ones.
func TestLateResultsAppliedOnceOneStepLate(t *testing.T) {
	const P, steps, batch = 3, 7, 4
	flushAt := map[int64]bool{3: true, steps - 1: true}
	sgd := optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4}
	hks := make([]*deferHook, P)
	trueHash := make([][]uint64, P)
	var working, local0, trueVals []map[string][]float32 // rank 0's, per step
	snap := func(ps []*nn.Param) map[string][]float32 {
		m := map[string][]float32{}
		for _, p := range ps {
			m[p.Name] = slices.Clone(p.Value.Data)
		}
		return m
	}
	runRanks(t, P, func(g comm.Group) error {
		ctx := context.Background()
		h := newDeferHook(everyOtherParam)
		hks[g.Rank()] = h
		dp, err := New(ctx, smallNet(uint64(1+g.Rank())), g, WithCommHook(h), WithBucketCap(2048, 8192))
		if err != nil {
			return err
		}
		opt, _ := optim.NewSGD(dp.Parameters(), sgd)
		dp.SetCorrector(opt)
		tape := nn.NewTape()
		var loc map[string][]float32
		tape.OnGradReady(func(p *nn.Param) {
			if g.Rank() != 0 {
				return
			}
			if loc == nil { // the values this step's forward and backward ran on
				working = append(working, snap(dp.Parameters()))
				loc = map[string][]float32{}
			}
			// Each gradient as it becomes final, before DDP may write an average into it.
			loc[p.Name] = slices.Clone(p.Grad.Data)
		})
		for step := 0; step < steps; step++ {
			x, y := syntheticBatch(uint64(100*step+g.Rank()), batch)
			tape.Reset()
			opt.ZeroGrad()
			if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
				return err
			}
			if g.Rank() == 0 {
				local0, loc = append(local0, loc), nil
			}
			if st := dp.Stats(); (step > 0) != (st.Deferred > 0) || nn.NumParams(dp.Pending()) != st.Deferred ||
				!slices.Equal(dp.Pending(), h.deferredAt(int64(step))) {
				return fmt.Errorf("step %d: stats say %d elements deferred, Pending has %d", step, st.Deferred, nn.NumParams(dp.Pending()))
			}
			if flushAt[int64(step)] {
				if err := dp.Flush(ctx); err != nil {
					return err
				}
				if len(dp.Pending()) != 0 {
					return fmt.Errorf("%d parameters pending after Flush", len(dp.Pending()))
				}
			}
			opt.Step()
			trueHash[g.Rank()] = append(trueHash[g.Rank()], paramHash(dp.Parameters()))
			if g.Rank() == 0 {
				trueVals = append(trueVals, snap(dp.Parameters()))
			}
		}
		return nil
	})
	for s := range steps {
		for r := 1; r < P; r++ {
			if trueHash[r][s] != trueHash[0][s] {
				t.Fatalf("step %d: rank %d's true parameters differ from rank 0's", s+1, r)
			}
		}
	}
	h := hks[0]
	byName := func(ps []*nn.Param) map[string]*nn.Param {
		m := map[string]*nn.Param{}
		for _, p := range ps {
			m[p.Name] = p
		}
		return m
	}
	deferredNames := func(it int64) map[string]bool {
		m := map[string]bool{}
		for _, p := range h.deferredAt(it) {
			m[p.Name] = true
		}
		return m
	}
	avg := func(it int64) map[string][]float32 {
		m := map[string][]float32{}
		for p, v := range h.avg[it] {
			m[p.Name] = v
		}
		return m
	}

	// True values: one SGD on rank 0's initial parameters, fed the shifted global gradients.
	ref := nn.Parameters(smallNet(1))
	refBy := byName(ref)
	opt, _ := optim.NewSGD(ref, sgd)
	for s := int64(0); s < steps; s++ {
		now, before := deferredNames(s), deferredNames(s-1)
		G, Gprev := avg(s), avg(s-1)
		for name, rp := range refBy {
			if now[name] {
				clear(rp.Grad.Data)
			} else {
				copy(rp.Grad.Data, G[name])
			}
			if before[name] && !flushAt[s-1] {
				kernels.Add(rp.Grad.Data, rp.Grad.Data, Gprev[name])
			}
			if flushAt[s] && now[name] {
				kernels.Add(rp.Grad.Data, rp.Grad.Data, G[name])
			}
		}
		opt.Step()
		for name, rp := range refBy {
			if !slices.Equal(rp.Value.Data, trueVals[s][name]) {
				t.Fatalf("step %d: %s: true parameters differ from the replay of the shifted global gradients", s+1, name)
			}
		}
	}

	// LGP: the dense-equivalent run. Its state after step s-1 is cloned and stepped with the
	// local estimates of step s-1's deferred gradients to give the values forward s must use.
	dense := nn.Parameters(smallNet(1))
	denseBy := byName(dense)
	noWD := sgd
	noWD.WeightDecay = 0 // taken from the true values instead
	denseOpt, _ := optim.NewSGD(dense, noWD)
	stepDense := func(ps map[string]*nn.Param, o *optim.SGD, s int64, estimate bool) {
		wTrue := trueVals[max(s-1, 0)]
		if s == 0 {
			wTrue = snap(nn.Parameters(smallNet(1)))
		}
		G, est := avg(s), deferredNames(s)
		for name, p := range ps {
			src := G[name]
			if estimate && est[name] && !flushAt[s] { // a flushed step applied the global one
				src = local0[s][name]
			}
			for j := range p.Grad.Data {
				p.Grad.Data[j] = src[j] + float32(sgd.WeightDecay)*wTrue[name][j]
			}
		}
		o.Step()
	}
	var worst float64
	for s := int64(1); s < steps; s++ {
		clone := nn.Parameters(smallNet(1))
		for _, p := range clone {
			copy(p.Value.Data, denseBy[p.Name].Value.Data)
		}
		cloneOpt, _ := optim.NewSGD(clone, noWD)
		if err := cloneOpt.LoadState(denseOpt.State()); err != nil {
			t.Fatal(err)
		}
		stepDense(byName(clone), cloneOpt, s-1, true)
		for _, p := range clone {
			for j, v := range p.Value.Data {
				d := math.Abs(float64(v - working[s][p.Name][j]))
				worst = max(worst, d)
				if d > 1e-6 {
					t.Fatalf("forward %d: %s[%d] = %v, the dense-equivalent value is %v", s+1, p.Name, j, working[s][p.Name][j], v)
				}
			}
		}
		stepDense(denseBy, denseOpt, s-1, false)
	}
	t.Logf("largest |working − dense-equivalent| over %d forwards: %.3g", steps-1, worst)
}

// A late result may arrive during the next iteration's forward and backward: the late
// Future here is released from inside the next backward (a grad-ready hook). If DDP waited
// for it any earlier (in the Backward that deferred it, before the step, or in Forward) it
// would time out.
func TestLateResultArrivesDuringNextBackward(t *testing.T) {
	runRanks(t, 2, func(g comm.Group) error {
		ctx := context.Background()
		release := map[int64]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
		h := newDeferHook(func(iter int64, b Bucket) []int {
			if iter == 1 && b.Index() == 0 {
				return []int{0}
			}
			return nil
		})
		h.gate = func(iter int64) error {
			select {
			case <-release[iter]:
				return nil
			case <-time.After(10 * time.Second):
				return errors.New("the late result was awaited before the next backward could release it")
			}
		}
		dp, err := New(ctx, smallNet(2), g, WithCommHook(h), WithBucketCap(2048, 8192))
		if err != nil {
			return err
		}
		opt, _ := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.01})
		tape := nn.NewTape()
		var once sync.Once
		step := 0
		tape.OnGradReady(func(*nn.Param) {
			if step == 2 {
				once.Do(func() { close(release[1]) })
			}
		})
		for step = 0; step < 3; step++ {
			x, y := syntheticBatch(uint64(7+step), 4)
			tape.Reset()
			opt.ZeroGrad()
			if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
				return err
			}
			opt.Step()
		}
		if st := dp.Stats(); st.Iteration != 2 || st.Deferred != 0 {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
}

// An evaluation forward (recording off) runs on the true values; the next training forward
// puts the LGP offsets back.
func TestEvaluationForwardUsesTrueValues(t *testing.T) {
	runRanks(t, 2, func(g comm.Group) error {
		ctx := context.Background()
		h := newDeferHook(func(iter int64, b Bucket) []int {
			if b.Index() == 0 {
				return []int{0}
			}
			return nil
		})
		dp, err := New(ctx, smallNet(4), g, WithCommHook(h), WithBucketCap(2048, 8192))
		if err != nil {
			return err
		}
		opt, _ := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.1})
		dp.SetCorrector(opt)
		tape := nn.NewTape()
		x, y := syntheticBatch(uint64(3+g.Rank()), 4)
		if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
			return err
		}
		opt.Step()
		p := dp.Plan()[0][0]
		param := dp.Parameters()[p]
		trueVal := slices.Clone(param.Value.Data)
		tape.Reset()
		dp.Forward(tape.Const(x))
		corrected := slices.Clone(param.Value.Data)
		if slices.Equal(corrected, trueVal) || !slices.Equal(dp.TrueValue(param), trueVal) {
			return errors.New("a training forward did not apply the LGP offset to the deferred parameter")
		}
		tape.Reset()
		tape.SetGradEnabled(false)
		dp.Forward(tape.Const(x))
		if !slices.Equal(param.Value.Data, trueVal) {
			return errors.New("an evaluation forward ran on LGP-corrected values")
		}
		tape.Reset()
		tape.SetGradEnabled(true)
		dp.Forward(tape.Const(x))
		if !slices.Equal(param.Value.Data, corrected) {
			return errors.New("the training forward after an evaluation lost the LGP offset")
		}
		return nil
	})
}

type epochHook struct {
	AllReduceHook
	got []EpochInfo
}

func (h *epochHook) EndEpoch(_ context.Context, _ comm.Group, e EpochInfo) error {
	h.got = append(h.got, e)
	return nil
}

// EndEpoch averages each rank's mean Backward loss (and first loss) over the ranks and hands
// the same EpochInfo to the hook on every rank.
func TestEndEpochAveragesLossesAndTellsTheHook(t *testing.T) {
	const P = 3
	infos := make([][]EpochInfo, P)
	var losses [P][]float64
	runRanks(t, P, func(g comm.Group) error {
		ctx := context.Background()
		h := &epochHook{}
		dp, err := New(ctx, smallNet(5), g, WithCommHook(h))
		if err != nil {
			return err
		}
		tape := nn.NewTape()
		for epoch := range 2 {
			for s := range 2 + epoch {
				x, y := syntheticBatch(uint64(10*g.Rank()+s+100*epoch), 3)
				tape.Reset()
				loss := nn.CrossEntropy(dp.Forward(tape.Const(x)), y)
				losses[g.Rank()] = append(losses[g.Rank()], float64(loss.Item()))
				if err := dp.Backward(ctx, loss); err != nil {
					return err
				}
			}
			info, err := dp.EndEpoch(ctx)
			if err != nil {
				return err
			}
			infos[g.Rank()] = append(infos[g.Rank()], info)
		}
		if !slices.Equal(h.got, infos[g.Rank()]) {
			return fmt.Errorf("the hook got %+v, EndEpoch returned %+v", h.got, infos[g.Rank()])
		}
		return nil
	})
	at := 0
	for e := range 2 {
		n := 2 + e
		var mean, first float64
		for r := range P {
			var s float64
			for _, l := range losses[r][at : at+n] {
				s += l
			}
			mean += s / float64(n) / P
			first += losses[r][at] / P
		}
		at += n
		for r := range P {
			got := infos[r][e]
			if got != infos[0][e] {
				t.Fatalf("epoch %d: rank %d got %+v, rank 0 %+v", e+1, r, got, infos[0][e])
			}
			if got.Epoch != e+1 || math.Abs(got.Loss-mean) > 1e-5 || math.Abs(got.FirstLoss-first) > 1e-5 {
				t.Fatalf("epoch %d: %+v, want loss %v first %v", e+1, got, mean, first)
			}
		}
	}
}

func TestBadDeferralIsAnError(t *testing.T) {
	runRanks(t, 2, func(g comm.Group) error {
		ctx := context.Background()
		h := newDeferHook(func(int64, Bucket) []int { return []int{1, 0} })
		dp, err := New(ctx, smallNet(1), g, WithCommHook(h))
		if err != nil {
			return err
		}
		x, y := syntheticBatch(1, 2)
		tape := nn.NewTape()
		err = dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y))
		if err == nil || !strings.Contains(err.Error(), "want ascending indices") {
			return fmt.Errorf("want an error about the deferred indices, got %v", err)
		}
		return nil
	})
}
