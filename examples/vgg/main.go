// Command vgg trains VGG on CIFAR-10 with data-parallel workers: in one process, each worker
// a goroutine with its own model replica, or one worker per process when a launcher starts it
// (torchrun, spargo launch, Slurm, mpirun, Kubernetes). Gradients flow parameter hook →
// bucket → comm hook → optimizer the same way in both.
//
//	go run ./examples/vgg                                      # VGG-11, 2 workers, CIFAR-10 found or downloaded
//	go run ./examples/vgg -data ../shared/data/cifar10/approx -model vgg11 -workers 2 \
//	    -batch 32 -epochs 3 -lr 0.01 -momentum 0.9 -wd 5e-4
//	go run ./examples/vgg -hook allreduce:algorithm=ring -metrics run.jsonl
//	go build -o vgg ./examples/vgg && spargo launch -n 4 -- ./vgg -epochs 3   # 4 processes
//
// -batch is per worker (global batch = workers × batch). CIFAR-10 is looked for in
// -data, $SPARGO_DATA, ../shared/data/cifar10/approx and the user cache directory, and
// downloaded into the cache (md5-checked) when none has it.
//
// Under a launcher (dist.DetectEnv finds a world size above 1) each process joins the job with
// dist.Init and trains one rank; -workers must then be left out, or be 1 (one per process) or
// the world size. Rank 0 prints, shows the progress bar (when its standard error is a
// terminal) and writes -metrics; every rank loads the data and takes its shard of each batch,
// exactly as the in-process workers do, so the run computes the same numbers. SIGINT and
// SIGTERM stop training between steps.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/dist"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/internal/train"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

type config struct {
	Data         string  `json:"data"`
	Model        string  `json:"model"`
	Workers      int     `json:"workers"`
	Hook         string  `json:"hook"`
	Batch        int     `json:"batch"`
	Epochs       int     `json:"epochs"`
	Steps        int     `json:"steps"`
	LR           float64 `json:"lr"`
	Momentum     float64 `json:"momentum"`
	WD           float64 `json:"wd"`
	Seed         uint64  `json:"seed"`
	WarmupEpochs int     `json:"warmup_epochs"`
	EvalLimit    int     `json:"eval_limit"`
	BucketMB     float64 `json:"bucket_mb"`
	DistBN       string  `json:"dist_bn"`
	Profile      string  `json:"profile,omitempty"`
	Metrics      string  `json:"-"`
	Progress     bool    `json:"-"`
}

