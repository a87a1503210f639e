package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/spargo-dl/spargo/gradrec"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/nn"
)

func init() {
	registerBench("comm", benchCommand{
		"time comm hooks on in-process workers: time per call, rounds, bytes and words received", runBenchComm})
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
	// Transport is -transport's; Formula the ALGORITHMS.md / SparDL Table I volume and
	// FormulaWords its value (words received per worker, whole model as one bucket).
	Transport    string  `json:"transport"`
	Formula      string  `json:"formula"`
	FormulaWords float64 `json:"formula_words"`
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

func runBenchComm(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo bench comm", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var specs hookList
	fs.Var(&specs, "hook", "hook spec, as for -hook of the examples (repeat for several; default: "+strings.Join(defaultCommHooks, ", ")+")")
	workers := fs.Int("workers", 4, "in-process workers P (with -grads: default the recording's P)")
	nFlag := fs.String("n", "1M", "elements in the single synthetic bucket (k, M, G suffixes: 14.7M is VGG-16's size)")
	model := fs.String("model", "", "take the parameters' layout from this model (a name of spargo models: vgg16, resnet20, resnet50, ...) instead of -n: each hook gets the buckets DDP would give it")
	gradsDir := fs.String("grads", "", "replay the gradients recorded in this directory (examples/vgg -record-grads) instead of synthetic ones")
	iters := fs.Int("iters", 5, "timed calls per hook (the median time is reported); not with -grads, which times every recorded iteration after -warmup")
	warmup := fs.Int("warmup", 2, "untimed calls per hook before timing (with -grads: the first recorded iterations, replayed untimed)")
	density := fs.Float64("density", 0.01, "density for hooks that take one and whose spec does not set it")
	seed := fs.Uint64("seed", 0, "seed of the synthetic gradients")
	asJSON := fs.Bool("json", false, "print one JSON object per hook instead of a table")
	transport := fs.String("transport", "local", "local: in-process channels; tcp: TCP on loopback (comm.NewTCPLoopback, all workers in this process)")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "usage: spargo bench comm [-hook SPEC]... [-workers P] [-n N | -model NAME | -grads DIR] [-iters K] [-warmup W] [-density D] [-seed S] [-transport local|tcp] [-json]")
		fmt.Fprintln(stdout, `
Runs each hook on P in-process workers and prints the median wall time per call (one call is
one iteration: every bucket of the hook's plan, one at a time, all workers at once) and the
rounds, bytes received and words (4 bytes) received: the maxima over workers, averaged over
the timed calls. For spardl and oktopk it also prints union/k and overlap: how much the
workers' local top-k selections (with local error feedback) agree.

The gradients: synthetic heavy-tailed ones (a shared component plus per-worker noise,
seeded), as one bucket of -n elements or in the parameters of -model; or, with -grads, those
recorded by a training run (examples/vgg -record-grads DIR), replayed iteration by iteration
so that residuals and the correlation between iterations are real. -workers below the
recording's P replays its first ranks; a multiple of P reuses each rank (identical gradients
then overlap fully); anything else is an error.`)
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
	case *gradsDir != "" && *model != "":
		return fmt.Errorf("bench comm: -model does not apply with -grads: the recording's layout is used")
	}
	if *gradsDir != "" {
		var err error
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
	case *iters < 1:
		return fmt.Errorf("bench comm: -iters %d: want at least 1", *iters)
	case *warmup < 0:
		return fmt.Errorf("bench comm: -warmup %d: want 0 or more", *warmup)
	case !(*density > 0 && *density <= 1):
		return fmt.Errorf("bench comm: -density %v: want a number in (0, 1]", *density)
	case *transport != "local" && *transport != "tcp":
		return fmt.Errorf("bench comm: -transport %q: want local or tcp", *transport)
	}
	if len(specs) == 0 {
		for _, h := range defaultCommHooks {
			if h == "gtopk" && *workers&(*workers-1) != 0 {
				continue // power-of-two P only
			}
			specs = append(specs, h)
		}
	}
	// Check every spec before generating gigabytes of gradients.
	full := make([]string, len(specs))
	dens := make([]float64, len(specs))
	for i, s := range specs {
		if full[i], dens[i], err = withDensity(s, *density); err != nil {
			return fmt.Errorf("bench comm: -hook %q: %w", s, err)
		}
		if _, err := hooks.Parse(full[i]); err != nil {
			return fmt.Errorf("bench comm: -hook: %w", err)
		}
	}

	var src *gradSource
	var what string
	switch {
	case rec != nil:
		if src, err = recordedSource(rec, *workers); err != nil {
			return fmt.Errorf("bench comm: %w", err)
		}
		what = fmt.Sprintf("gradients recorded in %s (model %s, P=%d, hook %s, iterations %v), replayed in order; the first %d untimed",
			rec.Dir, rec.Model, rec.World, rec.Hook, rec.Iterations, *warmup)
		if *workers > rec.World {
			what += fmt.Sprintf("; each recorded rank replayed by %d workers", *workers/rec.World)
		}
	case *model != "":
		if src, err = modelSource(*model, *seed, *workers); err != nil {
			return fmt.Errorf("bench comm: %w", err)
		}
		what = fmt.Sprintf("heavy-tailed gradients (seed %d) in %s's %d parameters, %d warm-up + %d timed calls", *seed, *model, len(src.params), *warmup, *iters)
	default:
		src = singleBucketSource(syntheticGradients(*seed, *workers, n))
		what = fmt.Sprintf("heavy-tailed gradients (seed %d) in one bucket, %d warm-up + %d timed calls", *seed, *warmup, *iters)
	}
	total := nn.NumParams(src.params)
	if !*asJSON {
		fmt.Fprintf(stdout, "P=%d workers in this process (transport %s), n=%d, %s\n", *workers, *transport, total, what)
		fmt.Fprintf(stdout, "%-36s %8s %7s %10s %7s %15s %15s %8s %8s\n", "hook", "density", "buckets", "time_ms", "rounds", "bytes_received", "words_received", "union/k", "overlap")
	}
	for i, spec := range full {
		runtime.GC() // the previous hook's residuals are garbage: do not bill their collection here
		o := benchOptions{workers: *workers, warmup: *warmup, iters: *iters, transport: *transport}
		if name, _, _ := strings.Cut(spec, ":"); slices.Contains(overlapHooks, name) {
			o.overlapDensity = dens[i]
		}
		res, err := benchHook(spec, src, o)
		if err != nil {
			return fmt.Errorf("bench comm: %s: %w", spec, err)
		}
		res.Density, res.Transport = dens[i], *transport
		if h, err := hooks.Parse(spec); err == nil {
			res.Formula, res.FormulaWords = costFormula(h, res.N, *workers, dens[i])
		}
		if rec != nil {
			res.Model, res.Grads = rec.Model, rec.Dir
		} else {
			res.Model = *model
		}
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
			continue
		}
		union, overlap := "-", "-"
		if res.UnionK != nil {
			union, overlap = fmt.Sprintf("%.3f", *res.UnionK), fmt.Sprintf("%.3f", *res.Overlap)
		}
		fmt.Fprintf(stdout, "%-36s %8g %7d %10.2f %7d %15d %15d %8s %8s\n", res.Hook, res.Density, res.Buckets, res.TimeMS, res.Rounds, res.BytesReceived, res.WordsReceived, union, overlap)
		if res.Formula != "" {
			fmt.Fprintf(stdout, "%-36s formula %s = %.0f words\n", "", res.Formula, res.FormulaWords)
		}
	}
	return nil
}

