package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

func init() {
	registerBench("train", benchCommand{
		"single-process training images/s of a model (forward, backward, SGD step)", runBenchTrain})
}

// trainResult is the -json output of `spargo bench train`.
type trainResult struct {
	Model       string    `json:"model"`
	Batch       int       `json:"batch"`
	ImagesPerS  float64   `json:"images_per_s"`
	StepMS      float64   `json:"step_ms"`
	StepsMS     []float64 `json:"steps_ms"`
	Warmup      int       `json:"warmup"`
	Threads     int       `json:"threads"`
	Kernels     string    `json:"kernels"`
	Parameters  int       `json:"parameters"`
	DatasetName string    `json:"dataset"`
	// The machine and the roofline: CPUModel from /proc/cpuinfo ("unknown"
	// elsewhere); SgemmPeakGFLOPS the rate of a 1024³ Sgemm at the same
	// thread count (the fastest of the calls in -peak), measured before the
	// model is built (0 with -peak 0);
	// FLOPsPerImage the forward and backward work of one image, counted
	// over one step's GEMMs and convolutions (kernels.CountFLOPs); GFLOPS
	// = FLOPsPerImage × ImagesPerS; Roofline = GFLOPS / SgemmPeakGFLOPS.
	CPUModel        string  `json:"cpu_model"`
	SgemmPeakGFLOPS float64 `json:"sgemm_peak_gflops"`
	FLOPsPerImage   float64 `json:"flops_per_image"`
	GFLOPS          float64 `json:"gflops"`
	Roofline        float64 `json:"roofline,omitempty"`
}

