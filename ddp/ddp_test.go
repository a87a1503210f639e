package ddp

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// smallNet is a CNN without BatchNorm, so P workers on B samples each compute exactly
// the gradient of one worker on P·B samples.
func smallNet(seed uint64) nn.Module {
	rng := nn.NewRand(seed)
	m := nn.NewSequential(
		nn.NewConv2d(3, 8, 3, 1, 1, true, rng), nn.ReLU{}, nn.MaxPool2d{Kernel: 2},
		nn.NewConv2d(8, 16, 3, 1, 1, true, rng), nn.ReLU{}, nn.AvgPool2d{Kernel: 2},
		nn.Flatten{}, nn.NewLinear(16*2*2, 32, true, rng), nn.ReLU{}, nn.NewLinear(32, 5, true, rng))
	nn.Parameters(m)
	return m
}

func syntheticBatch(seed uint64, n int) (*nn.Tensor, []int) {
	rng := nn.NewRand(seed)
	x := nn.NewTensor(n, 3, 8, 8)
	for i := range x.Data {
		x.Data[i] = float32(rng.NormFloat64())
	}
	y := make([]int, n)
	for i := range y {
		y[i] = rng.IntN(5)
	}
	return x, y
}

func paramHash(ps []*nn.Param) uint64 {
	h := fnv.New64a()
	for _, p := range ps {
		for _, v := range p.Value.Data {
			b := math.Float32bits(v)
			h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
		}
	}
	return h.Sum64()
}

// runRanks runs fn on P in-process ranks and returns the first error.
func runRanks(t *testing.T, p int, fn func(g comm.Group) error) {
	t.Helper()
	groups := commtest.Groups(t, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := 0; r < p; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			errs[r] = fn(groups[r])
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestDDPEquivalentToSingleProcess(t *testing.T) {
	const steps, batch = 20, 4
	sgd := optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4}
	for _, P := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("P=%d", P), func(t *testing.T) {
			// Reference: one process on the concatenated batch of P·B.
			ref := smallNet(1)
			refParams := nn.Parameters(ref)
			refOpt, _ := optim.NewSGD(refParams, sgd)
			tape := nn.NewTape()
			for s := 0; s < steps; s++ {
				x, y := syntheticBatch(uint64(100+s), P*batch)
				tape.Reset()
				refOpt.ZeroGrad()
				if err := tape.Backward(nn.CrossEntropy(ref.Forward(tape.Const(x)), y)); err != nil {
					t.Fatal(err)
				}
				refOpt.Step()
			}
			hashes := make([][]uint64, P)
			final := make([][]*nn.Param, P)
			runRanks(t, P, func(g comm.Group) error {
				ctx := context.Background()
				// Ranks start from different seeds: New must broadcast rank 0's weights.
				m := smallNet(uint64(1 + 7*g.Rank()))
				// Small buckets so several are in flight per step.
				dp, err := New(ctx, m, g, WithBucketCap(2048, 8192))
				if err != nil {
					return err
				}
				opt, _ := optim.NewSGD(dp.Parameters(), sgd)
				tape := nn.NewTape()
				for s := 0; s < steps; s++ {
					x, y := syntheticBatch(uint64(100+s), P*batch)
					per := x.Len() / P
					xr, _ := nn.FromSlice(x.Data[g.Rank()*per:(g.Rank()+1)*per], batch, 3, 8, 8)
					tape.Reset()
					opt.ZeroGrad()
					if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(xr)), y[g.Rank()*batch:(g.Rank()+1)*batch])); err != nil {
						return err
					}
					opt.Step()
					hashes[g.Rank()] = append(hashes[g.Rank()], paramHash(dp.Parameters()))
				}
				if len(dp.Plan()) < 2 {
					return fmt.Errorf("want several buckets, got %d", len(dp.Plan()))
				}
				final[g.Rank()] = dp.Parameters()
				return nil
			})
			for s := 0; s < steps; s++ {
				for r := 1; r < P; r++ {
					if hashes[r][s] != hashes[0][s] {
						t.Fatalf("step %d: rank %d's parameters differ from rank 0's", s+1, r)
					}
				}
			}
			var worst float64
			for i, p := range refParams {
				for j, v := range p.Value.Data {
					worst = max(worst, math.Abs(float64(v-final[0][i].Value.Data[j])))
				}
			}
			t.Logf("P=%d: max |ddp - single| after %d steps = %.3g", P, steps, worst)
			if worst > 1e-5 {
				t.Fatalf("max abs parameter difference %.3g > 1e-5", worst)
			}
		})
	}
}

