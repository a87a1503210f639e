// Command gorgonia trains a CIFAR-10 classifier that mixes spargo layers and a block written
// in gorgonia, with data-parallel in-process workers: the convolutional feature extractor is
// spargo's (Conv2d, BatchNorm2d, ReLU, MaxPool2d), the classifier head is a two-layer
// perceptron built as a gorgonia expression graph and run by nn/gorgonia's Block. The head's
// weights are ordinary spargo parameters: DDP buckets their gradients from the grad-ready
// hooks and the comm hook (SparDL by default) reduces them with everybody else's.
//
//	go run ./examples/gorgonia                                       # 2 workers, SparDL, 1 epoch
//	go run ./examples/gorgonia -data ~/data/cifar10 -workers 2 -hook spardl \
//	    -batch 32 -epochs 3 -lr 0.02
//	go run ./examples/gorgonia -head spargo -steps 100               # the same model, head in spargo
//
// -batch is per worker (global batch = workers × batch). CIFAR-10 is found by datasets.Find:
// -data, else $SPARGO_DATA/cifar10, else the user cache directory, else downloaded into the
// cache (md5-checked); docs/data.md says more. -head spargo swaps the gorgonia head for spargo's
// Linear+ReLU+Linear with the same initial weights, to compare accuracy and speed.
//
// Training runs on package train's Loop: its progress (a bar on a terminal, plain lines
// elsewhere, the evaluation's too) on stderr with -progress, and the first Ctrl-C stops after
// the step under way (the second at once).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/examples/internal/cifar"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
	sgorgonia "github.com/spargo-dl/spargo/nn/gorgonia"
	"github.com/spargo-dl/spargo/optim"
	"github.com/spargo-dl/spargo/train"
)

type config struct {
	Data       string
	Workers    int
	Hook       string
	Head       string
	Hidden     int
	Batch      int
	Epochs     int
	Steps      int
	LR         float64
	Momentum   float64
	WD         float64
	Seed       uint64
	EvalLimit  int
	PrintEvery int
	Progress   bool

	hook hooks.Config // Hook, parsed by check; each rank builds its own hook from it
}

func main() {
	var c config
	flag.StringVar(&c.Data, "data", "", "CIFAR-10 directory (default: $SPARGO_DATA/cifar10, then the user cache; downloaded if neither has it; see docs/data.md)")
	flag.IntVar(&c.Workers, "workers", 2, "data-parallel workers (in-process ranks)")
	flag.StringVar(&c.Hook, "hook", "spardl", "comm hook spec, e.g. spardl:density=0.05 or allreduce (see `spargo hooks`)")
	flag.StringVar(&c.Head, "head", "gorgonia", "classifier head: gorgonia (a gorgonia graph in a Block) or spargo (nn.Linear, same weights)")
	flag.IntVar(&c.Hidden, "hidden", 256, "width of the head's hidden layer")
	flag.IntVar(&c.Batch, "batch", 32, "batch size per worker")
	flag.IntVar(&c.Epochs, "epochs", 1, "epochs")
	flag.IntVar(&c.Steps, "steps", 0, "stop each epoch after this many steps (0: whole epoch)")
	flag.Float64Var(&c.LR, "lr", 0.02, "learning rate")
	flag.Float64Var(&c.Momentum, "momentum", 0.9, "SGD momentum")
	flag.Float64Var(&c.WD, "wd", 5e-4, "weight decay")
	flag.Uint64Var(&c.Seed, "seed", 0, "seed for initialisation, shuffling and augmentation")
	flag.IntVar(&c.EvalLimit, "eval-limit", 0, "evaluate on the first N test images (0: all)")
	flag.IntVar(&c.PrintEvery, "print-every", 50, "print the training loss, averaged over the ranks and the steps since the last line, every N steps (0: only per epoch)")
	flag.BoolVar(&c.Progress, "progress", true, "show each epoch's and evaluation's progress on stderr: a bar on a terminal, else a plain line per tenth")
	flag.Parse()
	// The first SIGINT or SIGTERM stops training after the step under way, the second at once.
	ctx, stop := cluster.NotifyGraceful(context.Background(), "gorgonia", nil)
	err := run(ctx, c, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gorgonia:", err)
		os.Exit(1)
	}
}

// check refuses bad flags before any data is looked for: the model (-head) first, then the
// numbers and -hook (parsed once into c.hook).
func (c *config) check() error {
	if c.Head != "gorgonia" && c.Head != "spargo" {
		return fmt.Errorf("-head %q: want gorgonia or spargo", c.Head)
	}
	if err := train.AtLeast(1, train.Int("-workers", c.Workers), train.Int("-batch", c.Batch), train.Int("-epochs", c.Epochs),
		train.Int("-hidden", c.Hidden)); err != nil {
		return err
	}
	if err := train.AtLeast(0, train.Int("-steps", c.Steps), train.Int("-eval-limit", c.EvalLimit)); err != nil {
		return err
	}
	var err error
	c.hook, err = train.ParseHook(c.Hook, c.Workers)
	return err
}

