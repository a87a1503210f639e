package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/cmd/spargo/internal/overlap"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/models"
)

func init() {
	registerBench("overlap", benchCommand{
		"communication left after backward per comm hook (DDP timeline; in-process or one rank per process)", runBenchOverlap})
}

// defaultOverlapHooks are OMGS-SGD's comparison (issue 7): TopK-SGD's single group and the
// layer-wise family.
var defaultOverlapHooks = []string{"topka", "lags", "mgs", "omgs"}

const benchOverlapUsage = `usage: spargo bench overlap [-model NAME] [-hook SPEC]... [-workers P] [-iters N] [-warmup W]
       [-batch B] [-bptt T] [-data DIR] [-buckets single|ddp] [-density D] [-profile-iters K] [-trace] [-json]

Trains -model through DDP with each hook in turn (forward and backward, no optimizer step: it
does not change what is left after backward) and reports rank 0's DDP timeline, medians over
the measured iterations: backward time, iteration time (every group reduced), the
non-overlapped communication (iteration - backward: what OMGS-SGD minimises), the groups of
the hook's plan and how many of them were done before backward was. -trace adds the last
iteration's groups: gradients ready, hook called, selected, all-gathered ("sent", including
waiting for the other ranks), done. Image classifiers get random images; the LSTM language
models random tokens, or consecutive windows of PTB's training set with -data.

omgs plans on a profile measured first (profile.Measure, -profile-warmup + -profile-iters
steps); lags and mgs then get the same profile (its measured backward order). Hooks that do
not plan their buckets (topka, allreduce, ...) get one bucket for the whole model with
-buckets single (TopK-SGD's single group, the default) or DDP's 1 MiB + 25 MiB buckets with
-buckets ddp.

Without a launcher's environment the P workers are goroutines of this process (in-process
transport). Under a launcher (spargo launch -n P, torchrun, srun, mpirun, or RANK /
WORLD_SIZE / MASTER_ADDR set by hand, e.g. one process per network namespace) every process
is one rank over TCP and rank 0 prints; -workers, when given, must equal the world size:

  spargo bench overlap -model vgg16 -workers 4 -iters 5 -trace
  spargo bench overlap -model lstm-ptb-small -data ~/data/ptb -hook topka -hook omgs
  spargo launch -n 4 -- spargo bench overlap -model vgg16 -json

flags:
`

