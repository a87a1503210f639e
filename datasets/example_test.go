package datasets_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/spargo-dl/spargo/datasets"
)

// Training on CIFAR-10. A program passes its -data flag to Find: empty, it
// searches $SPARGO_DATA/cifar10 and the user cache, then downloads. Here
// -data names the few official records committed as a test fixture.
func Example() {
	dataFlag := "../testdata/cifar10-mini"
	dir, err := datasets.Find(context.Background(), datasets.CIFAR10Set, dataFlag, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	train, test, err := datasets.LoadCIFAR10(dir)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(train.Summary)
	fmt.Println(test.Summary)
	fmt.Println("first image:", train.ClassNames[train.Labels[0]])

	ld, err := datasets.NewLoader(train, datasets.LoaderOptions{
		Batch: 2, Rank: 0, World: 2, Seed: 1,
		Shuffle: true, Augment: true, DropLast: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ld.NumBatches(), "batches per epoch on each of 2 ranks")
	for b, err := range ld.Epoch(context.Background(), 0) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(len(b.X), "floats,", len(b.Y), "labels,", b.N, "images")
		break // b.X and b.Y are valid until the next batch
	}
	// Output:
	// CIFAR-10 train: 16 records from data_batch_1.bin (batches 2-5 not present)
	// CIFAR-10 test: 8 records from test_batch.bin
	// first image: frog
	// 4 batches per epoch on each of 2 ranks
	// 6144 floats, 2 labels, 2 images
}

// A rank's epoch as a list of draws (image index, crop corner, flip), without preparing
// pixels: what a program writes to replay the exact data stream elsewhere.
func ExampleLoader_Plan() {
	ds := &datasets.Images{Name: "tiny", N: 10, C: 3, H: 32, W: 32,
		Pixels: make([]uint8, 10*3*32*32), Labels: make([]int32, 10),
		Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std}
	ld, err := datasets.NewLoader(ds, datasets.LoaderOptions{Batch: 2, Rank: 1, World: 2, Seed: 3, Shuffle: true, DropLast: true})
	if err != nil {
		log.Fatal(err)
	}
	draws, err := ld.Plan(0)
	if err != nil {
		log.Fatal(err)
	}
	seen := 0
	for _, d := range draws {
		if d.Index >= 0 && d.Index < ds.N && d.Top == datasets.CropPad && d.Left == datasets.CropPad && !d.Flip {
			seen++ // without Augment every window is the uncropped image
		}
	}
	fmt.Println(len(draws), "draws:", ld.NumBatches(), "batches of 2;", seen, "uncropped, unflipped")
	// Output:
	// 4 draws: 2 batches of 2; 4 uncropped, unflipped
}
