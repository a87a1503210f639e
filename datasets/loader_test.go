package datasets

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// syntheticImages is an n-image CIFAR-10-shaped split with label i%10 and
// pixels derived from i.
func syntheticImages(n int) *Images {
	m := &Images{
		Name: "synthetic", N: n, C: 3, H: 32, W: 32,
		Pixels: make([]uint8, n*cifarPixels), Labels: make([]int32, n),
		Classes: 10, ClassNames: cifar10ClassNames, Mean: CIFAR10Mean, Std: CIFAR10Std,
	}
	for i := range n {
		m.Labels[i] = int32(i % 10)
		copy(m.Image(i), recordPixels(byte(i)))
	}
	return m
}

// collect runs one epoch and copies out every batch.
func collect(t *testing.T, l *Loader, epoch int) (xs [][]float32, ys [][]int) {
	t.Helper()
	for b, err := range l.Epoch(context.Background(), epoch) {
		if err != nil {
			t.Fatal(err)
		}
		if len(b.X) != b.N*cifarPixels || len(b.Y) != b.N {
			t.Fatalf("batch N=%d with len X %d, len Y %d", b.N, len(b.X), len(b.Y))
		}
		xs = append(xs, slices.Clone(b.X))
		ys = append(ys, slices.Clone(b.Y))
	}
	return xs, ys
}

func TestLoaderShapes(t *testing.T) {
	ds := syntheticImages(10)
	for _, c := range []struct {
		opt   LoaderOptions
		sizes []int
	}{
		{LoaderOptions{Batch: 4}, []int{4, 4, 2}},
		{LoaderOptions{Batch: 4, DropLast: true}, []int{4, 4}},
		{LoaderOptions{Batch: 3, World: 3, Rank: 2}, []int{3, 1}},              // 4 samples, padded
		{LoaderOptions{Batch: 3, World: 3, Rank: 0, DropLast: true}, []int{3}}, // same count on every rank
		{LoaderOptions{Batch: 16, Shuffle: true, Augment: true}, []int{10}},
	} {
		l, err := NewLoader(ds, c.opt)
		if err != nil {
			t.Fatal(err)
		}
		_, ys := collect(t, l, 0)
		var sizes []int
		for _, y := range ys {
			sizes = append(sizes, len(y))
		}
		if !slices.Equal(sizes, c.sizes) || l.NumBatches() != len(c.sizes) {
			t.Errorf("%+v: batch sizes %v (NumBatches %d), want %v", c.opt, sizes, l.NumBatches(), c.sizes)
		}
	}
}

