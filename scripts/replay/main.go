// Command replay trains the CIFAR program's dense recipe (examples/vgg, examples/resnet) on
// a given data stream from given initial weights, and writes spargo's own stream and weights,
// so that spargo and PyTorch (scripts/torch_replay.py) can each train on the other's exact
// batches. It separates what the data order, augmentation and initial draw do to a run from
// what the framework does (BENCHMARKS.md, "Dense all-reduce against PyTorch" for VGG-11,
// "ResNets (issue 10)" for ResNet-20).
//
//	go run ./scripts/replay -write-stream s0.bin -write-init s0.safetensors -seed 0   # examples/vgg's, seed 0
//	go run ./scripts/replay -stream torch_s0.bin -init torch_s0.safetensors           # train on PyTorch's
//	go run ./scripts/replay -model resnet20 -workers 2 -batch 128 -lr 0.1 -wd 1e-4 -schedule cosine \
//	    -stream torch_s0.bin -init torch_s0.safetensors                                # examples/resnet's recipe
//
// A stream file is little-endian int32: a header (epochs, steps per epoch, workers, batch
// per worker), then for every epoch, step, worker and image of its batch four numbers: the
// training-set index, the crop's top and left corner in the 4-pixel padded image, and the
// flip (0 or 1). Weights are safetensors with spargo's parameter and buffer names.
// -model is any 32×32 model of spargo's catalogue (models.LookupImage), built from -seed as
// the CIFAR program builds it. Training is the CIFAR program's: -workers in-process ranks,
// DDP with the allreduce hook, SGD with -lr, -momentum and -wd, at a constant rate or on
// -schedule (train.Flags' spec, over the replayed epochs and steps), rank 0's BatchNorm
// statistics; it prints the train loss and the test accuracy after each epoch, and with
// -log-steps N the mean loss of the first N steps.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"iter"
	"os"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
	"github.com/spargo-dl/spargo/train"
)

type config struct {
	data, model            string
	workers, batch, epochs int
	steps, evalLimit       int
	seed                   uint64
	lr, momentum, wd       float64
	schedule               string
	logSteps               int
	writeStream, writeInit string
	stream, init           string
}

