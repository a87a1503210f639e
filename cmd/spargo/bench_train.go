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
		"single-process training images/s or sequences/s of a model (forward, backward, SGD step)", runBenchTrain})
}

// trainResult is the -json output of `spargo bench train`.
//
// An image classifier sets ImagesPerS, DatasetName and FLOPsPerImage (always non-zero
// there, so its object keeps the fields it has always had) and leaves the token fields
// out. A model that reads tokens (an LSTM, BERT) leaves those three out and sets
// SequencesPerS, TokensPerS, SeqLen, Vocab and FLOPsPerSequence instead; Batch is then
// in sequences (an LSTM language model's columns) and a sequence is SeqLen token
// positions, padding included (a bptt window for the LSTM language models).
type trainResult struct {
	Model         string    `json:"model"`
	Batch         int       `json:"batch"`
	ImagesPerS    float64   `json:"images_per_s,omitempty"`
	SequencesPerS float64   `json:"sequences_per_s,omitempty"`
	TokensPerS    float64   `json:"tokens_per_s,omitempty"` // SequencesPerS × SeqLen
	SeqLen        int       `json:"seq_len,omitempty"`
	Vocab         int       `json:"vocab,omitempty"`
	StepMS        float64   `json:"step_ms"`
	StepsMS       []float64 `json:"steps_ms"`
	Warmup        int       `json:"warmup"`
	Threads       int       `json:"threads"`
	Kernels       string    `json:"kernels"`
	ChannelsLast  bool      `json:"channels_last,omitempty"`
	Parameters    int       `json:"parameters"`
	DatasetName   string    `json:"dataset,omitempty"`
	// The machine and the roofline: CPUModel from /proc/cpuinfo ("unknown"
	// elsewhere); SgemmPeakGFLOPS the rate of a 1024³ Sgemm at the same
	// thread count (the fastest of the calls in -peak), measured before the
	// model is built (0 with -peak 0);
	// FLOPsPerImage (FLOPsPerSequence) the forward and backward work of one
	// image (sequence), counted over one step's GEMMs and convolutions
	// (kernels.CountFLOPs) and divided by Batch; GFLOPS = FLOPsPerImage ×
	// ImagesPerS (FLOPsPerSequence × SequencesPerS); Roofline = GFLOPS /
	// SgemmPeakGFLOPS.
	CPUModel         string  `json:"cpu_model"`
	SgemmPeakGFLOPS  float64 `json:"sgemm_peak_gflops"`
	FLOPsPerImage    float64 `json:"flops_per_image,omitempty"`
	FLOPsPerSequence float64 `json:"flops_per_sequence,omitempty"`
	GFLOPS           float64 `json:"gflops"`
	Roofline         float64 `json:"roofline,omitempty"`
}

const benchTrainUsage = `usage: spargo bench train [-model NAME] [-batch N] [-seq T] [-vocab V] [-dataset cifar10|cifar100] [-size S] [-channels-last] [-steps K] [-warmup W] [-peak D] [-cpuprofile FILE] [-json]

Times single-process training steps (forward, loss, backward, SGD with momentum 0.9
and weight decay 5e-4) on one random batch and prints the median throughput over the
timed steps, the CPU model, the machine's SGEMM peak (1024³, same threads), the model's
FLOPs per image or sequence (forward + backward), its GFLOP/s and their ratio to the
peak (roofline). Threads: GOMAXPROCS (set the environment variable to change it).

Image classifiers (vgg*, resnet*): -batch random images (default 32) of the data set's
shape (-dataset, -size), cross-entropy; images/s. -channels-last keeps the activations
as [N, H, W, C] between the input and the classifier (models.SetChannelsLast).

Models that read tokens: random token ids, the step of models.NewTokenStep (that of the
./models benchmarks LSTMLMStep and BertTinyMLMStep); sequences/s and tokens/s:
  lstm-ptb-small, lstm-ptb-medium, lstm-ptb: a bptt window of -seq words (default 35) in
      -batch columns (default 20, examples/lstm's per-worker batch), cross-entropy over
      every word, the hidden state carried from step to step;
  lstm-imdb: -batch reviews (default 32) of -seq words (default 500), cross-entropy of
      the class at the last word;
  bert-tiny … bert-base: -batch sequences (default 16) of -seq tokens (default 128, at
      most 512) from a -vocab of 8000 (examples/bert's on PTB), the last seq/8 positions
      of odd sequences padded, every 7th position masked and predicted there, the NSP
      head, dropout on.
Their programs train with other optimizers (examples/lstm: SGD with clipping, Adam for
IMDB; examples/bert: AdamW); the SGD step here makes the figure comparable with
scripts/torch_throughput.py's, which runs the same step in PyTorch.
`

