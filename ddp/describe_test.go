package ddp

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/spargo-dl/spargo/comm/commtest"
)

// evenOnly is an all-reduce hook that says it runs only on an even number of ranks.
type evenOnly struct{ AllReduceHook }

func (evenOnly) Name() string { return "even-only" }

func (evenOnly) CheckWorldSize(p int) error {
	if p%2 != 0 {
		return fmt.Errorf("needs an even number of ranks")
	}
	return nil
}

// corrected asks for a Corrector.
type corrected struct{ AllReduceHook }

func (corrected) NeedsCorrector() bool { return true }

func TestNewRefusesHookAtWorldSize(t *testing.T) {
	for _, p := range []int{2, 3} {
		groups := commtest.Groups(t, p)
		errs := make([]error, p)
		var wg sync.WaitGroup
		for r, g := range groups {
			wg.Go(func() {
				_, errs[r] = New(context.Background(), smallNet(1), g, WithCommHook(evenOnly{}))
			})
		}
		wg.Wait()
		for r, err := range errs {
			const want = "ddp: hook even-only cannot run at world size P=3: needs an even number of ranks"
			if p == 2 && err != nil || p == 3 && (err == nil || err.Error() != want) {
				t.Errorf("P=%d rank %d: New = %v", p, r, err)
			}
		}
		for _, g := range groups {
			g.Close()
		}
	}
	if err := CheckWorldSize(AllReduceHook{}, 7); err != nil {
		t.Errorf("allreduce at P=7: %v", err)
	}
	if !NeedsCorrector(corrected{}) || NeedsCorrector(AllReduceHook{}) || NeedsCorrector(evenOnly{}) {
		t.Error("NeedsCorrector: only the hook that says so needs one")
	}
	if err := CheckWorldSize(evenOnly{}, 5); err == nil || !strings.Contains(err.Error(), "P=5") {
		t.Errorf("CheckWorldSize(even-only, 5) = %v", err)
	}
}
