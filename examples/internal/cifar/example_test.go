package cifar_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/spargo-dl/spargo/examples/internal/cifar"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// writeCIFARFiles writes a small CIFAR-10 directory in the binary format (a label byte and
// 3×32×32 pixels per record): n training and n test images whose brightness is their class.
func writeCIFARFiles(dir string, n int) error {
	for _, name := range []string{"data_batch_1.bin", "test_batch.bin"} {
		rec := make([]byte, 0, n*3073)
		for i := range n {
			label := byte(i % 10)
			rec = append(rec, label)
			for range 3 * 32 * 32 {
				rec = append(rec, 20*label+byte(i%7))
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), rec, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// A CIFAR-10 example program is its defaults and a model constructor: here a one-layer
// classifier, trained for an epoch by 2 in-process workers with SparDL.
func Example() {
	dir, err := os.MkdirTemp("", "cifar-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	if err := writeCIFARFiles(dir, 40); err != nil {
		fmt.Println(err)
		return
	}
	linear := func(_ string, ds models.Dataset, rng *rand.Rand) (nn.Module, error) {
		return nn.NewSequential(nn.Flatten{}, nn.NewLinear(ds.Channels*32*32, ds.Classes, true, rng)), nil
	}
	c := cifar.Config{Data: dir, Model: "linear", NewModel: linear, Workers: 2, Hook: "spardl:density=0.1", Batch: 4, Epochs: 1,
		Flags: train.Flags{LR: 0.01, Momentum: 0.9}, DistBN: "broadcast"}
	sum, err := cifar.Run(context.Background(), c, io.Discard, io.Discard)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d parameters; %d epoch of %d steps on %.0f images\n", sum.Params, len(sum.Epochs), sum.Epochs[0].Steps, sum.Epochs[0].TrainSec*sum.Epochs[0].ImgPerSec)
	// Output:
	// 30730 parameters; 1 epoch of 5 steps on 40 images
}
