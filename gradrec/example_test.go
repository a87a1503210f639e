package gradrec_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"slices"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/gradrec"
	"github.com/spargo-dl/spargo/nn"
)

// Record the local gradients of the first two iterations of a 2-rank run (in-process ranks,
// DDP's default all-reduce), then open the recording and read one rank's gradients back.
// `spargo bench comm -grads DIR` replays such a recording through every comm hook.
func Example() {
	dir, err := os.MkdirTemp("", "grads")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	const ranks = 2
	groups, err := comm.NewLocal(ranks)
	if err != nil {
		log.Fatal(err)
	}
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			errs[r] = func() error {
				ctx := context.Background()
				rng := nn.NewRand(1)
				model := nn.NewSequential(nn.NewLinear(4, 8, true, rng), nn.ReLU{}, nn.NewLinear(8, 3, true, rng))
				rec, err := gradrec.NewRecorder(gradrec.Config{Dir: dir, Schedule: gradrec.Schedule{Every: 0, Steps: 2},
					Model: "mlp", Hook: "allreduce", Params: nn.Parameters(model)})
				if err != nil {
					return err
				}
				// Small buckets, so that the recording holds a plan of several buckets.
				dp, err := ddp.New(ctx, model, groups[r], ddp.WithBucketObserver(rec), ddp.WithBucketCap(64, 64))
				if err != nil {
					return err
				}
				tape := nn.NewTape()
				for step := range 3 {
					tape.Reset()
					for _, p := range dp.Parameters() {
						clear(p.Grad.Data)
					}
					x := nn.NewTensor(2, 4)
					for i := range x.Data {
						x.Data[i] = float32(r+1) * float32(i-step) / 8 // each rank its own batch
					}
					if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), []int{0, 2})); err != nil {
						return err
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			log.Fatalf("rank %d: %v", r, err)
		}
	}

	rec, err := gradrec.Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("model %s, hook %s, P=%d, iterations %v\n", rec.Model, rec.Hook, rec.World, rec.Iterations)
	for i, name := range rec.Names {
		fmt.Println(name, rec.Shapes[i])
	}
	fmt.Printf("buckets %v (parameter indices, in communication order), %d elements per rank and iteration\n", rec.Buckets, rec.Elements())
	g0, err := rec.Load(1, 0)
	if err != nil {
		log.Fatal(err)
	}
	g1, err := rec.Load(1, 1)
	if err != nil {
		log.Fatal(err)
	}
	// The recorded gradients are each rank's own, from before the all-reduce.
	fmt.Println("ranks recorded different gradients:", !slices.EqualFunc(g0, g1, slices.Equal))
	// Output:
	// model mlp, hook allreduce, P=2, iterations [0 1]
	// 0.weight [8 4]
	// 0.bias [8]
	// 2.weight [3 8]
	// 2.bias [3]
	// buckets [[3 2] [1 0]] (parameter indices, in communication order), 67 elements per rank and iteration
	// ranks recorded different gradients: true
}
