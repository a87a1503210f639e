package train_test

import (
	"context"
	"fmt"
	"iter"
	"math/rand/v2"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// toyBatches yields an epoch of a rank's batches of a synthetic 3-class problem: 8 samples of
// 4 features, labelled by which of three fixed directions they lie closest to. Every rank
// draws its own samples (seeded by rank, epoch and step).
func toyBatches(rank, steps int) func(ctx context.Context, epoch, start int) iter.Seq2[datasets.Batch, error] {
	centres := [3][4]float32{{2, 0, 0, 1}, {0, 2, 1, 0}, {-1, -1, 0, -2}}
	return func(ctx context.Context, epoch, start int) iter.Seq2[datasets.Batch, error] {
		return func(yield func(datasets.Batch, error) bool) {
			for s := start; s < steps; s++ {
				rng := rand.New(rand.NewPCG(uint64(rank), uint64(epoch*steps+s)))
				b := datasets.Batch{X: make([]float32, 8*4), Y: make([]int, 8), N: 8}
				for i := range b.N {
					b.Y[i] = rng.IntN(3)
					for j := range 4 {
						b.X[i*4+j] = centres[b.Y[i]][j] + float32(rng.NormFloat64())*0.5
					}
				}
				if !yield(b, ctx.Err()) {
					return
				}
			}
		}
	}
}

// trainToy trains a small perceptron on toyBatches with 2 in-process ranks and the comm hook
// that spec names, and returns the training loss of the first and the last epoch.
func trainToy(ctx context.Context, spec string) (first, last float64, err error) {
	const epochs, steps = 4, 25
	hook, err := train.ParseHook(spec, 2) // once: every rank builds its own hook from it
	if err != nil {
		return 0, 0, err
	}
	groups, err := comm.NewLocal(2)
	if err != nil {
		return 0, 0, err
	}
	var losses []float64 // rank 0's view of every epoch's loss over both ranks
	err = train.RunRanks(ctx, groups, func(ctx context.Context, g comm.Group) error {
		rng := nn.NewRand(1) // the same initial weights on every rank (DDP checks it)
		model := nn.NewSequential(nn.NewLinear(4, 16, true, rng), nn.ReLU{}, nn.NewLinear(16, 3, true, rng))
		flags := train.Flags{LR: 0.1, Momentum: 0.9}
		rep, err := train.Setup{Hook: hook, Flags: &flags}.New(ctx, g, model)
		if err != nil {
			return err
		}
		loop := &train.Loop[datasets.Batch]{
			Group: g, DDP: rep.DDP, Model: model, Optimizer: rep.Optimizer, Epochs: epochs, StepsPerEpoch: steps,
			Batches: toyBatches(g.Rank(), steps),
			Step:    train.ClassifierStep(rep.DDP, nn.NewTape(), 4),
			EndEpoch: func(_ context.Context, es train.EpochStats) error {
				if g.Rank() == 0 {
					losses = append(losses, es.Loss)
				}
				return nil
			},
		}
		return loop.Run(ctx)
	})
	if err != nil {
		return 0, 0, err
	}
	return losses[0], losses[len(losses)-1], nil
}

// Training a model of one's own with 2 in-process ranks: train.Setup builds the comm hook
// from its -hook spec, DDP and the optimizer on every rank, and train.Loop runs the epochs.
// Swapping the gradient communication is swapping the spec.
func Example() {
	for _, spec := range []string{"allreduce", "topka:density=0.5"} {
		first, last, err := trainToy(context.Background(), spec)
		if err != nil {
			fmt.Println(spec, err)
			continue
		}
		fmt.Printf("-hook %s: the loss fell below half its first epoch's: %v\n", spec, last < first/2)
	}
	// Output:
	// -hook allreduce: the loss fell below half its first epoch's: true
	// -hook topka:density=0.5: the loss fell below half its first epoch's: true
}