func main() {
	var c config
	flag.StringVar(&c.Data, "data", "", "CIFAR-10 directory (default: $SPARGO_DATA, ../shared/data/cifar10/approx, the user cache; downloaded if none has it)")
	flag.StringVar(&c.Model, "model", "vgg11", "vgg11|vgg13|vgg16|vgg19")
	flag.IntVar(&c.Workers, "workers", 2, "data-parallel workers (in-process ranks); under a launcher leave it out, or give 1 or the world size")
	flag.StringVar(&c.Hook, "hook", "allreduce", "comm hook spec, e.g. allreduce:algorithm=ring (see `spargo hooks`)")
	flag.IntVar(&c.Batch, "batch", 32, "batch size per worker")
	flag.IntVar(&c.Epochs, "epochs", 3, "epochs")
	flag.IntVar(&c.Steps, "steps", 0, "stop each epoch after this many steps (0: whole epoch)")
	flag.Float64Var(&c.LR, "lr", 0.01, "learning rate")
	flag.Float64Var(&c.Momentum, "momentum", 0.9, "SGD momentum")
	flag.Float64Var(&c.WD, "wd", 5e-4, "weight decay")
	flag.Uint64Var(&c.Seed, "seed", 0, "seed for initialisation, shuffling and augmentation")
	flag.IntVar(&c.WarmupEpochs, "warmup", 0, "epochs of linear warm-up from lr/workers to lr (the seeds' recipe); 0: constant lr")
	flag.IntVar(&c.EvalLimit, "eval-limit", 0, "evaluate on the first N test images (0: all)")
	flag.StringVar(&c.DistBN, "dist-bn", "broadcast", "BatchNorm running statistics across ranks: broadcast (rank 0's after every step, PyTorch DDP's default) or reduce (each rank keeps its own; their mean before each evaluation, timm's --dist-bn reduce)")
	flag.Float64Var(&c.BucketMB, "bucket-mb", 0, "DDP bucket cap in MiB, like PyTorch's bucket_cap_mb (0: ddp's defaults, a small first bucket then 25 MiB; hooks that plan their own buckets, such as spardl's default buckets=model, ignore it)")
	flag.StringVar(&c.Metrics, "metrics", "", "write one JSON line per epoch (and a summary) to this file")
	flag.StringVar(&c.Profile, "profile", "", "for hooks that plan from measured costs (omgs): reuse the profile saved in this file when it fits the model and -workers, else measure it and save it here")
	flag.BoolVar(&c.Progress, "progress", true, "show a progress bar per epoch (launched: on rank 0, when its stderr is a terminal)")
	logLevel := flag.String("log-level", "info", "log level of the hooks' messages on stderr: debug|info|warn|error (debug: one line per bucket and call, e.g. SparDL's d, Ok-Topk's thresholds and counts)")
	logFormat := flag.String("log-format", "text", "text|json")
	flag.Parse()
	if err := setupLogging(*logLevel, *logFormat, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "vgg:", err)
		os.Exit(2)
	}

	env, err := dist.DetectEnv(dist.Overrides{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "vgg:", err)
		os.Exit(2)
	}
	name, train := "vgg", run
	if env.WorldSize > 1 {
		// One rank per process.
		name = fmt.Sprintf("vgg: rank %d", env.Rank)
		workersSet := false
		flag.Visit(func(f *flag.Flag) { workersSet = workersSet || f.Name == "workers" })
		if err := checkWorkers(&c, workersSet, env); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(2)
		}
		train = func(ctx context.Context, c config, stdout, stderr io.Writer) (*summary, error) {
			return runProcess(ctx, c, env, stdout, stderr)
		}
	}
	ctx, stop := dist.NotifyContext(context.Background(), name, nil)
	defer stop()
	if _, err := train(ctx, c, os.Stdout, os.Stderr); err != nil {
		var sig *dist.SignalError
		if errors.As(context.Cause(ctx), &sig) {
			fmt.Fprintf(os.Stderr, "%s: stopped: %v\n", name, sig)
		} else {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
		stop()
		os.Exit(1)
	}
}

// checkWorkers reconciles -workers with a launcher's world size: left out, 1 (one worker per
// process) or equal to it are fine, and c.Workers becomes the world size.
func checkWorkers(c *config, workersSet bool, env dist.Env) error {
	if workersSet && c.Workers != 1 && c.Workers != env.WorldSize {
		return fmt.Errorf("-workers %d, but %s started %d processes: one worker per process; leave -workers out or give 1 or %d",
			c.Workers, env.Source, env.WorldSize, env.WorldSize)
	}
	c.Workers = env.WorldSize
	return nil
}

// setupLogging installs the default slog handler the hooks log through.
func setupLogging(level, format string, w io.Writer) error {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		slog.SetDefault(slog.New(slog.NewTextHandler(w, opts)))
	case "json":
		slog.SetDefault(slog.New(slog.NewJSONHandler(w, opts)))
	default:
		return fmt.Errorf("-log-format %q: want text or json", format)
	}
	return nil
}

// epochResult is one line of -metrics.
type epochResult struct {
	Epoch     int     `json:"epoch"`
	Steps     int     `json:"steps"`
	TrainLoss float64 `json:"train_loss"`
	TrainAcc  float64 `json:"train_acc"`
	TestLoss  float64 `json:"test_loss"`
	TestAcc   float64 `json:"test_acc"`
	ImgPerSec float64 `json:"img_s"`
	TrainSec  float64 `json:"train_s"`
	TotalSec  float64 `json:"total_s"`
	LR        float64 `json:"lr"`
}

type summary struct {
	Config    config        `json:"config"`
	Dataset   string        `json:"dataset"`
	Kernels   string        `json:"kernels"`
	Params    int           `json:"params"`
	Epochs    []epochResult `json:"epochs"`
	FinalAcc  float64       `json:"final_test_acc"`
	TotalSec  float64       `json:"total_s"`
	Summary   bool          `json:"summary"`
	CommStats comm.Stats    `json:"comm_rank0"`
	Launcher  dist.Source   `json:"launcher,omitempty"` // who started the processes of a multi-process run
}

