package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/simnet"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

func init() {
	commands["simulate"] = command{"time comm hooks on a simulated α-β network of up to thousands of workers", runSimulate}
}

const simulateHelp = `usage: spargo simulate [-model M | -n N] -workers P [-hook SPEC]... [-bandwidth 1gbit] [-latency 50us]
                      [-ranks-per-node R [-intra-bandwidth 80gbit] [-intra-latency 1us]] [-density D] [-iters K] [-warmup W] [-seed S] [-scale auto|M] [-mem 2GiB]
                      [-compute measure|none] [-cores C] [-backward D] [-json]
       spargo simulate -validate -workers P [-n N] [-hook SPEC]... [-iters K]

Runs each hook's real schedule (the hook code itself, through comm.Group) on P simulated workers
(comm/simnet) and reports the virtual time of one call on the model's gradient as one bucket,
split into communication and local computation, with the maxima over workers of bytes sent and
received, messages sent and rounds, next to the cost formula of docs/ALGORITHMS.md / SparDL's Table I.

The network: every worker has one full-duplex NIC port of -bandwidth; a message of L bytes
costs α + L·β (α = -latency, β = 1/bandwidth) and queues behind the sender's earlier sends and,
at the receiver, behind messages arriving at the same time. -ranks-per-node R puts the workers
on P/R nodes of R consecutive workers (R must divide P): workers of one node exchange messages
through shared memory, priced α' + L·β' (α' = -intra-latency, 1 µs by default; β' =
1/-intra-bandwidth, 80 gbit = 10 GB/s by default) on a memory port of their own, while every
worker keeps its own NIC for the other nodes; the hooks see the nodes (comm.Topologist), so
hier:SPEC runs hierarchically, and the output adds the bytes (inter_recv) and words received
from other nodes. Local computation is charged from a
cost model measured once per run on this machine (-compute measure): the hook's selection
kernel on the real size (exact top-k for topka/topkdsa/gtopk, per-block top-k for spardl), the
dense passes over the gradient before and after, and decoding and adding every received byte.
oktopk reports every piece of its local work as it does it (hooks.WorkMeter: the dense add,
copy, clears and scale, exact k-th magnitudes, threshold scans and the entries they select,
packing, decoding, scatter-adds, the radix select's histograms, the residual walk), each
charged at its measured rate with the size it has in that call, at that point of the
schedule. Each kernel is timed 7 times, the kernels in turn, and the fastest run kept, so
that load from elsewhere on the machine inflates the rates as little as possible. Wall time is
not used: P goroutines on this machine's cores say nothing about P machines. -cores C charges
computation as if the P workers shared C cores (only for comparing with runs on one machine):
the kernels are timed with min(P, C) copies running at once, since workers that compute
together share the memory bandwidth and caches, and each worker's computation is stretched
by P/C.

-backward D gives every call a backward pass of D before it: it is charged to every worker's
clock (and left out of time_ms and compute_ms, which stay the hook's own cost) and the bucket
reports it as its ready time, as DDP's buckets do (ddp.Timed). covap:interval=auto needs it:
its profiler measures the CCR of the simulated all-reduces against D and picks I = ⌈CCR⌉, so
a user sees the interval COVAP would choose on a cluster they do not have (the warm-up is
raised to cover its profiling, 1 + profile_iters dense calls; the chosen I and CCR are
printed under the hook's row and are covap_interval / covap_ccr in -json).

Memory: each worker holds its gradient and residual while it communicates (about 12 bytes an
element; topka and gaussiank also hold the P·k gathered entries, 16 bytes each). When P times
the model does not fit in -mem, the vectors are scaled down by an integer factor M, chosen for
each hook on its own (-scale auto picks the smallest that fits): every worker runs the hook on
n/M elements, rounded to a multiple of the hook's unit so that k and the per-block budgets stay
integers and scale exactly (P/density for the hooks that split the vector into P blocks, 1/density
for topka and gaussiank, whose k need not be a multiple of P), and every message counts M times
its bytes on the clock and in the output. The simulated model then has M·(n/M) elements, within
0.5 % of the real count. Under each row the output says what was approximated: the factor, and
whether the hook is exact under scaling. Schedules whose message sizes are proportional to k or
n (spardl, topka, gtopk, allreduce) give exactly the time of the full-size run; for
data-dependent ones (oktopk, topkdsa) volumes are those of the scaled data times M, which
overestimates the time more as M grows (measured at P=8 on 8M elements: oktopk +7 % at M=200
and +17 % at M=1000, topkdsa +4 % and +9 %); other hooks are marked as not checked. Gradients are
synthetic (heavy-tailed, seeded, those of spargo bench comm), generated per worker when needed.

-validate runs the hooks over real TCP on loopback (comm.NewTCPLoopback, P ranks in this
process), fits α from a ping-pong and β from all ranks exchanging 4 MiB at once, simulates the
same calls with those α, β and -cores set to this machine's CPUs, and prints measured and
predicted times and the error.
`