func runBenchTrain(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo bench train", flag.ContinueOnError)
	fs.SetOutput(stdout)
	model := fs.String("model", "vgg16", "an image classifier of spargo models (vgg11 … vgg19, resnet20 … resnet110, resnet18 … resnet152)")
	batch := fs.Int("batch", 32, "images per step")
	steps := fs.Int("steps", 20, "timed steps (the median is reported)")
	warmup := fs.Int("warmup", 3, "untimed steps before timing")
	dataset := fs.String("dataset", "", "input shape and classes: cifar10 or cifar100 (the model's CIFAR variant); empty: the model's own (cifar10, imagenet for resnet18 … resnet152)")
	size := fs.Int("size", 0, "input height = width instead of the data set's (ImageNet ResNets take any size from 32; 0: the data set's)")
	seed := fs.Uint64("seed", 0, "seed for the weights and the random batch")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	peak := fs.Duration("peak", 500*time.Millisecond, "how long to time the 1024³ SGEMM that gives the machine's peak (0: skip it)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the timed steps (go tool pprof) to this file")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "usage: spargo bench train [-model NAME] [-dataset cifar10|cifar100] [-size S] [-batch N] [-steps K] [-warmup W] [-peak D] [-cpuprofile FILE] [-json]")
		fmt.Fprintln(stdout, "\nTimes single-process training steps (forward, cross-entropy, backward, SGD with momentum 0.9\nand weight decay 5e-4) on one random batch and prints the median images/s over the timed steps,\nthe CPU model, the machine's SGEMM peak (1024³, same threads), the model's FLOPs per image\n(forward + backward), its GFLOP/s and their ratio to the peak (roofline).\nThreads: GOMAXPROCS (set the environment variable to change it).")
		fs.PrintDefaults()
	}
	if help, err := parseFlags(fs, args, stdout, ""); help || err != nil {
		return err
	}
	if *batch < 1 {
		return fmt.Errorf("bench train: -batch %d: want at least 1", *batch)
	}
	if *steps < 1 {
		return fmt.Errorf("bench train: -steps %d: want at least 1", *steps)
	}
	if *warmup < 0 {
		return fmt.Errorf("bench train: -warmup %d: want 0 or more", *warmup)
	}
	if *peak < 0 {
		return fmt.Errorf("bench train: -peak %v: want 0 or more", *peak)
	}
	entry, err := models.Lookup(*model)
	if err != nil {
		return fmt.Errorf("bench train: -model: %w", err)
	}
	switch *dataset {
	case "":
	case "cifar10", "cifar100":
		ds := models.CIFAR10
		if *dataset == "cifar100" {
			ds = models.CIFAR100
		}
		if entry, err = models.LookupImage(*model, ds); err != nil {
			return fmt.Errorf("bench train: -model with -dataset: %w", err)
		}
	default:
		return fmt.Errorf("bench train: -dataset %q: want cifar10 or cifar100", *dataset)
	}
	ds := entry.Input
	if ds.Size == 0 {
		return fmt.Errorf("bench train: -model %s: not an image classifier (family %s); bench train feeds images", entry.Name, entry.Family)
	}
	if *size < 0 {
		return fmt.Errorf("bench train: -size %d: want 0 or more", *size)
	}
	if *size > 0 {
		ds.Size = *size
	}
	var peakGFLOPS float64
	if *peak > 0 {
		peakGFLOPS = sgemmPeak(*peak)
	}
	m, err := entry.Build(nn.NewRand(*seed))
	if err != nil {
		return fmt.Errorf("bench train: -model: %w", err)
	}
	ps := nn.Parameters(m)
	opt, err := optim.NewSGD(ps, optim.SGDConfig{LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4})
	if err != nil {
		return err
	}
	rng := nn.NewRand(*seed + 1)
	x := nn.NewTensor(*batch, ds.Channels, ds.Size, ds.Size)
	for i := range x.Data {
		x.Data[i] = float32(rng.NormFloat64())
	}
	y := make([]int, *batch)
	for i := range y {
		y[i] = rng.IntN(ds.Classes)
	}
	tape := nn.NewTape()
	step := func() error {
		tape.Reset()
		opt.ZeroGrad()
		if err := tape.Backward(nn.CrossEntropy(m.Forward(tape.Const(x)), y)); err != nil {
			return fmt.Errorf("bench train: %s on %d×%d×%d input: %w", entry.Name, ds.Channels, ds.Size, ds.Size, err)
		}
		opt.Step()
		return nil
	}
	for range *warmup {
		if err := step(); err != nil {
			return err
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench train: -cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench train: -cpuprofile %s: %w", *cpuProfile, err)
		}
		defer pprof.StopCPUProfile()
	}
	times := make([]float64, *steps)
	var flops int64
	for i := range times {
		start := time.Now()
		var err error
		if i == 0 {
			// One atomic add per GEMM: the first step is timed as the others.
			flops = kernels.CountFLOPs(func() { err = step() })
		} else {
			err = step()
		}
		if err != nil {
			return err
		}
		times[i] = float64(time.Since(start).Nanoseconds()) / 1e6
	}
	sorted := slices.Clone(times)
	slices.Sort(sorted)
	med := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	res := trainResult{
		Model: *model, Batch: *batch, ImagesPerS: float64(*batch) / (med / 1e3), StepMS: med, StepsMS: times,
		Warmup: *warmup, Threads: runtime.GOMAXPROCS(0), Kernels: kernels.Impl(), Parameters: nn.NumParams(ps),
		DatasetName: ds.Name, CPUModel: cpuModel(), SgemmPeakGFLOPS: peakGFLOPS,
		FLOPsPerImage: float64(flops) / float64(*batch),
	}
	res.GFLOPS = res.FLOPsPerImage * res.ImagesPerS / 1e9
	if peakGFLOPS > 0 {
		res.Roofline = res.GFLOPS / peakGFLOPS
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "cpu %s  sgemm peak %.1f GFLOP/s (1024³, %d threads)\n", res.CPUModel, res.SgemmPeakGFLOPS, res.Threads)
	fmt.Fprintf(stdout, "model %s  dataset %s  batch %d  parameters %d  threads %d  kernels %s\n",
		res.Model, res.DatasetName, res.Batch, res.Parameters, res.Threads, res.Kernels)
	fmt.Fprintf(stdout, "step %.1f ms (median of %d, min %.1f, max %.1f)  %.1f images/s\n",
		med, len(times), sorted[0], sorted[len(sorted)-1], res.ImagesPerS)
	fmt.Fprintf(stdout, "%.3f GFLOP per image (forward + backward)  %.1f GFLOP/s  roofline %.3f of the SGEMM peak\n",
		res.FLOPsPerImage/1e9, res.GFLOPS, res.Roofline)
	return nil
}

// sgemmPeak times 1024³ Sgemm calls for about d at GOMAXPROCS threads (after
// one untimed call) and returns the fastest call's rate in GFLOP/s: a peak,
// and on a machine shared with other work the figure least disturbed by it.
func sgemmPeak(d time.Duration) float64 {
	const n = 1024
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], b[i] = float32(i%7)*0.25, float32(i%5)*0.5
	}
	gemm := func() { kernels.Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n) }
	gemm()
	best := time.Duration(math.MaxInt64)
	for start := time.Now(); best == math.MaxInt64 || time.Since(start) < d; {
		t := time.Now()
		gemm()
		best = min(best, time.Since(t))
	}
	return 2 * n * n * n / best.Seconds() / 1e9
}

// cpuModel returns the first "model name" of /proc/cpuinfo, or "unknown"
// where there is none (another OS, an architecture that names it otherwise).
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	return cpuModelFrom(string(b))
}

// cpuModelFrom parses the text of /proc/cpuinfo.
func cpuModelFrom(cpuinfo string) string {
	for line := range strings.Lines(cpuinfo) {
		key, val, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(key) == "model name" {
			if v := strings.TrimSpace(val); v != "" {
				return v
			}
		}
	}
	return "unknown"
}