// run trains with c.Workers in-process ranks.
func run(ctx context.Context, c config, stdout, stderr io.Writer) (*summary, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	dir, err := datasets.EnsureCIFAR10(ctx, c.Data, stderr)
	if err != nil {
		return nil, err
	}
	train, test, err := loadData(dir, stdout)
	if err != nil {
		return nil, err
	}
	groups, err := comm.NewLocal(c.Workers)
	if err != nil {
		return nil, err
	}
	return trainRanks(ctx, c, groups, train, test, stdout, stderr, "")
}

// runProcess trains this process's rank of a multi-process job (env from dist.DetectEnv,
// c.Workers its world size): it joins the job with dist.Init, loads the data (local rank 0
// first, so that one process per host downloads) and trains like one of run's workers.
func runProcess(ctx context.Context, c config, env dist.Env, stdout, stderr io.Writer) (sum *summary, err error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	g, _, err := dist.Init(ctx, dist.Options{})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := g.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close the group: %w", cerr)
		}
	}()
	if g.Size() != c.Workers {
		return nil, fmt.Errorf("joined a group of %d ranks, expected %d", g.Size(), c.Workers)
	}
	rank := g.Rank()
	if rank != 0 {
		stdout = io.Discard
	} else if fi, err := os.Stderr.Stat(); stderr == os.Stderr && (err != nil || fi.Mode()&os.ModeCharDevice == 0) {
		c.Progress = false // a launcher's pipe: the bar's carriage returns would garble its log
	}
	// The first rank on each host finds (or downloads) the data, the others look once it has:
	// one download per host. If it fails, its goodbye ends the others' wait.
	var dir string
	first := env.LocalRank == 0
	if first {
		if dir, err = datasets.EnsureCIFAR10(ctx, c.Data, stderr); err != nil {
			err = fmt.Errorf("rank %d: %w", rank, err)
		}
	}
	if berr := comm.Barrier(ctx, g, 99); err == nil && berr != nil {
		err = fmt.Errorf("wait for the data: %w", berr)
	}
	if err != nil {
		return nil, err
	}
	if !first {
		if dir, err = datasets.EnsureCIFAR10(ctx, c.Data, stderr); err != nil {
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
	}
	train, test, err := loadData(dir, stdout)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", rank, err)
	}
	sum, err = trainRanks(ctx, c, []comm.Group{g}, train, test, stdout, stderr, env.Source)
	return sum, err
}

func (c *config) check() error {
	if c.Workers < 1 || c.Batch < 1 || c.Epochs < 1 {
		return fmt.Errorf("-workers, -batch and -epochs must be at least 1 (got %d, %d, %d)", c.Workers, c.Batch, c.Epochs)
	}
	if c.DistBN == "" {
		c.DistBN = "broadcast"
	}
	if c.DistBN != "broadcast" && c.DistBN != "reduce" {
		return fmt.Errorf("-dist-bn %q: want broadcast or reduce", c.DistBN)
	}
	if c.BucketMB < 0 {
		return fmt.Errorf("-bucket-mb %g: want a positive size in MiB, or 0 for the defaults", c.BucketMB)
	}
	_, err := hooks.Parse(c.Hook)
	return err
}

// loadData reads CIFAR-10 from dir and describes it on stdout.
func loadData(dir string, stdout io.Writer) (train, test *datasets.Images, err error) {
	train, test, err = datasets.LoadCIFAR10(dir)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(stdout, "data: %s\n%s\n%s\n", dir, train.Summary, test.Summary)
	if strings.Contains(dir, "approx") {
		fmt.Fprintln(stdout, "note: accuracy on this copy is CIFAR-10 (JPEG-degraded, 10k-train subset)")
	}
	return train, test, nil
}

