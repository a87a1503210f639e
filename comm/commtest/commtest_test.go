package commtest_test

import (
	"context"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
)

func TestGroupsAllReduce(t *testing.T) {
	groups := commtest.Groups(t, 3)
	errs := make(chan error, 3)
	bufs := make([][]float32, 3)
	for r, g := range groups {
		bufs[r] = []float32{float32(r), 1}
		go func() { errs <- comm.AllReduce(context.Background(), g, 0, bufs[r], comm.Auto) }()
	}
	for range groups {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for r, b := range bufs {
		if b[0] != 3 || b[1] != 3 {
			t.Errorf("rank %d: %v, want [3 3] (transport %s)", r, b, commtest.Transport())
		}
	}
}

func TestUnknownTransport(t *testing.T) {
	t.Setenv(commtest.Var, "pigeon")
	if _, err := commtest.New(2); err == nil {
		t.Error("no error for an unknown transport")
	}
}
