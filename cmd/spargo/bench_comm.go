package main

import (
	"context"
	"encoding/json"
	"errors"
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
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
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
	Transport     string  `json:"transport"`
	Formula       string  `json:"formula"`       // ALGORITHMS.md / SparDL Table I volume
	FormulaWords  float64 `json:"formula_words"` // its value: words received per worker
}

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
	workers := fs.Int("workers", 4, "in-process workers P")
	nFlag := fs.String("n", "1M", "elements in the bucket (k, M, G suffixes: 14.7M is VGG-16's size)")
	iters := fs.Int("iters", 5, "timed calls per hook (the median time is reported)")
	warmup := fs.Int("warmup", 2, "untimed calls per hook before timing")
	density := fs.Float64("density", 0.01, "density for hooks that take one and whose spec does not set it")
	seed := fs.Uint64("seed", 0, "seed of the synthetic gradients")
	asJSON := fs.Bool("json", false, "print one JSON object per hook instead of a table")
	transport := fs.String("transport", "local", "local: in-process channels; tcp: TCP on loopback (comm.NewTCPLoopback, all workers in this process)")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "usage: spargo bench comm [-hook SPEC]... [-workers P] [-n N] [-iters K] [-density D] [-seed S] [-transport local|tcp] [-json]")
		fmt.Fprintln(stdout, "\nRuns each hook on P in-process workers, each with its own synthetic heavy-tailed gradient of n\nelements (a shared component plus per-worker noise, seeded), as one bucket. Prints the median\nwall time per call (all workers) and, for the last timed call, the maxima over workers of the\nrounds, bytes received and words (4 bytes) received.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench comm: unexpected argument %q", fs.Arg(0))
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

	grads := syntheticGradients(*seed, *workers, n)
	if !*asJSON {
		fmt.Fprintf(stdout, "P=%d in-process workers (transport %s), n=%d, heavy-tailed gradients (seed %d), %d warm-up + %d timed calls per hook\n",
			*workers, *transport, n, *seed, *warmup, *iters)
		fmt.Fprintf(stdout, "%-36s %8s %10s %7s %15s %15s  %s\n", "hook", "density", "time_ms", "rounds", "bytes_received", "words_received", "formula (words)")
	}
	buckets := make([]*benchBucket, *workers) // shared by the hooks: one allocation, warm pages
	for r := range buckets {
		buckets[r] = &benchBucket{flat: make([]float32, n)}
	}
	for i, spec := range full {
		runtime.GC() // the previous hook's residuals are garbage: do not bill their collection here
		var groups []comm.Group
		if *transport == "tcp" {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			groups, err = comm.NewTCPLoopback(ctx, *workers, nil)
			cancel()
		} else {
			groups, err = comm.NewLocal(*workers)
		}
		if err != nil {
			return fmt.Errorf("bench comm: -transport %s: %w", *transport, err)
		}
		res, err := benchHookOn(groups, spec, grads, buckets, *warmup, *iters)
		for _, g := range groups {
			g.Close()
		}
		if err != nil {
			return fmt.Errorf("bench comm: %s: %w", spec, err)
		}
		res.Density, res.Transport = dens[i], *transport
		h, _ := hooks.Parse(spec)
		res.Formula, res.FormulaWords = costFormula(h, n, *workers, dens[i])
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(stdout, "%-36s %8g %10.2f %7d %15d %15d  %s = %.0f\n", res.Hook, res.Density, res.TimeMS, res.Rounds, res.BytesReceived, res.WordsReceived, res.Formula, res.FormulaWords)
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

// benchBucket is the single bucket every worker communicates.
type benchBucket struct {
	iter int64
	flat []float32
}

func (b *benchBucket) Index() int          { return 0 }
func (b *benchBucket) Iteration() int64    { return b.iter }
func (b *benchBucket) IsLast() bool        { return true }
func (b *benchBucket) Flat() []float32     { return b.flat }
func (b *benchBucket) Params() []*nn.Param { return nil }
func (b *benchBucket) Offsets() []int      { return nil }
func (b *benchBucket) Tag() uint32         { return 1 << 16 }

// benchHook runs warmup+iters calls of spec on len(grads) in-process workers; buckets[r] is
// worker r's bucket, refilled from grads[r] before every call (untimed).
func benchHook(spec string, grads [][]float32, buckets []*benchBucket, warmup, iters int) (commResult, error) {
	groups, err := comm.NewLocal(len(grads))
	if err != nil {
		return commResult{}, err
	}
	return benchHookOn(groups, spec, grads, buckets, warmup, iters)
}

// benchHookOn is benchHook on the given groups (groups[r] is worker r's).
func benchHookOn(groups []comm.Group, spec string, grads [][]float32, buckets []*benchBucket, warmup, iters int) (commResult, error) {
	p, n := len(grads), len(grads[0])
	var err error
	hs := make([]ddp.CommHook, p)
	for r := range p {
		if hs[r], err = hooks.Parse(spec); err != nil { // one hook per worker
			return commResult{}, err
		}
	}
	var times []float64
	var last []comm.Stats
	for it := range warmup + iters {
		var wg sync.WaitGroup
		for r := range p {
			wg.Go(func() { copy(buckets[r].flat, grads[r]); buckets[r].iter = int64(it) })
		}
		wg.Wait()
		before := make([]comm.Stats, p)
		for r := range p {
			before[r] = groups[r].Counters().Snapshot()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		errs := make([]error, p)
		start := time.Now()
		for r := range p {
			wg.Go(func() { _, errs[r] = hs[r].Run(ctx, groups[r], buckets[r]).Wait() })
		}
		wg.Wait()
		took := time.Since(start)
		cancel()
		if err := errors.Join(errs...); err != nil {
			return commResult{}, err
		}
		last = make([]comm.Stats, p)
		for r := range p {
			last[r] = groups[r].Counters().Snapshot().Sub(before[r])
		}
		if it >= warmup {
			times = append(times, float64(took.Nanoseconds())/1e6)
		}
	}
	slices.Sort(times)
	med := times[len(times)/2]
	if len(times)%2 == 0 {
		med = (times[len(times)/2-1] + times[len(times)/2]) / 2
	}
	res := commResult{Hook: spec, Workers: p, N: n, TimeMS: med}
	for _, s := range last {
		res.Rounds = max(res.Rounds, s.Rounds)
		res.BytesReceived = max(res.BytesReceived, s.BytesRecv)
	}
	res.WordsReceived = res.BytesReceived / 4
	return res, nil
}
