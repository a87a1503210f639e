package cluster

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

func TestDetectNode(t *testing.T) {
	defer func(h func() (string, error)) { hostname = h }(hostname)
	hostname = func() (string, error) { return "gpu07", nil }
	for _, tc := range []struct {
		name    string
		flags   Overrides
		env     map[string]string
		want    NodeInfo
		wantErr string
	}{
		{name: "torchrun", env: map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
			"GROUP_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			want: NodeInfo{Label: "GROUP_RANK=1", LocalRank: 1, LocalWorldSize: 4, SharedMemory: true}},
		{name: "torchrun-like launcher without GROUP_RANK: the host name", env: map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
			"MASTER_ADDR": "h", "MASTER_PORT": "1"},
			want: NodeInfo{Label: "host=gpu07", LocalRank: 1, SharedMemory: true}},
		{name: "SPARGO_NODE overrides GROUP_RANK", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
			"GROUP_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1", "SPARGO_NODE": "ns0"},
			want: NodeInfo{Label: "SPARGO_NODE=ns0", LocalRank: 0, LocalWorldSize: 1, SharedMemory: true}},
		{name: "slurm", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
			"SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NODELIST": "gpu[07-08]"},
			want: NodeInfo{Label: "SLURM_NODEID=1", LocalRank: 1, LocalWorldSize: 4, SharedMemory: true}},
		{name: "slurm without SLURM_NODEID or a uniform count", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
			"SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[07-08]"},
			want: NodeInfo{Label: "host=gpu07", LocalRank: 1, SharedMemory: true}},
		{name: "open mpi", env: map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "0", "MASTER_ADDR": "h"},
			want: NodeInfo{Label: "host=gpu07", LocalRank: 0, LocalWorldSize: 2, SharedMemory: true}},
		{name: "open mpi without local variables", env: map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "MASTER_ADDR": "h"},
			want: NodeInfo{Label: "host=gpu07", LocalRank: -1, SharedMemory: true}},
		{name: "pmi", env: map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h"},
			want: NodeInfo{Label: "host=gpu07", LocalRank: 1, LocalWorldSize: 2, SharedMemory: true}},
		{name: "kubernetes: a node per pod", env: map[string]string{"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "m", "MASTER_PORT": "1"},
			want: NodeInfo{Label: "pod=1", LocalRank: 0, LocalWorldSize: 1, SharedMemory: true}},
		{name: "flags without a local world size: local ranks unchecked", flags: Overrides{WorldSize: 4, Rank: 2, MasterAddr: "h"},
			want: NodeInfo{Label: "host=gpu07", LocalRank: -1, SharedMemory: true}},
		{name: "flags with a local world size", flags: Overrides{WorldSize: 4, Rank: 2, LocalRank: 0, LocalWorldSize: 2, MasterAddr: "h"},
			want: NodeInfo{Label: "host=gpu07", LocalRank: 0, LocalWorldSize: 2, SharedMemory: true}},
		{name: "one process", env: map[string]string{},
			want: NodeInfo{Label: "single", LocalRank: 0, LocalWorldSize: 1, SharedMemory: true}},
		{name: "SPARGO_SHM=0", env: map[string]string{"SPARGO_SHM": "0"},
			want: NodeInfo{Label: "single", LocalRank: 0, LocalWorldSize: 1}},
		{name: "bad SPARGO_SHM", env: map[string]string{"SPARGO_SHM": "maybe"}, wantErr: `SPARGO_SHM="maybe"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, err := DetectEnvFrom(tc.flags, lookupMap(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			got, err := DetectNode(env, tc.flags, lookupMap(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			back, err := decodeNodeInfo(got.encode())
			if err != nil || back != got {
				t.Errorf("record %q decodes to %+v, %v", got.encode(), back, err)
			}
		})
	}
}

func TestTopologyOfChecksLocalRanks(t *testing.T) {
	n := func(label string, lr, lws int) NodeInfo {
		return NodeInfo{Label: label, LocalRank: lr, LocalWorldSize: lws}
	}
	top, err := TopologyOf([]NodeInfo{n("a", 0, 2), n("a", 1, 2), n("b", 0, 2), n("b", 1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := comm.GridTopology(2, 2); !top.Equal(want) {
		t.Errorf("topology %v, want %v", top, want)
	}
	// Round-robin placement, local ranks unknown: nothing to check.
	if top, err := TopologyOf([]NodeInfo{n("a", -1, 0), n("b", -1, 0), n("a", -1, 0)}); err != nil || top.String() != "[0 2] [1]" {
		t.Errorf("round robin: %v, %v", top, err)
	}
	for _, tc := range []struct {
		name  string
		infos []NodeInfo
		want  []string
	}{
		{"network namespaces sharing a host name", []NodeInfo{n("host=x", 0, 1), n("host=x", 0, 1)},
			[]string{"rank 0's launcher says its node has 1 ranks", "ranks [0 1]", "SPARGO_NODE"}},
		{"two ranks claim one local rank", []NodeInfo{n("a", 0, 0), n("a", 1, 0), n("b", 0, 0), n("b", 0, 0)},
			[]string{"ranks 2 and 3 both have local rank 0 on node b"}},
		{"local rank beyond the node", []NodeInfo{n("a", 0, 0), n("b", 0, 0), n("a", 2, 0)},
			[]string{"rank 2's launcher gives it local rank 2", "ranks [0 2]"}},
		{"empty label", []NodeInfo{n("a", 0, 0), n("", 0, 0)}, []string{"rank 1 has an empty node label"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := TopologyOf(tc.infos)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// inProcessNodes is a NodeTransport for ranks of one process: the first rank of a node to
// arrive makes an in-process group for the node, and each takes its member's rank.
type inProcessNodes struct {
	mu     sync.Mutex
	groups map[string][]comm.Group
	calls  []NodeGroupConfig
}

func (n *inProcessNodes) connect(_ context.Context, c NodeGroupConfig) (comm.Group, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	key := fmtInts(c.Members)
	if n.groups == nil {
		n.groups = map[string][]comm.Group{}
	}
	if n.groups[key] == nil {
		g, err := comm.NewLocal(len(c.Members))
		if err != nil {
			return nil, err
		}
		n.groups[key] = g
	}
	n.calls = append(n.calls, c)
	for i, m := range c.Members {
		if m == c.Rank {
			return n.groups[key][i], nil
		}
	}
	return nil, errors.New("this rank is not among the node's members")
}

func fmtInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// Four ranks of this process on two nodes (SPARGO_NODE), as two launchers' LOCAL_RANK say:
// every rank reports the same topology, and the node transport carries the traffic inside a
// node while TCP carries the rest.
func TestInitAgreesOnTopology(t *testing.T) {
	for _, withNodes := range []bool{true, false} {
		t.Run("node transport "+strconv.FormatBool(withNodes), func(t *testing.T) {
			const p = 4
			port, _ := freePort()
			nodes := &inProcessNodes{}
			groups, _, errs := initRanks(t, p, func(r int) Options {
				o := Options{Logf: t.Logf, Lookup: rankEnv(r, p, port, "SPARGO_SECRET=s", "SPARGO_TIMEOUT=5",
					"SPARGO_NODE=n"+strconv.Itoa(r/2), "LOCAL_RANK="+strconv.Itoa(r%2), "LOCAL_WORLD_SIZE=2")}
				if withNodes {
					o.NodeTransport = nodes.connect
				}
				return o
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			defer func() {
				var wg sync.WaitGroup
				for _, g := range groups {
					wg.Go(func() { g.Close() })
				}
				wg.Wait()
			}()
			want, _ := comm.GridTopology(2, 2)
			for r, g := range groups {
				if got := comm.TopologyOf(g); !got.Equal(want) {
					t.Fatalf("rank %d: topology %v, want %v", r, got, want)
				}
			}
			if withNodes && len(nodes.calls) != p {
				t.Fatalf("node transport called %d times, want %d", len(nodes.calls), p)
			}
			for _, c := range nodes.calls {
				if c.Store == nil || c.RunID != "unit" || len(c.Members) != 2 || c.Members[0] != c.Rank/2*2 {
					t.Errorf("node transport config %+v", c)
				}
			}
			var wg sync.WaitGroup
			data := make([][]float32, p)
			for r, g := range groups {
				data[r] = []float32{float32(r), 1, 2, 3}
				wg.Go(func() {
					if err := comm.AllReduce(testCtx(t), g, 1, data[r], comm.Ring); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			for r, g := range groups {
				if data[r][0] != 6 || data[r][3] != 12 {
					t.Errorf("rank %d: all-reduce gave %v", r, data[r])
				}
				// The ring 0→1→2→3→0 crosses nodes from rank 1 and from rank 3.
				s := g.Counters().Snapshot()
				if crosses := r%2 == 1; (s.InterBytesSent > 0) != crosses || s.InterBytesSent > s.BytesSent {
					t.Errorf("rank %d: %+v: inter-node bytes sent should be > 0 only on ranks 1 and 3", r, s)
				}
			}
		})
	}
}

// Ranks in network namespaces share a host name: without SPARGO_NODE, the launcher's one rank
// per node contradicts the labels, and every rank fails naming the same rank.
func TestInitTopologyMismatch(t *testing.T) {
	defer func(h func() (string, error)) { hostname = h }(hostname)
	hostname = func() (string, error) { return "same", nil }
	const p = 2
	port, _ := freePort()
	_, _, errs := initRanks(t, p, func(r int) Options {
		return Options{Logf: t.Logf, Lookup: rankEnv(r, p, port, "SPARGO_TIMEOUT=5", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1")}
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "rank 0's launcher says its node has 1 ranks, but ranks [0 1] report its node (host=same)") ||
			!strings.Contains(err.Error(), "SPARGO_NODE") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// When the node's first rank cannot make the shared segment (here: its directory does not
// exist; in a container: a full /dev/shm), every rank of the node stops with its error at once,
// not after the 60 s join timeout.
func TestShmFailureOfFirstRankReachesTheNode(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport needs Linux")
	}
	missing := t.TempDir() + "/no-such-dir"
	start := time.Now()
	errs := initShmIn(t, 3, 3, func(int) string { return missing })
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the ranks stopped after %v; want well before the 60 s join timeout", took)
	}
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: Init succeeded without a segment", r)
		}
		msg := err.Error()
		t.Logf("rank %d: %v", r, err)
		if r == 0 && !strings.Contains(msg, missing) {
			t.Errorf("rank %d: %q does not name the directory", r, msg)
		}
		// Rank 0 hosts the store and takes it down as its Init fails: the others read its
		// error from the store, or see the store go while they wait for rank 0.
		if r > 0 && !strings.Contains(msg, "rank 0, the node's first, could not make its shared segment") &&
			!strings.Contains(msg, "lost the job's store while waiting for rank 0 to make the node's shared segment") {
			t.Errorf("rank %d: %q does not say that it waited for rank 0", r, msg)
		}
	}
}

// The same on a node whose first rank does not host the store: the node's other rank reads the
// first rank's error from the store.
func TestShmFailureOfFirstRankOfSecondNode(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport needs Linux")
	}
	good, missing := t.TempDir(), t.TempDir()+"/no-such-dir"
	errs := initShmIn(t, 4, 2, func(r int) string {
		if r >= 2 {
			return missing
		}
		return good
	})
	want := "rank 2, the node's first, could not make its shared segment: comm: NewShm: rank 0: open " + missing
	if err := errs[3]; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("rank 3: %v; want an error containing %q", err, want)
	}
	if err := errs[2]; err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("rank 2: %v; want an error naming %s", err, missing)
	}
}

// initShmIn runs Init on p ranks of this process, perNode to a node, whose node transport is
// the shared memory in dir(rank), closes the groups it made and returns the errors.
func initShmIn(t *testing.T, p, perNode int, dir func(r int) string) []error {
	port, _ := freePort()
	groups, _, errs := initRanks(t, p, func(r int) Options {
		return Options{Logf: t.Logf, Lookup: rankEnv(r, p, port, "SPARGO_SECRET=s", "SPARGO_TIMEOUT=5",
			"SPARGO_NODE=n"+strconv.Itoa(r/perNode), "LOCAL_RANK="+strconv.Itoa(r%perNode), "LOCAL_WORLD_SIZE="+strconv.Itoa(perNode)),
			NodeTransport: func(ctx context.Context, c NodeGroupConfig) (comm.Group, error) { return joinShm(ctx, c, dir(r)) }}
	})
	for _, g := range groups {
		if g != nil {
			g.Close()
		}
	}
	return errs
}
