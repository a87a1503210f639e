package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/gradrec"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/nn"
)

func init() {
	registerBench("comm", benchCommand{
		"time comm hooks in-process or one process per worker: time per call, rounds, bytes and words received", runBenchComm})
}

// commResult is one line of `spargo bench comm -json`. The keys are stable: the benchmark
// issue extends this command.
type commResult struct {
	Hook          string  `json:"hook"`
	Workers       int     `json:"workers"`
	N             int     `json:"n"`
	Density       float64 `json:"density"`
	TimeMS        float64 `json:"time_ms"`
	Rounds        int64   `json:"rounds"`
	BytesReceived int64   `json:"bytes_received"`
	WordsReceived int64   `json:"words_received"`
	// Nodes and InterWordsReceived: in a launched job whose ranks share nodes (hosts), the
	// number of nodes and the words per call received from ranks on other nodes (maximum over
	// ranks), the part of words_received that crossed the network.
	// InterFormula and InterFormulaWords are hier:SPEC's formula for those words (CostSplit:
	// SPEC's at P = nodes on a rank's shard) and its value.
	Nodes              int     `json:"nodes,omitempty"`
	InterWordsReceived int64   `json:"inter_words_received,omitempty"`
	InterFormula       string  `json:"inter_formula,omitempty"`
	InterFormulaWords  float64 `json:"inter_formula_words,omitempty"`
	// Buckets is how many buckets the hook's plan has (one per call of the hook per
	// iteration); Calls how many timed calls (iterations) the counts are averaged over.
	Buckets int `json:"buckets"`
	Calls   int `json:"calls"`
	// Model is -model's or the recording's model; Grads the recording replayed (-grads).
	Model string `json:"model,omitempty"`
	Grads string `json:"grads,omitempty"`
	// UnionK and Overlap (spardl and oktopk only) measure how much the workers' local
	// top-k selections agree: the size of their union over k (1 to P) and the mean fraction
	// of k two workers share (see overlapTracker).
	UnionK  *float64 `json:"union_k,omitempty"`
	Overlap *float64 `json:"overlap,omitempty"`
	// Transport is -transport's; Formula the docs/ALGORITHMS.md / SparDL Table I volume and
	// FormulaWords its value (words received per worker, whole model as one bucket).
	Transport    string  `json:"transport"`
	Formula      string  `json:"formula"`
	FormulaWords float64 `json:"formula_words"`
	// Refused is why the hook cannot run at this world size (ddp.CheckWorldSize); the
	// row has no measurement then.
	Refused string `json:"refused,omitempty"`
}

// overlapHooks are the hooks whose rows get the top-k union and overlap: their volumes
// depend on it most visibly.
var overlapHooks = []string{"spardl", "oktopk"}

// defaultCommHooks are measured when no -hook is given (gtopk only for power-of-two P).
var defaultCommHooks = []string{"spardl", "topka", "topkdsa", "gtopk", "allreduce"}

// hookList is the repeatable -hook flag.
type hookList []string

func (h *hookList) String() string     { return strings.Join(*h, " ") }
func (h *hookList) Set(s string) error { *h = append(*h, s); return nil }

// parseCount reads an element count with an optional k, M or G suffix (decimal: 14.7M is
// 14 700 000).
func parseCount(s string) (int, error) {
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "k"), strings.HasSuffix(s, "K"):
		mult = 1e3
	case strings.HasSuffix(s, "M"):
		mult = 1e6
	case strings.HasSuffix(s, "G"):
		mult = 1e9
	}
	if mult != 1 {
		s = s[:len(s)-1]
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f*mult >= 1) || f*mult > math.MaxInt32 || f*mult != math.Trunc(f*mult) {
		return 0, fmt.Errorf("want a whole number of elements from 1 to %d, e.g. 1000 or 14.7M", math.MaxInt32)
	}
	return int(f * mult), nil
}

