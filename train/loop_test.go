package train

import (
	"context"
	"iter"
	"math"
	"sync"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// toyBatch is a toy classification batch: 4 samples of 6 features.
type toyBatch struct {
	x []float32
	y []int
}

// toyLoop is a Loop over 2 in-process ranks training a linear classifier with plain SGD
// (lr 0.5, so an update is −0.5 × the gradient) on fixed batches; edit sets its options.
func toyLoop(t *testing.T, epochs, steps int, edit func(rank int, l *Loop[toyBatch])) [][]*nn.Param {
	t.Helper()
	out, errs := toyLoopCtx(t, context.Background(), epochs, steps, edit)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// toyLoopCtx is toyLoop run with ctx; it returns the ranks' errors.
func toyLoopCtx(t *testing.T, ctx context.Context, epochs, steps int, edit func(rank int, l *Loop[toyBatch])) ([][]*nn.Param, []error) {
	t.Helper()
	groups, err := comm.NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]*nn.Param, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			errs[r] = func() error {
				model := nn.NewLinear(6, 3, true, nn.NewRand(1))
				dp, err := ddp.New(context.Background(), model, g)
				if err != nil {
					return err
				}
				opt, err := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.5})
				if err != nil {
					return err
				}
				tape := nn.NewTape()
				l := &Loop[toyBatch]{Group: g, DDP: dp, Model: model, Optimizer: opt, Epochs: epochs, StepsPerEpoch: steps,
					Batches: func(ctx context.Context, epoch, start int) iter.Seq2[toyBatch, error] {
						return func(yield func(toyBatch, error) bool) {
							for s := start; s < steps; s++ {
								b := toyBatch{x: make([]float32, 24), y: []int{0, 1, 2, (s + r) % 3}}
								for i := range b.x {
									b.x[i] = float32(math.Sin(float64(i*(s+1)+r+epoch))) * 10 // large: gradients worth clipping
								}
								if !yield(b, nil) {
									return
								}
							}
						}
					},
					Step: func(ctx context.Context, b toyBatch) (StepResult, error) {
						x, _ := nn.FromSlice(b.x, 4, 6)
						tape.Reset()
						loss := nn.CrossEntropy(dp.Forward(tape.Const(x)), b.y)
						if err := dp.Backward(ctx, loss); err != nil {
							return StepResult{}, err
						}
						return StepResult{Loss: float64(loss.Item()), N: 4}, nil
					},
				}
				edit(r, l)
				out[r] = dp.Parameters()
				return l.Run(ctx)
			}()
		})
	}
	wg.Wait()
	return out, errs
}

func gradNorm(ps []*nn.Param) float64 {
	var s float64
	for _, p := range ps {
		for _, g := range p.Grad.Data {
			s += float64(g) * float64(g)
		}
	}
	return math.Sqrt(s)
}

// The loop calls Clip on every step, with the synchronised (equal on every rank) gradients
// and MaxNorm, and the optimizer applies what Clip left: each update's norm is lr × MaxNorm
// when the gradient was larger. Without Clip (or with MaxNorm 0) nothing is clipped.
func TestLoopClip(t *testing.T) {
	const maxNorm, lr = 0.25, 0.5
	var mu sync.Mutex
	norms := map[int][]float64{}
	var updates []float64 // rank 0's update norms
	toyLoop(t, 1, 3, func(rank int, l *Loop[toyBatch]) {
		l.MaxNorm = maxNorm
		l.Clip = func(ps []*nn.Param, max float64) float64 {
			norm := gradNorm(ps)
			if max != maxNorm || len(ps) != 2 {
				t.Errorf("Clip got max %v and %d parameters", max, len(ps))
			}
			if norm > max {
				for _, p := range ps {
					for i := range p.Grad.Data {
						p.Grad.Data[i] *= float32(max / norm)
					}
				}
			}
			mu.Lock()
			norms[rank] = append(norms[rank], norm)
			mu.Unlock()
			if rank == 0 { // remember the values before the step: the update is measured after it
				before := make([][]float32, len(ps))
				for i, p := range ps {
					before[i] = append([]float32(nil), p.Value.Data...)
				}
				l.Schedule = afterStep{func() {
					var s float64
					for i, p := range ps {
						for j, v := range p.Value.Data {
							d := float64(v - before[i][j])
							s += d * d
						}
					}
					updates = append(updates, math.Sqrt(s))
				}, lr}
			}
			return norm
		}
	})
	if len(norms[0]) != 3 || len(norms[1]) != 3 {
		t.Fatalf("Clip calls per rank: %d, %d; want 3 each", len(norms[0]), len(norms[1]))
	}
	for i := range norms[0] {
		if norms[0][i] != norms[1][i] {
			t.Errorf("step %d: rank 0 clipped a gradient of norm %v, rank 1 %v: not the synchronised gradients", i+1, norms[0][i], norms[1][i])
		}
		if norms[0][i] <= maxNorm {
			t.Fatalf("step %d: gradient norm %v: the test needs gradients above %v", i+1, norms[0][i], maxNorm)
		}
	}
	// updates[i] is measured at the start of step i+2 (the schedule runs before each step).
	if len(updates) != 2 {
		t.Fatalf("%d updates measured", len(updates))
	}
	for i, u := range updates {
		if math.Abs(u-lr*maxNorm) > 1e-6 {
			t.Errorf("update %d has norm %v, want lr × MaxNorm = %v", i+1, u, lr*maxNorm)
		}
	}
	// MaxNorm 0: Clip is not called.
	toyLoop(t, 1, 2, func(rank int, l *Loop[toyBatch]) {
		l.Clip = func([]*nn.Param, float64) float64 { t.Error("Clip called with MaxNorm 0"); return 0 }
	})
}

// afterStep is a Schedule that runs f when asked for the next step's rate, i.e. after the
// previous step's optimizer update.
type afterStep struct {
	f  func()
	lr float64
}

func (a afterStep) LR(int, int, int) float64 { a.f(); return a.lr }

// LogEvery: a StepRecord after every LogEvery optimizer steps of the run (counted across
// epochs), with the mean loss over both ranks and the steps since the last record, the rate
// and the epoch's length; rank 1 takes part in the collective without a LogStep.
func TestLoopLogEvery(t *testing.T) {
	var recs []StepRecord
	var losses [2][]float64
	toyLoop(t, 2, 3, func(rank int, l *Loop[toyBatch]) {
		l.LogEvery = 2
		l.Schedule = optim.Constant(0.25)
		step := l.Step
		l.Step = func(ctx context.Context, b toyBatch) (StepResult, error) {
			res, err := step(ctx, b)
			losses[rank] = append(losses[rank], res.Loss)
			return res, err
		}
		if rank == 0 {
			l.LogStep = func(r StepRecord) error { recs = append(recs, r); return nil }
		}
	})
	if len(recs) != 3 {
		t.Fatalf("%d step records, want 3 (steps 2, 4, 6): %+v", len(recs), recs)
	}
	for i, r := range recs {
		var sum float64
		for s := 2 * i; s < 2*i+2; s++ {
			sum += losses[0][s] + losses[1][s]
		}
		if r.Step != int64(2*i+2) || r.LR != 0.25 || r.StepsPerEpoch != 3 || math.Abs(r.Loss-sum/4) > 1e-5 || r.TotalSec <= 0 {
			t.Errorf("record %d: %+v, want step %d, loss %v", i, r, 2*i+2, sum/4)
		}
	}
}
