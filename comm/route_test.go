package comm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// newRouted returns p ranks joined by Route: a TCP loopback world and, for each node (node(r) is
// rank r's), an in-process group of its ranks. Configure adjusts the world's TCP configuration.
// newRoutedShm is newRouted with the node groups on shared memory, as a job's on one host.
func newRoutedShm(t testing.TB, p int, node func(r int) int) []Group {
	t.Helper()
	routed, _ := routedOver(t, p, node, func(n int) ([]Group, error) { return newShm(t, n), nil })
	return routed
}

func newRouted(t testing.TB, p int, node func(r int) int, configure ...func(*TCPConfig)) []Group {
	t.Helper()
	groups, _ := newRoutedParts(t, p, node, configure...)
	return groups
}

// newRoutedParts is newRouted that also returns the world groups.
func newRoutedParts(t testing.TB, p int, node func(r int) int, configure ...func(*TCPConfig)) (routed, world []Group) {
	t.Helper()
	return routedOver(t, p, node, NewLocal, configure...)
}

// routedOver routes TCP loopback world groups through node groups made by nodeGroups.
func routedOver(t testing.TB, p int, node func(r int) int, nodeGroups func(n int) ([]Group, error), configure ...func(*TCPConfig)) (routed, world []Group) {
	t.Helper()
	labels := make([]string, p)
	for r := range labels {
		labels[r] = strconv.Itoa(node(r))
	}
	top, err := NewTopology(labels)
	if err != nil {
		t.Fatal(err)
	}
	world = newTCP(t, p, configure...)
	routed = make([]Group, p)
	for id := range top.Nodes() {
		members := top.Members(id)
		local, err := nodeGroups(len(members))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range members {
			if routed[r], err = Route(world[r], local[i], top); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() { closeAll(routed) })
	return routed, world
}

func TestRouteTopologyAndCounters(t *testing.T) {
	g := newRouted(t, 4, func(r int) int { return r / 2 })
	want, _ := GridTopology(2, 2)
	for r := range g {
		if got := TopologyOf(g[r]); !got.Equal(want) {
			t.Fatalf("rank %d: topology %v, want %v", r, got, want)
		}
	}
	// A ring all-reduce of n floats at P = 4 sends 2(P-1) = 6 messages of n/4 floats per rank;
	// in the ring 0→1→2→3→0, ranks 1 and 3 send across nodes (to 2 and to 0), 0 and 2 do not.
	const n = 4000
	var wg sync.WaitGroup
	errs := make([]error, 4)
	data := make([][]float32, 4)
	for r := range g {
		data[r] = rankData(1, r, n)
		wg.Go(func() { errs[r] = AllReduce(context.Background(), g[r], 3, data[r], Ring) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range g {
		for i := range data[r] {
			if data[r][i] != data[0][i] {
				t.Fatalf("rank %d differs from rank 0 at %d", r, i)
			}
		}
		s := g[r].Counters().Snapshot()
		wantSent, wantInter := int64(6*n), int64(0)
		if r%2 == 1 {
			wantInter = wantSent
		}
		if s.BytesSent != wantSent || s.InterBytesSent != wantInter || s.Rounds == 0 {
			t.Errorf("rank %d: %+v, want %d bytes sent, %d of them across nodes", r, s, wantSent, wantInter)
		}
		wantInterRecv := int64(0)
		if r%2 == 0 {
			wantInterRecv = int64(6 * n)
		}
		if s.InterBytesRecv != wantInterRecv {
			t.Errorf("rank %d: %d bytes received across nodes, want %d", r, s.InterBytesRecv, wantInterRecv)
		}
	}
}

// Errors of the node group name world ranks, not the node's local numbering.
func TestRouteLocalErrorsNameWorldRanks(t *testing.T) {
	g := newRouted(t, 4, func(r int) int { return r / 2 })
	ctx := context.Background()
	if err := g[2].Send(ctx, 3, 6, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	_, err := g[3].Recv(ctx, 2, 6, make([]byte, 4))
	if err == nil {
		t.Fatal("oversized message accepted")
	}
	for _, w := range []string{"comm: rank 3: recv from rank 2 tag 6", "local ranks 1 and 0", "10 bytes"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if err := g[3].Send(ctx, 9, 1, nil); err == nil || !strings.Contains(err.Error(), "rank 9") {
		t.Errorf("send to rank 9: %v", err)
	}
}

// failingLocal is a node group whose receives report that local rank 0 failed.
type failingLocal struct{ Group }

func (f failingLocal) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *Request {
	return DoneRequest(0, fmt.Errorf("shm: %w", &PeerError{Rank: 0, Cause: errors.New("gone"), ReportedBy: -1, self: f.Rank()}))
}

func TestRouteTranslatesLocalPeerError(t *testing.T) {
	world := newTCP(t, 4)
	top, _ := GridTopology(2, 2)
	local, _ := NewLocal(2)
	g, err := Route(world[3], failingLocal{local[1]}, top)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	_, err = g.Recv(context.Background(), 2, 1, nil)
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 2 || !strings.Contains(err.Error(), "peer rank 2 failed: gone") {
		t.Fatalf("error %v (PeerError %+v), want one naming world rank 2", err, pe)
	}
	// The failure is the view's: later operations fail with it, over TCP too.
	if err := g.Send(context.Background(), 0, 1, nil); err == nil || !strings.Contains(err.Error(), "peer rank 2 failed") {
		t.Fatalf("send after the failure: %v", err)
	}
}

// A rank of another node dies: its TCP peers fail, and a receive that waits on the node group
// (from a live rank that will never send) is released, naming the dead rank.
func TestRouteWorldFailureReleasesLocalWaits(t *testing.T) {
	g, world := newRoutedParts(t, 4, func(r int) int { return r / 2 }, shortTimeout)
	req := g[0].Irecv(context.Background(), 1, 5, make([]byte, 4))
	time.Sleep(10 * time.Millisecond)
	world[3].(*tcpGroup).killForTest()
	done := make(chan struct{})
	var err error
	go func() { _, err = req.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the node-local receive was not released by the world's failure")
	}
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 3 {
		t.Fatalf("error %v, want a PeerError naming rank 3", err)
	}
}

func TestRouteRefusesMismatchedGroups(t *testing.T) {
	world, _ := NewLocal(4)
	top, _ := GridTopology(2, 2)
	three, _ := NewLocal(3)
	if _, err := Route(world[0], three[0], top); err == nil || !strings.Contains(err.Error(), "local group has 3") {
		t.Errorf("local group of 3 for a node of 2: %v", err)
	}
	two, _ := NewLocal(2)
	if _, err := Route(world[2], two[1], top); err == nil || !strings.Contains(err.Error(), "local rank 0") {
		t.Errorf("local group numbering rank 2 as 1: %v", err)
	}
	flat := FlatTopology(3)
	if _, err := Route(world[0], two[0], flat); err == nil || !strings.Contains(err.Error(), "topology of 3 ranks") {
		t.Errorf("topology of 3 for a world of 4: %v", err)
	}
}
