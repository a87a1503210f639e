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
//	go run ./examples/vgg -checkpoint ck -checkpoint-every 100   # save at every epoch end and every 100 steps
//	go run ./examples/vgg -checkpoint ck -resume -epochs 5       # continue exactly where ck/latest stopped
//	go run ./examples/vgg -record-grads /tmp/grads -record-every 50 -record-steps 3   # for spargo bench comm -grads
//
// -resume needs the flags of the saved run (model, hook, workers, batch, steps, lr, momentum,
// wd, seed, warmup, bucket-mb, dist-bn; -epochs may grow) and appends to -metrics. With -hook
// omgs, give -profile FILE so that the resumed run plans the same buckets.
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
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/dist"
	"github.com/spargo-dl/spargo/gradrec"
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
	// Checkpoint is the checkpoint directory; CheckpointEvery saves every N steps besides
	// each epoch's end; Keep keeps the newest Keep; Resume continues from the latest.
	Checkpoint      string `json:"checkpoint,omitempty"`
	CheckpointEvery int    `json:"checkpoint_every,omitempty"`
	Keep            int    `json:"keep,omitempty"`
	Resume          bool   `json:"resume,omitempty"`
	// RecordGrads, when set, records every rank's bucket inputs (local gradients before
	// communication) at the iterations RecordEvery/RecordSteps select (gradrec.Schedule), for
	// `spargo bench comm -grads DIR`.
	RecordGrads string `json:"record_grads,omitempty"`
	RecordEvery int    `json:"record_every,omitempty"`
	RecordSteps int    `json:"record_steps,omitempty"`

	// newModel, when set (tests), builds the model instead of models.NewVGG(Model).
	newModel func(rng *rand.Rand) (nn.Module, error)
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
	flag.StringVar(&c.Checkpoint, "checkpoint", "", "save checkpoints into this directory at the end of every epoch (and every -checkpoint-every steps); the newest is named by DIR/latest")
	flag.IntVar(&c.CheckpointEvery, "checkpoint-every", 0, "also save a checkpoint every N steps (0: only at epoch ends)")
	flag.IntVar(&c.Keep, "keep", 3, "keep the newest N checkpoints (0: all)")
	flag.BoolVar(&c.Resume, "resume", false, "continue from the latest checkpoint in -checkpoint DIR, exactly where it stopped (the same flags are required; -epochs may grow)")
	flag.StringVar(&c.RecordGrads, "record-grads", "", "record every rank's local gradients (the comm hook's bucket inputs) as safetensors files in this directory, for spargo bench comm -grads")
	flag.IntVar(&c.RecordEvery, "record-every", 50, "with -record-grads: start a window of recorded iterations every N iterations (0: only the first window)")
	flag.IntVar(&c.RecordSteps, "record-steps", 3, "with -record-grads: consecutive iterations per window")
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
	name, trainFn := "vgg", run
	if env.WorldSize > 1 {
		// One rank per process.
		name = fmt.Sprintf("vgg: rank %d", env.Rank)
		workersSet := false
		flag.Visit(func(f *flag.Flag) { workersSet = workersSet || f.Name == "workers" })
		if err := checkWorkers(&c, workersSet, env); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(2)
		}
		trainFn = func(ctx context.Context, c config, stdout, stderr io.Writer) (*summary, error) {
			return runProcess(ctx, c, env, stdout, stderr)
		}
	}
	ctx, stop := dist.NotifyContext(context.Background(), name, nil)
	defer stop()
	if _, err := trainFn(ctx, c, os.Stdout, os.Stderr); err != nil {
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
	if c.CheckpointEvery < 0 || c.Keep < 0 {
		return fmt.Errorf("-checkpoint-every %d, -keep %d: want 0 or more", c.CheckpointEvery, c.Keep)
	}
	if (c.Resume || c.CheckpointEvery > 0) && c.Checkpoint == "" {
		return fmt.Errorf("-resume and -checkpoint-every need -checkpoint DIR")
	}
	if c.BucketMB < 0 {
		return fmt.Errorf("-bucket-mb %g: want a positive size in MiB, or 0 for the defaults", c.BucketMB)
	}
	if c.RecordGrads != "" {
		if err := (gradrec.Schedule{Every: c.RecordEvery, Steps: c.RecordSteps}).Check(); err != nil {
			return err
		}
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
func trainRanks(ctx context.Context, c config, groups []comm.Group, trainSet, test *datasets.Images, stdout, stderr io.Writer, launcher dist.Source) (*summary, error) {
	hasRank0 := groups[0].Rank() == 0
	var metrics *json.Encoder
	if c.Metrics != "" && hasRank0 {
		f, err := train.OpenMetrics(c.Metrics, c.Resume) // appended to on -resume
		if err != nil {
			return nil, err
		}
		defer f.Close()
		metrics = json.NewEncoder(f)
	}
	sum := &summary{Config: c, Dataset: trainSet.Summary, Kernels: kernels.Impl(), Summary: true, Launcher: launcher}
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{cfg: c, group: g, train: trainSet, test: test, stdout: stdout, stderr: stderr, metrics: metrics, sum: sum, start: start}
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
	if len(sum.Epochs) == 0 { // resumed after the last epoch
		fmt.Fprintf(stdout, "done: nothing left to train: the checkpoint in %s is at the end of epoch %d\n", c.Checkpoint, c.Epochs)
		return sum, nil
	}
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
	var model nn.Module
	var err error
	if c.newModel != nil {
		model, err = c.newModel(nn.NewRand(c.Seed))
	} else {
		model, err = models.NewVGG(c.Model, models.CIFAR10, nn.NewRand(c.Seed))
	}
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
	if c.RecordGrads != "" {
		rec, err := gradrec.NewRecorder(gradrec.Config{Dir: c.RecordGrads, Schedule: gradrec.Schedule{Every: c.RecordEvery, Steps: c.RecordSteps},
			Model: c.Model, Hook: c.Hook, Params: nn.Parameters(model)})
		if err != nil {
			return err
		}
		opts = append(opts, ddp.WithBucketObserver(rec))
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
	loop := &train.Loop[datasets.Batch]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Schedule: sched, Epochs: c.Epochs, StepsPerEpoch: steps,
		AverageBuffers: c.DistBN == "reduce",
		Batches:        loader.EpochFrom,
		Step: func(ctx context.Context, b datasets.Batch) (train.StepResult, error) {
			x, _ := nn.FromSlice(b.X, b.N, 3, 32, 32)
			tape.Reset()
			tape.SetGradEnabled(true)
			logits := dp.Forward(tape.Const(x))
			loss := nn.CrossEntropy(logits, b.Y)
			if err := dp.Backward(ctx, loss); err != nil {
				return train.StepResult{}, err
			}
			return train.StepResult{Loss: float64(loss.Item()), Correct: float64(nn.Accuracy(logits.Value, b.Y)), N: b.N}, nil
		},
		EndEpoch: func(ctx context.Context, es train.EpochStats) error {
			testLoss, testAcc, err := train.Evaluate(ctx, g, dp, model, tape, evalLoader, c.EvalLimit, 3, 32, 32)
			if err != nil {
				return err
			}
			if rank != 0 {
				return nil
			}
			res := epochResult{Epoch: es.Epoch, Steps: es.Steps, TrainLoss: es.Loss, TrainAcc: es.Acc, TestLoss: testLoss, TestAcc: testAcc,
				ImgPerSec: es.Samples / es.TrainSec, TrainSec: es.TrainSec, TotalSec: time.Since(w.start).Seconds(), LR: opt.LR()}
			w.sum.Epochs = append(w.sum.Epochs, res)
			w.sum.CommStats = g.Counters().Snapshot().Sub(traffic)
			fmt.Fprintf(w.stdout, "epoch %d train_loss %.4f train_acc %.4f test_loss %.4f test_acc %.4f img_s %.1f train_s %.1f total_s %.1f\n",
				res.Epoch, res.TrainLoss, res.TrainAcc, res.TestLoss, res.TestAcc, res.ImgPerSec, res.TrainSec, res.TotalSec)
			if w.metrics != nil {
				return w.metrics.Encode(res)
			}
			return nil
		},
	}
	if rank == 0 && c.Progress {
		loop.Progress = w.stderr
	}
	if c.Checkpoint != "" {
		loop.Checkpoints = &train.Checkpointer{Dir: c.Checkpoint, Every: c.CheckpointEvery, Keep: c.Keep, Resume: c.Resume, Meta: c.checkpointMeta(world)}
		if rank == 0 {
			loop.Checkpoints.Saved = func(path string, pos checkpoint.Position) {
				fmt.Fprintf(w.stdout, "checkpoint %s (epoch %d, step %d, iteration %d)\n", path, pos.Epoch+1, pos.Step, pos.Iteration)
			}
		}
	}
	return loop.Run(ctx)
}

// checkpointMeta describes the run for checkpoints: resuming requires the same model, hook,
// world size and the flags that change the trajectory (-epochs may grow; -data, -eval-limit,
// -metrics and -progress may change).
func (c config) checkpointMeta(world int) checkpoint.Meta {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return checkpoint.Meta{Model: c.Model, Hook: c.Hook, World: world, Config: map[string]string{
		"batch": strconv.Itoa(c.Batch), "steps": strconv.Itoa(c.Steps), "lr": f(c.LR), "momentum": f(c.Momentum), "wd": f(c.WD),
		"seed": strconv.FormatUint(c.Seed, 10), "warmup": strconv.Itoa(c.WarmupEpochs), "bucket_mb": f(c.BucketMB), "dist_bn": c.DistBN,
	}}
}
