package datasets

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"sync/atomic"
)

// LoaderOptions configure a Loader.
type LoaderOptions struct {
	// Batch is the number of images per batch (per rank), > 0.
	Batch int
	// Rank and World split each epoch with a DistributedSampler; World 0
	// means 1 (a single process).
	Rank, World int
	// Seed seeds the sampler's shuffle (all ranks must agree on it) and,
	// mixed with Rank and the epoch, the augmentation.
	Seed uint64
	// Shuffle reorders the dataset every epoch (training); otherwise the
	// order is the dataset's (evaluation).
	Shuffle bool
	// Augment applies a random crop (CropPad zero padding) and a horizontal
	// flip with probability 1/2 to every image.
	Augment bool
	// DropLast drops this rank's last batch if it is short, so every batch
	// has exactly Batch images. The sampler always pads, so every rank has
	// the same number of batches either way.
	DropLast bool
	// Mean and Std are the per-channel normalisation; both zero means the
	// dataset's defaults (Images.Mean, Images.Std).
	Mean, Std [3]float32
}

// Batch is one batch from a Loader. Its slices belong to the Loader and are
// valid until the next batch is requested (the next loop iteration) or the
// loop ends; copy them to keep them.
type Batch struct {
	X []float32 // N×C×H×W normalised images, NCHW
	Y []int     // N labels
	N int       // images in this batch: Batch, or fewer for a short last batch
}

// prefetchDepth is how many batch buffers a Loader cycles through: one held
// by the training loop while the next is being prepared.
const prefetchDepth = 2

// Loader yields batches of an Images split for one rank. One goroutine
// prepares the next batch (normalise, augment) while the caller trains on
// the current one; both live in buffers allocated once by NewLoader, so an
// epoch's steady state allocates nothing. A Loader runs one epoch at a
// time.
type Loader struct {
	ds      *Images
	opt     LoaderOptions
	sampler DistributedSampler
	norm    *Normalizer
	imgSize int // C*H*W

	indices, scratch []int // this epoch's indices; permutation scratch
	bufs             [prefetchDepth]Batch
	pcg              rand.PCG
	rng              *rand.Rand
	running          atomic.Bool
}

// NewLoader checks opt and allocates the loader's buffers.
func NewLoader(ds *Images, opt LoaderOptions) (*Loader, error) {
	if ds == nil || ds.N == 0 {
		return nil, errors.New("datasets: NewLoader: empty dataset")
	}
	if ds.C != 3 {
		return nil, fmt.Errorf("datasets: NewLoader: %s has %d channels, want 3", ds.Name, ds.C)
	}
	if len(ds.Pixels) != ds.N*ds.C*ds.H*ds.W || len(ds.Labels) != ds.N {
		return nil, fmt.Errorf("datasets: NewLoader: %s: %d pixel bytes and %d labels do not match N=%d of %d×%d×%d",
			ds.Name, len(ds.Pixels), len(ds.Labels), ds.N, ds.C, ds.H, ds.W)
	}
	if opt.Batch <= 0 {
		return nil, fmt.Errorf("datasets: LoaderOptions.Batch = %d, must be > 0", opt.Batch)
	}
	if opt.World == 0 {
		opt.World = 1
	}
	if opt.World < 0 {
		return nil, fmt.Errorf("datasets: LoaderOptions.World = %d, must be >= 1", opt.World)
	}
	if opt.Rank < 0 || opt.Rank >= opt.World {
		return nil, fmt.Errorf("datasets: LoaderOptions.Rank = %d, must be in [0, World=%d)", opt.Rank, opt.World)
	}
	if opt.Mean == ([3]float32{}) && opt.Std == ([3]float32{}) {
		opt.Mean, opt.Std = ds.Mean, ds.Std
	}
	norm, err := NewNormalizer(opt.Mean, opt.Std)
	if err != nil {
		return nil, fmt.Errorf("datasets: LoaderOptions.Std: %w", err)
	}
	l := &Loader{
		ds:  ds,
		opt: opt,
		sampler: DistributedSampler{
			N: ds.N, Rank: opt.Rank, World: opt.World, Seed: opt.Seed, Shuffle: opt.Shuffle,
		},
		norm:    norm,
		imgSize: ds.C * ds.H * ds.W,
	}
	l.indices = make([]int, 0, l.sampler.NumSamples())
	l.scratch = make([]int, 0, ds.N)
	for i := range l.bufs {
		l.bufs[i] = Batch{X: make([]float32, opt.Batch*l.imgSize), Y: make([]int, opt.Batch)}
	}
	l.rng = rand.New(&l.pcg)
	return l, nil
}

