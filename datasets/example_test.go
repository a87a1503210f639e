package datasets_test

import (
	"context"
	"fmt"
	"log"

	"github.com/spargo-dl/spargo/datasets"
)

// Training on the project's shared CIFAR-10 copy; a program would pass its
// -data flag to FindCIFAR10 (empty: search $SPARGO_DATA, the shared copy,
// the user cache).
func Example() {
	dir, err := datasets.FindCIFAR10("../../shared/data/cifar10/approx")
	if err != nil {
		log.Fatal(err)
	}
	train, test, err := datasets.LoadCIFAR10(dir)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(train.Summary)
	fmt.Println(test.Summary)

	ld, err := datasets.NewLoader(train, datasets.LoaderOptions{
		Batch: 128, Rank: 0, World: 2, Seed: 1,
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
	// CIFAR-10 train: 10000 records from data_batch_1.bin (batches 2-5 not present)
	// CIFAR-10 test: 10000 records from test_batch.bin
	// 39 batches per epoch on each of 2 ranks
	// 393216 floats, 128 labels, 128 images
}
