package hooks

import (
	"context"
	"crypto/rand"
	"encoding/gob"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
)

// hier:SPEC between processes: 2 nodes × 2 ranks, each rank a process that joins through
// cluster.Init as under torchrun on two hosts (GROUP_RANK names the node), so that a node's ranks
// talk through shared memory and the nodes over TCP. Each rank runs hierSpecs on the gradients
// of the in-process test and leaves its outputs, residuals and counters in a file; the test
// then requires what the in-process test requires of the simulated hosts (bit-identical
// replicas, conservation, the words crossing nodes as CostSplit says) and, bit for bit and byte
// for byte, what the in-process run on 2 simulated hosts × 2 ranks gives.
//
// The ranks can also come from elsewhere: with hierRanksVar set, the test binary is one rank of
// such a job and writes its file into that directory (e.g. across network namespaces,
//
//	go test -c -o /tmp/hooks.test ./hooks
//	SPARGO_TEST_HIER_RANKS=/tmp/hier NETNS_RANKS_PER_NODE=2 scripts/netns-job.sh 4 \
//	    /tmp/hooks.test -test.run '^TestHierAcrossProcesses$'
//
// ), and with hierCheckVar set the test checks the files in that directory instead of
// starting its own ranks: SPARGO_TEST_HIER_CHECK=/tmp/hier go test -run HierAcrossProcesses ./hooks.
const (
	hierRanksVar = "SPARGO_TEST_HIER_RANKS"
	hierCheckVar = "SPARGO_TEST_HIER_CHECK"
)

// hierProcNodes × hierProcPerNode ranks; hierProcCalls calls of each spec on a bucket of
// hierProcN elements (uneven shards), then one call on hierFormulaN elements, a size at which
// CostSplit is exact (TestHierInterWordsMatchFormula).
// hierProcBucket is the bucket of call it.
func hierProcBucket(it int) int {
	if it == hierProcCalls {
		return 1
	}
	return 0
}

const (
	hierProcNodes, hierProcPerNode = 2, 2
	hierProcCalls                  = 4
	hierProcN                      = 1500*hierProcNodes*hierProcPerNode + 13
	hierFormulaN                   = 200 * hierProcNodes * hierProcPerNode
)

// hierRankCall is one call of one rank: its output, its residual (hierResidual) before and
// after, and its traffic.
type hierRankCall struct {
	Out, Before, After []float32
	Stats              comm.Stats
}

// hierRankResult is what one rank leaves.
type hierRankResult struct {
	Rank  int
	Nodes []int // comm.TopologyOf(world).Node(r) for every rank r
	// NodeShm: the rank's node is a shared-memory group (comm.OnSharedMemory of comm.Sub)
	NodeShm bool
	Calls   map[string][]hierRankCall
}

// hierProcGrads is every rank's gradient at call it: the quantized ones of the in-process test
// (any order of a node's additions gives the same bits), then those of the formula's call.
// The formula's call, of another size, is on bucket 1 (hierProcBucket).
func hierProcGrads(it int) [][]float32 {
	p := hierProcNodes * hierProcPerNode
	if it == hierProcCalls {
		return grads(7, p, hierFormulaN)
	}
	return quantized(uint64(1000*hierProcNodes+10*hierProcPerNode+it), p, hierProcN)
}

func TestHierAcrossProcesses(t *testing.T) {
	if dir := os.Getenv(hierRanksVar); dir != "" {
		os.Exit(hierRankMain(dir))
	}
	dir := os.Getenv(hierCheckVar)
	if dir == "" {
		dir = t.TempDir()
		startHierRanks(t, dir)
	}
	p := hierProcNodes * hierProcPerNode
	res := make([]hierRankResult, p)
	for r := range p {
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("rank%d.gob", r)))
		if err != nil {
			t.Fatalf("rank %d left no result: %v", r, err)
		}
		err = gob.NewDecoder(f).Decode(&res[r])
		f.Close()
		if err != nil || res[r].Rank != r {
			t.Fatalf("rank %d's result (rank %d): %v", r, res[r].Rank, err)
		}
	}
	top, _ := comm.GridTopology(hierProcNodes, hierProcPerNode)
	for r := range p {
		for q, node := range res[r].Nodes {
			if node != top.Node(q) {
				t.Fatalf("rank %d sees rank %d on node %d; the launcher put it on node %d", r, q, node, top.Node(q))
			}
		}
		if !res[r].NodeShm && runtime.GOOS == "linux" {
			t.Errorf("rank %d: its node's ranks do not talk through shared memory", r)
		}
	}
	for _, inner := range hierSpecs {
		spec := "hier:" + inner
		ref, _ := newHierWorld(t, hierProcNodes, hierProcPerNode, spec)
		for it := 0; it <= hierProcCalls; it++ {
			what := fmt.Sprintf("%s/call %d", spec, it)
			gs := hierProcGrads(it)
			outs := make([][]float32, p)
			before, after := make([][]float32, p), make([][]float32, p)
			stats := make([]comm.Stats, p)
			for r := range p {
				calls := res[r].Calls[spec]
				if len(calls) != hierProcCalls+1 {
					t.Fatalf("%s: rank %d made %d calls, want %d", spec, r, len(calls), hierProcCalls+1)
				}
				c := calls[it]
				outs[r], before[r], after[r], stats[r] = c.Out, c.Before, c.After, c.Stats
			}
			checkIdentical(t, what, outs)
			checkConservation(t, what, gs, before, after, outs[0])
			refOuts, refStats := ref.call(t, hierProcBucket(it), gs)
			for i, x := range refOuts[0] {
				if math.Float32bits(x) != math.Float32bits(outs[0][i]) {
					t.Fatalf("%s: element %d = %v between processes, %v on in-process simulated hosts", what, i, outs[0][i], x)
				}
			}
			for r := range p {
				if got, want := stats[r].InterBytesRecv, refStats[r].InterBytesRecv; got != want {
					t.Errorf("%s: rank %d received %d bytes across nodes between processes, %d on simulated hosts", what, r, got, want)
				}
				if stats[r].InterBytesRecv == 0 || stats[r].InterBytesRecv == stats[r].BytesRecv {
					t.Errorf("%s: rank %d received %d bytes, %d of them across nodes: a node's ranks should talk among themselves too",
						what, r, stats[r].BytesRecv, stats[r].InterBytesRecv)
				}
			}
			if it == hierProcCalls && inner != hierSpecs[2] { // CostSplit is exact for these two (Ok-Topk's is a bound)
				c := ref.hooks[0].(*Hier).CostSplit(hierFormulaN, hierProcNodes, hierProcPerNode)
				var inter float64
				for _, s := range stats {
					inter = max(inter, s.InterWordsRecv())
				}
				if inter != c.Inter {
					t.Errorf("%s: the busiest rank received %v words across nodes between processes; %s = %v", what, inter, c.InterExpr, c.Inter)
				}
			}
		}
	}
}