// Options returns the options in effect (World and Mean/Std defaults filled in).
func (l *Loader) Options() LoaderOptions { return l.opt }

// NumSamples is how many images this rank sees per epoch (padding included,
// before DropLast).
func (l *Loader) NumSamples() int { return l.sampler.NumSamples() }

// NumBatches is how many batches Epoch yields; the same on every rank.
func (l *Loader) NumBatches() int {
	n := l.sampler.NumSamples()
	if l.opt.DropLast {
		return n / l.opt.Batch
	}
	return (n + l.opt.Batch - 1) / l.opt.Batch
}

// augmentStream derives the augmentation generator's stream from rank and
// epoch, so ranks crop differently and each epoch differently.
func augmentStream(rank, epoch int) uint64 {
	return uint64(rank)<<32 ^ uint64(uint32(epoch)) ^ 0x9e3779b97f4a7c15
}

// Epoch returns the batches of one epoch, in order:
//
//	for b, err := range ld.Epoch(ctx, epoch) {
//		if err != nil { return err } // ctx was cancelled
//		train(b.X, b.Y)
//	}
//
// The same (Seed, Rank, epoch) always gives the same batches. Breaking out
// of the loop, or cancelling ctx (the loop then yields ctx's error once and
// stops), stops the prefetching goroutine before Epoch returns. Running two
// epochs of one Loader at once yields an error.
func (l *Loader) Epoch(ctx context.Context, epoch int) iter.Seq2[Batch, error] {
	return l.EpochFrom(ctx, epoch, 0)
}

// EpochFrom is Epoch resumed at batch start: it yields batches start, start+1, … of the
// epoch, identical to the ones Epoch yields at those positions (same images, same
// augmentation: the generator is advanced past the skipped images' draws without
// preparing them). A checkpoint taken after step s of an epoch resumes with EpochFrom(ctx,
// epoch, s). start outside [0, NumBatches()] yields an error.
func (l *Loader) EpochFrom(ctx context.Context, epoch, start int) iter.Seq2[Batch, error] {
	return func(yield func(Batch, error) bool) {
		if start < 0 || start > l.NumBatches() {
			yield(Batch{}, fmt.Errorf("datasets: Loader.EpochFrom: batch %d outside the epoch's %d batches", start, l.NumBatches()))
			return
		}
		if !l.running.CompareAndSwap(false, true) {
			yield(Batch{}, errors.New("datasets: Loader.Epoch: another epoch of this loader is running"))
			return
		}
		defer l.running.Store(false)
		if err := ctx.Err(); err != nil {
			yield(Batch{}, err)
			return
		}
		l.indices = l.sampler.AppendIndices(l.indices[:0], l.scratch, epoch)
		l.pcg.Seed(l.opt.Seed, augmentStream(l.opt.Rank, epoch))
		nb := l.NumBatches()
		if l.opt.Augment {
			for range min(start*l.opt.Batch, len(l.indices)) {
				l.augmentDraws()
			}
		}

		ctx, cancel := context.WithCancel(ctx)
		free := make(chan int, prefetchDepth)
		full := make(chan int, prefetchDepth)
		done := make(chan struct{})
		for i := range prefetchDepth {
			free <- i
		}
		go l.produce(ctx, start, nb, free, full, done)
		defer func() {
			cancel()
			<-done // the producer no longer touches the buffers
		}()

		for range nb - start {
			var buf int
			select {
			case buf = <-full:
			case <-ctx.Done():
			}
			if err := ctx.Err(); err != nil {
				yield(Batch{}, err)
				return
			}
			if !yield(l.bufs[buf], nil) {
				return
			}
			free <- buf // never blocks: at most prefetchDepth buffers exist
		}
	}
}