// run trains with c.Workers in-process ranks and prints rank 0's view.
func run(ctx context.Context, c config, stdout, stderr io.Writer) error {
	if err := c.check(); err != nil {
		return err
	}
	dir, err := datasets.Find(ctx, datasets.CIFAR10Set, c.Data, stderr)
	if err != nil {
		return err
	}
	train, test, err := datasets.LoadCIFAR10(dir)
	if err != nil {
		return err
	}
	if share := train.N / c.Workers; c.Batch > share {
		return fmt.Errorf("-batch %d is larger than a rank's share of the training data: %d of %s's %d images on each of %d workers",
			c.Batch, share, dir, train.N, c.Workers)
	}
	fmt.Fprintf(stdout, "data: %s\n%s\n%s\n", dir, train.Summary, test.Summary)
	if strings.Contains(dir, "approx") {
		fmt.Fprintln(stdout, "note: accuracy on this copy is CIFAR-10 (JPEG-degraded, 10k-train subset)")
	}
	groups, err := comm.NewLocal(c.Workers)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	errs := make([]error, c.Workers)
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			w := &worker{cfg: c, group: g, train: train, test: test, stdout: stdout, stderr: stderr, start: start}
			if errs[r] = w.run(ctx); errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
				cancel() // unblock the other ranks
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "done: %s head, hook %s, %d workers × batch %d, %d epochs in %.0fs\n",
		c.Head, c.Hook, c.Workers, c.Batch, c.Epochs, time.Since(start).Seconds())
	return nil
}

// featureWidth is what the conv stack hands the head: 64 channels × 4 × 4.
const featureWidth = 64 * 4 * 4

// newModel returns the conv stack (spargo) and the classifier head (a gorgonia Block, or the
// same perceptron in spargo layers with the same initial weights).
func newModel(c config) (nn.Module, error) {
	rng := nn.NewRand(c.Seed)
	convBlock := func(in, out int) []nn.Module {
		return []nn.Module{nn.NewConv2d(in, out, 3, 1, 1, false, rng), nn.NewBatchNorm2d(out), nn.ReLU{}, nn.MaxPool2d{Kernel: 2}}
	}
	var layers []nn.Module
	layers = append(layers, convBlock(3, 32)...)  // 32×16×16
	layers = append(layers, convBlock(32, 64)...) // 64×8×8
	layers = append(layers, convBlock(64, 64)...) // 64×4×4
	layers = append(layers, nn.Flatten{})
	features := nn.NewSequential(layers...)

	// Both heads draw the same numbers: PyTorch's Linear initialisation, weight then bias.
	headRng := nn.NewRand(c.Seed + 1)
	fc1, fc2 := nn.NewLinear(featureWidth, c.Hidden, true, headRng), nn.NewLinear(c.Hidden, 10, true, headRng)
	var head nn.Module = nn.NewSequential(fc1, nn.ReLU{}, fc2)
	if c.Head == "gorgonia" {
		blk, err := sgorgonia.NewBlock(mlpHead(fc1, fc2), nn.NewRand(c.Seed+1), []int{c.Batch, featureWidth})
		if err != nil {
			return nil, err
		}
		head = blk
	}
	m := nn.NewSequential().Add("features", features).Add("head", head)
	nn.Parameters(m)
	return m, nil
}

// mlpHead builds relu(x·W1 + b1)·W2 + b2 in gorgonia, its weights initialised from spargo
// Linear layers (transposed: gorgonia multiplies x by an [in, out] matrix, PyTorch's Linear
// holds [out, in]).
func mlpHead(fc1, fc2 *nn.Linear) sgorgonia.BuildFunc {
	return func(b *sgorgonia.Builder, xs ...*G.Node) (*G.Node, error) {
		w1 := b.Param("fc1.weight", sgorgonia.Values(transpose(fc1.Weight.Value.Data, fc1.Out, fc1.In)), fc1.In, fc1.Out)
		b1 := b.Param("fc1.bias", sgorgonia.Values(fc1.Bias.Value.Data), fc1.Out)
		w2 := b.Param("fc2.weight", sgorgonia.Values(transpose(fc2.Weight.Value.Data, fc2.Out, fc2.In)), fc2.In, fc2.Out)
		b2 := b.Param("fc2.bias", sgorgonia.Values(fc2.Bias.Value.Data), fc2.Out)
		h, err := G.Mul(xs[0], w1)
		if err != nil {
			return nil, err
		}
		if h, err = G.BroadcastAdd(h, b1, nil, []byte{0}); err != nil {
			return nil, err
		}
		if h, err = G.Rectify(h); err != nil {
			return nil, err
		}
		if h, err = G.Mul(h, w2); err != nil {
			return nil, err
		}
		return G.BroadcastAdd(h, b2, nil, []byte{0})
	}
}

