package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// NodeInfo is where one rank runs, as its launcher (or SPARGO_NODE) says: the ranks of a job
// exchange theirs through the store and agree on one comm.Topology.
type NodeInfo struct {
	// Label names the rank's node: ranks with equal labels share a host. It starts with where
	// it came from ("SPARGO_NODE=rack1-a", "GROUP_RANK=1", "SLURM_NODEID=0", "host=gpu07",
	// "pod=3"), so labels of different origins never match by accident.
	Label string
	// LocalRank and LocalWorldSize are what the launcher says of the rank's place on its node
	// (LOCAL_RANK / LOCAL_WORLD_SIZE, SLURM_LOCALID / SLURM_NTASKS_PER_NODE, …); -1 and 0 when
	// it does not say. The agreement checks them against the labels.
	LocalRank, LocalWorldSize int
	// SharedMemory is whether this rank may talk to the ranks of its node through shared memory
	// (SPARGO_SHM=0 says no). A node uses it only when all its ranks may.
	SharedMemory bool
}

// hostname is os.Hostname; tests replace it.
var hostname = os.Hostname

// DetectNode finds this rank's node from its launcher's variables, read through lookup (nil =
// os.LookupEnv): SPARGO_NODE when set (for ranks that share a host name but not a host, as
// network namespaces or containers do, or to simulate hosts on one machine), else GROUP_RANK
// under torchrun and spargo launch, SLURM_NODEID under Slurm, the pod under Kubernetes (one
// rank per pod), else the host name, which is what Open MPI and MPICH jobs (their
// OMPI_COMM_WORLD_NODE_RANK is a local rank, not a node) and the flags get. flags are the
// command-line values env was detected with: when they set no local world size, the local
// ranks they imply are not checked against the labels.
func DetectNode(env Env, flags Overrides, lookup func(string) (string, bool)) (NodeInfo, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	e := envReader{lookup}
	info := NodeInfo{LocalRank: -1}
	switch env.Source {
	case SourceFlags:
		if flags.LocalWorldSize > 0 {
			info.LocalRank, info.LocalWorldSize = env.LocalRank, env.LocalWorldSize
		}
	case SourceTorchrun, SourceSlurm, SourceKubernetes, SourceSingle:
		info.LocalRank, info.LocalWorldSize = env.LocalRank, env.LocalWorldSize
	case SourceMPI:
		if e.has("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID") {
			info.LocalRank = env.LocalRank
		}
		info.LocalWorldSize = env.LocalWorldSize
	}
	shm, err := sharedMemoryEnabled(e)
	if err != nil {
		return info, err
	}
	info.SharedMemory = shm
	if v, ok := e.get("SPARGO_NODE"); ok {
		info.Label = "SPARGO_NODE=" + v
		return info, nil
	}
	switch env.Source {
	case SourceSingle:
		info.Label = "single"
		return info, nil
	case SourceKubernetes:
		info.Label = "pod=" + strconv.Itoa(env.Rank)
		return info, nil
	case SourceTorchrun:
		if v, ok := e.get("GROUP_RANK"); ok {
			info.Label = "GROUP_RANK=" + v
			return info, nil
		}
	case SourceSlurm:
		if v, ok := e.get("SLURM_NODEID"); ok {
			info.Label = "SLURM_NODEID=" + v
			return info, nil
		}
	}
	h, err := hostname()
	if err != nil || h == "" {
		return info, fmt.Errorf("find this rank's node: the launcher names none and the host name is unknown (%v): set SPARGO_NODE", err)
	}
	info.Label = "host=" + h
	return info, nil
}

// sharedMemoryEnabled reads SPARGO_SHM: unset, 1, true or yes allow shared memory; 0, false or
// no forbid it.
func sharedMemoryEnabled(e envReader) (bool, error) {
	v, ok := e.get("SPARGO_SHM")
	if !ok {
		return true, nil
	}
	switch strings.ToLower(v) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("SPARGO_SHM=%q: want 0 (no shared memory) or 1", v)
}

// encode is NodeInfo as it travels through the store: "localRank localWorldSize shm label".
func (n NodeInfo) encode() []byte {
	shm := 0
	if n.SharedMemory {
		shm = 1
	}
	return fmt.Appendf(nil, "%d %d %d %s", n.LocalRank, n.LocalWorldSize, shm, n.Label)
}