// produce fills batches start..nb-1 into free buffers and hands them over on
// full, until done or ctx is cancelled.
func (l *Loader) produce(ctx context.Context, start, nb int, free <-chan int, full chan<- int, done chan<- struct{}) {
	defer close(done)
	for b := start; b < nb; b++ {
		var buf int
		select {
		case buf = <-free:
		case <-ctx.Done():
			return
		}
		lo := b * l.opt.Batch
		hi := min(lo+l.opt.Batch, len(l.indices))
		l.fill(&l.bufs[buf], l.indices[lo:hi])
		select {
		case full <- buf:
		case <-ctx.Done():
			return
		}
	}
}

// fill prepares the images idx into bt, reslicing bt to len(idx) images.
func (l *Loader) fill(bt *Batch, idx []int) {
	n := len(idx)
	bt.N = n
	bt.X = bt.X[:n*l.imgSize]
	bt.Y = bt.Y[:n]
	h, w := l.ds.H, l.ds.W
	for k, i := range idx {
		dst := bt.X[k*l.imgSize : (k+1)*l.imgSize]
		src := l.ds.Pixels[i*l.imgSize : (i+1)*l.imgSize]
		if l.opt.Augment {
			top, left, flip := l.augmentDraws()
			l.norm.CropFlip(dst, src, h, w, top, left, flip)
		} else {
			l.norm.Normalize(dst, src, h, w)
		}
		bt.Y[k] = int(l.ds.Labels[i])
	}
}

// augmentDraws draws one image's augmentation: crop top, crop left, then flip, in
// torchvision's order. EpochFrom calls it for the images it skips.
func (l *Loader) augmentDraws() (top, left int, flip bool) {
	top = l.rng.IntN(2*CropPad + 1)
	left = l.rng.IntN(2*CropPad + 1)
	flip = l.rng.Uint64()&1 == 1
	return top, left, flip
}

// Draw is one image of an epoch as a Loader prepares it: its dataset index and, with
// Augment, the crop window's top-left corner in padded coordinates (0..2*CropPad) and
// the flip; without Augment, Top and Left are CropPad and Flip is false.
type Draw struct {
	Index     int
	Top, Left int
	Flip      bool
}

// Plan returns what Epoch(ctx, epoch) yields on this rank, image by image in batch order
// (NumBatches()·Batch draws with DropLast, every sampled image otherwise), without
// preparing any pixels: the same (Seed, Rank, epoch) gives the same draws as the
// batches. Other programs use it to replay a run's exact data stream (the PyTorch
// cross-check scripts/torch_replay.py reads one). It must not run while an epoch of
// this loader is running.
func (l *Loader) Plan(epoch int) ([]Draw, error) {
	if !l.running.CompareAndSwap(false, true) {
		return nil, errors.New("datasets: Loader.Plan: an epoch of this loader is running")
	}
	defer l.running.Store(false)
	l.indices = l.sampler.AppendIndices(l.indices[:0], l.scratch, epoch)
	l.pcg.Seed(l.opt.Seed, augmentStream(l.opt.Rank, epoch))
	n := min(l.NumBatches()*l.opt.Batch, len(l.indices))
	draws := make([]Draw, n)
	for k, i := range l.indices[:n] {
		draws[k] = Draw{Index: i, Top: CropPad, Left: CropPad}
		if l.opt.Augment {
			draws[k].Top, draws[k].Left, draws[k].Flip = l.augmentDraws()
		}
	}
	return draws, nil
}
