package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/internal/train"
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
		ld, err := datasets.NewLoader(ds, train.CIFARTrainLoader(batch, r, workers, 9))
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
