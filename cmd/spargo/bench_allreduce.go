package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
)

func init() {
	registerBench("allreduce", benchCommand{
		"dense all-reduce throughput between processes over shared memory or TCP (algbw, busbw; like nccl-tests)", runBenchAllReduce})
}

// allReduceResult is `spargo bench allreduce -json`'s object. The keys are stable and shared
// with scripts/torch_gloo_allreduce.py --json, so the two line up in BENCHMARKS.md.
type allReduceResult struct {
	Workers   int     `json:"workers"`
	Bytes     int     `json:"bytes"`
	Algorithm string  `json:"algorithm"` // the one that ran (auto resolved)
	Transport string  `json:"transport"` // "shm" (the ranks share one segment) or "tcp"
	Buffer    string  `json:"buffer"`    // "private" (ordinary memory) or "shared" (comm.AllocShared's)
	TimeMS    float64 `json:"time_ms"`   // median over the timed iterations
	MinMS     float64 `json:"min_ms"`
	AlgBW     float64 `json:"algbw_mb_s"` // bytes / time, MB = 10^6 bytes
	BusBW     float64 `json:"busbw_mb_s"` // algbw · 2(P-1)/P
	Iters     int     `json:"iters"`
}

var allReduceAlgorithms = map[string]comm.Algorithm{
	"auto": comm.Auto, "ring": comm.Ring, "rabenseifner": comm.Rabenseifner,
	"recursive_doubling": comm.RecursiveDoubling, "recursive-doubling": comm.RecursiveDoubling,
	"shared_memory": comm.SharedMemory, "shared-memory": comm.SharedMemory,
}

const benchAllReduceUsage = `usage: spargo bench allreduce [-n SIZE] [-workers P] [-transport T] [-buffer B] [-iters K] [-warmup W] [-algorithm A] [-json] [-cpuprofile FILE]

Measures dense all-reduce (sum) of a float32 vector of SIZE bytes between P processes, like
nccl-tests' all_reduce_perf and scripts/torch_gloo_allreduce.py. Processes on one host talk
through shared memory (-transport shm, the default there: auto picks the shared all-reduce) or
over TCP (-transport tcp, as SPARGO_SHM=0); across hosts over TCP. The vector is ordinary
memory (-buffer private, as a user's tensor) or comm.AllocShared's (-buffer shared, as DDP's
buckets): on shared memory the all-reduce then reads the peers' vectors in place.
Each iteration refills the vector, passes a barrier, and times one all-reduce on every rank;
an iteration's time is the slowest rank's. After W untimed iterations, K timed ones give the
median and minimum time, algbw = SIZE / median and busbw = algbw · 2(P-1)/P (MB = 10^6 bytes).

Without a launcher's environment it starts P copies of itself on this machine (cluster.Launch
over 127.0.0.1) and prints rank 0's result. Under a launcher (spargo launch -n P, torchrun,
srun, mpirun) every process is one rank and rank 0 prints; -workers, when given, must equal
the world size:

  spargo bench allreduce -n 64MiB -workers 4
  spargo launch -n 4 -- spargo bench allreduce -n 64MiB      (lines prefixed "[rank 0] ")

flags:
`