// trainRanks trains the ranks of groups, this process's share of the job (all c.Workers of them
// in-process, one per process when launched), each on its own goroutine. The process that has
// rank 0 prints the results and writes -metrics; its summary is complete, the others' have no
// epochs.
func trainRanks(ctx context.Context, c config, groups []comm.Group, train, test *datasets.Images, stdout, stderr io.Writer, launcher dist.Source) (*summary, error) {
	hasRank0 := groups[0].Rank() == 0
	var metrics *json.Encoder
	if c.Metrics != "" && hasRank0 {
		f, err := os.Create(c.Metrics)
		if err != nil {
			return nil, fmt.Errorf("-metrics: %w", err)
		}
		defer f.Close()
		metrics = json.NewEncoder(f)
	}
	sum := &summary{Config: c, Dataset: train.Summary, Kernels: kernels.Impl(), Summary: true, Launcher: launcher}
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{cfg: c, group: g, train: train, test: test, stdout: stdout, stderr: stderr, metrics: metrics, sum: sum, start: start}
			if errs[i] = w.run(ctx); errs[i] != nil {
				cancel() // unblock the other ranks
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if !hasRank0 {
		return sum, nil
	}
	sum.TotalSec = time.Since(start).Seconds()
	last := sum.Epochs[len(sum.Epochs)-1]
	sum.FinalAcc = last.TestAcc
	fmt.Fprintf(stdout, "done: %s %s, %d workers × batch %d, %d epochs: test acc %.2f%%, train loss %.4f, %.1f img/s, %.0fs total\n",
		c.Model, c.Hook, c.Workers, c.Batch, c.Epochs, 100*last.TestAcc, last.TrainLoss, last.ImgPerSec, sum.TotalSec)
	if metrics != nil {
		if err := metrics.Encode(sum); err != nil {
			return nil, err
		}
	}
	return sum, nil
}

type worker struct {
	cfg         config
	group       comm.Group
	train, test *datasets.Images
	stdout      io.Writer
	stderr      io.Writer
	metrics     *json.Encoder
	sum         *summary
	start       time.Time
}

func (w *worker) run(ctx context.Context) error {
	c, g := w.cfg, w.group
	rank, world := g.Rank(), g.Size()
	traffic := g.Counters().Snapshot() // the summary counts training's traffic, not the set-up's
	model, err := models.NewVGG(c.Model, models.CIFAR10, nn.NewRand(c.Seed))
	if err != nil {
		return err
	}
	hook, err := hooks.Parse(c.Hook)
	if err != nil {
		return err
	}
	opts := []ddp.Option{ddp.WithCommHook(hook), ddp.WithBroadcastBuffers(c.DistBN == "broadcast")}
	if c.BucketMB > 0 {
		capBytes := int(c.BucketMB * (1 << 20))
		opts = append(opts, ddp.WithBucketCap(capBytes, capBytes))
	}
	if pp, ok := hook.(ddp.ProfiledPlanner); ok { // omgs plans its buckets from a measured profile
		prof, err := w.profile(ctx, model, pp)
		if err != nil {
			return err
		}
		opts = append(opts, ddp.WithProfile(prof))
		traffic = g.Counters().Snapshot() // the profile's timings are set-up, not training
	}
	dp, err := ddp.New(ctx, model, g, opts...)
	if err != nil {
		return err
	}
	opt, err := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: c.LR, Momentum: c.Momentum, WeightDecay: c.WD})
	if err != nil {
		return err
	}
	dp.SetCorrector(opt) // LGP for hooks that deliver results late (osp); no effect otherwise
	var sched optim.Schedule = optim.Constant(c.LR)
	if c.WarmupEpochs > 0 {
		sched = optim.WarmupStep{Base: c.LR, WarmupFrom: c.LR / float64(world), WarmupEpochs: c.WarmupEpochs, Gamma: 0.1}
	}
	loader, err := datasets.NewLoader(w.train, datasets.LoaderOptions{Batch: c.Batch, Rank: rank, World: world,
		Seed: c.Seed, Shuffle: true, Augment: true, DropLast: true, Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std})
	if err != nil {
		return err
	}
	evalBatch := 250
	evalLoader, err := datasets.NewLoader(w.test, datasets.LoaderOptions{Batch: evalBatch, Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std})
	if err != nil {
		return err
	}
	if rank == 0 {
		w.sum.Params = nn.NumParams(dp.Parameters())
		fmt.Fprintf(w.stdout, "model %s: %d parameters in %d tensors, %d buckets; hook %s; %d workers × batch %d; kernels %s, GOMAXPROCS %d\n",
			c.Model, w.sum.Params, len(dp.Parameters()), len(dp.Plan()), c.Hook, world, c.Batch, kernels.Impl(), runtime.GOMAXPROCS(0))
	}
	steps := loader.NumBatches()
	if c.Steps > 0 && c.Steps < steps {
		steps = c.Steps
	}
	tape := nn.NewTape()
	stat := make([]float32, 3) // loss sum, correct, samples — all-reduced for the bar
	for epoch := 0; epoch < c.Epochs; epoch++ {
		var bar *progressbar.ProgressBar
		if rank == 0 && c.Progress {
			bar = progressbar.NewOptions(steps, progressbar.OptionSetWriter(w.stderr),
				progressbar.OptionSetDescription(fmt.Sprintf("epoch %d/%d", epoch+1, c.Epochs)),
				progressbar.OptionShowCount(), progressbar.OptionSetWidth(24), progressbar.OptionThrottle(250*time.Millisecond),
				progressbar.OptionClearOnFinish())
		}
		nn.SetTraining(model, true)
		tape.SetGradEnabled(true)
		var lossSum, correct, seen float64
		epochStart := time.Now()
		step := 0
		for b, err := range loader.Epoch(ctx, epoch) {
			if err != nil {
				return err
			}
			if step == steps {
				break
			}
			lr := sched.LR(epoch, step, steps)
			opt.SetLR(lr)
			x, _ := nn.FromSlice(b.X, b.N, 3, 32, 32)
			tape.Reset()
			opt.ZeroGrad()
			logits := dp.Forward(tape.Const(x))
			loss := nn.CrossEntropy(logits, b.Y)
			if err := dp.Backward(ctx, loss); err != nil {
				return fmt.Errorf("rank %d, epoch %d, step %d: %w", rank, epoch+1, step+1, err)
			}
			if step == steps-1 { // the epoch's last step applies every late result (osp)
				if err := dp.Flush(ctx); err != nil {
					return fmt.Errorf("rank %d, epoch %d: %w", rank, epoch+1, err)
				}
			}
			opt.Step()
			lossSum += float64(loss.Item()) * float64(b.N)
			correct += float64(nn.Accuracy(logits.Value, b.Y))
			seen += float64(b.N)
			step++
			if bar != nil {
				ips := seen * float64(world) / time.Since(epochStart).Seconds()
				bar.Describe(fmt.Sprintf("epoch %d/%d loss %.3f acc %.1f%% %.0f img/s", epoch+1, c.Epochs, lossSum/seen, 100*correct/seen, ips))
				_ = bar.Add(1)
			}
		}
		trainSec := time.Since(epochStart).Seconds()
		if bar != nil {
			_ = bar.Finish()
		}
		// Training statistics over all ranks.
		stat[0], stat[1], stat[2] = float32(lossSum), float32(correct), float32(seen)
		if err := comm.AllReduce(ctx, g, 100, stat, comm.Auto); err != nil {
			return err
		}
		trainLoss, trainAcc, total := float64(stat[0])/float64(stat[2]), float64(stat[1])/float64(stat[2]), float64(stat[2])
		if _, err := dp.EndEpoch(ctx); err != nil { // epoch-adaptive hooks (osp's budget)
			return err
		}
		if c.DistBN == "reduce" {
			if err := dp.AverageBuffers(ctx); err != nil {
				return err
			}
		}
		testLoss, testAcc, err := train.Evaluate(ctx, w.group, dp, model, tape, evalLoader, w.cfg.EvalLimit, 3, 32, 32)
		if err != nil {
			return err
		}
		if rank == 0 {
			res := epochResult{Epoch: epoch + 1, Steps: step, TrainLoss: trainLoss, TrainAcc: trainAcc, TestLoss: testLoss, TestAcc: testAcc,
				ImgPerSec: total / trainSec, TrainSec: trainSec, TotalSec: time.Since(w.start).Seconds(), LR: opt.LR()}
			w.sum.Epochs = append(w.sum.Epochs, res)
			w.sum.CommStats = g.Counters().Snapshot().Sub(traffic)
			fmt.Fprintf(w.stdout, "epoch %d train_loss %.4f train_acc %.4f test_loss %.4f test_acc %.4f img_s %.1f train_s %.1f total_s %.1f\n",
				res.Epoch, res.TrainLoss, res.TrainAcc, res.TestLoss, res.TestAcc, res.ImgPerSec, res.TrainSec, res.TotalSec)
			if w.metrics != nil {
				if err := w.metrics.Encode(res); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