func runBenchTrain(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo bench train", flag.ContinueOnError)
	fs.SetOutput(stdout)
	model := fs.String("model", "vgg16", "a model of spargo models: an image classifier (vgg11 … vgg19, resnet20 … resnet110, resnet18 … resnet152), an LSTM (lstm-ptb-small, lstm-ptb-medium, lstm-ptb, lstm-imdb) or BERT (bert-tiny … bert-base)")
	batch := fs.Int("batch", 32, "images per step, or sequences for the models that read tokens (their defaults: 20 LSTM-PTB columns, 32 IMDB reviews, 16 BERT sequences)")
	seqLen := fs.Int("seq", 0, "tokens per sequence, for the models that read tokens (default: 35 LSTM-PTB, 500 IMDB, 128 BERT)")
	vocab := fs.Int("vocab", 0, "vocabulary of a model that reads tokens (default: 10000 LSTM-PTB, 50001 IMDB, 8000 BERT)")
	steps := fs.Int("steps", 20, "timed steps (the median is reported)")
	warmup := fs.Int("warmup", 3, "untimed steps before timing")
	dataset := fs.String("dataset", "", "image classifiers: input shape and classes: cifar10 or cifar100 (the model's CIFAR variant); empty: the model's own (cifar10, imagenet for resnet18 … resnet152)")
	size := fs.Int("size", 0, "image classifiers: input height = width instead of the data set's (ImageNet ResNets take any size from 32; 0: the data set's)")
	seed := fs.Uint64("seed", 0, "seed for the weights and the random batch")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	peak := fs.Duration("peak", 500*time.Millisecond, "how long to time the 1024³ SGEMM that gives the machine's peak (0: skip it)")
	channelsLast := fs.Bool("channels-last", false, "image classifiers: channels-last activations (models.SetChannelsLast)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the timed steps (go tool pprof) to this file")
	fs.Usage = func() {
		fmt.Fprint(stdout, benchTrainUsage)
		fmt.Fprintln(stdout, "\nflags:")
		fs.PrintDefaults()
	}
	if help, err := parseFlags(fs, args, stdout, ""); help || err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *batch < 1 {
		return fmt.Errorf("bench train: -batch %d: want at least 1", *batch)
	}
	if *seqLen < 1 && set["seq"] {
		return fmt.Errorf("bench train: -seq %d: want at least 1", *seqLen)
	}
	if *vocab < 1 && set["vocab"] {
		return fmt.Errorf("bench train: -vocab %d: want at least 1", *vocab)
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
	if *size < 0 {
		return fmt.Errorf("bench train: -size %d: want 0 or more", *size)
	}
	entry, err := models.Lookup(*model)
	if err != nil {
		return fmt.Errorf("bench train: -model: %w", err)
	}
	tokens := entry.Input.Size == 0
	if tokens {
		// -dataset "" and -size 0 say "the default" and are harmless; -seq 0 and -vocab 0
		// were rejected above, so any -seq or -vocab is a value.
		if *channelsLast {
			return fmt.Errorf("bench train: -channels-last: -model %s reads tokens (family %s); only the image classifiers have a channels-last layout", entry.Name, entry.Family)
		}
		for _, f := range []string{"dataset", "size"} {
			if fs.Lookup(f).Value.String() != fs.Lookup(f).DefValue {
				return fmt.Errorf("bench train: -%s %s: -model %s reads tokens (family %s), not images; -dataset and -size are for the image classifiers",
					f, fs.Lookup(f).Value, entry.Name, entry.Family)
			}
		}
	} else {
		for _, f := range []string{"seq", "vocab"} {
			if set[f] {
				return fmt.Errorf("bench train: -%s %s: -model %s is an image classifier (family %s); -seq and -vocab are for the models that read tokens",
					f, fs.Lookup(f).Value, entry.Name, entry.Family)
			}
		}
	}
	var ds models.Dataset
	if !tokens {
		switch *dataset {
		case "":
		case "cifar10", "cifar100":
			want := models.CIFAR10
			if *dataset == "cifar100" {
				want = models.CIFAR100
			}
			if entry, err = models.LookupImage(*model, want); err != nil {
				return fmt.Errorf("bench train: -model with -dataset: %w", err)
			}
		default:
			return fmt.Errorf("bench train: -dataset %q: want cifar10 or cifar100", *dataset)
		}
		ds = entry.Input
		if *size > 0 {
			ds.Size = *size
		}
	}
	var peakGFLOPS float64
	if *peak > 0 {
		peakGFLOPS = sgemmPeak(*peak)
	}

	// The model and its loss on one fixed random batch.
	var (
		m       nn.Module
		loss    func(t *nn.Tape) *nn.Var
		what    string // the input, for errors
		tokStep *models.TokenStep
	)
	if tokens {
		cfg := models.TokenStepConfig{Seq: *seqLen, Vocab: *vocab}
		if set["batch"] {
			cfg.Batch = *batch
		}
		tokStep, err = models.NewTokenStep(entry.Name, cfg, nn.NewRand(*seed), nn.NewRand(*seed+1))
		if err != nil {
			given := ""
			for _, f := range []string{"batch", "seq", "vocab"} {
				if set[f] {
					given += fmt.Sprintf(" -%s %s", f, fs.Lookup(f).Value)
				}
			}
			return fmt.Errorf("bench train: -model %s%s: %w", entry.Name, given, err)
		}
		m, loss = tokStep.Model, tokStep.Loss
		*batch = tokStep.Batch
		what = fmt.Sprintf("%d × %d tokens", tokStep.Batch, tokStep.Seq)
	} else {
		if m, err = entry.Build(nn.NewRand(*seed)); err != nil {
			return fmt.Errorf("bench train: -model: %w", err)
		}
		if *channelsLast {
			if err := models.SetChannelsLast(m, true); err != nil {
				return fmt.Errorf("bench train: -channels-last: %w", err)
			}
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
		loss = func(t *nn.Tape) *nn.Var { return nn.CrossEntropy(m.Forward(t.Const(x)), y) }
		what = fmt.Sprintf("%d×%d×%d input", ds.Channels, ds.Size, ds.Size)
	}
	ps := nn.Parameters(m)
	opt, err := optim.NewSGD(ps, optim.SGDConfig{LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4})
	if err != nil {
		return err
	}
	tape := nn.NewTape()
	step := func() error {
		tape.Reset()
		opt.ZeroGrad()
		if err := tape.Backward(loss(tape)); err != nil {
			return fmt.Errorf("bench train: %s on %s: %w", entry.Name, what, err)
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
	med := median(times) // bench_allreduce.go's
	perS := float64(*batch) / (med / 1e3)
	perItem := float64(flops) / float64(*batch)
	res := trainResult{
		Model: entry.Name, Batch: *batch, StepMS: med, StepsMS: times,
		Warmup: *warmup, Threads: runtime.GOMAXPROCS(0), Kernels: kernels.Impl(), ChannelsLast: *channelsLast, Parameters: nn.NumParams(ps),
		CPUModel: cpuModel(), SgemmPeakGFLOPS: peakGFLOPS, GFLOPS: perItem * perS / 1e9,
	}
	if tokens {
		res.SequencesPerS, res.TokensPerS = perS, perS*float64(tokStep.Seq)
		res.SeqLen, res.Vocab, res.FLOPsPerSequence = tokStep.Seq, tokStep.Vocab, perItem
	} else {
		res.Model, res.ImagesPerS, res.DatasetName, res.FLOPsPerImage = *model, perS, ds.Name, perItem
	}
	if peakGFLOPS > 0 {
		res.Roofline = res.GFLOPS / peakGFLOPS
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	peakText, rooflineText := "not measured (-peak 0)", "no roofline without the peak"
	if res.SgemmPeakGFLOPS > 0 {
		peakText = fmt.Sprintf("%.1f GFLOP/s (1024³, %d threads)", res.SgemmPeakGFLOPS, res.Threads)
		rooflineText = fmt.Sprintf("roofline %.3f of the SGEMM peak", res.Roofline)
	}
	fmt.Fprintf(stdout, "cpu %s  sgemm peak %s\n", res.CPUModel, peakText)
	unit := "image"
	if tokens {
		unit = "sequence"
		fmt.Fprintf(stdout, "model %s  batch %d × %d tokens  vocab %d  parameters %d  threads %d  kernels %s\n",
			res.Model, res.Batch, res.SeqLen, res.Vocab, res.Parameters, res.Threads, res.Kernels)
		fmt.Fprintf(stdout, "step %.1f ms (median of %d, min %.1f, max %.1f)  %.1f sequences/s  %.0f tokens/s\n",
			med, len(times), slices.Min(times), slices.Max(times), res.SequencesPerS, res.TokensPerS)
	} else {
		layout := ""
		if res.ChannelsLast {
			layout = "  channels last"
		}
		fmt.Fprintf(stdout, "model %s  dataset %s  batch %d  parameters %d  threads %d  kernels %s%s\n",
			res.Model, res.DatasetName, res.Batch, res.Parameters, res.Threads, res.Kernels, layout)
		fmt.Fprintf(stdout, "step %.1f ms (median of %d, min %.1f, max %.1f)  %.1f images/s\n",
			med, len(times), slices.Min(times), slices.Max(times), res.ImagesPerS)
	}
	fmt.Fprintf(stdout, "%.3f GFLOP per %s (forward + backward)  %.1f GFLOP/s  %s\n",
		perItem/1e9, unit, res.GFLOPS, rooflineText)
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

// cpuModel returns the first "model name" of /proc/cpuinfo with its x86
// "cpu family" and "model" numbers, or "unknown" where there is none
// (another OS, an architecture that names it otherwise).
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	return cpuModelFrom(string(b))
}

// cpuModelFrom parses the text of /proc/cpuinfo. Virtual machines often show
// a bare "AMD EPYC" or "Intel(R) Xeon(R) Processor" for microarchitectures
// as far apart as Zen 1 and Zen 4, so the first processor's family and model
// numbers follow the name: "AMD EPYC (family 23 model 1)".
func cpuModelFrom(cpuinfo string) string {
	var name, family, model string
	for line := range strings.Lines(cpuinfo) {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			if strings.TrimSpace(line) == "" && name != "" {
				break // the end of the first processor that has a name
			}
			continue
		}
		v := strings.TrimSpace(val)
		switch strings.TrimSpace(key) {
		case "model name":
			if name == "" {
				name = v
			}
		case "cpu family":
			if family == "" {
				family = v
			}
		case "model":
			if model == "" {
				model = v
			}
		}
	}
	switch {
	case name == "":
		return "unknown"
	case family != "" && model != "":
		return fmt.Sprintf("%s (family %s model %s)", name, family, model)
	}
	return name
}
