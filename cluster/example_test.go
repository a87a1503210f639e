package cluster_test

import (
	"context"
	"fmt"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
)

// A training program joins its job with Init. Started on its own, as here, it is a job of one
// process; started by spargo launch, torchrun, srun or mpirun, the same code gets its rank and
// a TCP group connected to the other ranks.
func Example() {
	ctx, stop := cluster.NotifyContext(context.Background(), "example", nil)
	defer stop()
	// Lookup stands in for the environment of a process started by hand; a real program
	// leaves it nil to read os.LookupEnv.
	g, env, err := cluster.Init(ctx, cluster.Options{Lookup: func(string) (string, bool) { return "", false }})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()

	grad := []float32{1, 2, 3}
	if err := comm.AllReduce(ctx, g, 1, grad, comm.Auto); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("rank %d of %d (%s): %v\n", env.Rank, env.WorldSize, env.Source, grad)
	// Output: rank 0 of 1 (single): [1 2 3]
}

// DetectEnv reads what a launcher set. These are the variables srun gives task 5 of 8.
func ExampleDetectEnvFrom() {
	slurm := map[string]string{
		"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
		"SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
	}
	env, err := cluster.DetectEnvFrom(cluster.Overrides{}, func(k string) (string, bool) { v, ok := slurm[k]; return v, ok })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: rank %d of %d, local rank %d, store at %s:%d, run %s\n",
		env.Source, env.Rank, env.WorldSize, env.LocalRank, env.MasterAddr, env.MasterPort, env.RunID)
	// Output: slurm: rank 5 of 8, local rank 1, store at gpu07:29500, run slurm-4242.0
}

// ExpandNodelist reads Slurm's compressed host lists.
func ExampleExpandNodelist() {
	hosts, err := cluster.ExpandNodelist("node[01-04,07],gpu3", 0)
	fmt.Println(hosts, err)
	// Output: [node01 node02 node03 node04 node07 gpu3] <nil>
}
