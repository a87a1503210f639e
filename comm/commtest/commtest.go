// Package commtest gives tests the ranks they run on. Groups returns in-process ranks
// (comm.NewLocal) unless the environment variable SPARGO_TEST_TRANSPORT names another
// transport, so that one test suite runs on every transport:
//
//	go test ./comm ./hooks ./ddp                              # in-process ranks
//	SPARGO_TEST_TRANSPORT=shm go test ./comm ./hooks ./ddp    # shared memory (NewShmLocal)
//	SPARGO_TEST_TRANSPORT=tcp go test ./comm ./hooks ./ddp    # TCP over loopback
//
// Only tests import it; the transports themselves know nothing of it.
package commtest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// Var is the environment variable that picks the transport.
const Var = "SPARGO_TEST_TRANSPORT"

// Transport is the transport the tests run on: "local" (the default), "shm" or "tcp".
func Transport() string {
	if tr := os.Getenv(Var); tr != "" {
		return tr
	}
	return "local"
}

// Groups returns p ranks of the transport Transport names, closed when the test ends (ranks
// of shared memory and TCP hold goroutines and mappings until then). It fails the test if
// they cannot be made.
func Groups(t testing.TB, p int) []comm.Group {
	t.Helper()
	groups, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Close(groups) })
	return groups
}

// New returns p ranks of the transport Transport names; the caller closes them.
func New(p int) ([]comm.Group, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch tr := Transport(); tr {
	case "local":
		return comm.NewLocal(p)
	case "shm":
		return comm.NewShmLocal(ctx, p, smallSegment)
	case "tcp":
		return comm.NewTCPLoopback(ctx, p, []byte("commtest"))
	default:
		return nil, &transportError{tr}
	}
}

// Close closes every group, concurrently (a TCP rank waits briefly for its peers' goodbyes).
func Close(groups []comm.Group) {
	var wg sync.WaitGroup
	for _, g := range groups {
		if g != nil {
			wg.Go(func() { g.Close() })
		}
	}
	wg.Wait()
}

type transportError struct{ name string }

func (e *transportError) Error() string {
	return Var + "=" + e.name + ": want local, shm or tcp"
}

// smallSegment gives the test ranks of shared memory the smallest rings and reduce slots (64
// KiB each; 17 MiB at 16 ranks): tests hold many groups, a container's /dev/shm is 64 MiB, and
// messages and vectors larger than a ring or half a slot then take the streaming paths.
func smallSegment(c *comm.ShmConfig) {
	c.RingBytes, c.ReduceBytes = 64<<10, 64<<10
}
