package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// A script of one's own, safe by construction: one hook per rank (built on the rank), and
// every rank closes its DDP and its group when it returns, however it returns. Rank 1 fails
// before its first Backward; rank 0's Backward then fails with an error naming rank 1
// instead of waiting for it forever.
func Example_closeOnReturn() {
	groups, _ := comm.NewLocal(2)
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			defer g.Close() // the other ranks' collectives fail instead of waiting for this rank
			errs[r] = func() error {
				ctx := context.Background()
				model := nn.NewSequential(nn.NewLinear(4, 3, true, nn.NewRand(1)))
				hook := ddp.AllReduceHook{} // hooks.Parse(spec) on each rank: one hook per rank
				dp, err := ddp.New(ctx, model, g, ddp.WithCommHook(hook))
				if err != nil {
					return err
				}
				defer dp.Close() // frees the hook instance for a later DDP
				if g.Rank() == 1 {
					return errors.New("no data for rank 1")
				}
				x := nn.NewTensor(2, 4)
				tape := nn.NewTape()
				return dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), []int{0, 2}))
			}()
		})
	}
	wg.Wait()
	fmt.Println("rank 1:", errs[1])
	fmt.Println("rank 0 failed because rank 1 closed its group:",
		errors.Is(errs[0], comm.ErrClosed) && strings.Contains(errs[0].Error(), "rank 1 closed its group"))
	// Output:
	// rank 1: no data for rank 1
	// rank 0 failed because rank 1 closed its group: true
}