func runBenchAllReduce(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo bench allreduce", flag.ContinueOnError)
	fs.SetOutput(stdout)
	sizeFlag := fs.String("n", "64MiB", "vector size in bytes, a multiple of 4 (suffixes KiB, MiB, GiB; kB, MB, GB)")
	workers := fs.Int("workers", 2, "processes P (under a launcher: its world size)")
	iters := fs.Int("iters", 10, "timed iterations (median and minimum reported)")
	warmup := fs.Int("warmup", 2, "untimed iterations first")
	algName := fs.String("algorithm", "auto", "auto|ring|rabenseifner|recursive_doubling|shared_memory")
	transport := fs.String("transport", "auto", "auto|shm|tcp: shared memory among the ranks of one host (auto: when every rank allows it) or TCP only")
	buffer := fs.String("buffer", "private", "private|shared: the vector in ordinary memory (a user's tensor) or in memory from comm.AllocShared (DDP's buckets), which the shared all-reduce reads in place")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	cpuProfile := fs.String("cpuprofile", "", "write rank 0's CPU profile (go tool pprof) to this file")
	fs.Usage = func() {
		fmt.Fprint(stdout, benchAllReduceUsage)
		fs.PrintDefaults()
	}
	if help, err := parseFlags(fs, args, stdout, ""); help || err != nil {
		return err
	}
	size, err := parseBytes(*sizeFlag)
	if err != nil {
		return fmt.Errorf("bench allreduce: -n %q: %w", *sizeFlag, err)
	}
	alg, ok := allReduceAlgorithms[*algName]
	switch {
	case !ok:
		return fmt.Errorf("bench allreduce: -algorithm %q: want auto, ring, rabenseifner, recursive_doubling or shared_memory", *algName)
	case *transport != "auto" && *transport != "shm" && *transport != "tcp":
		return fmt.Errorf("bench allreduce: -transport %q: want auto, shm or tcp", *transport)
	case *buffer != "private" && *buffer != "shared":
		return fmt.Errorf("bench allreduce: -buffer %q: want private or shared", *buffer)
	case *iters < 1:
		return fmt.Errorf("bench allreduce: -iters %d: want at least 1", *iters)
	case *warmup < 0:
		return fmt.Errorf("bench allreduce: -warmup %d: want 0 or more", *warmup)
	}
	workersSet := false
	fs.Visit(func(f *flag.Flag) { workersSet = workersSet || f.Name == "workers" })

	env, err := benchLauncherEnv("allreduce", nil, *workers, workersSet)
	if err != nil {
		return err
	}
	if env.WorldSize > 1 {
		ctx, stop := cluster.NotifyContext(context.Background(), fmt.Sprintf("rank %d", env.Rank), nil)
		defer stop()
		if *cpuProfile != "" && env.Rank == 0 {
			f, err := os.Create(*cpuProfile)
			if err != nil {
				return fmt.Errorf("bench allreduce: -cpuprofile: %w", err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return fmt.Errorf("bench allreduce: -cpuprofile: %w", err)
			}
			defer pprof.StopCPUProfile()
		}
		res, err := allReduceRank(ctx, size, alg, *transport, *buffer, *warmup, *iters)
		if err != nil || res == nil {
			return err // res is nil on ranks other than 0
		}
		if path := benchResultFile(nil); path != "" {
			b, err := json.Marshal(res)
			if err != nil {
				return err
			}
			return os.WriteFile(path, b, 0o644)
		}
		return printAllReduce(stdout, *res, *algName, *warmup, *asJSON)
	}
	if *workers < 2 {
		return fmt.Errorf("bench allreduce: -workers %d: want at least 2 processes", *workers)
	}
	res, err := launchAllReduce(args, *workers)
	if err != nil {
		return err
	}
	return printAllReduce(stdout, *res, *algName, *warmup, *asJSON)
}

// launchAllReduce runs this program's `bench allreduce args` as p local processes and returns
// rank 0's result.
func launchAllReduce(args []string, p int) (*allReduceResult, error) {
	b, err := launchBench("allreduce", args, p)
	if err != nil {
		return nil, err
	}
	var res allReduceResult
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("bench allreduce: rank 0's result: %w", err)
	}
	return &res, nil
}

