// Command resnet trains a CIFAR ResNet (He et al. 2016: resnet20, 32, 44, 56, 110) on
// CIFAR-10 with data-parallel workers, in one process or one rank per process under a
// launcher, exactly as examples/vgg does: both are the CIFAR-10 program
// of examples/internal/cifar (cifar.Main) with their own models and defaults, so every flag, the metrics, the
// checkpoints and the launchers work the same (go doc ./examples/vgg).
//
//	go run ./examples/resnet                                   # resnet20, 2 workers × batch 128, cosine
//	go run ./examples/resnet -epochs 164 -schedule multistep:milestones=82/123   # the paper's step decay
//	go run ./examples/resnet -hook spardl:density=0.01 -metrics run.jsonl -log-every 20 -plot run.png
//
// The defaults are the paper's recipe: SGD with lr 0.1, momentum 0.9, weight decay 1e-4,
// batch 128 (per worker here: -workers 2 -batch 64 is the paper's global 128). Its schedule
// divides the rate by 10 at 50% and 75% of training (32k and 48k of 64k iterations); as a
// multistep schedule that needs milestones in epochs, which would be wrong for any other
// -epochs, so the default -schedule is cosine annealing to 0 over the run instead
// (-schedule cosine, per step): it adapts to -epochs and -steps, and matches or beats step
// decay on CIFAR ResNets (the usual recipe since SGDR, Loshchilov & Hutter 2017).
package main

import (
	"math/rand/v2"

	"github.com/spargo-dl/spargo/examples/internal/cifar"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// defaults are the program's flags' defaults: resnet20 with He et al.'s recipe (see the
// package doc for the schedule).
func defaults() cifar.Config {
	return cifar.Config{
		Model: "resnet20", ModelHelp: "resnet20|resnet32|resnet44|resnet56|resnet110, or any 32×32 model of spargo models (vgg11 … vgg19)", NewModel: newModel, CheckModel: checkModel,
		Workers: 2, Hook: "allreduce", Batch: 128, Epochs: 3,
		Flags:    train.Flags{LR: 0.1, Momentum: 0.9, WD: 1e-4, Optim: "sgd", Schedule: "cosine"},
		DistBN:   "broadcast",
		Keep:     3,
		Progress: true,
	}
}

// newModel builds the catalogue's image classifier called name for ds (models.LookupImage):
// the CIFAR ResNets, and the VGGs as examples/vgg builds them.
func newModel(name string, ds models.Dataset, rng *rand.Rand) (nn.Module, error) {
	e, err := models.LookupImage(name, ds)
	if err != nil {
		return nil, err
	}
	return e.Build(rng)
}

// checkModel refuses a name newModel does not build, without building it.
func checkModel(name string) error {
	_, err := models.LookupImage(name, models.CIFAR10)
	return err
}

func main() {
	cifar.Main("resnet", defaults())
}