// gateHook signals when bucket 0's communication starts.
type gateHook struct {
	AllReduceHook
	started chan struct{}
	once    sync.Once
}

func (h *gateHook) Run(ctx context.Context, g comm.Group, b Bucket) Future {
	if b.Index() == 0 {
		h.once.Do(func() { close(h.started) })
	}
	return h.AllReduceHook.Run(ctx, g, b)
}

// Communication overlaps backward: the grad-ready hook of the model's first parameter
// (the last gradient to become final) blocks until bucket 0's communication has
// started. If DDP only communicated after backward, this would time out.
func TestCommunicationOverlapsBackward(t *testing.T) {
	runRanks(t, 2, func(g comm.Group) error {
		ctx := context.Background()
		m := smallNet(3)
		hook := &gateHook{started: make(chan struct{})}
		dp, err := New(ctx, m, g, WithCommHook(hook), WithBucketCap(4096, 4096))
		if err != nil {
			return err
		}
		first := dp.Parameters()[0]
		if dp.Plan()[len(dp.Plan())-1][len(dp.Plan()[len(dp.Plan())-1])-1] != 0 {
			return fmt.Errorf("plan does not end with parameter 0: %v", dp.Plan())
		}
		tape := nn.NewTape()
		var overlapped bool
		tape.OnGradReady(func(p *nn.Param) {
			if p != first {
				return
			}
			select {
			case <-hook.started:
				overlapped = true
			case <-time.After(20 * time.Second):
			}
		})
		x, y := syntheticBatch(9, 4)
		if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
			return err
		}
		if !overlapped {
			return fmt.Errorf("bucket 0 did not start communicating before backward finished")
		}
		st := dp.Stats()
		if st.Buckets[0].CommStart >= st.BackwardEnd {
			return fmt.Errorf("timestamps: bucket 0 comm start %v, backward end %v", st.Buckets[0].CommStart, st.BackwardEnd)
		}
		if g.Rank() == 0 {
			for _, b := range st.Buckets {
				t.Logf("bucket %d: %d params %d B ready %v comm %v..%v (backward end %v)", b.Index, b.Params, b.Bytes, b.Ready, b.CommStart, b.CommEnd, st.BackwardEnd)
			}
		}
		return nil
	})
}

