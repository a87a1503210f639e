package ddp

import (
	"context"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/comm/commtest"
)

// State round-trips DDP's counters into a fresh DDP; state of another world size, a
// malformed or foreign entry, and late results of another bucket plan are refused with an
// error naming the mismatch.
func TestStateLoadStateChecks(t *testing.T) {
	ctx := context.Background()
	groups := commtest.Groups(t, 1)
	a, err := New(ctx, smallNet(1), groups[0])
	if err != nil {
		t.Fatal(err)
	}
	a.reducer.iter, a.late.epochs, a.late.lossN, a.late.lossSum = 7, 2, 3, 1.25
	st, err := a.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(ctx, smallNet(2), groups[0])
	if err := b.LoadState(st); err != nil {
		t.Fatal(err)
	}
	if b.Iteration() != 7 || b.late.epochs != 2 || b.late.lossN != 3 || b.late.lossSum != 1.25 {
		t.Fatalf("restored iteration %d, epochs %d, losses %d/%v", b.Iteration(), b.late.epochs, b.late.lossN, b.late.lossSum)
	}
	other := func(mod func(map[string][]float32)) map[string][]float32 {
		c := map[string][]float32{}
		for k, v := range st {
			c[k] = append([]float32(nil), v...)
		}
		mod(c)
		return c
	}
	for _, tc := range []struct {
		st   map[string][]float32
		want string
	}{
		{other(func(m map[string][]float32) { copy(m[stateMeta][12:], packU64(4)) }), "saved by rank 0 of 4, restoring on rank 0 of 1"},
		{other(func(m map[string][]float32) { delete(m, stateMeta) }), "no ddp.meta entry"},
		{other(func(m map[string][]float32) { m["osp.meta"] = nil }), `unknown key "osp.meta"`},
		{other(func(m map[string][]float32) {
			m["ddp.late0.meta"] = append(packU64(9), packU64(0)...)
			m["ddp.late0.values"] = []float32{1}
		}), "bucket 9, the plan has"},
		{other(func(m map[string][]float32) { m["ddp.late0.meta"] = packU64(0) }), "late result 0 is incomplete"},
		{other(func(m map[string][]float32) { m["ddp.lgp.nosuch"] = []float32{1} }), `LGP estimate "nosuch"`},
	} {
		c, _ := New(ctx, smallNet(3), groups[0])
		if err := c.LoadState(tc.st); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}