const benchCommUsage = `usage: spargo bench comm [-hook SPEC]... [-workers P] [-n N | -model NAME | -grads DIR] [-iters K] [-warmup W]
                        [-density D] [-seed S] [-gen NAME] [-transport local|tcp|launch] [-json]

Runs each hook on P workers and prints the median wall time per call (one call is one
iteration: every bucket of the hook's plan, one at a time, all workers at once) and the
rounds, bytes received and words (4 bytes) received: the maxima over workers, averaged over
the timed calls. For spardl and oktopk in-process it also prints union/k and overlap: how
much the workers' local top-k selections (with local error feedback) agree.

The gradients: synthetic heavy-tailed ones (a shared component plus per-worker noise,
seeded), as one bucket of -n elements or in the parameters of -model; or, with -grads, those
recorded by a training run (examples/vgg -record-grads DIR), replayed iteration by iteration
so that residuals and the correlation between iterations are real. -workers below the
recording's P replays its first ranks; a multiple of P reuses each rank (identical gradients
then overlap fully); anything else is an error.

Transports: local runs the P workers in this process over channels, tcp over TCP on
loopback (still one process). launch runs one worker per process (shared memory between the
processes of one host, TCP across hosts; in a job whose hosts hold several ranks the JSON adds
the words received from other nodes): under a launcher (spargo launch -n P, torchrun, srun, mpirun, or
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand, e.g. one process per network namespace
of scripts/netns-cluster.sh) every process is one rank, as in spargo bench allreduce, and
launch is the default; without one, -transport launch starts P copies of this program on
this machine over 127.0.0.1. Each rank generates its own worker's gradients (the same values
as in-process) or reads its own rank's recording; each call starts after a barrier, and its
time is the slowest rank's. Rank 0 prints; union/k and overlap are not measured.

  spargo bench comm -transport launch -workers 4 -n 1M -hook spardl
  spargo launch -n 4 -- spargo bench comm -n 1M -hook spardl      (lines prefixed "[rank 0] ")

flags:
`

func runBenchComm(args []string, stdout io.Writer) error {
	return benchComm(args, stdout, nil)
}