// withDensity adds density=D to a spec whose hook takes a density and whose spec does not set
// one; it returns the spec and the density the hook will use (1 for dense hooks).
func withDensity(spec string, density float64) (string, float64, error) {
	name, opts, _ := strings.Cut(spec, ":")
	var hookSpec *hooks.Spec
	for _, s := range hooks.Registered() {
		if s.Name == name {
			hookSpec = &s
			break
		}
	}
	if hookSpec == nil {
		_, err := hooks.Parse(spec) // the registry's error lists the hooks
		return "", 0, err
	}
	if !slices.ContainsFunc(hookSpec.Options, func(o hooks.Option) bool { return o.Name == "density" }) {
		return spec, 1, nil
	}
	for _, kv := range strings.Split(opts, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == "density" {
			d, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return "", 0, fmt.Errorf("density=%q is not a number", v)
			}
			return spec, d, nil
		}
	}
	d := strconv.FormatFloat(density, 'g', -1, 64)
	if opts == "" {
		return name + ":density=" + d, density, nil
	}
	return spec + ",density=" + d, density, nil
}

// syntheticGradients returns one gradient per worker: heavy-tailed values (a normal over the
// square root of a uniform, Student-t-like), half a component shared by all workers and the
// rest per worker, so workers agree on some large entries as real gradients do.
func syntheticGradients(seed uint64, p, n int) [][]float32 {
	common := syntheticCommon(seed, n)
	grads := make([][]float32, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() {
			grads[r] = make([]float32, n)
			fillSynthetic(grads[r], common, seed, r)
		})
	}
	wg.Wait()
	return grads
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