// transpose returns the [cols, rows] transpose of a row-major [rows, cols] matrix.
func transpose(m []float32, rows, cols int) []float32 {
	t := make([]float32, len(m))
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			t[c*rows+r] = m[r*cols+c]
		}
	}
	return t
}

type worker struct {
	cfg         config
	group       comm.Group
	train, test *datasets.Images
	stdout      io.Writer
	stderr      io.Writer
	start       time.Time // the run's
}

func (w *worker) run(ctx context.Context) error {
	c, g := w.cfg, w.group
	rank, world := g.Rank(), g.Size()
	model, err := newModel(c)
	if err != nil {
		return err
	}
	hook, err := c.hook.New()
	if err != nil {
		return err
	}
	dp, err := ddp.New(ctx, model, g, ddp.WithCommHook(hook))
	if err != nil {
		return err
	}
	opt, err := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: c.LR, Momentum: c.Momentum, WeightDecay: c.WD})
	if err != nil {
		return err
	}
	dp.SetCorrector(opt) // SGD predicts its own step: OSP's LGP needs it, other hooks ignore it
	loader, err := datasets.NewLoader(w.train, datasets.LoaderOptions{Batch: c.Batch, Rank: rank, World: world,
		Seed: c.Seed, Shuffle: true, Augment: true, DropLast: true, Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std})
	if err != nil {
		return err
	}
	evalLoader, err := datasets.NewLoader(w.test, datasets.LoaderOptions{Batch: 250, Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std})
	if err != nil {
		return err
	}
	if rank == 0 {
		var inHead int
		for _, p := range dp.Parameters() {
			if strings.HasPrefix(p.Name, "head.") {
				inHead += p.Len()
			}
		}
		fmt.Fprintf(w.stdout, "model: spargo conv stack + %s MLP head (%d→%d→10): %d parameters (%d in the head) in %d tensors, %d buckets; hook %s; %d workers × batch %d; kernels %s, GOMAXPROCS %d\n",
			c.Head, featureWidth, c.Hidden, nn.NumParams(dp.Parameters()), inHead, len(dp.Parameters()), len(dp.Plan()), c.Hook, world, c.Batch, kernels.Impl(), runtime.GOMAXPROCS(0))
	}
	steps := loader.NumBatches()
	if c.Steps > 0 && c.Steps < steps {
		steps = c.Steps
	}
	tape := nn.NewTape()
	loop := &train.Loop[datasets.Batch]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Epochs: c.Epochs, StepsPerEpoch: steps,
		Batches:  loader.EpochFrom,
		Step:     train.ClassifierStep(dp, tape, 3, 32, 32),
		LogEvery: c.PrintEvery, // a collective: every rank takes part, rank 0 prints
		Start:    w.start,
		EndEpoch: func(ctx context.Context, es train.EpochStats) error {
			testLoss, testAcc, err := train.Evaluate(ctx, g, dp, model, tape, evalLoader, c.EvalLimit, 3, 32, 32)
			if err != nil || rank != 0 {
				return err
			}
			res := epochRecord{Epoch: cifar.Epoch{Epoch: es.Epoch, Steps: es.Steps, TrainLoss: es.Loss, TrainAcc: es.Acc, TestLoss: testLoss, TestAcc: testAcc,
				ImgPerSec: es.Samples / es.TrainSec, TrainSec: es.TrainSec, TotalSec: time.Since(w.start).Seconds(), LR: opt.LR()},
				StepMS: 1000 * es.TrainSec / float64(max(es.Steps, 1))}
			return train.Print(w.stdout, "epoch", res, fmt.Sprintf("epoch %d train_loss %.4f train_acc %.4f test_loss %.4f test_acc %.4f img_s %.1f step_ms %.1f train_s %.1f",
				res.Epoch.Epoch, res.TrainLoss, res.TrainAcc, res.TestLoss, res.TestAcc, res.ImgPerSec, res.StepMS, res.TrainSec))
		},
	}
	if rank == 0 {
		if c.Progress {
			loop.Progress = w.stderr
		}
		loop.LogStep = func(rec train.StepRecord) error {
			epoch, step := (rec.Step-1)/int64(steps)+1, (rec.Step-1)%int64(steps)+1
			_, err := fmt.Fprintf(w.stdout, "epoch %d step %d/%d: loss %.4f (all ranks, since the last line) %.1fs\n", epoch, step, steps, rec.Loss, rec.TotalSec)
			return err
		}
	}
	return loop.Run(ctx)
}

// epochRecord is an epoch's line, and its fields in JSON: the CIFAR programs' epoch record
// and the mean step time.
type epochRecord struct {
	cifar.Epoch
	StepMS float64 `json:"step_ms"`
}