// benchComm is `spargo bench comm args`; lookup reads the launcher's environment (nil: this
// process's), so that tests can run two ranks in one process.
func benchComm(args []string, stdout io.Writer, lookup func(string) (string, bool)) (err error) {
	fs := flag.NewFlagSet("spargo bench comm", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var specs hookList
	fs.Var(&specs, "hook", "hook spec, as for -hook of the examples (repeat for several; default: "+strings.Join(defaultCommHooks, ", ")+")")
	workers := fs.Int("workers", 4, "workers P (with -grads: default the recording's P; under a launcher: its world size)")
	nFlag := fs.String("n", "1M", "elements in the single synthetic bucket (k, M, G suffixes: 14.7M is VGG-16's size)")
	model := fs.String("model", "", "take the parameters' layout from this model (a name of spargo models: vgg16, resnet20, resnet50, ...) instead of -n: each hook gets the buckets DDP would give it")
	gradsDir := fs.String("grads", "", "replay the gradients recorded in this directory (examples/vgg -record-grads) instead of synthetic ones")
	iters := fs.Int("iters", 5, "timed calls per hook (the median time is reported); not with -grads, which times every recorded iteration after -warmup")
	warmup := fs.Int("warmup", 2, "untimed calls per hook before timing (with -grads: the first recorded iterations, replayed untimed)")
	density := fs.Float64("density", 0.01, "density for hooks that take one and whose spec does not set it")
	seed := fs.Uint64("seed", 0, "seed of the synthetic gradients")
	gen := fs.String("gen", commGenerators[0], commGenHelp)
	asJSON := fs.Bool("json", false, "print one JSON object per hook instead of a table")
	transport := fs.String("transport", "local", "local: in-process channels; tcp: TCP on loopback (comm.NewTCPLoopback, all workers in this process); launch: one process per worker (the default under a launcher)")
	fs.Usage = func() {
		fmt.Fprint(stdout, benchCommUsage)
		fs.PrintDefaults()
	}
	if help, err := parseFlags(fs, args, stdout, ""); help || err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var rec *gradrec.Recording
	switch {
	case *gradsDir != "" && set["iters"]:
		return fmt.Errorf("bench comm: -iters does not apply with -grads: every recorded iteration after -warmup is timed")
	case (*gradsDir != "" || *model != "") && set["n"]:
		return fmt.Errorf("bench comm: -n does not apply with -model or -grads: the model's layout sets the sizes")
	case *gen != commGenerators[0] && (*gradsDir != "" || *model != ""):
		return fmt.Errorf("bench comm: -gen %s applies to the single bucket of -n only", *gen)
	case *gradsDir != "" && *model != "":
		return fmt.Errorf("bench comm: -model does not apply with -grads: the recording's layout is used")
	case *transport != "local" && *transport != "tcp" && *transport != "launch":
		return fmt.Errorf("bench comm: -transport %q: want local, tcp or launch", *transport)
	}
	env, err := benchLauncherEnv("comm", lookup, *workers, set["workers"])
	if err != nil {
		return err
	}
	rank := -1 // this process's rank in a launched job; -1: not one
	if env.WorldSize > 1 {
		if *transport != "launch" && set["transport"] {
			return fmt.Errorf("bench comm: -transport %s: the launcher (%s) started %d processes, each one rank; leave -transport out or say launch",
				*transport, env.Source, env.WorldSize)
		}
		*transport, *workers, rank = "launch", env.WorldSize, env.Rank
		set["workers"] = true
	}
	if *gradsDir != "" {
		if rec, err = gradrec.Open(*gradsDir); err != nil {
			return fmt.Errorf("bench comm: -grads: %w", err)
		}
		if !set["workers"] {
			*workers = rec.World
		}
		if *warmup >= len(rec.Iterations) {
			return fmt.Errorf("bench comm: -warmup %d: the recording in %s has %d iterations %v; leave at least one to time",
				*warmup, *gradsDir, len(rec.Iterations), rec.Iterations)
		}
		*iters = len(rec.Iterations) - *warmup
	}
	n, err := parseCount(*nFlag)
	if err != nil {
		return fmt.Errorf("bench comm: -n %q: %w", *nFlag, err)
	}
	switch {
	case *workers < 1:
		return fmt.Errorf("bench comm: -workers %d: want at least 1", *workers)
	case *transport == "launch" && *workers < 2:
		return fmt.Errorf("bench comm: -workers %d: -transport launch wants at least 2 processes", *workers)
	case *iters < 1:
		return fmt.Errorf("bench comm: -iters %d: want at least 1", *iters)
	case *warmup < 0:
		return fmt.Errorf("bench comm: -warmup %d: want 0 or more", *warmup)
	case !(*density > 0 && *density <= 1):
		return fmt.Errorf("bench comm: -density %v: want a number in (0, 1]", *density)
	}
	// Parse every spec before generating gigabytes of gradients. The default set leaves out
	// the hooks that cannot run on this many workers (gtopk needs a power of two); a -hook
	// that cannot gets its refusal printed in its row.
	rows, err := hookRows(specs, defaultCommHooks, *density, *workers)
	if err != nil {
		return fmt.Errorf("bench comm: %w", err)
	}

	// The workers this process holds: all of them in-process, its own as a rank, none when it
	// launches the ranks.
	held := allWorkers(*workers)
	var launched []commResult
	switch {
	case rank >= 0:
		held = []int{rank}
	case *transport == "launch":
		held = nil
		b, err := launchBench("comm", args, *workers)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &launched); err != nil {
			return fmt.Errorf("bench comm: rank 0's result: %w", err)
		}
	}
	var src *gradSource
	var what string
	switch {
	case rec != nil:
		if src, err = recordedSource(rec, *workers, held); err != nil {
			return fmt.Errorf("bench comm: %w", err)
		}
		what = fmt.Sprintf("gradients recorded in %s (model %s, P=%d, hook %s, iterations %v), replayed in order; the first %d untimed",
			rec.Dir, rec.Model, rec.World, rec.Hook, rec.Iterations, *warmup)
		if *workers > rec.World {
			what += fmt.Sprintf("; each recorded rank replayed by %d workers", *workers/rec.World)
		}
	case *model != "":
		if src, err = modelSource(*model, *seed, held); err != nil {
			return fmt.Errorf("bench comm: %w", err)
		}
		what = fmt.Sprintf("heavy-tailed gradients (seed %d) in %s's %d parameters, %d warm-up + %d timed calls", *seed, *model, len(src.params), *warmup, *iters)
	default:
		if src, what, err = genSource(*gen, *seed, n, *workers, held); err != nil {
			return fmt.Errorf("bench comm: %w", err)
		}
		what += fmt.Sprintf(" in one bucket, %d warm-up + %d timed calls", *warmup, *iters)
	}

	var g comm.Group
	ctx := context.Background()
	if rank >= 0 {
		var stop func()
		ctx, stop = cluster.NotifyContext(ctx, fmt.Sprintf("rank %d", rank), nil)
		defer stop()
		if g, _, err = cluster.Init(ctx, cluster.Options{Lookup: lookup}); err != nil {
			return fmt.Errorf("bench comm: %w", err)
		}
		defer func() {
			if cerr := g.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("bench comm: rank %d: close: %w", rank, cerr)
			}
		}()
	}
	// Rank 0 of a job that launchBench started leaves its results in a file; other ranks print nothing.
	resultFile := ""
	if rank >= 0 {
		resultFile = benchResultFile(lookup)
	}
	quiet := rank > 0 || resultFile != ""
	if !*asJSON && !quiet {
		where := fmt.Sprintf("P=%d workers in this process (transport %s)", *workers, *transport)
		if *transport == "launch" {
			where = fmt.Sprintf("P=%d processes, one worker each (transport launch: shared memory between the processes of a host, TCP across hosts, barrier before each call, slowest rank's time)", *workers)
		}
		fmt.Fprintf(stdout, "%s, n=%d, %s\n", where, nn.NumParams(src.params), what)
		fmt.Fprintf(stdout, "%-36s %8s %7s %10s %7s %15s %15s %8s %8s\n", "hook", "density", "buckets", "time_ms", "rounds", "bytes_received", "words_received", "union/k", "overlap")
	}
	var results []commResult
	var sharedFlat []float32 // the launched ranks' buckets (rankHook)
	for i, row := range rows {
		var res commResult
		h, err := row.config.New() // for its description; the runs build their own
		if err != nil {
			return fmt.Errorf("bench comm: %s: %w", row.label, err)
		}
		refusal := ddp.CheckWorldSize(h, *workers)
		switch {
		case launched != nil:
			if i >= len(launched) {
				return fmt.Errorf("bench comm: rank 0 returned %d results for %d hooks", len(launched), len(rows))
			}
			res = launched[i]
		case refusal != nil:
			res = commResult{Hook: row.label, Workers: *workers, N: nn.NumParams(src.params), Refused: refusal.Error()}
		case rank >= 0:
			runtime.GC() // the previous hook's residuals are garbage: do not bill their collection here
			if res, err = rankHook(ctx, g, row, src, &sharedFlat, *warmup, *iters); err != nil {
				return fmt.Errorf("bench comm: %s: %w", row.label, err)
			}
		default:
			runtime.GC()
			o := benchOptions{workers: *workers, warmup: *warmup, iters: *iters, transport: *transport}
			if slices.Contains(overlapHooks, row.config.Name()) {
				o.overlapDensity = row.density
			}
			if res, err = benchHook(row, src, o); err != nil {
				return fmt.Errorf("bench comm: %s: %w", row.label, err)
			}
		}
		res.Density, res.Transport = row.density, *transport
		if res.Refused == "" && res.Formula == "" { // a launched rank's is its own hook's, for its topology
			res.Formula, res.FormulaWords = costFormula(h, res.N, *workers, row.density)
		}
		if rec != nil {
			res.Model, res.Grads = rec.Model, rec.Dir
		} else {
			res.Model = *model
		}
		results = append(results, res)
		if !quiet {
			if err := printCommResult(stdout, res, *asJSON); err != nil {
				return err
			}
		}
	}
	if rank == 0 && resultFile != "" {
		b, err := json.Marshal(results)
		if err != nil {
			return err
		}
		return os.WriteFile(resultFile, b, 0o644)
	}
	return nil
}