func TestShapeMismatchNamesParamAndRanks(t *testing.T) {
	groups := commtest.Groups(t, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			rng := nn.NewRand(1)
			hidden := 6
			if r == 2 {
				hidden = 7
			}
			m := nn.NewSequential(nn.NewLinear(4, hidden, true, rng), nn.NewLinear(hidden, 2, true, rng))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, errs[r] = New(ctx, m, groups[r])
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), `rank 0 has "0.weight [6 4]", rank 2 has "0.weight [7 4]"`) {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestNoSyncAccumulates(t *testing.T) {
	// Two micro-batches under NoSync then one synchronised = one step on their union.
	runRanks(t, 2, func(g comm.Group) error {
		ctx := context.Background()
		dp, err := New(ctx, smallNet(5), g)
		if err != nil {
			return err
		}
		ref := smallNet(5)
		tape := nn.NewTape()
		x, y := syntheticBatch(uint64(50+g.Rank()), 6)
		part := func(i int) (*nn.Tensor, []int) {
			t, _ := nn.FromSlice(x.Data[i*3*192:(i+1)*3*192], 3, 3, 8, 8)
			return t, y[i*3 : (i+1)*3]
		}
		nn.ZeroGrad(dp.Parameters())
		var comms int64
		err = dp.NoSync(func() error {
			xa, ya := part(0)
			before := g.Counters().Snapshot()
			loss := nn.CrossEntropy(dp.Forward(tape.Const(xa)), ya)
			err := dp.Backward(ctx, loss)
			comms = g.Counters().Snapshot().Sub(before).MsgsSent
			return err
		})
		if err != nil {
			return err
		}
		if comms != 0 {
			return fmt.Errorf("NoSync backward sent %d messages", comms)
		}
		tape.Reset()
		xb, yb := part(1)
		if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(xb)), yb)); err != nil {
			return err
		}
		// Reference: both ranks' sums of the two half-batch mean losses, averaged.
		rp := nn.Parameters(ref)
		acc := make([][]float32, len(rp))
		for r := 0; r < 2; r++ {
			xr, yr := syntheticBatch(uint64(50+r), 6)
			for i := 0; i < 2; i++ {
				xi, _ := nn.FromSlice(xr.Data[i*3*192:(i+1)*3*192], 3, 3, 8, 8)
				tp := nn.NewTape()
				nn.ZeroGrad(rp)
				if err := tp.Backward(nn.CrossEntropy(ref.Forward(tp.Const(xi)), yr[i*3:(i+1)*3])); err != nil {
					return err
				}
				for k, p := range rp {
					if acc[k] == nil {
						acc[k] = make([]float32, p.Len())
					}
					kernels.Axpy(0.5, p.Grad.Data, acc[k])
				}
			}
		}
		for k, p := range dp.Parameters() {
			for j, v := range p.Grad.Data {
				if math.Abs(float64(v-acc[k][j])) > 1e-5 {
					return fmt.Errorf("%s[%d]: grad %g, want %g", p.Name, j, v, acc[k][j])
				}
			}
		}
		return nil
	})
}

func TestSizeCappedPlan(t *testing.T) {
	ps := []*nn.Param{nn.NewParam("a", 100), nn.NewParam("b", 300), nn.NewParam("c", 50), nn.NewParam("d", 200), nn.NewParam("e", 10)}
	// 4 bytes per element; first cap 800 B (200 elements), then 1600 B.
	got := fmt.Sprint(SizeCappedPlan(ps, 800, 1600))
	if want := "[[4 3] [2 1 0]]"; got != want {
		t.Fatalf("plan %s, want %s", got, want)
	}
	if err := validatePlan([][]int{{0, 1}, {1, 2}}, 3); err == nil {
		t.Fatal("duplicate parameter accepted")
	}
	if err := validatePlan([][]int{{0}}, 2); err == nil {
		t.Fatal("missing parameter accepted")
	}
}

// Buffers (BatchNorm running statistics) follow rank 0 after every step.
func TestBuffersBroadcastAfterStep(t *testing.T) {
	bufHash := make([]uint64, 2)
	runRanks(t, 2, func(g comm.Group) error {
		ctx := context.Background()
		rng := nn.NewRand(1)
		m := nn.NewSequential(nn.NewConv2d(3, 4, 3, 1, 1, true, rng), nn.NewBatchNorm2d(4), nn.ReLU{}, nn.Flatten{}, nn.NewLinear(4*64, 5, true, rng))
		dp, err := New(ctx, m, g)
		if err != nil {
			return err
		}
		x, y := syntheticBatch(uint64(10+g.Rank()), 4) // different data per rank
		tape := nn.NewTape()
		if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
			return err
		}
		h := fnv.New64a()
		for _, b := range nn.Buffers(m) {
			fmt.Fprint(h, b.Value.Data)
		}
		bufHash[g.Rank()] = h.Sum64()
		return nil
	})
	if bufHash[0] != bufHash[1] {
		t.Fatal("running statistics differ across ranks after a step")
	}
}

