package comm

import (
	"context"
	"strings"
	"testing"
)

func TestTopologyLabelsAndGrid(t *testing.T) {
	top, err := NewTopology([]string{"b", "a", "b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	if top.Nodes() != 2 || top.Node(0) != 0 || top.Node(1) != 1 || top.Node(2) != 0 {
		t.Fatalf("nodes %v", top)
	}
	if got := top.String(); got != "[0 2] [1 3]" {
		t.Fatalf("String %q", got)
	}
	if top.LocalRank(2) != 1 || top.LocalRank(1) != 0 || top.LocalRank(3) != 1 {
		t.Fatal("local ranks")
	}
	if n, err := top.RanksPerNode(); err != nil || n != 2 {
		t.Fatalf("RanksPerNode %d %v", n, err)
	}
	g, _ := GridTopology(2, 2)
	if g.String() != "[0 1] [2 3]" || g.Equal(top) {
		t.Fatalf("grid %v", g)
	}
	if r := g.Restrict([]int{1, 3}); r.Nodes() != 2 || r.Size() != 2 {
		t.Fatalf("restrict across nodes %v", r)
	}
	if r := g.Restrict([]int{3, 2}); r.Nodes() != 1 {
		t.Fatalf("restrict within a node %v", r)
	}
	uneven, _ := NewTopology([]string{"x", "x", "y"})
	if _, err := uneven.RanksPerNode(); err == nil || !strings.Contains(err.Error(), "node 1 has 1") {
		t.Fatalf("uneven: %v", err)
	}
	if _, err := NewTopology([]string{"x", ""}); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("empty label: %v", err)
	}
	if _, err := GridTopology(0, 2); err == nil {
		t.Fatal("grid of 0 nodes accepted")
	}
	if f := FlatTopology(3); f.Nodes() != 3 {
		t.Fatalf("flat %v", f)
	}
}

// WithTopology counts what crosses nodes, and sub-groups see their part of the topology.
func TestWithTopologyCountsInterNodeTraffic(t *testing.T) {
	ctx := context.Background()
	local, err := NewLocal(4)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := GridTopology(2, 2)
	gs := make([]Group, 4)
	for r := range gs {
		if gs[r], err = WithTopology(local[r], top); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := WithTopology(local[0], FlatTopology(3)); err == nil {
		t.Fatal("topology of the wrong size accepted")
	}
	if !TopologyOf(gs[1]).Equal(top) || TopologyOf(local[1]).Nodes() != 4 {
		t.Fatal("TopologyOf")
	}
	sub, err := Sub(gs[0], []int{0, 2})
	if err != nil {
		t.Fatal(err)
	}
	if st := TopologyOf(sub); st.Nodes() != 2 {
		t.Fatalf("sub-group topology %v", st)
	}
	// Rank 0 sends 8 bytes to rank 1 (same node) and 12 bytes to rank 2 (other node), one
	// blocking and one non-blocking.
	done := make(chan error, 2)
	go func() { _, err := gs[1].Recv(ctx, 0, 7, make([]byte, 8)); done <- err }()
	go func() { _, err := gs[2].Irecv(ctx, 0, 7, make([]byte, 12)).Wait(); done <- err }()
	if err := gs[0].Send(ctx, 1, 7, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := gs[0].Isend(ctx, 2, 7, make([]byte, 12)).Wait(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	s0, s1, s2 := local[0].Counters().Snapshot(), local[1].Counters().Snapshot(), local[2].Counters().Snapshot()
	if s0.BytesSent != 20 || s0.InterBytesSent != 12 || s1.InterBytesRecv != 0 || s2.InterBytesRecv != 12 || s2.InterWordsRecv() != 3 {
		t.Fatalf("counters: %+v %+v %+v", s0, s1, s2)
	}
}
