package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// onRanks runs do on world in-process ranks, each with net(1, 3) under DDP.
func onRanks(ctx context.Context, world int, do func(r int, st State) error) error {
	groups, err := comm.NewLocal(world)
	if err != nil {
		return err
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			model := net(1, 3)
			dp, err := ddp.New(ctx, model, groups[r])
			if err == nil {
				err = do(r, State{Model: model, DDP: dp})
			}
			if err != nil {
				errs[r] = fmt.Errorf("rank %d of %d: %w", r, world, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// A checkpoint of 4 ranks taken at an epoch's end loads on 2; one whose old rank 2 holds its
// own BatchNorm statistics (state that differs between ranks) is refused, naming that rank.
func TestResizeRefusesPerRankState(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, differ := range []bool{false, true} {
		dir := t.TempDir()
		var path string
		err := onRanks(ctx, 4, func(r int, st State) error {
			if differ && r == 2 {
				for _, b := range nn.Buffers(st.Model) {
					b.Value.Data[0] += 1
				}
			}
			p, err := Saver{Dir: dir}.Save(ctx, st, Meta{Model: "net"}, Position{Epoch: 1, Iteration: 0})
			if r == 0 {
				path = p
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		err = onRanks(ctx, 2, func(r int, st State) error {
			_, err := Load(path, st, Meta{Model: "net"})
			return err
		})
		switch {
		case !differ && err != nil:
			t.Fatalf("identical ranks, 4 → 2: %v", err)
		case differ && (err == nil || !strings.Contains(err.Error(), "old rank 2's") || !strings.Contains(err.Error(), "on 2 ranks from 4")):
			t.Fatalf("old rank 2 with its own buffers, 4 → 2: %v, want a refusal naming old rank 2 and both world sizes", err)
		}
	}
}