// simResult is one line of `spargo simulate -json`.
type simResult struct {
	Hook          string  `json:"hook"`
	Model         string  `json:"model"`
	Workers       int     `json:"workers"`
	N             int     `json:"n"`       // elements of the simulated model (NSim × Scale)
	NModel        int     `json:"n_model"` // elements of the real model
	NSim          int     `json:"n_sim"`   // elements each worker actually ran
	Scale         int     `json:"scale"`   // M
	Scaling       string  `json:"scaling"` // what the scaling approximates (scaling)
	Density       float64 `json:"density"` // 1 for dense hooks
	BandwidthBps  float64 `json:"bandwidth_bit_s"`
	LatencyUS     float64 `json:"latency_us"`
	TimeMS        float64 `json:"time_ms"`    // virtual time per call, slowest worker
	CommMS        float64 `json:"comm_ms"`    // of which communication (and waiting)
	ComputeMS     float64 `json:"compute_ms"` // of which local computation (selection, passes, reduction)
	BytesSent     int64   `json:"bytes_sent"`
	BytesReceived int64   `json:"bytes_received"`
	WordsReceived int64   `json:"words_received"`
	Messages      int64   `json:"messages"`
	Rounds        int64   `json:"rounds"`
	Formula       string  `json:"formula"`
	FormulaWords  float64 `json:"formula_words"`
	BackwardMS    float64 `json:"backward_ms,omitempty"`    // -backward, outside time_ms
	CovapInterval int     `json:"covap_interval,omitempty"` // the interval covap chose (or was given)
	CovapCCR      float64 `json:"covap_ccr,omitempty"`      // what covap:interval=auto measured
	// With -ranks-per-node R > 1: the nodes, their shared memory, and the part of the traffic
	// received from other nodes (maximum over workers, Scale applied).
	RanksPerNode       int     `json:"ranks_per_node,omitempty"`
	IntraBandwidthBps  float64 `json:"intra_bandwidth_bit_s,omitempty"`
	IntraLatencyUS     float64 `json:"intra_latency_us,omitempty"`
	InterBytesReceived int64   `json:"inter_bytes_received,omitempty"`
	InterWordsReceived int64   `json:"inter_words_received,omitempty"`
}

// simOptions are the parsed flags of one simulation.
type simOptions struct {
	model         string
	nModel        int
	workers       int
	specs         []string // the rows' labels, with density filled in
	densities     []float64
	rows          []hookRow
	alpha, beta   float64
	bandwidthBits float64
	iters, warmup int
	seed          uint64
	scale         int // 0: auto
	mem           int64
	compute       string
	cores         int
	backward      float64 // seconds of backward before every call (-backward)
	ranksPerNode  int     // R: workers per node; 0 or 1 = a node per worker, no shared memory
	intraAlpha    float64 // α' and β' between workers of one node (-intra-latency, -intra-bandwidth)
	intraBeta     float64
	intraBits     float64
	rates         *kernelRates // fixed kernel rates instead of measuring them (tests)
	concurrent    int          // time the kernels on this many goroutines at once, median round (-validate)
}

// largeSimulation is the world size from which -iters defaults to 1: one call of a hook on
// P workers runs P goroutines over the scaled vectors, and at P = 1024 the README's five hooks
// took 162 s of CPU (12 min on a loaded 2-core machine) with 1 warm-up and 2 timed calls.
const largeSimulation = 512

// flagSet reports whether the command line set flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// simBytesPerElement is the memory a worker needs per element of its bucket while it
// communicates: the gradient, the residual and the hook's dense scratch.
const simBytesPerElement = 12

