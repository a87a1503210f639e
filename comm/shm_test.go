package comm

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
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

// A sub-group of exactly one node's ranks of a Route (as hier:SPEC's node groups) is a view of
// the node's shared-memory group: comm.AllReduce on it runs the shared all-reduce and counts
// on the parent. Any other sub-group, and one listing the node's ranks out of order, is not.
func TestSubOfRouteNodeRunsSharedAllReduce(t *testing.T) {
	g := newRoutedShm(t, 4, func(r int) int { return r / 2 })
	top := TopologyOf(g[0])
	const n = 3001
	var wg sync.WaitGroup
	errs := make([]error, 4)
	data := make([][]float32, 4)
	for r := range g {
		members := top.Members(top.Node(r))
		node, err := Sub(g[r], members)
		if err != nil {
			t.Fatal(err)
		}
		if !OnSharedMemory(node) || AllReduceAlgorithmOn(node, n, Auto) != SharedMemory {
			t.Fatalf("rank %d: the sub-group of its node %v is not on shared memory", r, members)
		}
		cross, _ := Sub(g[r], []int{r % 2, 2 + r%2})
		reversed, _ := Sub(g[r], []int{members[1], members[0]})
		if OnSharedMemory(cross) || OnSharedMemory(reversed) {
			t.Fatalf("rank %d: a sub-group across nodes or out of the node's order is on shared memory", r)
		}
		data[r] = rankData(5, r, n)
		wg.Go(func() { errs[r] = AllReduce(context.Background(), node, 7, data[r], Auto) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range g {
		want := rankData(5, r-r%2, n)
		other := rankData(5, r-r%2+1, n)
		for i := range want {
			if s := want[i] + other[i]; data[r][i] != s {
				t.Fatalf("rank %d element %d = %v, its node's sum is %v", r, i, data[r][i], s)
			}
		}
		if s := g[r].Counters().Snapshot(); s.BytesRecv == 0 || s.InterBytesRecv != 0 {
			t.Errorf("rank %d: %+v: the node's all-reduce should count on the job's group, none of it across nodes", r, s)
		}
	}
}