func decodeNodeInfo(b []byte) (NodeInfo, error) {
	f := strings.SplitN(string(b), " ", 4)
	if len(f) != 4 || f[3] == "" {
		return NodeInfo{}, fmt.Errorf("%q is not a node record", truncate(b))
	}
	var n NodeInfo
	var err1, err2 error
	n.LocalRank, err1 = strconv.Atoi(f[0])
	n.LocalWorldSize, err2 = strconv.Atoi(f[1])
	if err := errors.Join(err1, err2); err != nil || (f[2] != "0" && f[2] != "1") {
		return NodeInfo{}, fmt.Errorf("%q is not a node record", truncate(b))
	}
	n.SharedMemory, n.Label = f[2] == "1", f[3]
	return n, nil
}

// topologyTag is the tag of the exchange of node records on a job's new TCP group.
const topologyTag = 0

// agreeTopology sends this rank's node record to every rank of world, the job's TCP group just
// connected, and returns the job's topology with each rank's record: every rank reads the same
// records, so all agree on the topology or all refuse it, naming the same rank. The exchange
// is left out of world's counters.
func agreeTopology(ctx context.Context, world comm.Group, mine NodeInfo) (comm.Topology, []NodeInfo, error) {
	recs, err := comm.AllGatherBytes(ctx, world, topologyTag, mine.encode())
	if err != nil {
		return comm.Topology{}, nil, fmt.Errorf("exchange the ranks' nodes: %w", err)
	}
	world.Counters().Reset()
	infos := make([]NodeInfo, len(recs))
	for r, rec := range recs {
		if infos[r], err = decodeNodeInfo(rec); err != nil {
			return comm.Topology{}, nil, fmt.Errorf("rank %d sent its node as %w", r, err)
		}
	}
	top, err := TopologyOf(infos)
	return top, infos, err
}

// TopologyOf is the topology of the ranks whose nodes are infos (infos[r] is rank r's), after
// checking the labels against what the launcher said of each rank's place on its node: a rank
// whose local world size differs from the number of ranks that share its label, or whose local
// rank is out of that range or taken by another rank of the node, is an error naming it. Such
// an error usually means that hosts share a name (network namespaces, containers): set
// SPARGO_NODE on each.
func TopologyOf(infos []NodeInfo) (comm.Topology, error) {
	labels := make([]string, len(infos))
	for r, n := range infos {
		labels[r] = n.Label
	}
	top, err := comm.NewTopology(labels)
	if err != nil {
		return top, err
	}
	const hint = "; ranks that share a host name but not a host (network namespaces, containers) need SPARGO_NODE set to tell them apart"
	for id := range top.Nodes() {
		members := top.Members(id)
		owner := map[int]int{} // local rank → the rank that claims it
		for _, r := range members {
			n := infos[r]
			if n.LocalWorldSize > 0 && n.LocalWorldSize != len(members) {
				return top, fmt.Errorf("topology: rank %d's launcher says its node has %d ranks, but ranks %v report its node (%s)%s",
					r, n.LocalWorldSize, members, n.Label, hint)
			}
			if n.LocalRank < 0 {
				continue
			}
			if n.LocalRank >= len(members) {
				return top, fmt.Errorf("topology: rank %d's launcher gives it local rank %d, but only ranks %v report its node (%s)%s",
					r, n.LocalRank, members, n.Label, hint)
			}
			if o, taken := owner[n.LocalRank]; taken {
				return top, fmt.Errorf("topology: ranks %d and %d both have local rank %d on node %s (ranks %v)%s",
					o, r, n.LocalRank, n.Label, members, hint)
			}
			owner[n.LocalRank] = r
		}
	}
	return top, nil
}

// NodeGroupConfig is what a NodeTransport gets to connect the ranks of this rank's node.
type NodeGroupConfig struct {
	// Rank is this rank in the job; Topology the job's; Members the job ranks on this node,
	// ascending: the node group's rank i must be Members[i].
	Rank     int
	Topology comm.Topology
	Members  []int
	// RunID names the job (and Attempt its restart), for names that must not collide with
	// another job's (shared-memory segments); Secret is the job's secret (may be empty).
	RunID   string
	Attempt int
	Secret  []byte
	// Timeout is the peer failure timeout and OpTimeout the operation timeout, as the job's
	// TCP group has them.
	Timeout, OpTimeout time.Duration
	// Store is the job's store under a prefix of this node's own; it stays open until the
	// transport returns, for what the node's ranks must exchange.
	Store *Store
	// Logf receives notes, as Options.Logf.
	Logf func(format string, args ...any)
}