// printCommResult prints one hook's line of the table, or its JSON object.
func printCommResult(w io.Writer, res commResult, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(res)
	}
	if res.Refused != "" {
		_, err := fmt.Fprintf(w, "%-36s %8g refused: %s\n", res.Hook, res.Density, res.Refused)
		return err
	}
	union, overlap := "-", "-"
	if res.UnionK != nil {
		union, overlap = fmt.Sprintf("%.3f", *res.UnionK), fmt.Sprintf("%.3f", *res.Overlap)
	}
	across := ""
	if res.Nodes > 0 {
		across = fmt.Sprintf("  (%d words from other nodes, %d nodes)", res.InterWordsReceived, res.Nodes)
	}
	if res.InterFormula != "" {
		across += fmt.Sprintf("\n%-36s across nodes: formula %s = %.0f words", "", res.InterFormula, res.InterFormulaWords)
	}
	fmt.Fprintf(w, "%-36s %8g %7d %10.2f %7d %15d %15d %8s %8s%s\n", res.Hook, res.Density, res.Buckets, res.TimeMS, res.Rounds, res.BytesReceived, res.WordsReceived, union, overlap, across)
	if res.Formula != "" {
		fmt.Fprintf(w, "%-36s formula %s = %.0f words\n", "", res.Formula, res.FormulaWords)
	}
	return nil
}

