package overlap

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// workload feeds one rank: each call of loss draws the next batch, runs forward (the model's
// or DDP's) on a reset tape and returns the mean cross-entropy.
type workload struct {
	describe string
	lm       bool
	loss     func(tape *nn.Tape, forward func(*nn.Var) *nn.Var) (*nn.Var, error)
}

// dataRand is rank's data generator: the same for every hook, different for every rank.
func dataRand(seed uint64, rank int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(rank)+1))
}

// newWorkload returns rank's data for m (built from cfg.Model) in a job of world ranks.
func newWorkload(cfg Config, m nn.Module, rank, world int) (*workload, error) {
	if lm, ok := m.(*models.LSTMLM); ok {
		return lmWorkload(cfg, lm.Config.Vocab, rank, world)
	}
	in := cfg.Model.Input
	if in.Size == 0 {
		return nil, fmt.Errorf("overlap: model %s (family %s): neither an image classifier nor an LSTM language model", cfg.Model.Name, cfg.Model.Family)
	}
	rng := dataRand(cfg.Seed, rank)
	x := nn.NewTensor(cfg.Batch, in.Channels, in.Size, in.Size)
	y := make([]int, cfg.Batch)
	return &workload{
		describe: fmt.Sprintf("random images %d×%d×%d (normal), random labels of %d classes", in.Channels, in.Size, in.Size, in.Classes),
		loss: func(tape *nn.Tape, forward func(*nn.Var) *nn.Var) (*nn.Var, error) {
			for i := range x.Data {
				x.Data[i] = float32(rng.NormFloat64())
			}
			for i := range y {
				y[i] = rng.IntN(in.Classes)
			}
			tape.Reset()
			loss := nn.CrossEntropy(forward(tape.Const(x)), y)
			return loss, tape.Err()
		},
	}, nil
}

// lmWorkload feeds windows of cfg.BPTT × cfg.Batch tokens: consecutive windows of the rank's
// shard of cfg.Tokens, or uniformly random tokens when there are none. Every window starts
// from the zero hidden state.
func lmWorkload(cfg Config, vocab, rank, world int) (*workload, error) {
	if cfg.BPTT < 1 {
		return nil, fmt.Errorf("overlap: model %s: bptt %d: want at least 1 token per window", cfg.Model.Name, cfg.BPTT)
	}
	steps, cols := cfg.BPTT, cfg.Batch
	xs, ys := make([]float32, steps*cols), make([]int, steps*cols)
	var next func()
	describe := fmt.Sprintf("random tokens (uniform over %d), windows of %d × %d", vocab, steps, cols)
	if cfg.Tokens == nil {
		rng := dataRand(cfg.Seed, rank)
		next = func() {
			for i := range xs {
				xs[i], ys[i] = float32(rng.IntN(vocab)), rng.IntN(vocab)
			}
		}
	} else {
		if top := slices.Max(cfg.Tokens); int(top) >= vocab || slices.Min(cfg.Tokens) < 0 {
			return nil, fmt.Errorf("overlap: model %s has a vocabulary of %d, the token stream has ids up to %d", cfg.Model.Name, vocab, top)
		}
		shard, err := datasets.ShardTokens(cfg.Tokens, rank, world)
		if err != nil {
			return nil, fmt.Errorf("overlap: %w", err)
		}
		b, err := datasets.Batchify(shard, cols)
		if err != nil {
			return nil, fmt.Errorf("overlap: rank %d's shard: %w", rank, err)
		}
		full := (b.Rows - 1) / steps // windows of full length
		if full < 1 {
			return nil, fmt.Errorf("overlap: rank %d's shard of %d tokens in %d columns has no window of %d steps", rank, len(shard), cols, steps)
		}
		describe = fmt.Sprintf("token windows of %d × %d, consecutive in each rank's shard (%d of %d tokens)", steps, cols, len(shard), len(cfg.Tokens))
		i := 0
		next = func() {
			x, y, _ := b.Window(i%full, steps)
			for j := range xs {
				xs[j], ys[j] = float32(x[j]), int(y[j])
			}
			i++
		}
	}
	return &workload{describe: describe, lm: true,
		loss: func(tape *nn.Tape, forward func(*nn.Var) *nn.Var) (*nn.Var, error) {
			next()
			x, err := nn.FromSlice(xs, steps, cols)
			if err != nil {
				return nil, err
			}
			tape.Reset()
			loss := nn.CrossEntropy(forward(tape.Const(x)), ys)
			return loss, tape.Err()
		}}, nil
}
