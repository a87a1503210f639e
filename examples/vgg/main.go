// Command vgg trains VGG on CIFAR-10 with data-parallel workers: in one process, each worker
// a goroutine with its own model replica, or one worker per process when a launcher starts it
// (torchrun, spargo launch, Slurm, mpirun, Kubernetes). Gradients flow parameter hook →
// bucket → comm hook → optimizer the same way in both.
//
//	go run ./examples/vgg                                      # VGG-11, 2 workers, CIFAR-10 found or downloaded
//	go run ./examples/vgg -data ~/data/cifar10 -model vgg11 -workers 2 \
//	    -batch 32 -epochs 3 -lr 0.01 -momentum 0.9 -wd 5e-4
//	go run ./examples/vgg -hook allreduce:algorithm=ring -metrics run.jsonl
//	go build -o vgg ./examples/vgg && spargo launch -n 4 -- ./vgg -epochs 3   # 4 processes
//	go run ./examples/vgg -checkpoint ck -checkpoint-every 100   # save at every epoch end and every 100 steps
//	go run ./examples/vgg -checkpoint ck -resume -epochs 5       # continue exactly where ck/latest stopped
//	go run ./examples/vgg -optim adamw:wd=0.05 -lr 1e-3 -schedule cosine:warmup=1 \
//	    -metrics run.jsonl -log-every 10 -plot run.png          # another optimizer and schedule, plotted
//	go run ./examples/vgg -record-grads /tmp/grads -record-every 50 -record-steps 3   # for spargo bench comm -grads
//
// The program is the CIFAR-10 program of examples/internal/cifar (cifar.Main), which examples/resnet
// shares; this one builds VGG models and has the PyTorch anchor's recipe (scripts/anchors/torch_cifar_vgg.py) as defaults (-lr 0.01,
// -momentum 0.9, -wd 5e-4, constant rate; -warmup N warms up from lr/workers). The training
// flags every example shares (-optim, -schedule, -warmup, -lr, -momentum, -wd, -metrics,
// -log-every, -plot) are train.Flags; -optim help and -schedule help list the specs.
//
// -resume needs the flags of the saved run (model, hook, workers, batch, steps, lr, momentum,
// wd, optim, schedule, seed, warmup, bucket-mb, dist-bn; -epochs may grow) and appends to -metrics. With -hook
// omgs, give -profile FILE so that the resumed run plans the same buckets.
//
// -batch is per worker (global batch = workers × batch). CIFAR-10 is found by
// datasets.Find: -data, else $SPARGO_DATA/cifar10, else the user cache directory, else
// downloaded into the cache (md5-checked); docs/data.md says more.
//
// Under a launcher (cluster.DetectEnv finds a world size above 1) each process joins the job with
// cluster.Init and trains one rank; -workers must then be left out, or be 1 (one per process) or
// the world size. Rank 0 prints, shows the progress bar (when its standard error is a
// terminal) and writes -metrics; every rank loads the data and takes its shard of each batch,
// exactly as the in-process workers do, so the run computes the same numbers. SIGINT and
// SIGTERM stop training between steps.
package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/spargo-dl/spargo/examples/internal/cifar"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// defaults are the program's flags' defaults: VGG-11, 2 workers of batch 32, 3 epochs, SGD
// with the PyTorch anchor's lr 0.01, momentum 0.9 and weight decay 5e-4 at a constant rate.
func defaults() cifar.Config {
	return cifar.Config{
		Model: "vgg11", ModelHelp: "vgg11|vgg13|vgg16|vgg19", NewModel: newModel, CheckModel: checkModel,
		Workers: 2, Hook: "allreduce", Batch: 32, Epochs: 3,
		Flags:    train.Flags{LR: 0.01, Momentum: 0.9, WD: 5e-4, Optim: "sgd"},
		DistBN:   "broadcast",
		Keep:     3,
		Progress: true,
	}
}

// newModel builds the VGG named name for ds.
func newModel(name string, ds models.Dataset, rng *rand.Rand) (nn.Module, error) {
	return models.NewVGG(name, ds, rng)
}

// checkModel refuses a name newModel does not build, without building it.
func checkModel(name string) error {
	if !slices.Contains(models.VGGNames(), strings.ToLower(name)) {
		return fmt.Errorf("unknown VGG (have %s)", strings.Join(models.VGGNames(), ", "))
	}
	return nil
}

func main() {
	cifar.Main("vgg", defaults())
}