// hookRow is one -hook of a command: its label (the spec as given, with density=D added
// where the hook takes a density and the spec sets none), its parsed configuration (with that
// density) and the density the hook uses (1 for dense hooks).
type hookRow struct {
	label   string
	config  hooks.Config
	density float64
}

// withDensity parses spec, giving it density unless the spec sets one.
func withDensity(spec string, density float64) (hookRow, error) {
	c, err := hooks.ParseConfig(spec)
	if err != nil {
		return hookRow{}, err
	}
	if !c.Has("density") {
		return hookRow{spec, c, 1}, nil
	}
	if c.Given("density") {
		d, err := c.Float("density")
		return hookRow{spec, c, d}, err
	}
	d := strconv.FormatFloat(density, 'g', -1, 64)
	if c, err = c.With("density", d); err != nil {
		return hookRow{}, err
	}
	// The density joins the innermost spec's options ("spardl:teams=2,density=D"), or
	// starts them ("spardl:density=D", "hier:spardl:density=D") when it has none.
	if label := spec + ",density=" + d; strings.Contains(spec, "=") {
		if _, err := hooks.ParseConfig(label); err == nil {
			return hookRow{label, c, density}, nil
		}
	}
	return hookRow{strings.TrimSuffix(strings.TrimSpace(spec), ":") + ":density=" + d, c, density}, nil
}

// hookRows parses the -hook specs (defaults when none are given) with withDensity. Of the
// defaults, the hooks that cannot run on p workers (ddp.CheckWorldSize) are left out.
func hookRows(specs, defaults []string, density float64, p int) ([]hookRow, error) {
	given := len(specs) > 0
	if !given {
		specs = defaults
	}
	var rows []hookRow
	for _, s := range specs {
		row, err := withDensity(s, density)
		if err != nil {
			return nil, fmt.Errorf("-hook %q: %w", s, err)
		}
		if !given {
			h, err := row.config.New()
			if err != nil {
				return nil, fmt.Errorf("-hook %q: %w", s, err)
			}
			if ddp.CheckWorldSize(h, p) != nil {
				continue
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// syntheticGradients returns the gradients of the given workers, in that order: heavy-tailed
// values (a normal over the square root of a uniform, Student-t-like), half a component shared
// by all workers and the rest per worker, so workers agree on some large entries as real
// gradients do. Worker r's gradient depends only on seed, r and n, so a rank of a launched
// job that generates its own has the values the in-process run gives that worker.
func syntheticGradients(seed uint64, n int, workers []int) [][]float32 {
	if len(workers) == 0 {
		return nil
	}
	common := syntheticCommon(seed, n)
	grads := make([][]float32, len(workers))
	var wg sync.WaitGroup
	for i, r := range workers {
		wg.Go(func() {
			grads[i] = make([]float32, n)
			fillSynthetic(grads[i], common, seed, r)
		})
	}
	wg.Wait()
	return grads
}

// allWorkers is 0, 1, …, p-1: the workers an in-process run holds.
func allWorkers(p int) []int {
	ws := make([]int, p)
	for i := range ws {
		ws[i] = i
	}
	return ws
}

// heavyTailed draws one value of the synthetic gradients.
func heavyTailed(rng *rand.Rand) float32 {
	return float32(1e-3 * rng.NormFloat64() / math.Sqrt(rng.Float64()+1e-3))
}

// syntheticCommon is the component of the synthetic gradients that all workers share.
func syntheticCommon(seed uint64, n int) []float32 {
	common := make([]float32, n)
	rng := rand.New(rand.NewPCG(seed, math.MaxUint64))
	for i := range common {
		common[i] = heavyTailed(rng)
	}
	return common
}

// fillSynthetic writes worker r's synthetic gradient into dst (len(dst) == len(common)):
// the same values syntheticGradients gives it, generated on demand so that a simulation of
// many workers holds one gradient per worker only while it communicates.
func fillSynthetic(dst, common []float32, seed uint64, r int) {
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	for i := range dst {
		dst[i] = 0.5*common[i] + heavyTailed(rng)
	}
}