// Without the per-step broadcast each rank's running statistics follow its own batches;
// AverageBuffers leaves every rank with their mean.
func TestAverageBuffers(t *testing.T) {
	const p = 3
	before := make([][]float32, p)
	after := make([][]float32, p)
	runRanks(t, p, func(g comm.Group) error {
		ctx := context.Background()
		rng := nn.NewRand(1)
		m := nn.NewSequential(nn.NewConv2d(3, 4, 3, 1, 1, true, rng), nn.NewBatchNorm2d(4), nn.ReLU{}, nn.Flatten{}, nn.NewLinear(4*64, 5, true, rng))
		dp, err := New(ctx, m, g, WithBroadcastBuffers(false))
		if err != nil {
			return err
		}
		x, y := syntheticBatch(uint64(10+g.Rank()), 4) // different data per rank
		tape := nn.NewTape()
		if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
			return err
		}
		for _, b := range nn.Buffers(m) {
			before[g.Rank()] = append(before[g.Rank()], b.Value.Data...)
		}
		if err := dp.AverageBuffers(ctx); err != nil {
			return err
		}
		for _, b := range nn.Buffers(m) {
			after[g.Rank()] = append(after[g.Rank()], b.Value.Data...)
		}
		return nil
	})
	if slices.Equal(before[0], before[1]) {
		t.Fatal("without the broadcast the ranks' running statistics should differ")
	}
	for i := range after[0] {
		var sum float64
		for r := range p {
			sum += float64(before[r][i])
		}
		for r := range p {
			if math.Abs(float64(after[r][i])-sum/p) > 1e-6*(1+math.Abs(sum)) {
				t.Fatalf("rank %d buffer value %d = %v, want the mean %v", r, i, after[r][i], sum/p)
			}
			if math.Float32bits(after[r][i]) != math.Float32bits(after[0][i]) {
				t.Fatalf("rank %d buffer value %d = %v differs from rank 0's %v", r, i, after[r][i], after[0][i])
			}
		}
	}
}

func TestHookErrorIsReported(t *testing.T) {
	runRanks(t, 2, func(g comm.Group) error {
		ctx := context.Background()
		dp, err := New(ctx, smallNet(1), g, WithCommHook(badHook{}))
		if err != nil {
			return err
		}
		x, y := syntheticBatch(1, 2)
		tape := nn.NewTape()
		err = dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y))
		if err == nil || !strings.Contains(err.Error(), "hook bad returned 1 values for bucket 0") {
			return fmt.Errorf("want a hook result-size error, got %v", err)
		}
		return nil
	})
}

type badHook struct{}

func (badHook) Name() string { return "bad" }
func (badHook) Run(context.Context, comm.Group, Bucket) Future {
	return Ready([]float32{1}, nil)
}

// skipHead uses only its first layer: the second layer's parameters never get a
// gradient, and DDP must still complete the iteration (reducing them unchanged).
type skipHead struct{ used, unused *nn.Linear }

func (m *skipHead) Children() []nn.Child {
	return []nn.Child{{Name: "used", Module: m.used}, {Name: "unused", Module: m.unused}}
}
func (m *skipHead) Forward(x *nn.Var) *nn.Var { return m.used.Forward(x) }

func TestUnusedParametersDoNotHang(t *testing.T) {
	runRanks(t, 2, func(g comm.Group) error {
		rng := nn.NewRand(1)
		m := &skipHead{used: nn.NewLinear(4, 3, true, rng), unused: nn.NewLinear(3, 3, true, rng)}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		dp, err := New(ctx, m, g, WithBucketCap(16, 16))
		if err != nil {
			return err
		}
		x := nn.NewTensor(2, 4)
		tape := nn.NewTape()
		if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), []int{0, 2})); err != nil {
			return err
		}
		if got := strings.Join(dp.Stats().UnusedParams, " "); got != "unused.weight unused.bias" {
			return fmt.Errorf("unused params %q", got)
		}
		return nil
	})
}