func runBenchOverlap(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo bench overlap", flag.ContinueOnError)
	fs.SetOutput(stdout)
	model := fs.String("model", "vgg16", "a model of spargo models: an image classifier or an LSTM language model (lstm-ptb-small, lstm-ptb-medium, lstm-ptb)")
	var specs hookList
	fs.Var(&specs, "hook", "hook spec (repeat for several; default: "+strings.Join(defaultOverlapHooks, ", ")+")")
	workers := fs.Int("workers", 4, "in-process workers P (under a launcher: its world size)")
	iters := fs.Int("iters", 5, "measured iterations per hook (medians reported)")
	warmup := fs.Int("warmup", 1, "unmeasured iterations per hook first")
	batch := fs.Int("batch", 0, "per worker: images, or columns of a language model's window (0: 16 images, 20 columns)")
	bptt := fs.Int("bptt", 35, "a language model's window length in tokens")
	data := fs.String("data", "", "a language model reads consecutive windows of this PTB directory's training set (each rank its shard); empty: random tokens")
	buckets := fs.String("buckets", "single", "buckets of hooks that do not plan their own: single (the whole model, TopK-SGD) or ddp (1 MiB first, 25 MiB after)")
	density := fs.Float64("density", 0.01, "density for hooks that take one and whose spec does not set it")
	profWarmup := fs.Int("profile-warmup", overlap.DefaultProfileWarmup, "unmeasured steps of omgs's profile")
	profIters := fs.Int("profile-iters", overlap.DefaultProfileIterations, "measured steps of omgs's profile")
	seed := fs.Uint64("seed", 0, "seed of the weights and the data")
	withTrace := fs.Bool("trace", false, "also print each hook's last iteration, group by group")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	fs.Usage = func() {
		fmt.Fprint(stdout, benchOverlapUsage)
		fs.PrintDefaults()
	}
	if help, err := parseFlags(fs, args, stdout, ""); help || err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	entry, err := models.Lookup(*model)
	if err != nil {
		return fmt.Errorf("bench overlap: -model: %w", err)
	}
	lm := entry.Input.Size == 0
	switch {
	case *buckets != "single" && *buckets != "ddp":
		return fmt.Errorf("bench overlap: -buckets %q: want single or ddp", *buckets)
	case !(*density > 0 && *density <= 1):
		return fmt.Errorf("bench overlap: -density %v: want a number in (0, 1]", *density)
	case *batch < 0:
		return fmt.Errorf("bench overlap: -batch %d: want at least 1 (0: the default)", *batch)
	case !lm && (set["data"] || set["bptt"]):
		return fmt.Errorf("bench overlap: -data and -bptt are for the language models; %s gets random images", entry.Name)
	}
	if *batch == 0 {
		*batch = 16
		if lm {
			*batch = 20
		}
	}
	if len(specs) == 0 {
		specs = defaultOverlapHooks
	}
	hs := make([]overlap.Hook, len(specs))
	for i, s := range specs {
		row, err := withDensity(s, *density)
		if err != nil {
			return fmt.Errorf("bench overlap: -hook %q: %w", s, err)
		}
		hs[i] = overlap.Hook{Label: row.label, Config: row.config}
	}
	cfg := overlap.Config{Model: entry, Hooks: hs, SingleBucket: *buckets == "single", Batch: *batch, BPTT: *bptt,
		Warmup: *warmup, Iters: *iters, ProfileWarmup: *profWarmup, ProfileIterations: *profIters, Seed: *seed, Trace: *withTrace}
	env, err := cluster.DetectEnv(cluster.Overrides{})
	if err != nil {
		return fmt.Errorf("bench overlap: %w", err)
	}
	name := "bench overlap"
	if env.WorldSize > 1 {
		if set["workers"] && *workers != env.WorldSize {
			return fmt.Errorf("bench overlap: -workers %d, but the launcher (%s) started %d processes; leave -workers out or make it equal",
				*workers, env.Source, env.WorldSize)
		}
		name = fmt.Sprintf("rank %d", env.Rank)
	} else if *workers < 1 {
		return fmt.Errorf("bench overlap: -workers %d: want at least 1", *workers)
	}
	ctx, stop := cluster.NotifyContext(context.Background(), name, nil)
	defer stop()
	if *data != "" {
		// An explicit -data is only looked in (never downloaded), so progress has nothing to show.
		dir, err := datasets.Find(ctx, datasets.PTBSet, *data, os.Stderr)
		if err != nil {
			return fmt.Errorf("bench overlap: %w", err)
		}
		ptb, err := datasets.LoadPTB(dir)
		if err != nil {
			return fmt.Errorf("bench overlap: %w", err)
		}
		cfg.Tokens = ptb.Train
	}
	var rep *overlap.Report
	if env.WorldSize > 1 {
		if rep, err = overlapRank(ctx, cfg); err != nil || rep == nil {
			return err // rep is nil on ranks other than 0
		}
		rep.Transport = fmt.Sprintf("TCP, one process per rank, %s environment", env.Source)
	} else if rep, err = overlap.RunLocal(ctx, *workers, cfg); err != nil {
		return fmt.Errorf("bench overlap: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	return rep.WriteText(stdout)
}

// overlapRank is this process's rank of a launched job: it joins (cluster.Init), measures and
// returns the report on rank 0 (nil elsewhere).
func overlapRank(ctx context.Context, cfg overlap.Config) (rep *overlap.Report, err error) {
	g, env, err := cluster.Init(ctx, cluster.Options{})
	if err != nil {
		return nil, fmt.Errorf("bench overlap: %w", err)
	}
	defer func() {
		if cerr := g.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("bench overlap: rank %d: close: %w", env.Rank, cerr)
		}
	}()
	if rep, err = overlap.Run(ctx, g, cfg); err != nil {
		return nil, fmt.Errorf("bench overlap: %w", err)
	}
	return rep, nil
}