func main() {
	var c config
	flag.StringVar(&c.data, "data", "", "CIFAR-10 directory (default: $SPARGO_DATA/cifar10, then the user cache; downloaded if neither has it; see docs/data.md)")
	flag.StringVar(&c.model, "model", "vgg11", "a 32×32 model of spargo's catalogue: vgg11 … vgg19, resnet20 … resnet110")
	flag.IntVar(&c.workers, "workers", 4, "data-parallel workers")
	flag.IntVar(&c.batch, "batch", 16, "batch per worker")
	flag.IntVar(&c.epochs, "epochs", 3, "epochs to write (-write-stream)")
	flag.IntVar(&c.steps, "steps", 0, "with -stream: train only the first N steps of each epoch (0: all)")
	flag.IntVar(&c.evalLimit, "eval-limit", 0, "evaluate on the first N test images (0: all)")
	flag.Uint64Var(&c.seed, "seed", 0, "examples/vgg's -seed (-write-stream, -write-init)")
	flag.Float64Var(&c.lr, "lr", 0.01, "learning rate")
	flag.Float64Var(&c.momentum, "momentum", 0.9, "SGD momentum")
	flag.Float64Var(&c.wd, "wd", 5e-4, "weight decay")
	flag.StringVar(&c.schedule, "schedule", "", "learning-rate schedule spec (examples/resnet's: cosine); empty: constant -lr")
	flag.IntVar(&c.logSteps, "log-steps", 0, "print the mean loss over the workers of each of the first N steps")
	flag.StringVar(&c.writeStream, "write-stream", "", "write examples/vgg's data stream for -seed to this file")
	flag.StringVar(&c.writeInit, "write-init", "", "write examples/vgg's initial weights for -seed to this file")
	flag.StringVar(&c.stream, "stream", "", "train on this data stream")
	flag.StringVar(&c.init, "init", "", "train from these initial weights (with -stream)")
	flag.Parse()
	if err := run(context.Background(), c); err != nil {
		fmt.Fprintf(os.Stderr, "replay: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	if c.writeStream == "" && c.writeInit == "" && (c.stream == "" || c.init == "") {
		return errors.New("give -write-stream and/or -write-init, or -stream with -init")
	}
	dir, err := datasets.Find(ctx, datasets.CIFAR10Set, c.data, os.Stderr)
	if err != nil {
		return err
	}
	trainSet, test, err := datasets.LoadCIFAR10(dir)
	if err != nil {
		return err
	}
	if c.writeInit != "" {
		m, err := newModel(c.model, c.seed)
		if err != nil {
			return err
		}
		if err := writeWeights(m, c.writeInit); err != nil {
			return err
		}
	}
	if c.writeStream != "" {
		if err := writeStream(trainSet, c); err != nil {
			return err
		}
	}
	if c.stream == "" {
		return nil
	}
	s, err := readStream(c.stream, c.workers, c.batch)
	if err != nil {
		return err
	}
	if err := s.check(c.stream, trainSet.N); err != nil {
		return err
	}
	w, err := safetensors.ReadFile(c.init)
	if err != nil {
		return err
	}
	return replayAll(ctx, c, s, w, trainSet, test)
}

// replayAll trains c.workers in-process ranks on s from w.
func replayAll(ctx context.Context, c config, s *stream, w *safetensors.File, trainSet, test *datasets.Images) error {
	groups, err := comm.NewLocal(c.workers)
	if err != nil {
		return err
	}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() { errs[r] = replay(ctx, c, g, s, w, trainSet, test) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// stream is a decoded stream file: draws[epoch][step][rank] holds that batch's images.
type stream struct {
	epochs, steps int
	draws         [][][][]datasets.Draw
}

// check refuses a stream with an image outside a training set of n images or a crop outside
// the 4-pixel padding, before any rank starts (a rank that failed mid-step would leave the
// others waiting in the all-reduce).
func (s *stream) check(path string, n int) error {
	for e, ep := range s.draws {
		for st, ranks := range ep {
			for r, draws := range ranks {
				for j, d := range draws {
					if d.Index < 0 || d.Index >= n || d.Top < 0 || d.Top > 8 || d.Left < 0 || d.Left > 8 {
						return fmt.Errorf("%s: epoch %d step %d rank %d image %d: index %d, crop (%d, %d) is outside the training set's %d images or the 4-pixel padding",
							path, e, st, r, j, d.Index, d.Top, d.Left, n)
					}
				}
			}
		}
	}
	return nil
}

func writeStream(ds *datasets.Images, c config) error {
	var steps int
	plans := make([][][]datasets.Draw, c.epochs) // [epoch][rank]
	for r := range c.workers {
		ld, err := datasets.NewLoader(ds, trainLoader(c.batch, r, c.workers, c.seed))
		if err != nil {
			return err
		}
		steps = ld.NumBatches()
		for e := range c.epochs {
			p, err := ld.Plan(e)
			if err != nil {
				return err
			}
			plans[e] = append(plans[e], p)
		}
	}
	out := []int32{int32(c.epochs), int32(steps), int32(c.workers), int32(c.batch)}
	for e := range c.epochs {
		for st := range steps {
			for r := range c.workers {
				for _, d := range plans[e][r][st*c.batch : (st+1)*c.batch] {
					flip := int32(0)
					if d.Flip {
						flip = 1
					}
					out = append(out, int32(d.Index), int32(d.Top), int32(d.Left), flip)
				}
			}
		}
	}
	f, err := os.Create(c.writeStream)
	if err != nil {
		return err
	}
	if err := binary.Write(f, binary.LittleEndian, out); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", c.writeStream, err)
	}
	return f.Close()
}

func readStream(path string, workers, batch int) (*stream, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(raw)%4 != 0 || len(raw) < 16 {
		return nil, fmt.Errorf("%s: %d bytes is not a stream file (int32 header and records)", path, len(raw))
	}
	v := make([]int32, len(raw)/4)
	if err := binary.Read(bytes.NewReader(raw), binary.LittleEndian, v); err != nil {
		return nil, err
	}
	epochs, steps, w, b := int(v[0]), int(v[1]), int(v[2]), int(v[3])
	if w != workers || b != batch {
		return nil, fmt.Errorf("%s: written for %d workers × batch %d, not -workers %d -batch %d", path, w, b, workers, batch)
	}
	if epochs < 1 || steps < 1 || len(v)-4 != epochs*steps*w*b*4 {
		return nil, fmt.Errorf("%s: header says %d epochs of %d steps of %d×%d images, but it holds %d numbers after it", path, epochs, steps, w, b, len(v)-4)
	}
	s := &stream{epochs: epochs, steps: steps}
	v = v[4:]
	for range epochs {
		var ep [][][]datasets.Draw
		for range steps {
			var st [][]datasets.Draw
			for range w {
				ds := make([]datasets.Draw, b)
				for j := range ds {
					ds[j] = datasets.Draw{Index: int(v[0]), Top: int(v[1]), Left: int(v[2]), Flip: v[3] == 1}
					v = v[4:]
				}
				st = append(st, ds)
			}
			ep = append(ep, st)
		}
		s.draws = append(s.draws, ep)
	}
	return s, nil
}

func writeWeights(m nn.Module, path string) error {
	f := safetensors.New()
	for _, p := range nn.Parameters(m) {
		f.Tensors[p.Name] = safetensors.FromFloat32(p.Value.Data, p.Value.Shape...)
	}
	for _, b := range nn.Buffers(m) {
		f.Tensors[b.Name] = safetensors.FromFloat32(b.Value.Data, b.Value.Shape...)
	}
	return f.WriteFile(path)
}

func loadWeights(m nn.Module, f *safetensors.File, path string) error {
	set := func(name string, dst []float32) error {
		v, err := f.Float32(name)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(v) != len(dst) {
			return fmt.Errorf("%s: %s has %d values, the model's has %d", path, name, len(v), len(dst))
		}
		copy(dst, v)
		return nil
	}
	for _, p := range nn.Parameters(m) {
		if err := set(p.Name, p.Value.Data); err != nil {
			return err
		}
	}
	for _, b := range nn.Buffers(m) {
		if err := set(b.Name, b.Value.Data); err != nil {
			return err
		}
	}
	return nil
}

// newModel builds the catalogue's CIFAR-10 model called name from seed, as the CIFAR
// program (examples/vgg and examples/resnet, cifar.Main) does.
func newModel(name string, seed uint64) (nn.Module, error) {
	e, err := models.LookupImage(name, models.CIFAR10)
	if err != nil {
		return nil, err
	}
	return e.Build(nn.NewRand(seed))
}

// replay trains rank g.Rank() on its share of s.
func replay(ctx context.Context, c config, g comm.Group, s *stream, w *safetensors.File, trainSet, test *datasets.Images) error {
	model, err := newModel(c.model, 0)
	if err != nil {
		return err
	}
	if err := loadWeights(model, w, c.init); err != nil {
		return err
	}
	flags := train.Flags{LR: c.lr, Momentum: c.momentum, WD: c.wd, Optim: "sgd", Schedule: c.schedule}
	rep, err := train.Setup{Flags: &flags}.New(ctx, g, model) // allreduce, rank 0's buffers after every step, as examples/vgg
	if err != nil {
		return err
	}
	dp, opt := rep.DDP, rep.Optimizer
	norm, err := datasets.NewNormalizer(datasets.CIFAR10Mean, datasets.CIFAR10Std)
	if err != nil {
		return err
	}
	evalLoader, err := datasets.NewLoader(test, datasets.LoaderOptions{Batch: 250, Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std})
	if err != nil {
		return err
	}
	size := trainSet.C * trainSet.H * trainSet.W
	b := datasets.Batch{X: make([]float32, c.batch*size), Y: make([]int, c.batch), N: c.batch}
	steps := s.steps
	if c.steps > 0 && c.steps < steps {
		steps = c.steps
	}
	sched, err := flags.NewSchedule(s.epochs, steps, g.Size())
	if err != nil {
		return err
	}
	tape := nn.NewTape()
	step := train.ClassifierStep(dp, tape, 3, 32, 32)
	var done int // steps taken, for -log-steps
	loop := &train.Loop[datasets.Batch]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Schedule: sched, Epochs: s.epochs, StepsPerEpoch: steps,
		Batches: func(ctx context.Context, epoch, start int) iter.Seq2[datasets.Batch, error] {
			return func(yield func(datasets.Batch, error) bool) {
				for _, draws := range s.draws[epoch][start:] {
					for j, d := range draws[g.Rank()] { // stream.check has bounded d
						norm.CropFlip(b.X[j*size:(j+1)*size], trainSet.Image(d.Index), trainSet.H, trainSet.W, d.Top, d.Left, d.Flip)
						b.Y[j] = int(trainSet.Labels[d.Index])
					}
					if !yield(b, ctx.Err()) {
						return
					}
				}
			}
		},
		Step: func(ctx context.Context, b datasets.Batch) (train.StepResult, error) {
			r, err := step(ctx, b)
			if err != nil || done >= c.logSteps {
				return r, err
			}
			done++
			mean, err := meanLoss(ctx, g, r.Loss)
			if err == nil && g.Rank() == 0 {
				fmt.Printf("step %d loss %.6f\n", done, mean)
			}
			return r, err
		},
		EndEpoch: func(ctx context.Context, es train.EpochStats) error {
			_, acc, err := train.Evaluate(ctx, g, dp, model, tape, evalLoader, c.evalLimit, 3, 32, 32)
			if err == nil && g.Rank() == 0 {
				fmt.Printf("epoch %d train_loss %.4f test_acc %.4f\n", es.Epoch, es.Loss, acc)
			}
			return err
		},
	}
	return loop.Run(ctx)
}

// tagStepLoss is the all-reduce tag of -log-steps' losses (beside train's 100–103,
// below DDP's bucket tags).
const tagStepLoss = 110

// meanLoss is loss averaged over g's ranks: the step's loss as PyTorch's simulation reports
// it (the mean of the workers' batch means).
func meanLoss(ctx context.Context, g comm.Group, loss float64) (float64, error) {
	buf := []float32{float32(loss)}
	if err := comm.AllReduce(ctx, g, tagStepLoss, buf, comm.Auto); err != nil {
		return 0, err
	}
	return float64(buf[0]) / float64(g.Size()), nil
}

// trainLoader is the training loader's options of the CIFAR-10 program (examples/vgg,
// examples/resnet: examples/internal/cifar.TrainLoader, which this program cannot import)
// on rank of world: batch images per rank, reshuffled every epoch from seed, random crop and
// flip, the last short batch dropped, CIFAR-10's normalisation. A replay draws the images the
// program draws only while the two agree.
func trainLoader(batch, rank, world int, seed uint64) datasets.LoaderOptions {
	return datasets.LoaderOptions{Batch: batch, Rank: rank, World: world, Seed: seed, Shuffle: true, Augment: true,
		DropLast: true, Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std}
}
