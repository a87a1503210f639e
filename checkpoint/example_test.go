package checkpoint_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// Save a model and its optimizer, then resume from the latest checkpoint into fresh objects.
// With DDP, pass checkpoint.State{…, DDP: dp} on every rank: Save then also writes the comm
// hook's and DDP's state, per rank.
func Example() {
	dir, err := os.MkdirTemp("", "ckpt")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	meta := checkpoint.Meta{Model: "mlp", Config: map[string]string{"lr": "0.1"}}

	model := nn.NewSequential(nn.NewLinear(4, 2, true, nn.NewRand(0)))
	opt, _ := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	saver := checkpoint.Saver{Dir: dir, Keep: 3}
	if _, err := saver.Save(context.Background(), checkpoint.State{Model: model, Optimizer: opt}, meta,
		checkpoint.Position{Epoch: 2, Iteration: 500}); err != nil {
		log.Fatal(err)
	}

	fresh := nn.NewSequential(nn.NewLinear(4, 2, true, nn.NewRand(1)))
	freshOpt, _ := optim.NewSGD(nn.Parameters(fresh), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	path, err := checkpoint.Latest(dir)
	if err != nil {
		log.Fatal(err)
	}
	pos, err := checkpoint.Load(path, checkpoint.State{Model: fresh, Optimizer: freshOpt}, meta)
	if err != nil {
		log.Fatal(err)
	}
	same := nn.Parameters(fresh)[0].Value.Data[0] == nn.Parameters(model)[0].Value.Data[0]
	fmt.Printf("resume at epoch %d, iteration %d; weights restored: %v\n", pos.Epoch, pos.Iteration, same)
	// Output: resume at epoch 2, iteration 500; weights restored: true
}
