package cluster

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Source names where DetectEnv found the job's layout.
type Source string

const (
	SourceFlags      Source = "flags"      // Overrides.WorldSize > 0
	SourceTorchrun   Source = "torchrun"   // torchrun, spargo launch, or anything setting LOCAL_RANK + RANK + WORLD_SIZE
	SourceSlurm      Source = "slurm"      // srun
	SourceMPI        Source = "mpi"        // mpirun / mpiexec (Open MPI, or MPICH / Intel MPI through PMI)
	SourceKubernetes Source = "kubernetes" // Kubeflow PyTorchJob, without torchrun in the container
	SourceSingle     Source = "single"     // nothing found: one process
)

// DefaultMasterPort is the store port when the environment names none (PyTorch's default).
const DefaultMasterPort = 29500

// Env is one process's place in the job.
type Env struct {
	Source          Source
	Rank, WorldSize int
	// LocalRank is the rank among the processes on this host; LocalWorldSize their number,
	// 0 when the launcher does not say.
	LocalRank, LocalWorldSize int
	// MasterAddr and MasterPort locate the rendezvous store: torchrun's agent store when
	// UseAgentStore, otherwise the store rank 0 hosts. Empty and 0 for one process.
	MasterAddr string
	MasterPort int
	// UseAgentStore is torchrun's TORCHELASTIC_USE_AGENT_STORE=True: its agent already hosts a
	// TCPStore at MasterAddr:MasterPort, and the ranks use it with the key prefix
	// "/worker/attempt_<RestartCount>", as PyTorch's workers do.
	UseAgentStore bool
	// RestartCount is torchrun's or spargo launch's restart count (0 on the first attempt).
	RestartCount int
	// RunID names the job in store keys, so jobs sharing a store do not mix.
	RunID string
}

// Overrides are values from command-line flags. They come first in detection: WorldSize > 0
// selects them as the source, and MasterAddr / MasterPort / RunID, when set, replace what any
// source says.
type Overrides struct {
	// WorldSize > 0 makes the flags the source of Rank and WorldSize.
	WorldSize, Rank int
	// LocalRank and LocalWorldSize, used with WorldSize; when LocalWorldSize is 0 all ranks
	// are taken to be on one host (LocalRank = Rank, LocalWorldSize = WorldSize).
	LocalRank, LocalWorldSize int
	MasterAddr                string
	MasterPort                int
	RunID                     string
}

// DetectEnv finds this process's rank, world size and rendezvous address, trying in order:
// the flags in o, torchrun, Slurm, Open MPI / PMI, Kubernetes PyTorchJob, else one process.
// See the package doc for the variables of each. A source whose marker variable is set but
// that lacks a variable it needs is an error naming the missing variable.
func DetectEnv(o Overrides) (Env, error) { return DetectEnvFrom(o, os.LookupEnv) }

// DetectEnvFrom is DetectEnv reading variables through lookup (os.LookupEnv in DetectEnv),
// for tests and for programs that keep their environment elsewhere. Empty values count as
// unset.
func DetectEnvFrom(o Overrides, lookup func(string) (string, bool)) (Env, error) {
	e := envReader{lookup}
	env, err := detect(o, e)
	if err != nil {
		return Env{}, fmt.Errorf("dist: detect environment: %w", err)
	}
	if o.MasterAddr != "" {
		env.MasterAddr = o.MasterAddr
	}
	if o.MasterPort != 0 {
		env.MasterPort = o.MasterPort
	}
	if o.RunID != "" {
		env.RunID = o.RunID
	} else if id, ok := e.get("SPARGO_RUN_ID"); ok {
		env.RunID = id
	}
	if env.RunID == "" {
		env.RunID = "spargo"
	}
	if err := env.validate(); err != nil {
		return Env{}, fmt.Errorf("dist: detect environment (%s): %w", env.Source, err)
	}
	return env, nil
}

