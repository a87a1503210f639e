package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
)

// The measurements that run one rank per process (bench allreduce, bench comm -transport
// launch) share these: how a process finds out it is a rank, how a measurement started
// without a launcher launches itself, and how rank 0 learns the slowest rank's times.

// benchResultVar names the file where rank 0 of a job that `spargo bench NAME` launched
// itself leaves its result, for the launching process to print without rank prefixes.
const benchResultVar = "SPARGO_BENCH_RESULT"

// The tags of the benchmarks' own collectives (the hooks' bucket tags start at 1<<16).
const (
	tagBenchBarrier   = 1
	tagBenchAllReduce = 2
	tagBenchTimes     = 3
	tagBenchAlloc     = 4
)

// benchLauncherEnv reads the launcher's environment through lookup (nil: the process's).
// A world size above 1 means this process is one rank of a launched job; -workers, when
// the user set it, must then equal the world size.
func benchLauncherEnv(name string, lookup func(string) (string, bool), workers int, workersSet bool) (cluster.Env, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	env, err := cluster.DetectEnvFrom(cluster.Overrides{}, lookup)
	if err != nil {
		return cluster.Env{}, fmt.Errorf("bench %s: %w", name, err)
	}
	if env.WorldSize > 1 && workersSet && workers != env.WorldSize {
		return cluster.Env{}, fmt.Errorf("bench %s: -workers %d, but the launcher (%s) started %d processes; leave -workers out or make it equal",
			name, workers, env.Source, env.WorldSize)
	}
	return env, nil
}

// benchResultFile is where a rank 0 launched by launchBench leaves its result ("" when it
// was launched by someone else and prints it).
func benchResultFile(lookup func(string) (string, bool)) string {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	path, _ := lookup(benchResultVar)
	return path
}

// launchBench runs this program's `bench name args` as p processes on this machine
// (cluster.Launch over 127.0.0.1) and returns what rank 0 wrote to its result file.
func launchBench(name string, args []string, p int) ([]byte, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench %s: find this program to launch it: %w", name, err)
	}
	dir, err := os.MkdirTemp("", "spargo-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	resultFile := filepath.Join(dir, "result.json")
	ctx, stop := cluster.NotifyContext(context.Background(), "bench "+name, nil)
	defer stop()
	err = cluster.Launch(ctx, cluster.LaunchConfig{
		NProc:   p,
		Program: exe,
		Args:    append([]string{"bench", name}, args...),
		Env:     append(os.Environ(), benchResultVar+"="+resultFile),
		Stdout:  os.Stderr, // the ranks print nothing but trouble; the result comes back in the file
		Stderr:  os.Stderr,
	})
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", name, err)
	}
	b, err := os.ReadFile(resultFile)
	if err != nil {
		return nil, fmt.Errorf("bench %s: rank 0 left no result: %w", name, err)
	}
	return b, nil
}

// allMax returns, on every rank, the element-wise maximum of xs over the ranks of g: per
// timed iteration, the slowest rank's time (and the largest count). Every rank must pass
// as many values.
func allMax(ctx context.Context, g comm.Group, tag uint32, xs []float64) ([]float64, error) {
	enc := make([]byte, 8*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint64(enc[8*i:], math.Float64bits(x))
	}
	all, err := comm.AllGatherBytes(ctx, g, tag, enc)
	if err != nil {
		return nil, fmt.Errorf("rank %d: gather the times: %w", g.Rank(), err)
	}
	out := make([]float64, len(xs))
	for r, b := range all {
		if len(b) != len(enc) {
			return nil, fmt.Errorf("rank %d sent %d values, rank %d %d (the same flags on every rank?)", r, len(b)/8, g.Rank(), len(xs))
		}
		for i := range out {
			v := math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
			if r == 0 || v > out[i] {
				out[i] = v
			}
		}
	}
	return out, nil
}
