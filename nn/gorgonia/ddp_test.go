package gorgonia

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

const (
	headIn, headHidden, classes = 8 * 2 * 2, 16, 5
)

// features is a small spargo conv stack for 3×8×8 images: [N, 32] out.
func features(seed uint64) *nn.Sequential {
	rng := nn.NewRand(seed)
	return nn.NewSequential(nn.NewConv2d(3, 6, 3, 1, 1, true, rng), nn.ReLU{}, nn.MaxPool2d{Kernel: 2},
		nn.NewConv2d(6, 8, 3, 1, 1, true, rng), nn.ReLU{}, nn.AvgPool2d{Kernel: 2}, nn.Flatten{})
}

// mixedNet is spargo convolutions followed by a gorgonia MLP head; allSpargoNet is the same
// model with a spargo head of identical weights.
func mixedNet(t testing.TB, seed uint64) *nn.Sequential {
	ref := allSpargoNet(seed)
	head := mustBlock(t, mlpBuild(headIn, headHidden, classes, nil), seed, []int{4, headIn})
	l1, l2 := ref.Children()[1].Module.(*nn.Sequential).Children()[0].Module.(*nn.Linear), ref.Children()[1].Module.(*nn.Sequential).Children()[2].Module.(*nn.Linear)
	copyLinearInto(head.OwnParams(), 0, l1)
	copyLinearInto(head.OwnParams(), 2, l2)
	m := nn.NewSequential().Add("features", ref.Children()[0].Module).Add("head", head)
	nn.Parameters(m)
	return m
}

func allSpargoNet(seed uint64) *nn.Sequential {
	head, _, _ := spargoMLP(headIn, headHidden, classes, seed+1)
	m := nn.NewSequential().Add("features", features(seed)).Add("head", head)
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
		y[i] = rng.IntN(classes)
	}
	return x, y
}

// trainDDP trains model(rank) on p in-process ranks for steps steps (batch 4, 3 on the last
// step: a second graph shape) and returns each rank's parameter hash after every step and
// rank 0's final parameters.
func trainDDP(t *testing.T, p int, spec string, steps int, model func(rank int) nn.Module) ([][]uint64, []*nn.Param) {
	t.Helper()
	groups, err := comm.NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hashes := make([][]uint64, p)
	errs := make([]error, p)
	var final []*nn.Param
	models := make([]nn.Module, p) // built here: a failed build must stop the test's goroutine
	for r := range p {
		models[r] = model(r)
	}
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() {
			errs[r] = func() error {
				h, err := hooks.Parse(spec)
				if err != nil {
					return err
				}
				dp, err := ddp.New(ctx, models[r], groups[r], ddp.WithCommHook(h), ddp.WithBucketCap(1024, 2048))
				if err != nil {
					return err
				}
				if len(dp.Plan()) < 2 {
					return fmt.Errorf("want several buckets, got %d", len(dp.Plan()))
				}
				opt, err := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4})
				if err != nil {
					return err
				}
				tape := nn.NewTape()
				for s := range steps {
					batch := 4
					if s == steps-1 {
						batch = 3
					}
					x, y := syntheticBatch(uint64(100*s+r), batch)
					tape.Reset()
					opt.ZeroGrad()
					loss := nn.CrossEntropy(dp.Forward(tape.Const(x)), y)
					if l := loss.Item(); math.IsNaN(float64(l)) || math.IsInf(float64(l), 0) {
						return fmt.Errorf("step %d: loss %v (%v)", s, l, tape.Err())
					}
					if err := dp.Backward(ctx, loss); err != nil {
						return fmt.Errorf("step %d: %w", s, err)
					}
					// Every parameter reached its bucket through a grad-ready hook; one the
					// hooks missed would be listed here.
					if u := dp.Stats().UnusedParams; len(u) > 0 {
						return fmt.Errorf("step %d: parameters reduced without a grad-ready hook: %v", s, u)
					}
					opt.Step()
					hashes[r] = append(hashes[r], paramHash(dp.Parameters()))
				}
				if r == 0 {
					final = dp.Parameters()
				}
				return nil
			}()
			if errs[r] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return hashes, final
}

// A model mixing spargo layers and a gorgonia block trains under DDP with 2 and 3 in-process
// workers, with the dense all-reduce and with SparDL: after every step every rank holds
// bit-identical parameters, and the parameters move.
func TestMixedModelReplicaConsistency(t *testing.T) {
	const steps = 4
	for _, spec := range []string{"allreduce", "spardl:buckets=ddp", "spardl:density=0.05,buckets=ddp"} {
		for _, p := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/P=%d", spec, p), func(t *testing.T) {
				initial := paramHash(nn.Parameters(mixedNet(t, 7)))
				hashes, _ := trainDDP(t, p, spec, steps, func(r int) nn.Module { return mixedNet(t, uint64(7+r)) })
				for s := range steps {
					for r := 1; r < p; r++ {
						if hashes[r][s] != hashes[0][s] {
							t.Fatalf("step %d: rank %d's parameters differ from rank 0's", s+1, r)
						}
					}
				}
				if hashes[0][steps-1] == initial {
					t.Fatal("the parameters did not change")
				}
			})
		}
	}
}

// DDP over the mixed model computes what DDP over the all-spargo model computes: after three
// SGD steps with the dense all-reduce on 2 ranks, every parameter agrees within 1e-4.
func TestMixedModelTrainsLikeAllSpargo(t *testing.T) {
	const steps = 3
	_, mixed := trainDDP(t, 2, "allreduce", steps, func(r int) nn.Module { return mixedNet(t, uint64(7+r)) })
	_, ref := trainDDP(t, 2, "allreduce", steps, func(r int) nn.Module { return allSpargoNet(uint64(7 + r)) })
	if len(mixed) != len(ref) {
		t.Fatalf("%d parameters, all-spargo %d", len(mixed), len(ref))
	}
	for i, p := range mixed {
		want := ref[i].Value.Data
		got := p.Value.Data
		if p.Name == "head.fc1.weight" {
			got = transposeGrad(got, headIn, headHidden)
		} else if p.Name == "head.fc2.weight" {
			got = transposeGrad(got, headHidden, classes)
		}
		closeTo(t, p.Name+" vs "+ref[i].Name, got, want, 1e-4)
	}
}