func detect(o Overrides, e envReader) (Env, error) {
	switch {
	case o.WorldSize > 0:
		env := Env{Source: SourceFlags, Rank: o.Rank, WorldSize: o.WorldSize,
			LocalRank: o.LocalRank, LocalWorldSize: o.LocalWorldSize}
		if o.LocalWorldSize == 0 {
			env.LocalRank, env.LocalWorldSize = o.Rank, o.WorldSize
		}
		return env, e.masterFromEnv(&env, o, "the flags")

	case e.has("LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
		return e.torchrun()

	case e.has("SLURM_PROCID"):
		return e.slurm(o)

	case e.has("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
		return e.mpi(o, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")

	case e.has("PMI_RANK", "PMI_SIZE"):
		return e.mpi(o, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")

	case e.has("RANK", "WORLD_SIZE"):
		return e.pytorchJob()

	case e.has("PET_NNODES", "PET_NODE_RANK"):
		return e.pytorchJobElastic()
	}
	return Env{Source: SourceSingle, WorldSize: 1, LocalWorldSize: 1}, nil
}

func (e envReader) torchrun() (Env, error) {
	marker := e.firstSet("LOCAL_RANK", "TORCHELASTIC_RUN_ID")
	if err := e.require("torchrun", marker, "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"); err != nil {
		return Env{}, err
	}
	env := Env{Source: SourceTorchrun}
	var err error
	if env.Rank, err = e.int("RANK"); err != nil {
		return env, err
	}
	if env.WorldSize, err = e.int("WORLD_SIZE"); err != nil {
		return env, err
	}
	if env.LocalRank, err = e.int("LOCAL_RANK"); err != nil {
		return env, err
	}
	if e.has("LOCAL_WORLD_SIZE") {
		if env.LocalWorldSize, err = e.int("LOCAL_WORLD_SIZE"); err != nil {
			return env, err
		}
	}
	env.MasterAddr, _ = e.get("MASTER_ADDR")
	if env.MasterPort, err = e.int("MASTER_PORT"); err != nil {
		return env, err
	}
	if v, ok := e.get("TORCHELASTIC_USE_AGENT_STORE"); ok {
		// PyTorch compares with str(True); accept the usual spellings of true as well.
		switch strings.ToLower(v) {
		case "true", "1", "yes":
			env.UseAgentStore = true
		case "false", "0", "no":
		default:
			return env, fmt.Errorf("TORCHELASTIC_USE_AGENT_STORE=%q is not True or False", v)
		}
	}
	if env.UseAgentStore {
		// PyTorch's workers name their keys after the attempt; so must we.
		if err := e.require("torchrun", "TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT"); err != nil {
			return env, err
		}
	}
	if name := e.firstSet("TORCHELASTIC_RESTART_COUNT", "SPARGO_RESTART_COUNT"); name != "" {
		if env.RestartCount, err = e.int(name); err != nil {
			return env, err
		}
	}
	env.RunID, _ = e.get("TORCHELASTIC_RUN_ID")
	return env, nil
}

func (e envReader) slurm(o Overrides) (Env, error) {
	ntasks := e.firstSet("SLURM_NTASKS", "SLURM_NPROCS")
	if ntasks == "" {
		ntasks = "SLURM_NTASKS"
	}
	if err := e.require("Slurm", "SLURM_PROCID", ntasks, "SLURM_LOCALID"); err != nil {
		return Env{}, err
	}
	env := Env{Source: SourceSlurm}
	var err error
	if env.Rank, err = e.int("SLURM_PROCID"); err != nil {
		return env, err
	}
	if env.WorldSize, err = e.int(ntasks); err != nil {
		return env, err
	}
	if env.LocalRank, err = e.int("SLURM_LOCALID"); err != nil {
		return env, err
	}
	// SLURM_NTASKS_PER_NODE is a plain number only when every node runs the same count.
	if v, ok := e.get("SLURM_NTASKS_PER_NODE"); ok {
		if n, err := strconv.Atoi(v); err == nil {
			env.LocalWorldSize = n
		}
	}
	if addr := e.masterAddr(o); addr == "" && env.WorldSize > 1 {
		list := e.firstSet("SLURM_JOB_NODELIST", "SLURM_NODELIST")
		if list == "" {
			return env, fmt.Errorf("Slurm environment (SLURM_PROCID is set) lacks SLURM_JOB_NODELIST, needed for the master address (or set SPARGO_MASTER_ADDR)")
		}
		nodes, _ := e.get(list)
		if env.MasterAddr, err = FirstNode(nodes); err != nil {
			return env, fmt.Errorf("%s: %w", list, err)
		}
	} else {
		env.MasterAddr = addr
	}
	if env.MasterPort, err = e.masterPort(o); err != nil {
		return env, err
	}
	job, _ := e.get("SLURM_JOB_ID")
	step, _ := e.get("SLURM_STEP_ID")
	env.RunID = strings.Trim("slurm-"+job+"."+step, ".-")
	return env, nil
}

func (e envReader) mpi(o Overrides, rankVar, sizeVar, localRankVar, localSizeVar string) (Env, error) {
	if err := e.require("MPI", e.firstSet(rankVar, sizeVar), rankVar, sizeVar); err != nil {
		return Env{}, err
	}
	env := Env{Source: SourceMPI}
	var err error
	if env.Rank, err = e.int(rankVar); err != nil {
		return env, err
	}
	if env.WorldSize, err = e.int(sizeVar); err != nil {
		return env, err
	}
	if e.has(localRankVar) {
		if env.LocalRank, err = e.int(localRankVar); err != nil {
			return env, err
		}
	}
	if e.has(localSizeVar) {
		if env.LocalWorldSize, err = e.int(localSizeVar); err != nil {
			return env, err
		}
	}
	return env, e.masterFromEnv(&env, o, "the MPI environment ("+rankVar+" is set)")
}

// pytorchJob reads the variables the Kubeflow training operator sets in each pod of a
// PyTorchJob (one process per pod).
func (e envReader) pytorchJob() (Env, error) {
	masterAddr := e.firstSet("MASTER_ADDR", "PET_MASTER_ADDR")
	if masterAddr == "" {
		masterAddr = "MASTER_ADDR"
	}
	masterPort := e.firstSet("MASTER_PORT", "PET_MASTER_PORT")
	if masterPort == "" {
		masterPort = "MASTER_PORT"
	}
	if err := e.require("Kubernetes PyTorchJob", e.firstSet("RANK", "WORLD_SIZE"), "RANK", "WORLD_SIZE", masterAddr, masterPort); err != nil {
		return Env{}, err
	}
	env := Env{Source: SourceKubernetes}
	var err error
	if env.Rank, err = e.int("RANK"); err != nil {
		return env, err
	}
	if env.WorldSize, err = e.int("WORLD_SIZE"); err != nil {
		return env, err
	}
	env.LocalWorldSize = 1
	env.MasterAddr, _ = e.get(masterAddr)
	if env.MasterPort, err = e.int(masterPort); err != nil {
		return env, err
	}
	return env, nil
}

// pytorchJobElastic reads the PET_* variables (the training operator's arguments for
// torchrun) when the pod runs the program directly: one process per pod.
func (e envReader) pytorchJobElastic() (Env, error) {
	if err := e.require("Kubernetes PyTorchJob", e.firstSet("PET_NNODES", "PET_NODE_RANK"), "PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"); err != nil {
		return Env{}, err
	}
	env := Env{Source: SourceKubernetes, LocalWorldSize: 1}
	if v, ok := e.get("PET_NPROC_PER_NODE"); ok && v != "1" {
		return env, fmt.Errorf("PET_NPROC_PER_NODE=%s asks for %s processes per pod, but this program is one process: start it with torchrun or spargo launch in the pod", v, v)
	}
	nnodes, _ := e.get("PET_NNODES")
	lo, hi, elastic := strings.Cut(nnodes, ":")
	if elastic && lo != hi {
		return env, fmt.Errorf("PET_NNODES=%s is an elastic range; spargo needs a fixed number of pods (N or N:N)", nnodes)
	}
	n, err := strconv.Atoi(lo)
	if err != nil {
		return env, fmt.Errorf("PET_NNODES=%q is not a number of pods", nnodes)
	}
	env.WorldSize = n
	if env.Rank, err = e.int("PET_NODE_RANK"); err != nil {
		return env, err
	}
	env.MasterAddr, _ = e.get("PET_MASTER_ADDR")
	if env.MasterPort, err = e.int("PET_MASTER_PORT"); err != nil {
		return env, err
	}
	return env, nil
}

// masterFromEnv fills the master address and port of sources that do not carry one:
// the flags, then SPARGO_MASTER_ADDR / MASTER_ADDR (required when there is more than one
// rank), and SPARGO_MASTER_PORT / MASTER_PORT / DefaultMasterPort.
func (e envReader) masterFromEnv(env *Env, o Overrides, what string) error {
	env.MasterAddr = e.masterAddr(o)
	if env.MasterAddr == "" && env.WorldSize > 1 {
		return fmt.Errorf("%s gives no master address: set SPARGO_MASTER_ADDR (or MASTER_ADDR, or the master-address flag) to rank 0's host", what)
	}
	var err error
	env.MasterPort, err = e.masterPort(o)
	return err
}

func (e envReader) masterAddr(o Overrides) string {
	if o.MasterAddr != "" {
		return o.MasterAddr
	}
	v, _ := e.get(e.firstSet("SPARGO_MASTER_ADDR", "MASTER_ADDR"))
	return v
}

func (e envReader) masterPort(o Overrides) (int, error) {
	if o.MasterPort != 0 {
		return o.MasterPort, nil
	}
	if name := e.firstSet("SPARGO_MASTER_PORT", "MASTER_PORT"); name != "" {
		return e.int(name)
	}
	return DefaultMasterPort, nil
}

func (env Env) validate() error {
	switch {
	case env.WorldSize < 1:
		return fmt.Errorf("world size %d, want >= 1", env.WorldSize)
	case env.Rank < 0 || env.Rank >= env.WorldSize:
		return fmt.Errorf("rank %d is outside [0, %d)", env.Rank, env.WorldSize)
	case env.LocalRank < 0 || (env.LocalWorldSize > 0 && env.LocalRank >= env.LocalWorldSize):
		return fmt.Errorf("local rank %d is outside [0, %d)", env.LocalRank, env.LocalWorldSize)
	case env.WorldSize > 1 && (env.MasterPort < 1 || env.MasterPort > 65535):
		return fmt.Errorf("master port %d is outside [1, 65535]", env.MasterPort)
	}
	return nil
}

// envReader reads environment variables; empty values count as unset.
type envReader struct {
	lookup func(string) (string, bool)
}

func (e envReader) get(name string) (string, bool) {
	if name == "" {
		return "", false
	}
	v, ok := e.lookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

// has reports whether any of the names is set.
func (e envReader) has(names ...string) bool { return e.firstSet(names...) != "" }

// firstSet returns the first of names that is set, or "".
func (e envReader) firstSet(names ...string) string {
	for _, n := range names {
		if _, ok := e.get(n); ok {
			return n
		}
	}
	return ""
}

// require fails when a source was selected by marker but lacks some of names, listing them.
func (e envReader) require(source, marker string, names ...string) error {
	var missing []string
	for _, n := range names {
		if _, ok := e.get(n); !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	verb := "is"
	if len(missing) > 1 {
		verb = "are"
	}
	return fmt.Errorf("%s environment is incomplete: %s is set but %s %s not", source, marker, strings.Join(missing, ", "), verb)
}

func (e envReader) int(name string) (int, error) {
	v, ok := e.get(name)
	if !ok {
		return 0, fmt.Errorf("%s is not set", name)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not an integer", name, v)
	}
	return n, nil
}