func TestLoaderContents(t *testing.T) {
	ds := syntheticImages(7)
	l, err := NewLoader(ds, LoaderOptions{Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	norm, _ := NewNormalizer(CIFAR10Mean, CIFAR10Std)
	want := make([]float32, cifarPixels)
	xs, ys := collect(t, l, 0)
	i := 0
	for b := range xs {
		for k := range ys[b] {
			norm.Normalize(want, ds.Image(i), 32, 32)
			if !slices.Equal(xs[b][k*cifarPixels:(k+1)*cifarPixels], want) || ys[b][k] != i%10 {
				t.Fatalf("batch %d image %d is not dataset image %d", b, k, i)
			}
			i++
		}
	}
	if i != 7 {
		t.Errorf("%d images, want 7", i)
	}
}

func TestLoaderDeterminism(t *testing.T) {
	ds := syntheticImages(20)
	opt := LoaderOptions{Batch: 8, World: 2, Rank: 1, Seed: 5, Shuffle: true, Augment: true}
	a, _ := NewLoader(ds, opt)
	b, _ := NewLoader(ds, opt)
	ax, ay := collect(t, a, 3)
	bx, by := collect(t, b, 3)
	if !slices.EqualFunc(ax, bx, slices.Equal) || !slices.EqualFunc(ay, by, slices.Equal) {
		t.Error("same options and epoch gave different batches")
	}
	again, _ := collect(t, a, 3) // the same loader, run again
	if !slices.EqualFunc(ax, again, slices.Equal) {
		t.Error("rerunning an epoch gave different batches")
	}
	next, _ := collect(t, a, 4)
	if slices.EqualFunc(ax, next, slices.Equal) {
		t.Error("epoch 4 equals epoch 3")
	}
	opt.Seed = 6
	c, _ := NewLoader(ds, opt)
	cx, _ := collect(t, c, 3)
	if slices.EqualFunc(ax, cx, slices.Equal) {
		t.Error("seed 6 equals seed 5")
	}
}

func TestLoaderNoSteadyStateAllocs(t *testing.T) {
	ds := syntheticImages(300)
	l, err := NewLoader(ds, LoaderOptions{Batch: 1, Shuffle: true, Augment: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	batches := 0
	allocs := testing.AllocsPerRun(3, func() {
		for _, err := range l.Epoch(ctx, 1) {
			if err != nil {
				t.Fatal(err)
			}
			batches++
		}
	})
	// 300 batches per epoch; the per-epoch setup (context, channels,
	// goroutine, generator) is a handful of allocations.
	if batches < 300 || allocs > 20 {
		t.Errorf("%v allocations per epoch of 300 batches, want a per-epoch constant (<= 20)", allocs)
	}
}

func TestLoaderCancel(t *testing.T) {
	ds := syntheticImages(50)
	l, _ := NewLoader(ds, LoaderOptions{Batch: 2, Augment: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen, errs := 0, 0
	for _, err := range l.Epoch(ctx, 0) {
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("error %v, want context.Canceled", err)
			}
			errs++
			continue
		}
		seen++
		if seen == 3 {
			cancel()
		}
	}
	if seen != 3 || errs != 1 {
		t.Errorf("after cancelling at batch 3: %d batches, %d errors; want 3, 1", seen, errs)
	}
	// The loader is free again, and an already-cancelled context stops at once.
	for _, err := range l.Epoch(ctx, 1) {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled context: %v", err)
		}
	}
	// Breaking out early also frees it.
	for range l.Epoch(context.Background(), 0) {
		break
	}
	if _, ys := collect(t, l, 0); len(ys) != 25 {
		t.Errorf("%d batches after break, want 25", len(ys))
	}
}

func TestLoaderOptionErrors(t *testing.T) {
	ds := syntheticImages(4)
	for _, c := range []struct {
		opt  LoaderOptions
		want string
	}{
		{LoaderOptions{Batch: 0}, "Batch"},
		{LoaderOptions{Batch: 2, World: 2, Rank: 2}, "Rank"},
		{LoaderOptions{Batch: 2, Rank: -1}, "Rank"},
		{LoaderOptions{Batch: 2, World: -1}, "World"},
		{LoaderOptions{Batch: 2, Mean: [3]float32{0.5, 0.5, 0.5}}, "Std"},
	} {
		_, err := NewLoader(ds, c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %s", c.opt, err, c.want)
		}
	}
}

func BenchmarkLoaderAugment(b *testing.B) {
	ds := syntheticImages(1024)
	l, _ := NewLoader(ds, LoaderOptions{Batch: 128, Shuffle: true, Augment: true})
	b.SetBytes(int64(l.NumBatches() * 128 * cifarPixels))
	for i := 0; b.Loop(); i++ {
		for range l.Epoch(context.Background(), i) {
		}
	}
}

// EpochFrom(ctx, e, s) yields exactly Epoch(ctx, e)'s batches from s on, augmentation
// included (the skipped images' draws are replayed), for every s and a short last batch;
// a start outside the epoch is an error.
func TestLoaderEpochFromResumes(t *testing.T) {
	ds := syntheticImages(45)
	for _, dropLast := range []bool{true, false} {
		opt := LoaderOptions{Batch: 4, World: 2, Rank: 1, Seed: 3, Shuffle: true, Augment: true, DropLast: dropLast}
		ld, _ := NewLoader(ds, opt)
		all, ally := collect(t, ld, 2)
		for s := 0; s <= ld.NumBatches(); s++ {
			var xs [][]float32
			var ys [][]int
			for b, err := range ld.EpochFrom(context.Background(), 2, s) {
				if err != nil {
					t.Fatal(err)
				}
				xs, ys = append(xs, slices.Clone(b.X)), append(ys, slices.Clone(b.Y))
			}
			if !slices.EqualFunc(xs, all[s:], slices.Equal) || !slices.EqualFunc(ys, ally[s:], slices.Equal) {
				t.Fatalf("DropLast %v: EpochFrom(2, %d) differs from Epoch(2)'s batches %d…", dropLast, s, s)
			}
		}
		for _, bad := range []int{-1, ld.NumBatches() + 1} {
			for _, err := range ld.EpochFrom(context.Background(), 0, bad) {
				if err == nil || !strings.Contains(err.Error(), "outside the epoch") {
					t.Fatalf("start %d: %v", bad, err)
				}
			}
		}
	}
}

// Plan lists exactly the images and augmentations Epoch prepares: rebuilding every batch
// from the draws gives Epoch's batches, with and without augmentation and DropLast.
func TestLoaderPlanMatchesEpoch(t *testing.T) {
	ds := syntheticImages(50)
	for _, aug := range []bool{true, false} {
		for _, drop := range []bool{true, false} {
			l, err := NewLoader(ds, LoaderOptions{Batch: 4, Rank: 1, World: 3, Seed: 7, Shuffle: true, Augment: aug, DropLast: drop})
			if err != nil {
				t.Fatal(err)
			}
			norm, err := NewNormalizer(ds.Mean, ds.Std)
			if err != nil {
				t.Fatal(err)
			}
			for _, epoch := range []int{0, 2} {
				draws, err := l.Plan(epoch)
				if err != nil {
					t.Fatal(err)
				}
				xs, ys := collect(t, l, epoch)
				var want int
				for _, y := range ys {
					want += len(y)
				}
				if len(draws) != want {
					t.Fatalf("augment %v, drop_last %v, epoch %d: %d draws, Epoch yields %d images", aug, drop, epoch, len(draws), want)
				}
				flips, moved := 0, 0
				img := make([]float32, cifarPixels)
				k := 0
				for b := range xs {
					for j := range ys[b] {
						d := draws[k]
						norm.CropFlip(img, ds.Image(d.Index), 32, 32, d.Top, d.Left, d.Flip)
						if !slices.Equal(img, xs[b][j*cifarPixels:(j+1)*cifarPixels]) || ys[b][j] != int(ds.Labels[d.Index]) {
							t.Fatalf("augment %v, drop_last %v, epoch %d: batch %d image %d differs from draw %+v", aug, drop, epoch, b, j, d)
						}
						if d.Flip {
							flips++
						}
						if d.Top != CropPad || d.Left != CropPad {
							moved++
						}
						k++
					}
				}
				if aug != (flips > 0 && moved > 0) {
					t.Fatalf("augment %v: %d of %d draws flipped, %d cropped off-centre", aug, flips, len(draws), moved)
				}
			}
		}
	}
}
