// Command export writes a parity case of a catalogue model for scripts/torch_parity.py:
// the weights, a batch and spargo's loss, gradients and updated buffers (models/internal/parity).
//
//	go run ./models/internal/parity/export -model resnet20 -batch 8 /tmp/parity/resnet20
//	go run ./models/internal/parity/export -model resnet18 -batch 2 -size 64 /tmp/parity/resnet18
//	go run ./models/internal/parity/export -model resnet20 -batch 16 -steps 5 /tmp/parity/resnet20-sgd
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/spargo-dl/spargo/models/internal/parity"
)

func main() {
	var c parity.Case
	flag.StringVar(&c.Model, "model", "resnet20", "catalogue model (spargo models)")
	flag.IntVar(&c.Batch, "batch", 8, "batch size")
	flag.IntVar(&c.Size, "size", 0, "image height = width (0: the data set's)")
	flag.Uint64Var(&c.Seed, "seed", 1, "seed of the weights (the batch uses seed+1)")
	flag.IntVar(&c.Steps, "steps", 0, "also take this many SGD steps on the batch and export the parameters after them")
	flag.Float64Var(&c.LR, "lr", 0.1, "with -steps: SGD learning rate")
	flag.Float64Var(&c.Momentum, "momentum", 0.9, "with -steps: SGD momentum")
	flag.Float64Var(&c.WD, "wd", 1e-4, "with -steps: SGD weight decay")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: export [-model M] [-batch N] [-size S] [-seed S] DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if c.Steps == 0 {
		c.LR, c.Momentum, c.WD = 0, 0, 0 // not part of a gradient-only case
	}
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	r, err := parity.Export(flag.Arg(0), c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "export:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %s, batch %d, loss %.6f, written to %s\n", c.Model, r.Entry.Family, c.Batch, r.Loss, flag.Arg(0))
}