// allReduceRank is one rank of the measurement: it joins the job (cluster.Init), runs the
// iterations and returns the result on rank 0 (nil elsewhere).
func allReduceRank(ctx context.Context, size int, alg comm.Algorithm, transport, buffer string, warmup, iters int) (res *allReduceResult, err error) {
	if transport == "tcp" {
		os.Setenv("SPARGO_SHM", "0") // read by cluster.Init
	}
	g, env, err := cluster.Init(ctx, cluster.Options{})
	if err != nil {
		return nil, fmt.Errorf("bench allreduce: %w", err)
	}
	defer func() {
		if cerr := g.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("bench allreduce: rank %d: close: %w", env.Rank, cerr)
		}
	}()
	p, rank := g.Size(), g.Rank()
	onShm := comm.OnSharedMemory(g)
	if transport == "shm" && !onShm {
		return nil, fmt.Errorf("bench allreduce: rank %d: -transport shm: the ranks do not share one host's memory (topology %v; SPARGO_SHM=0 on a rank?)", rank, comm.TopologyOf(g))
	}
	buf := make([]float32, size/4)
	if buffer == "shared" {
		if buf, err = comm.AllocShared[float32](ctx, g, tagBenchAlloc, size/4); err != nil {
			return nil, fmt.Errorf("bench allreduce: rank %d: -buffer shared: %w", rank, err)
		}
	}
	var mine []float64 // seconds per timed iteration on this rank
	for it := range warmup + iters {
		fill := float32(rank + 1)
		for i := range buf {
			buf[i] = fill
		}
		if err := comm.Barrier(ctx, g, tagBenchBarrier); err != nil {
			return nil, fmt.Errorf("bench allreduce: rank %d: %w", rank, err)
		}
		start := time.Now()
		if err := comm.AllReduce(ctx, g, tagBenchAllReduce, buf, alg); err != nil {
			return nil, fmt.Errorf("bench allreduce: rank %d: %w", rank, err)
		}
		if it >= warmup {
			mine = append(mine, time.Since(start).Seconds())
		}
	}
	// Every element is 1 + 2 + … + P, exactly (small integers in float32).
	want := float32(p * (p + 1) / 2)
	if i := slices.IndexFunc(buf, func(v float32) bool { return v != want }); i >= 0 {
		return nil, fmt.Errorf("bench allreduce: rank %d: element %d is %v after the all-reduce, want %v", rank, i, buf[i], want)
	}
	// An iteration lasts as long as its slowest rank.
	slowest, err := allMax(ctx, g, tagBenchTimes, mine)
	if err != nil {
		return nil, fmt.Errorf("bench allreduce: %w", err)
	}
	if rank != 0 {
		return nil, nil
	}
	med, lo := median(slowest), slices.Min(slowest)
	algbw := float64(size) / med / 1e6
	return &allReduceResult{
		Workers:   p,
		Bytes:     size,
		Algorithm: strings.ReplaceAll(comm.AllReduceAlgorithmOn(g, len(buf), alg).String(), "-", "_"),
		Transport: map[bool]string{true: "shm", false: "tcp"}[onShm],
		Buffer:    buffer,
		TimeMS:    med * 1e3,
		MinMS:     lo * 1e3,
		AlgBW:     algbw,
		BusBW:     algbw * 2 * float64(p-1) / float64(p),
		Iters:     iters,
	}, nil
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func printAllReduce(w io.Writer, res allReduceResult, asked string, warmup int, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(res)
	}
	alg := res.Algorithm
	if asked == "auto" {
		alg += " (auto)"
	}
	fmt.Fprintf(w, "all-reduce of %s (%d float32, %s buffer) over P=%d processes (%s), %s, %d warm-up + %d timed iterations, barrier before each, time of the slowest rank\n",
		formatBytes(res.Bytes), res.Bytes/4, res.Buffer, res.Workers, map[string]string{"shm": "shared memory", "tcp": "TCP"}[res.Transport], alg, warmup, res.Iters)
	fmt.Fprintf(w, "%7s %12s  %-18s %10s %10s %11s %11s\n", "workers", "bytes", "algorithm", "time_ms", "min_ms", "algbw_MB/s", "busbw_MB/s")
	fmt.Fprintf(w, "%7d %12d  %-18s %10.2f %10.2f %11.1f %11.1f\n", res.Workers, res.Bytes, res.Algorithm, res.TimeMS, res.MinMS, res.AlgBW, res.BusBW)
	return nil
}

// byteUnits are the suffixes parseBytes understands, longest first.
var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
}

// parseBytes reads a size such as 64MiB, 1.5GB or 4096: a whole number of bytes, a multiple of
// 4 (float32), from 4 bytes to 8 GiB.
func parseBytes(s string) (int, error) {
	num, mult := s, 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	n := f * mult
	if err != nil || !(n >= 4) || n > 8<<30 || n != math.Trunc(n) || math.Mod(n, 4) != 0 {
		return 0, errors.New("want a whole number of bytes, a multiple of 4 from 4 to 8GiB, e.g. 64MiB or 4096")
	}
	return int(n), nil
}

// formatBytes writes n in the largest binary unit that divides it.
func formatBytes(n int) string {
	for _, u := range []struct {
		name string
		size int
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