func runSimulate(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo simulate", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var specs hookList
	fs.Var(&specs, "hook", "hook spec (repeat for several; default: spardl, oktopk, topka, gtopk (power-of-two P), allreduce)")
	model := fs.String("model", "vgg16", "model whose parameter count is the bucket: a name of spargo models (vgg16, resnet20, resnet50, bert-base, ...)")
	nFlag := fs.String("n", "", "elements in the bucket instead of -model (k, M, G suffixes)")
	workers := fs.Int("workers", 0, "simulated workers P (required)")
	bandwidth := fs.String("bandwidth", "1gbit", "NIC bandwidth per worker and direction (bit, kbit, mbit, gbit, tbit; e.g. 10gbit)")
	latency := fs.Duration("latency", 50*time.Microsecond, "latency α of one message")
	density := fs.Float64("density", 0.01, "density for hooks that take one and whose spec does not set it")
	iters := fs.Int("iters", 2, "timed calls per hook (the mean is reported; default 1 at P >= 512)")
	warmup := fs.Int("warmup", 1, "calls per hook before the timed ones (oktopk's first call computes exact thresholds)")
	seed := fs.Uint64("seed", 0, "seed of the synthetic gradients")
	scaleFlag := fs.String("scale", "auto", "down-scaling factor M of the vectors (auto: 1 when P·n fits -mem, else the smallest that fits)")
	memFlag := fs.String("mem", "2GiB", "memory the workers' vectors may use (KiB, MiB, GiB; at most 8GiB)")
	compute := fs.String("compute", "measure", "measure: charge local computation from kernels timed on this machine; none: communication only")
	cores := fs.Int("cores", 0, "charge computation as if the P workers shared this many cores (0: one core per worker)")
	backward := fs.Duration("backward", 0, "backward computation before every call: on the clock, not in time_ms, and the bucket's ready time (needed by covap:interval=auto)")
	ranksPerNode := fs.Int("ranks-per-node", 1, "workers per node R (must divide -workers): workers of one node talk through shared memory (-intra-bandwidth, -intra-latency), the others over their NICs (-bandwidth, -latency)")
	intraBandwidth := fs.String("intra-bandwidth", "80gbit", "shared-memory bandwidth per worker and direction between workers of one node (80gbit = 10 GB/s)")
	intraLatency := fs.Duration("intra-latency", time.Microsecond, "latency α' of one message between workers of one node")
	asJSON := fs.Bool("json", false, "print one JSON object per hook instead of a table")
	validate := fs.Bool("validate", false, "compare with the same hooks over TCP on loopback (α, β fitted from a probe)")
	if helped, err := parseFlags(fs, args, stdout, simulateHelp); helped || err != nil {
		return err
	}
	itersNote := ""
	if !flagSet(fs, "iters") && *workers >= largeSimulation {
		*iters = 1 // each call of a hook on 512+ workers takes minutes of CPU here
		itersNote = fmt.Sprintf(", -iters 1 (the default from P=%d; give -iters to time more calls)", largeSimulation)
	}
	o := simOptions{workers: *workers, iters: *iters, warmup: *warmup, seed: *seed, compute: *compute, cores: *cores, alpha: latency.Seconds(),
		backward: backward.Seconds()}
	switch {
	case *workers < 1:
		return fmt.Errorf("simulate: -workers %d: want at least 1", *workers)
	case *iters < 1:
		return fmt.Errorf("simulate: -iters %d: want at least 1", *iters)
	case *warmup < 0:
		return fmt.Errorf("simulate: -warmup %d: want 0 or more", *warmup)
	case !(*density > 0 && *density <= 1):
		return fmt.Errorf("simulate: -density %v: want a number in (0, 1]", *density)
	case *latency < 0:
		return fmt.Errorf("simulate: -latency %v: want 0 or more", *latency)
	case *compute != "measure" && *compute != "none":
		return fmt.Errorf("simulate: -compute %q: want measure or none", *compute)
	case *cores < 0:
		return fmt.Errorf("simulate: -cores %d: want 0 (one per worker) or more", *cores)
	case *backward < 0:
		return fmt.Errorf("simulate: -backward %v: want 0 or more", *backward)
	case *ranksPerNode < 1:
		return fmt.Errorf("simulate: -ranks-per-node %d: want at least 1", *ranksPerNode)
	case *workers%*ranksPerNode != 0:
		return fmt.Errorf("simulate: -ranks-per-node %d does not divide -workers %d: every node needs the same number of workers", *ranksPerNode, *workers)
	case *intraLatency < 0:
		return fmt.Errorf("simulate: -intra-latency %v: want 0 or more", *intraLatency)
	case *validate && *ranksPerNode > 1:
		return fmt.Errorf("simulate: -validate runs every worker over TCP on loopback, with no nodes: leave out -ranks-per-node")
	}
	o.ranksPerNode, o.intraAlpha = *ranksPerNode, intraLatency.Seconds()
	ibw, err := parseBandwidth(*intraBandwidth)
	if err != nil {
		return fmt.Errorf("simulate: -intra-bandwidth %q: %w", *intraBandwidth, err)
	}
	o.intraBits, o.intraBeta = ibw, 8/ibw
	bw, err := parseBandwidth(*bandwidth)
	if err != nil {
		return fmt.Errorf("simulate: -bandwidth %q: %w", *bandwidth, err)
	}
	o.bandwidthBits, o.beta = bw, 8/bw
	mem, err := parseBytes(*memFlag)
	if err != nil {
		return fmt.Errorf("simulate: -mem %q: %w", *memFlag, err)
	}
	o.mem = int64(mem)
	if *scaleFlag != "auto" {
		if o.scale, err = strconv.Atoi(*scaleFlag); err != nil || o.scale < 1 {
			return fmt.Errorf("simulate: -scale %q: want auto or a whole number >= 1", *scaleFlag)
		}
	}
	if *nFlag != "" {
		if o.nModel, err = parseCount(*nFlag); err != nil {
			return fmt.Errorf("simulate: -n %q: %w", *nFlag, err)
		}
		o.model = "n=" + *nFlag
	} else {
		m, err := models.New(*model, nn.NewRand(0))
		if err != nil {
			return fmt.Errorf("simulate: -model %q: %w", *model, err)
		}
		o.model, o.nModel = *model, nn.NumParams(nn.Parameters(m))
	}
	// The default set leaves out the hooks that cannot run on -workers (gtopk needs a power
	// of two); a -hook that cannot is refused here, before any measuring.
	rows, err := hookRows(specs, []string{"spardl", "oktopk", "topka", "gtopk", "allreduce"}, *density, o.workers)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	for _, row := range rows {
		h, err := row.config.New()
		if err == nil {
			err = ddp.CheckWorldSize(h, o.workers)
		}
		if err != nil {
			return fmt.Errorf("simulate: -hook %s: %w", row.label, err)
		}
		o.specs, o.densities, o.rows = append(o.specs, row.label), append(o.densities, row.density), append(o.rows, row)
	}
	if *validate {
		return runValidate(o, *nFlag != "", stdout, *asJSON)
	}
	plans := make([]scalePlan, len(o.rows))
	for i := range o.rows {
		if plans[i], err = planScale(o, i); err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
	}
	nodes := o.ranksPerNode > 1
	if !*asJSON {
		fmt.Fprintf(stdout, "%s: %d parameters; P=%d, %s, α=%v, compute %s%s\n",
			o.model, o.nModel, o.workers, formatBandwidth(o.bandwidthBits), *latency, o.compute, itersNote)
		if nodes {
			fmt.Fprintf(stdout, "%d nodes of R=%d workers; inside a node shared memory of %s, α'=%v\n",
				o.workers/o.ranksPerNode, o.ranksPerNode, formatBandwidth(o.intraBits), *intraLatency)
			fmt.Fprintf(stdout, "%-28s %10s %10s %10s %14s %14s %14s %9s %7s  %s\n", "hook", "time_ms", "comm_ms", "compute_ms", "bytes_sent", "bytes_recv", "inter_recv", "messages", "rounds", "formula (words received per worker)")
		} else {
			fmt.Fprintf(stdout, "%-28s %10s %10s %10s %14s %14s %9s %7s  %s\n", "hook", "time_ms", "comm_ms", "compute_ms", "bytes_sent", "bytes_recv", "messages", "rounds", "formula (words received per worker)")
		}
	}
	for i, row := range o.rows {
		runtime.GC()
		res, err := simulateHook(o, plans[i], row)
		if err != nil {
			return fmt.Errorf("simulate: %s: %w", row.label, err)
		}
		res.Scaling = scaling(row.label, plans[i])
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
			continue
		}
		if nodes {
			fmt.Fprintf(stdout, "%-28s %10.2f %10.2f %10.2f %14d %14d %14d %9d %7d  %s = %.0f vs %d simulated, %d from other nodes\n", res.Hook, res.TimeMS, res.CommMS, res.ComputeMS,
				res.BytesSent, res.BytesReceived, res.InterBytesReceived, res.Messages, res.Rounds, res.Formula, res.FormulaWords, res.WordsReceived, res.InterWordsReceived)
		} else {
			fmt.Fprintf(stdout, "%-28s %10.2f %10.2f %10.2f %14d %14d %9d %7d  %s = %.0f vs %d simulated\n", res.Hook, res.TimeMS, res.CommMS, res.ComputeMS,
				res.BytesSent, res.BytesReceived, res.Messages, res.Rounds, res.Formula, res.FormulaWords, res.WordsReceived)
		}
		fmt.Fprintf(stdout, "%-28s %s\n", "", res.Scaling)
		if res.CovapCCR > 0 {
			fmt.Fprintf(stdout, "%-28s CCR %.3f against a backward of %v: I = %d\n", "", res.CovapCCR, *backward, res.CovapInterval)
		}
	}
	return nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func isPowerOfTwo(p int) bool { return p > 0 && p&(p-1) == 0 }

