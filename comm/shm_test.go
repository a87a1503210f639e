package comm

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
)

// newShm returns p ranks of one process over a shared segment in a temporary directory
// (closed when the test ends), with an optional change to every rank's configuration. It
// skips the test where the transport does not exist.
func newShm(t testing.TB, p int, configure ...func(*ShmConfig)) []Group {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport needs Linux")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	log := &testLog{t: t}
	groups, err := newShmLocal(ctx, p, func(c *ShmConfig) {
		c.Dir = dir
		c.Logf = log.logf
		for _, f := range configure {
			f(c)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(groups) })
	return groups
}

// A shared-memory group knows that its ranks share a host.
func TestShmTopology(t *testing.T) {
	groups := newShm(t, 3)
	if top := TopologyOf(groups[1]); top.Nodes() != 1 || top.Size() != 3 {
		t.Errorf("topology %v, want the 3 ranks on one node", top)
	}
}

// SharedMemory on a group that is not one is refused, naming the algorithm.
func TestSharedMemoryNeedsShm(t *testing.T) {
	groups, _ := NewLocal(2)
	err := AllReduce(context.Background(), groups[0], 0, make([]float32, 4), SharedMemory)
	if err == nil || !strings.Contains(err.Error(), "shared-memory needs a group made by NewShm") {
		t.Errorf("SharedMemory on a local group: %v", err)
	}
}
