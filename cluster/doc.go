// Package cluster starts multi-process and multi-machine jobs: it finds a process's place in the
// job from what its launcher set (torchrun, spargo launch, Slurm, mpirun, Kubernetes), meets the
// other ranks through a key-value store that speaks PyTorch's TCPStore protocol, and connects them
// with comm's TCP transport. It also holds the local launcher behind `spargo launch`.
//
//	ctx, stop := cluster.NotifyContext(context.Background(), "train", nil) // SIGINT/SIGTERM cancel ctx
//	defer stop()
//	g, env, err := cluster.Init(ctx, cluster.Options{})  // one process: an in-process group of 1
//	if err != nil { … }
//	defer g.Close()
//	dp, err := ddp.New(ctx, model, g)               // rank env.Rank of env.WorldSize
//
// The same binary then runs unchanged under
//
//	spargo launch -n 4 -- ./train …
//	torchrun --nproc_per_node=4 --no_python ./train …          (newer torchrun also spells them --nproc-per-node, --no-python)
//	srun -N 2 --ntasks-per-node=4 ./train …
//	mpirun -np 8 -x SPARGO_MASTER_ADDR=node01 ./train …
//	a Kubeflow PyTorchJob whose container runs ./train
//
// # Environment detection
//
// DetectEnv (and Init) try these sources in this order and use the first whose marker variable
// is set. A source that is selected but lacks a variable it needs is an error naming the
// variable ("torchrun environment is incomplete: LOCAL_RANK is set but WORLD_SIZE is not"):
// a half-configured job fails at start instead of running as something else. Empty variables
// count as unset.
//
//	order  source        marker                        rank / world size / local rank            store address
//	1      flags         Overrides.WorldSize > 0       Overrides                                 flags, SPARGO_MASTER_ADDR|MASTER_ADDR, SPARGO_MASTER_PORT|MASTER_PORT|29500
//	2      torchrun      LOCAL_RANK or                 RANK, WORLD_SIZE, LOCAL_RANK              MASTER_ADDR, MASTER_PORT
//	                     TORCHELASTIC_RUN_ID           (LOCAL_WORLD_SIZE)                        (agent store if TORCHELASTIC_USE_AGENT_STORE=True)
//	3      Slurm         SLURM_PROCID                  SLURM_PROCID, SLURM_NTASKS|SLURM_NPROCS,  SPARGO_MASTER_ADDR|MASTER_ADDR, else first host of
//	                                                   SLURM_LOCALID (SLURM_NTASKS_PER_NODE)     SLURM_JOB_NODELIST|SLURM_NODELIST; port as for flags
//	4      Open MPI      OMPI_COMM_WORLD_RANK|SIZE     OMPI_COMM_WORLD_RANK, _SIZE, (_LOCAL_RANK, flags or SPARGO_MASTER_ADDR|MASTER_ADDR (required);
//	                                                   _LOCAL_SIZE)                              port as for flags
//	       PMI           PMI_RANK|PMI_SIZE             PMI_RANK, PMI_SIZE, (MPI_LOCALRANKID,     as for Open MPI
//	                     (MPICH, Intel MPI)            MPI_LOCALNRANKS)
//	5      Kubernetes    RANK or WORLD_SIZE            RANK, WORLD_SIZE (one process per pod)    MASTER_ADDR|PET_MASTER_ADDR, MASTER_PORT|PET_MASTER_PORT
//	       PyTorchJob    PET_NNODES or PET_NODE_RANK   PET_NODE_RANK, PET_NNODES ("N" or "N:N";  PET_MASTER_ADDR, PET_MASTER_PORT
//	                                                   PET_NPROC_PER_NODE must be 1)
//	6      one process   none of the above             0 / 1 / 0                                 none: Init returns comm.NewLocal(1)[0]
//
// The flags' MasterAddr, MasterPort and RunID override every source. torchrun is recognised by
// LOCAL_RANK, which the Kubeflow operator does not set, so a pod that runs torchrun is torchrun
// and a pod that runs the program directly is Kubernetes. Run under srun: an sbatch script's own
// shell also has SLURM_PROCID. Slurm's compressed host lists ("node[01-04,07],gpu3") are
// expanded by ExpandNodelist. SPARGO_RUN_ID (else TORCHELASTIC_RUN_ID, else the Slurm job and
// step, else "spargo") names the job in store keys.
//
// # Nodes
//
// Init also learns which ranks share a host (DetectNode): SPARGO_NODE when set, else
// GROUP_RANK (torchrun; spargo launch sets 0), SLURM_NODEID (Slurm), the pod (Kubernetes),
// else the host name (MPI, the flags). Once the mesh is connected the ranks exchange their
// nodes over it and check them against the launcher's local ranks (TopologyOf): hosts that
// share a name (network namespaces) contradict LOCAL_WORLD_SIZE and fail every rank alike,
// naming the rank, until SPARGO_NODE tells them apart. The returned group reports the
// comm.Topology (comm.TopologyOf) and counts the bytes that cross nodes. A NodeTransport
// (Options.NodeTransport; by default shared memory, comm.NewShm, in SPARGO_SHM_DIR or /dev/shm;
// refused by SPARGO_SHM=0) connects the ranks of a node, and comm.Route sends their traffic
// through it instead of TCP. If a node's first rank cannot make the segment, the node's other
// ranks learn it through the store and stop at once instead of waiting out the join timeout.
//
// # Rendezvous
//
// With torchrun's default static rendezvous (TORCHELASTIC_USE_AGENT_STORE=True) the agent
// already hosts a TCPStore at MASTER_ADDR:MASTER_PORT; the ranks use it under the key prefix
// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>", as PyTorch's own workers do. Otherwise (spargo
// launch, torchrun --rdzv_backend=c10d, Slurm, MPI, Kubernetes) rank 0 starts a StoreServer on
// MASTER_PORT and every rank connects to it. Each rank binds its own data listener on a free
// port (never MASTER_PORT; Options.Bind or SPARGO_BIND choose the address), publishes
// "host:port" under spargo/<run id>/addr/<rank>, reads the others' and calls comm.NewTCP.
// SPARGO_TIMEOUT (or Options.Timeout, the same on every rank) is the peer failure timeout: a
// rank that dies or stalls makes every other rank's operations fail within it, with an error
// naming the rank (the first survivor to notice tells the others in its goodbye, so they all
// name the same rank).
//
// Start-up is bounded in two stages: waiting for every rank's address (Options.RendezvousTimeout,
// 5 minutes, as ranks may start far apart), then connecting the mesh, which
// SPARGO_CONNECT_TIMEOUT (Options.ConnectTimeout; default SPARGO_TIMEOUT, else 30 s) bounds: a
// rank that published its address and died is named by every other rank within it.
// Heartbeats cannot catch a rank that is alive but out of step (it ran fewer steps and waits
// in another collective): SPARGO_OP_TIMEOUT (Options.OpTimeout; none by default) bounds every
// operation with a peer, over TCP and over shared memory, and fails the group naming the peer
// that never answered, like gloo's timeout. Set it above the longest time one rank may wait for
// another (evaluation, checkpoints). A context deadline bounds a single operation
// (comm.TCPConfig.OpTimeout, comm.ShmConfig.OpTimeout).
//
// StoreServer and Store speak PyTorch 1.13's TCPStore protocol (see store_protocol.go) and
// work with PyTorch's own clients and servers in both directions: Python can rendezvous
// through a spargo store and spargo through torchrun's. Store keys carry TCPStore's "/" prefix,
// and Store.WithPrefix names keys like PyTorch's PrefixStore.
//
// # Security
//
// A job has a shared secret: Options.Secret, else SPARGO_SECRET, else the contents of the file
// named by SPARGO_SECRET_FILE. spargo launch makes a random one per job. With a secret, every
// connection to a spargo port is authenticated before anything else is read:
//
//   - the store rank 0 hosts runs a mutual HMAC-SHA256 challenge–response (auth.go) with fresh
//     nonces on both sides, so the secret never crosses the wire and exchanges cannot be
//     replayed;
//   - the data connections run comm's own HMAC challenge–response (comm.TCPConfig.Secret), and
//     after the mesh is complete they accept no new connection.
//
// A connection that fails is closed and logged ("rejected connection from …", at most 10 lines
// per 10 s, then a count) and the job goes on. Limits on lengths keep a stranger from making a
// rank allocate what it asks for; the store also closes a connection that has not
// authenticated (or, without a secret, sent a query) within the handshake deadline, caps the
// connections in the handshake and the open ones per source address, and, without a secret,
// stores at most StoreOptions.UnauthenticatedBytes of keys and values. Under spargo launch
// (MASTER_ADDR 127.0.0.1) the store listens on loopback only.
//
// Limits of this scheme, to know before exposing ports:
//
//   - torchrun's agent store speaks plain PyTorch protocol and cannot authenticate; under
//     torchrun's static rendezvous anyone who can reach MASTER_PORT can read and write the
//     rendezvous keys (so could they with PyTorch itself). The data connections are still
//     authenticated, so a forged address can stall the job's start but not join it. Use
//     --rdzv_backend=c10d (rank 0 hosts an authenticated spargo store) on untrusted networks.
//   - Without a secret nothing is authenticated. An empty SPARGO_SECRET counts as none. Init
//     does not require one, but warns; set SPARGO_SECRET
//     (or use spargo launch) outside a trusted network.
//   - Authentication is not encryption: gradients and store values travel in clear. Across
//     untrusted networks use a VPN or WireGuard between the machines.
//   - SPARGO_SECRET is visible to the same user (and root) in /proc/<pid>/environ; prefer
//     SPARGO_SECRET_FILE with mode 0600 on shared machines.
//
// # Signals and shutdown
//
// NotifyContext cancels a context on SIGINT or SIGTERM and logs "rank R: received SIGTERM,
// shutting down"; pass it to the training loop so a rank stops between steps, then Close the
// group. Close says goodbye to the peers, stops rank 0's store server and waits for every
// goroutine. Launch sends SIGTERM to the ranks when one fails or it is interrupted, and SIGKILL
// after a grace period. NotifyGraceful is the training programs' variant (train.Main uses it):
// the first signal only requests a stop (Stopping, WithStopper), so that the loop finishes
// its step, saves a checkpoint and returns; the second cancels the context.
package cluster