var bandwidthRE = regexp.MustCompile(`(?i)^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(bit|bps)\s*$`)

// parseBandwidth reads a rate in bits per second with tc's units: 100mbit, 1gbit, 10gbit
// (decimal; bps is a synonym of bit).
func parseBandwidth(s string) (float64, error) {
	m := bandwidthRE.FindStringSubmatch(s)
	if m == nil {
		return 0, errors.New("want a rate such as 100mbit, 1gbit or 10gbit")
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return 0, errors.New("want a positive rate such as 100mbit, 1gbit or 10gbit")
	}
	mult := map[string]float64{"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[strings.ToLower(m[2])]
	return v * mult, nil
}

func formatBandwidth(bps float64) string {
	switch {
	case bps >= 1e9:
		return strconv.FormatFloat(bps/1e9, 'g', 4, 64) + " Gbit/s"
	case bps >= 1e6:
		return strconv.FormatFloat(bps/1e6, 'g', 4, 64) + " Mbit/s"
	}
	return strconv.FormatFloat(bps, 'g', 4, 64) + " bit/s"
}

// costModel is the local computation charged to a worker per call, in seconds, for the real
// (unscaled) size: before the hook's first message (the passes over the gradient and the
// selection), after it returns, and per received byte. Hooks that report their work piece by
// piece (hooks.WorkMeter: Ok-Topk) are charged from work instead, as they do it.
type costModel struct {
	before       func(call int) float64
	after        float64
	perRecvByte  float64
	work         *[hooks.NumWork]float64 // set: charge the hook's reported work, nothing before or after
	contention   float64                 // multiplier from -cores
	selectionLbl string
}

// kernelRates are seconds per element of the kernels, measured on this machine.
type kernelRates struct {
	pass      float64                    // one dense pass (Add) per element
	topk      func(n, k int) float64     // exact top-k of n elements
	blockTopk func(c, kb, n int) float64 // top-kb of every block of c, n elements in all
	filter    float64                    // threshold filter per element
	kth       float64                    // exact k-th magnitude per element
	sparseIn  float64                    // decode + scatter-add per received COO entry
	work      [hooks.NumWork]float64     // seconds per unit of every piece of hooks.Work
}

// simSample is the largest vector the kernels are timed on; larger sizes are extrapolated
// linearly (the kernels are O(n)).
const simSample = 1 << 22

// kernelRepeats is how often each kernel is timed. The machine may be shared: load only ever
// adds time, so the fastest of several runs estimates the kernel's own cost, and timing the
// kernels in turn, round after round, spreads a burst of load over one round of every kernel
// instead of every round of one (with 3 back-to-back repeats per kernel, the rates of one
// hook moved up to 4.2× between runs on the loaded machine). Seven rounds of the kernels on
// 4 M elements take about a second.
const kernelRepeats = 7

// timedKernel is one kernel to time: units (elements, entries) per run, and a constructor of
// runs with their own scratch (concurrent copies must not share it).
type timedKernel struct {
	units int
	new   func() func()
}

// kernelTiming is how the kernels are timed: copies of each at once (the workers that compute
// together share the memory bandwidth and caches: on this 2-core machine two copies of a dense
// pass take 1.8 times as long as one), and the median round instead of the fastest.
type kernelTiming struct {
	copies    int
	useMedian bool
}

// timeKernels returns the seconds per unit of every kernel: each is run kernelRepeats times,
// the kernels in turn, o.copies copies at once; the fastest round is kept, or the median
// (-validate: the rates then include whatever else loads the machine, as the TCP run does).
func timeKernels(ks []timedKernel, o kernelTiming) []float64 {
	copies := max(1, o.copies)
	runs := make([][]func(), len(ks))
	for i, k := range ks {
		for range copies {
			runs[i] = append(runs[i], k.new())
		}
	}
	times := make([][]float64, len(ks))
	for range kernelRepeats {
		for i, rs := range runs {
			t := time.Now()
			if copies == 1 {
				rs[0]()
			} else {
				var wg sync.WaitGroup
				for _, run := range rs {
					wg.Go(run)
				}
				wg.Wait()
			}
			times[i] = append(times[i], time.Since(t).Seconds())
		}
	}
	rates := make([]float64, len(ks))
	for i, k := range ks {
		t := slices.Min(times[i])
		if o.useMedian {
			t = median(times[i])
		}
		rates[i] = t / float64(max(1, k.units))
	}
	return rates
}

// measureKernels times the selection kernels and the pieces of hooks.Work once on a synthetic
// gradient (timeKernels).
func measureKernels(seed uint64, n int, density float64, o kernelTiming) kernelRates {
	s := min(n, simSample)
	x := make([]float32, s)
	fillSynthetic(x, syntheticCommon(seed, s), seed, 0)
	kSample := max(1, int(float64(s)*density))
	th := kernels.KthLargestAbs(x, kSample)
	sel := hooks.TopK(hooks.COO{}, x, kSample)
	wire := sel.AppendWire(nil)
	ks := []timedKernel{
		{s, func() func() { dst := make([]float32, s); return func() { kernels.Add(dst, x, x) } }},
		{s, func() func() { return func() { kernels.TopKAbs(nil, x, kSample) } }},
		{s, func() func() { return func() { kernels.FilterAbs(nil, x, th) } }},
		{s, func() func() { return func() { kernels.KthLargestAbs(x, kSample) } }},
		{sel.Len(), func() func() {
			dst := make([]float32, s)
			var in hooks.COO
			return func() {
				if err := in.SetWire(wire, s); err == nil {
					hooks.ScatterAdd(dst, in)
				}
			}
		}},
	}
	probes := hooks.WorkProbes(x, density)
	for _, pr := range probes {
		ks = append(ks, timedKernel{pr.Units, pr.New})
	}
	t := timeKernels(ks, o)
	r := kernelRates{pass: t[0], filter: t[2], kth: t[3], sparseIn: t[4]}
	topkPerElem := t[1]
	r.topk = func(n, k int) float64 { return topkPerElem * float64(n) }
	for i, pr := range probes {
		r.work[pr.Work] = t[5+i]
	}
	for _, pr := range probes {
		if pr.Minus != nil { // this probe's run minus the other's, per unit of this one
			perRun := r.work[pr.Work]*float64(pr.Units) - r.work[pr.Minus.Work]*float64(pr.Minus.Units)
			r.work[pr.Work] = max(0, perRun) / float64(pr.Units)
		}
	}
	r.blockTopk = func(c, kb, n int) float64 {
		cs := min(c, s)
		blocks := max(1, s/cs)
		kbs := max(1, int(float64(kb)*float64(cs)/float64(c)))
		perElem := timeKernels([]timedKernel{{blocks * cs, func() func() {
			return func() {
				var idx []int32
				for b := range blocks {
					idx = kernels.TopKAbs(idx[:0], x[b*cs:(b+1)*cs], kbs)
				}
			}
		}}}, o)[0]
		return perElem * float64(n)
	}
	return r
}

// hookCost builds the cost model of one hook for the real size n on p workers, from what
// the hook says it selects (hooks.SelectionOf).
func hookCost(h ddp.CommHook, rates kernelRates, n, p int, density float64) costModel {
	c := costModel{contention: 1}
	pass := rates.pass * float64(n)
	switch sel := hooks.SelectionOf(h, n, p); sel.Kind {
	case hooks.SelectBlockTopK:
		cost := rates.blockTopk(sel.Block, sel.K, n)
		c.before = func(int) float64 { return 2*pass + cost }
		c.selectionLbl = "per-block top-k"
	case hooks.SelectMetered:
		// Every piece of its local work, with its real size, where it happens: the hook
		// reports it (hooks.WorkMeter), including the decoding of what it receives.
		c.before = func(int) float64 { return 0 }
		c.work = &rates.work
		c.selectionLbl = "every piece it reports (hooks.WorkMeter)"
		return c
	case hooks.SelectTopK:
		cost := rates.topk(n, sel.K)
		c.before = func(int) float64 { return 2*pass + cost }
		c.selectionLbl = "exact top-k"
	default:
		if density < 1 { // another sparse hook: the passes only
			c.before = func(int) float64 { return 2 * pass }
			c.selectionLbl = "dense passes only"
		} else {
			c.before = func(int) float64 { return 0 }
			c.selectionLbl = "none"
		}
	}
	if density < 1 {
		c.after = 2 * pass
		c.perRecvByte = rates.sparseIn / 8
	} else {
		c.after = pass                 // the division by P
		c.perRecvByte = rates.pass / 4 // adding what arrived
	}
	return c
}

// simulateHook runs warmup+iters calls of row's hook on the simulated network.
func simulateHook(o simOptions, plan scalePlan, row hookRow) (simResult, error) {
	p, density := o.workers, row.density
	nEff := plan.nSim * plan.scale
	hs := make([]ddp.CommHook, p)
	for r := range p {
		var err error
		if hs[r], err = row.config.New(); err != nil {
			return simResult{}, err
		}
	}
	cost := costModel{before: func(int) float64 { return 0 }, contention: 1}
	if o.compute == "measure" {
		rates := o.rates
		if rates == nil {
			timing := kernelTiming{copies: 1}
			switch {
			case o.concurrent > 1: // -validate
				timing = kernelTiming{copies: o.concurrent, useMedian: true}
			case o.cores > 0: // min(P, C) workers compute at once
				timing.copies = min(p, o.cores)
			}
			m := measureKernels(o.seed, nEff, density, timing)
			rates = &m
		}
		cost = hookCost(hs[0], *rates, nEff, p, density)
	}
	if o.cores > 0 {
		cost.contention = max(1, float64(p)/float64(o.cores))
	}
	control := map[uint32]bool{}
	for _, off := range hooks.ControlTagOffsets(hs[0]) {
		control[(&benchBucket{}).Tag()+off] = true
	}
	netCfg := simnet.Config{Alpha: o.alpha, Beta: o.beta, RecvCost: cost.perRecvByte * cost.contention,
		Scale: float64(plan.scale), Unscaled: func(tag uint32) bool { return control[tag] }}
	if o.ranksPerNode > 1 {
		var err error
		if netCfg.Topology, err = comm.GridTopology(p/o.ranksPerNode, o.ranksPerNode); err != nil {
			return simResult{}, err
		}
		netCfg.IntraAlpha, netCfg.IntraBeta = o.intraAlpha, o.intraBeta
	}
	net, err := simnet.New(p, netCfg)
	if err != nil {
		return simResult{}, err
	}
	groups := net.Groups()
	warmup := o.warmup
	covap, _ := hs[0].(*hooks.COVAP) // nil for the other hooks
	if covap != nil && covap.Interval == hooks.CovapIntervalAuto {
		if o.backward <= 0 {
			return simResult{}, fmt.Errorf("interval=auto measures its CCR against the backward computation: give -backward (e.g. -backward 100ms), or set interval=N")
		}
		warmup = max(warmup, 1+covap.ProfileIters) // the timed calls come after its profiling
	}
	common := syntheticCommon(o.seed, plan.nSim)
	buckets := make([]*benchBucket, p)
	res := simResult{Hook: row.label, Model: o.model, Workers: p, N: nEff, NModel: o.nModel, NSim: plan.nSim, Scale: plan.scale,
		Density: density, BandwidthBps: o.bandwidthBits, LatencyUS: o.alpha * 1e6}
	var sumT, sumCompute float64
	var last, timed []comm.Stats // the last call's traffic per worker; the timed calls' sum (COVAP)
	iters := o.iters
	for it := 0; it < warmup+iters; it++ {
		if covap != nil && it == warmup {
			// A shard goes once every I calls: time a whole number of intervals, so that the
			// mean per call is COVAP's average cost and not the luck of which calls were timed.
			if pl := covap.Plan(); pl != nil && pl.Interval > 1 {
				iters = (o.iters + pl.Interval - 1) / pl.Interval * pl.Interval
			}
		}
		start := net.Sync()
		computed := make([]float64, p)
		before := make([]comm.Stats, p)
		sent0, recv0, interRecv0 := make([]float64, p), make([]float64, p), make([]float64, p)
		for r := range p {
			computed[r] = net.Computed(r)
			before[r] = groups[r].Counters().Snapshot()
			sent0[r], recv0[r] = net.Bytes(r)
			_, interRecv0[r] = net.InterBytes(r)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		errs := make([]error, p)
		var wg sync.WaitGroup
		for r := range p {
			wg.Go(func() {
				if buckets[r] == nil {
					buckets[r] = &benchBucket{flat: make([]float32, plan.nSim), last: true}
				}
				b := buckets[r]
				fillSynthetic(b.flat, common, o.seed, r)
				b.iter = int64(it)
				var bucket ddp.Bucket = b
				if o.backward > 0 {
					net.Advance(r, o.backward)
					bucket = &timedBenchBucket{b, time.Duration(o.backward * float64(time.Second))}
				}
				net.Advance(r, cost.before(it)*cost.contention)
				hctx := ctx
				if cost.work != nil { // sizes are of the scaled vectors: count them M times
					perUnit := float64(plan.scale) * cost.contention
					hctx = hooks.WithWorkMeter(ctx, func(w hooks.Work, units int) {
						net.Advance(r, cost.work[w]*float64(units)*perUnit)
					})
				}
				if _, err := hs[r].Run(hctx, groups[r], bucket).Wait(); err != nil {
					errs[r] = fmt.Errorf("worker %d: %w", r, err)
					return
				}
				net.Advance(r, cost.after*cost.contention)
			})
		}
		wg.Wait()
		cancel()
		if err := errors.Join(errs...); err != nil {
			return simResult{}, err
		}
		slowest := 0
		for r := range p {
			if net.Clock(r) > net.Clock(slowest) {
				slowest = r
			}
		}
		last = make([]comm.Stats, p)
		for r := range p {
			last[r] = groups[r].Counters().Snapshot().Sub(before[r])
			s, rv := net.Bytes(r)
			last[r].BytesSent, last[r].BytesRecv = int64(math.Round(s-sent0[r])), int64(math.Round(rv-recv0[r]))
			_, irv := net.InterBytes(r)
			last[r].InterBytesRecv = int64(math.Round(irv - interRecv0[r]))
		}
		if it >= warmup { // the backward is on the clock but not the hook's cost
			if covap != nil {
				if timed == nil {
					timed = make([]comm.Stats, p)
				}
				for r := range p {
					timed[r] = timed[r].Add(last[r])
				}
			}
			sumT += net.Clock(slowest) - start - o.backward
			sumCompute += net.Computed(slowest) - computed[slowest] - o.backward
		}
	}
	if covap != nil {
		// COVAP's calls differ by design (a shard goes every I-th call): its traffic is the
		// mean per timed call, a whole number of intervals.
		for r := range timed {
			last[r] = comm.Stats{BytesSent: timed[r].BytesSent / int64(iters), BytesRecv: timed[r].BytesRecv / int64(iters),
				MsgsSent: timed[r].MsgsSent / int64(iters), Rounds: timed[r].Rounds / int64(iters),
				InterBytesRecv: timed[r].InterBytesRecv / int64(iters)}
		}
	}
	for _, s := range last {
		res.BytesSent = max(res.BytesSent, s.BytesSent) // as the clock counts them: Scale applied
		res.BytesReceived = max(res.BytesReceived, s.BytesRecv)
		res.Messages = max(res.Messages, s.MsgsSent)
		res.Rounds = max(res.Rounds, s.Rounds)
		res.InterBytesReceived = max(res.InterBytesReceived, s.InterBytesRecv)
	}
	res.WordsReceived = res.BytesReceived / 4
	if o.ranksPerNode > 1 {
		res.RanksPerNode, res.IntraBandwidthBps, res.IntraLatencyUS = o.ranksPerNode, o.intraBits, o.intraAlpha*1e6
		res.InterWordsReceived = res.InterBytesReceived / 4
	}
	res.TimeMS = max(0, sumT/float64(iters)*1e3) // -backward was subtracted: no rounding below 0
	res.ComputeMS = max(0, sumCompute/float64(iters)*1e3)
	res.CommMS = res.TimeMS - res.ComputeMS
	res.Formula, res.FormulaWords = costFormula(hs[0], nEff, p, density)
	res.BackwardMS = o.backward * 1e3
	if covap != nil {
		if pl := covap.Plan(); pl != nil {
			res.CovapInterval = pl.Interval
		}
		if pr := covap.Profile(); pr != nil {
			res.CovapCCR = pr.CCR
		}
	}
	return res, nil
}

// timedBenchBucket is a bucket that reports when it was ready, as DDP's do (ddp.Timed):
// after -backward.
type timedBenchBucket struct {
	*benchBucket
	ready time.Duration
}

func (b *timedBenchBucket) ReadyAfter() time.Duration { return b.ready }

// costFormula is the docs/ALGORITHMS.md / SparDL Table I volume of a hook (hooks.CostFormula):
// words received per worker, with its expression; a dense all-reduce's for the hooks
// without a formula of their own at density 1.
func costFormula(h ddp.CommHook, n, p int, density float64) (string, float64) {
	if expr, words, ok := hooks.CostFormula(h, n, p); ok {
		return expr, words
	}
	if density >= 1 {
		pf := float64(p)
		return "2n(P-1)/P", 2 * float64(n) * (pf - 1) / pf
	}
	return "-", 0
}