// NodeTransport connects the ranks of one node (Members, at least 2) and returns this rank's
// group among them; nil, nil means it has no group to offer and the node's ranks talk over TCP.
type NodeTransport func(ctx context.Context, c NodeGroupConfig) (comm.Group, error)

// sharedMemory is the node transport Init uses when Options.NodeTransport is nil and SPARGO_SHM
// does not forbid it: the node's ranks map one shared-memory segment (comm.NewShm) named after
// the job's run id, attempt and node, protected by the job's secret, with the job's failure
// timeout, in SPARGO_SHM_DIR (default /dev/shm). The node group's rank i is c.Members[i].
var sharedMemory NodeTransport = func(ctx context.Context, c NodeGroupConfig) (comm.Group, error) {
	return joinShm(ctx, c, os.Getenv("SPARGO_SHM_DIR"))
}

// joinShm is sharedMemory with the segment in dir ("" for /dev/shm). When the node's first rank
// cannot make the segment (a full /dev/shm, say) it leaves its error in the store, and the
// node's other ranks, which would otherwise wait the join timeout for a segment that never
// comes, stop at once with it (or, when the failed rank hosted the store and took it down,
// saying that the store went away while they waited for that rank).
func joinShm(ctx context.Context, c NodeGroupConfig, dir string) (comm.Group, error) {
	local := -1
	for i, m := range c.Members {
		if m == c.Rank {
			local = i
		}
	}
	if local < 0 {
		return nil, fmt.Errorf("rank %d is not among its node's ranks %v", c.Rank, c.Members)
	}
	failed := fmt.Sprintf("shm-failed/%d", c.Attempt)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if local > 0 && c.Store != nil {
		go func() {
			first := c.Members[0]
			for {
				werr := c.Store.Wait(ctx, failed)
				switch {
				case ctx.Err() != nil:
					return // the segment came, or the caller gave up
				case werr == nil:
					why, err := c.Store.Get(ctx, failed)
					if err != nil {
						why = []byte(err.Error())
					}
					cancel(firstRankFailed{fmt.Errorf("rank %d, the node's first, could not make its shared segment: %s", first, why)})
					return
				case errors.Is(werr, context.DeadlineExceeded):
					continue // the store's own timeout: wait again
				}
				// The store is gone: rank 0 hosts it and stops it when it fails.
				cancel(firstRankFailed{fmt.Errorf("lost the job's store while waiting for rank %d to make the node's shared segment (if rank %d failed, its output says why): %w", first, first, werr)})
				return
			}
		}()
	}
	g, err := comm.NewShm(ctx, comm.ShmConfig{
		Rank: local, Size: len(c.Members),
		Job:       fmt.Sprintf("%s.%d.node%d", c.RunID, c.Attempt, c.Topology.Node(c.Rank)),
		Secret:    c.Secret,
		Dir:       dir,
		Timeout:   c.Timeout,
		OpTimeout: c.OpTimeout,
		Logf:      c.Logf,
	})
	if err != nil {
		var first firstRankFailed
		if errors.As(context.Cause(ctx), &first) {
			return nil, first.error
		}
		if local == 0 && c.Store != nil {
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			c.Store.Set(sctx, failed, []byte(err.Error()))
			scancel()
		}
	}
	return g, err
}

// firstRankFailed is why joinShm stopped waiting: the node's first rank could not make the segment.
type firstRankFailed struct{ error }

// joinNodes returns the job's group: world viewed with topology top, and, when a node
// transport connects this rank's node, routed through it to the ranks of the node.
func joinNodes(ctx context.Context, world comm.Group, top comm.Topology, infos []NodeInfo, transport NodeTransport, c NodeGroupConfig) (comm.Group, error) {
	node := top.Node(world.Rank())
	members := top.Members(node)
	useNode := transport != nil && len(members) > 1
	for _, r := range members {
		useNode = useNode && infos[r].SharedMemory // every rank of the node must agree
	}
	if !useNode {
		return comm.WithTopology(world, top)
	}
	c.Rank, c.Topology, c.Members = world.Rank(), top, members
	c.Store = c.Store.WithPrefix("nodegroup/" + strconv.Itoa(node))
	local, err := transport(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("connect the ranks of this node (%v): %w", members, err)
	}
	if local == nil {
		return comm.WithTopology(world, top)
	}
	routed, err := comm.Route(world, local, top)
	if err != nil {
		local.Close()
		return nil, err
	}
	return routed, nil
}