// startHierRanks runs the job's ranks as processes of this test binary, with the environment
// torchrun gives on two hosts, and waits for them.
func startHierRanks(t *testing.T, dir string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	secret := make([]byte, 16)
	rand.Read(secret)
	var base []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "SPARGO_"), strings.HasPrefix(name, "SLURM_"), strings.HasPrefix(name, "OMPI_"),
			strings.HasPrefix(name, "PMI_"), strings.HasPrefix(name, "PET_"), strings.HasPrefix(name, "TORCHELASTIC_"),
			strings.HasSuffix(name, "RANK"), strings.HasSuffix(name, "WORLD_SIZE"), strings.HasPrefix(name, "MASTER_"):
			continue
		}
		base = append(base, kv)
	}
	p := hierProcNodes * hierProcPerNode
	cmds := make([]*exec.Cmd, p)
	logs := make([]strings.Builder, p)
	for r := range p {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHierAcrossProcesses$", "-test.timeout=2m")
		cmd.Env = append(base, "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(p),
			"LOCAL_RANK="+strconv.Itoa(r%hierProcPerNode), "LOCAL_WORLD_SIZE="+strconv.Itoa(hierProcPerNode),
			"GROUP_RANK="+strconv.Itoa(r/hierProcPerNode), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"SPARGO_SECRET="+hex.EncodeToString(secret), "SPARGO_TIMEOUT=60s", hierRanksVar+"="+dir)
		cmd.Stdout, cmd.Stderr = &logs[r], &logs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	failed := false
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			failed = true
			t.Errorf("rank %d: %v\n%s", r, err, logs[r].String())
		}
	}
	if failed {
		t.FailNow()
	}
}

// hierRankMain is one rank of the job: Init, hierSpecs, the result file. It returns the exit code.
func hierRankMain(dir string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	g, env, err := cluster.Init(ctx, cluster.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	defer g.Close()
	if err := hierRankRun(ctx, g, dir); err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", env.Rank, err)
		return 1
	}
	return 0
}

func hierRankRun(ctx context.Context, g comm.Group, dir string) error {
	r, p := g.Rank(), g.Size()
	if p != hierProcNodes*hierProcPerNode {
		return fmt.Errorf("the job has %d ranks, the test %d", p, hierProcNodes*hierProcPerNode)
	}
	top := comm.TopologyOf(g)
	res := hierRankResult{Rank: r, Calls: map[string][]hierRankCall{}}
	for q := range p {
		res.Nodes = append(res.Nodes, top.Node(q))
	}
	node, err := comm.Sub(g, top.Members(top.Node(r)))
	if err != nil {
		return err
	}
	res.NodeShm = comm.OnSharedMemory(node)
	for _, inner := range hierSpecs {
		spec := "hier:" + inner
		h, err := Parse(spec)
		if err != nil {
			return err
		}
		for it := 0; it <= hierProcCalls; it++ {
			gs := hierProcGrads(it)
			n := len(gs[r])
			idx := hierProcBucket(it)
			c := hierRankCall{Before: hierResidual(h, top, r, idx, n)}
			before := g.Counters().Snapshot()
			b := &testBucket{idx: idx, last: true, flat: gs[r]}
			out, err := h.Run(ctx, g, b).Wait()
			if err != nil {
				return fmt.Errorf("%s call %d: %w", spec, it, err)
			}
			c.Stats = g.Counters().Snapshot().Sub(before)
			c.Out = append([]float32(nil), out...)
			c.After = hierResidual(h, top, r, idx, n)
			res.Calls[spec] = append(res.Calls[spec], c)
		}
		if err := comm.Barrier(ctx, g, 1); err != nil {
			return err
		}
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("rank%d.gob", r)))
	if err != nil {
		return err
	}
	if err := gob.NewEncoder(f).Encode(res); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
