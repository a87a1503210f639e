package main

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

// A written stream reads back as the training loaders' plans, step by step and rank by rank,
// and a reader with other workers or batch refuses it.
func TestStreamRoundTrip(t *testing.T) {
	const n, workers, batch, epochs = 45, 3, 4, 2
	ds := &datasets.Images{Name: "tiny", N: n, C: 3, H: 32, W: 32, Pixels: make([]uint8, n*3*32*32), Labels: make([]int32, n),
		Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std}
	path := filepath.Join(t.TempDir(), "s.bin")
	c := config{workers: workers, batch: batch, epochs: epochs, seed: 9, writeStream: path}
	if err := writeStream(ds, c); err != nil {
		t.Fatal(err)
	}
	s, err := readStream(path, workers, batch)
	if err != nil {
		t.Fatal(err)
	}
	if s.epochs != epochs || s.steps != 3 { // 15 images per rank: 3 batches of 4
		t.Fatalf("read %d epochs of %d steps, want %d of 3", s.epochs, s.steps, epochs)
	}
	for r := range workers {
		ld, err := datasets.NewLoader(ds, trainLoader(batch, r, workers, 9))
		if err != nil {
			t.Fatal(err)
		}
		for e := range epochs {
			plan, err := ld.Plan(e)
			if err != nil {
				t.Fatal(err)
			}
			for st := range s.steps {
				for j, d := range s.draws[e][st][r] {
					if want := plan[st*batch+j]; d != want {
						t.Fatalf("epoch %d step %d rank %d image %d: read %+v, the loader draws %+v", e, st, r, j, d, want)
					}
				}
			}
		}
	}
	if _, err := readStream(path, workers+1, batch); err == nil || !strings.Contains(err.Error(), "3 workers × batch 4") {
		t.Errorf("reading with -workers 4: %v, want an error naming the stream's 3 workers × batch 4", err)
	}
}

// A model's weights written by -write-init load into a model built from another seed and
// make it the first one, for the CIFAR ResNets as for the VGGs.
func TestWeightsRoundTrip(t *testing.T) {
	for _, name := range []string{"resnet20", "vgg11"} {
		src, err := newModel(name, 3)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), name+".safetensors")
		if err := writeWeights(src, path); err != nil {
			t.Fatal(err)
		}
		f, err := safetensors.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := newModel(name, 4)
		if err != nil {
			t.Fatal(err)
		}
		if err := loadWeights(dst, f, path); err != nil {
			t.Fatal(err)
		}
		for i, p := range nn.Parameters(dst) {
			if q := nn.Parameters(src)[i]; p.Name != q.Name || !slices.Equal(p.Value.Data, q.Value.Data) {
				t.Fatalf("%s: parameter %s differs from the written model's %s after loading", name, p.Name, q.Name)
			}
		}
		for i, b := range nn.Buffers(dst) {
			if q := nn.Buffers(src)[i]; b.Name != q.Name || !slices.Equal(b.Value.Data, q.Value.Data) {
				t.Fatalf("%s: buffer %s differs from the written model's %s after loading", name, b.Name, q.Name)
			}
		}
	}
	if _, err := newModel("resnet18", 0); err == nil {
		t.Error("newModel(resnet18): no error, want one (an ImageNet model has no CIFAR-10 entry)")
	}
}

// A ResNet-20 replay with examples/resnet's recipe (cosine per step) trains two ranks on a
// written stream from written weights; a stream image outside the training set is refused.
func TestReplayResNetCosine(t *testing.T) {
	const n = 16
	rng := rand.New(rand.NewPCG(1, 2))
	ds := &datasets.Images{Name: "tiny", N: n, C: 3, H: 32, W: 32, Pixels: make([]uint8, n*3*32*32), Labels: make([]int32, n),
		Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std}
	for i := range ds.Pixels {
		ds.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range ds.Labels {
		ds.Labels[i] = int32(rng.IntN(10))
	}
	dir := t.TempDir()
	c := config{model: "resnet20", workers: 2, batch: 2, epochs: 1, seed: 5, lr: 0.1, momentum: 0.9, wd: 1e-4, schedule: "cosine",
		evalLimit: 4, logSteps: 2, stream: filepath.Join(dir, "s.bin"), init: filepath.Join(dir, "w.safetensors")}
	c.writeStream = c.stream
	if err := writeStream(ds, c); err != nil {
		t.Fatal(err)
	}
	m, err := newModel(c.model, c.seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeWeights(m, c.init); err != nil {
		t.Fatal(err)
	}
	s, err := readStream(c.stream, c.workers, c.batch)
	if err != nil {
		t.Fatal(err)
	}
	w, err := safetensors.ReadFile(c.init)
	if err != nil {
		t.Fatal(err)
	}
	if err := replayAll(t.Context(), c, s, w, ds, ds); err != nil {
		t.Fatal(err)
	}
	if err := s.check(c.stream, n); err != nil {
		t.Fatalf("a written stream: %v", err)
	}
	s.draws[0][1][1][0].Index = n
	if err := s.check(c.stream, n); err == nil || !strings.Contains(err.Error(), "epoch 0 step 1 rank 1 image 0: index 16") {
		t.Errorf("a stream image %d of %d: %v, want an error naming it", n, n, err)
	}
}
