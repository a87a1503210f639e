// Package cifar is the CIFAR-10 classification program that examples/vgg and
// examples/resnet share: its flags (Config), data, per-rank training on package train's Loop,
// evaluation, printing, -metrics, checkpoints and launchers. An example is only its defaults
// and a model constructor:
//
//	func main() {
//		cifar.Main("vgg", cifar.Config{Model: "vgg11", NewModel: newModel, Workers: 2,
//			Hook: "allreduce", Batch: 32, Epochs: 3, Flags: train.Flags{LR: 0.01, Momentum: 0.9, WD: 5e-4}})
//	}
package cifar

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/gradrec"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

// Config is a CIFAR-10 classification run: the flags of examples/vgg and
// examples/resnet, which differ only in their defaults and in NewModel. It is the "config"
// of the -metrics summary.
type Config struct {
	Data    string `json:"data"`
	Model   string `json:"model"`
	Workers int    `json:"workers"`
	Hook    string `json:"hook"`
	Batch   int    `json:"batch"`
	Epochs  int    `json:"epochs"`
	Steps   int    `json:"steps"`
	// Flags are the shared training flags (-lr -momentum -wd -optim -schedule -warmup
	// -metrics -log-every -plot).
	train.Flags
	Seed      uint64  `json:"seed"`
	EvalLimit int     `json:"eval_limit"`
	BucketMB  float64 `json:"bucket_mb"`
	DistBN    string  `json:"dist_bn"`
	Profile   string  `json:"profile,omitempty"`
	Progress  bool    `json:"-"`
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
	// ChannelsLast keeps the model's activations as [N, H, W, C]
	// (models.SetChannelsLast): faster on CPUs, the same results up to float32
	// rounding, the same checkpoints.
	ChannelsLast bool `json:"channels_last,omitempty"`
	// LogLevel and LogFormat are -log-level and -log-format (SetupLogging).
	LogLevel  string `json:"-"`
	LogFormat string `json:"-"`

	// ModelHelp is the -model flag's help: the names NewModel knows.
	ModelHelp string `json:"-"`
	// NewModel builds the model Model for CIFAR-10 (models.New's signature); required.
	NewModel func(name string, ds models.Dataset, rng *rand.Rand) (nn.Module, error) `json:"-"`
	// Saved, when set, is called on every rank after each checkpoint is saved, with its path
	// and position (train.Checkpointer.Saved): tools and tests watch a run with it
	// (examples/vgg's tests stop a rank there to test restarts).
	Saved func(path string, pos checkpoint.Position) `json:"-"`
	// CheckModel, when set, refuses a -model that NewModel does not build, without building
	// it (nil: the flag check builds the model once to find out).
	CheckModel func(name string) error `json:"-"`

	hook hooks.Config // -hook, parsed once by check
}

// Register defines the run's flags on fs; the struct's current values are the defaults.
func (c *Config) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.Data, "data", c.Data, "CIFAR-10 directory (default: $SPARGO_DATA/cifar10, then the user cache; downloaded if neither has it; see docs/data.md)")
	fs.StringVar(&c.Model, "model", c.Model, cmp.Or(c.ModelHelp, "model name"))
	fs.IntVar(&c.Workers, "workers", c.Workers, "data-parallel workers (in-process ranks); under a launcher leave it out, or give 1 or the world size")
	fs.StringVar(&c.Hook, "hook", c.Hook, "comm hook spec, e.g. allreduce:algorithm=ring (see `spargo hooks`)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "batch size per worker")
	fs.IntVar(&c.Epochs, "epochs", c.Epochs, "epochs")
	fs.IntVar(&c.Steps, "steps", c.Steps, "stop each epoch after this many steps (0: whole epoch)")
	fs.BoolVar(&c.ChannelsLast, "channels-last", c.ChannelsLast, "keep the activations channels-last, [N, H, W, C] (faster on CPUs; the same checkpoints)")
	c.Flags.Register(fs)
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed for initialisation, shuffling and augmentation")
	fs.IntVar(&c.EvalLimit, "eval-limit", c.EvalLimit, "evaluate on the first N test images (0: all)")
	fs.StringVar(&c.DistBN, "dist-bn", cmp.Or(c.DistBN, "broadcast"), "BatchNorm running statistics across ranks: broadcast (rank 0's after every step, PyTorch DDP's default) or reduce (each rank keeps its own; their mean before each evaluation, timm's --dist-bn reduce)")
	fs.Float64Var(&c.BucketMB, "bucket-mb", c.BucketMB, "DDP bucket cap in MiB, like PyTorch's bucket_cap_mb (0: ddp's defaults, a small first bucket then 25 MiB; hooks that plan their own buckets, such as spardl's default buckets=model, ignore it)")
	fs.StringVar(&c.Profile, "profile", c.Profile, "for hooks that plan from measured costs (omgs): reuse the profile saved in this file when it fits the model and -workers, else measure it and save it here")
	fs.StringVar(&c.Checkpoint, "checkpoint", c.Checkpoint, "save checkpoints into this directory at the end of every epoch (and every -checkpoint-every steps); the newest is named by DIR/latest")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "also save a checkpoint every N steps (0: only at epoch ends)")
	fs.IntVar(&c.Keep, "keep", c.Keep, "keep the newest N checkpoints (0: all)")
	fs.BoolVar(&c.Resume, "resume", c.Resume, "continue from the latest checkpoint in -checkpoint DIR, exactly where it stopped (the same flags are required; -epochs may grow); automatic when a launcher restarts the job and DIR has one")
	fs.StringVar(&c.RecordGrads, "record-grads", c.RecordGrads, "record every rank's local gradients (the comm hook's bucket inputs) as safetensors files in this directory, for spargo bench comm -grads")
	fs.IntVar(&c.RecordEvery, "record-every", cmp.Or(c.RecordEvery, 50), "with -record-grads: start a window of recorded iterations every N iterations (0: only the first window)")
	fs.IntVar(&c.RecordSteps, "record-steps", cmp.Or(c.RecordSteps, 3), "with -record-grads: consecutive iterations per window")
	fs.BoolVar(&c.Progress, "progress", c.Progress, "show a progress bar per epoch (launched: on rank 0, when its stderr is a terminal)")
	fs.StringVar(&c.LogLevel, "log-level", cmp.Or(c.LogLevel, "info"), "log level of the hooks' messages on stderr: debug|info|warn|error (debug: one line per bucket and call, e.g. SparDL's d, Ok-Topk's thresholds and counts)")
	fs.StringVar(&c.LogFormat, "log-format", cmp.Or(c.LogFormat, "text"), "text|json")
}

// Main is the main function of a CIFAR-10 example named name (examples/vgg,
// examples/resnet): it registers c's flags on flag.CommandLine (c holds the defaults),
// parses the command line, and trains, in-process with -workers ranks or, under a launcher
// (cluster.DetectEnv finds a world size above 1), one rank per process. It exits the process:
// 0 when training ends, 2 on a flag error, 1 otherwise. SIGINT and SIGTERM stop training
// between steps.
func Main(name string, c Config) {
	c.Register(flag.CommandLine)
	train.Main(train.Program{Name: name, Flags: &c.Flags, LogLevel: &c.LogLevel, LogFormat: &c.LogFormat, Workers: &c.Workers,
		InProcess: func(ctx context.Context, stdout, stderr io.Writer) error {
			_, err := Run(ctx, c, stdout, stderr)
			return err
		},
		Process: func(ctx context.Context, env cluster.Env, stdout, stderr io.Writer) error {
			_, err := RunProcess(ctx, c, env, stdout, stderr)
			return err
		}})
}

// Epoch is an epoch record of -metrics.
type Epoch struct {
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

// Summary is a run's result, and the last line of -metrics.
type Summary struct {
	Config    Config         `json:"config"`
	Dataset   string         `json:"dataset"`
	Kernels   string         `json:"kernels"`
	Params    int            `json:"params"`
	Epochs    []Epoch        `json:"epochs"`
	FinalAcc  float64        `json:"final_test_acc"`
	TotalSec  float64        `json:"total_s"`
	Summary   bool           `json:"summary"`
	CommStats comm.Stats     `json:"comm_rank0"`
	Launcher  cluster.Source `json:"launcher,omitempty"` // who started the processes of a multi-process run
}

// Run trains with c.Workers in-process ranks, each on its own goroutine.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Summary, error) {
	return c.startup().InProcess(ctx, stdout, stderr)
}

// RunProcess trains this process's rank of a multi-process job (env from
// cluster.DetectEnv, c.Workers its world size): it joins the job with cluster.Init, loads the
// data (local rank 0 first, so that one process per host downloads) and trains like one of
// Run's workers. Rank 0 prints and writes -metrics; every rank loads the data and takes
// its shard of each batch, exactly as the in-process workers do, so the run computes the
// same numbers.
func RunProcess(ctx context.Context, c Config, env cluster.Env, stdout, stderr io.Writer) (*Summary, error) {
	return c.startup().Process(ctx, env, stdout, stderr)
}

// images are the CIFAR-10 training and test sets a run loaded.
type images struct{ train, test *datasets.Images }

// startup is Run's and RunProcess's start-up on c (train.Startup): the flag check, the
// data (in-process, or launched local rank 0 first: loadLaunched) and trainRanks.
func (c *Config) startup() train.Startup[Config, images, *Summary] {
	return train.Startup[Config, images, *Summary]{Config: c, Workers: &c.Workers, Progress: &c.Progress, Resume: &c.Resume,
		Checkpoint: &c.Checkpoint, Check: c.check, Load: c.loadInProcess, LoadLaunched: c.loadLaunched, Train: trainRanks}
}

// loadInProcess finds (or downloads) the data and loads it.
func (c *Config) loadInProcess(ctx context.Context, stdout, stderr io.Writer) (images, error) {
	dir, err := datasets.Find(ctx, datasets.CIFAR10Set, c.Data, stderr)
	if err != nil {
		return images{}, err
	}
	return c.load(dir, stdout)
}

// loadLaunched loads the data of a launched rank of g: the first rank on each host finds (or
// downloads) the data, the others look once it has: one download per host. If it fails, its
// goodbye ends the others' wait.
func (c *Config) loadLaunched(ctx context.Context, g comm.Group, env cluster.Env, stdout, stderr io.Writer) (images, error) {
	rank := g.Rank()
	var dir string
	var err error
	first := env.LocalRank == 0
	if first {
		if dir, err = datasets.Find(ctx, datasets.CIFAR10Set, c.Data, stderr); err != nil {
			err = fmt.Errorf("rank %d: %w", rank, err)
		}
	}
	if berr := comm.Barrier(ctx, g, tagDataBarrier); err == nil && berr != nil {
		err = fmt.Errorf("wait for the data: %w", berr)
	}
	if err != nil {
		return images{}, err
	}
	if !first {
		if dir, err = datasets.Find(ctx, datasets.CIFAR10Set, c.Data, stderr); err != nil {
			return images{}, fmt.Errorf("rank %d: %w", rank, err)
		}
	}
	data, err := c.load(dir, stdout)
	if err != nil {
		return images{}, fmt.Errorf("rank %d: %w", rank, err)
	}
	return data, nil
}

// tagDataBarrier is the barrier's tag while the first rank of a host fetches the data.
const tagDataBarrier = 99

// check refuses bad flags before any data is looked for: the model's name first, then the
// numbers, the specs (parsed once: -hook into c.hook, -optim and -schedule into c.Flags).
func (c *Config) check() error {
	if c.NewModel == nil {
		return errors.New("cifar: Config.NewModel is nil: the program must say how to build its models")
	}
	if err := c.checkModel(); err != nil {
		return err
	}
	if err := train.AtLeast(1, train.Int("-workers", c.Workers), train.Int("-batch", c.Batch), train.Int("-epochs", c.Epochs)); err != nil {
		return err
	}
	// -steps 0 trains whole epochs, -eval-limit 0 evaluates on the whole test set.
	if err := train.AtLeast(0, train.Int("-steps", c.Steps), train.Int("-eval-limit", c.EvalLimit)); err != nil {
		return err
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
	if c.RecordGrads != "" {
		if err := (gradrec.Schedule{Every: c.RecordEvery, Steps: c.RecordSteps}).Check(); err != nil {
			return err
		}
	}
	if c.BucketMB < 0 {
		return fmt.Errorf("-bucket-mb %g: want a positive size in MiB, or 0 for the defaults", c.BucketMB)
	}
	var err error
	c.hook, err = c.Flags.CheckWithHook(c.Hook, c.Workers)
	return err
}

// checkModel refuses a -model the program does not build.
func (c *Config) checkModel() error {
	var err error
	if c.CheckModel != nil {
		err = c.CheckModel(c.Model)
	} else {
		_, err = c.NewModel(c.Model, models.CIFAR10, nn.NewRand(c.Seed))
	}
	if err != nil {
		return fmt.Errorf("-model %q: %w", c.Model, err)
	}
	return nil
}

// load reads CIFAR-10 from dir and describes it on stdout. A rank's share of the training
// set must hold at least one -batch (the last short batch is dropped).
func (c *Config) load(dir string, stdout io.Writer) (images, error) {
	trainSet, test, err := datasets.LoadCIFAR10(dir)
	if err != nil {
		return images{}, err
	}
	if share := trainSet.N / c.Workers; c.Batch > share {
		return images{}, fmt.Errorf("-batch %d is larger than a rank's share of the training data: %d of %s's %d images on each of %d workers",
			c.Batch, share, dir, trainSet.N, c.Workers)
	}
	fmt.Fprintf(stdout, "data: %s\n%s\n%s\n", dir, trainSet.Summary, test.Summary)
	if strings.Contains(dir, "approx") {
		fmt.Fprintln(stdout, "note: accuracy on this copy is CIFAR-10 (JPEG-degraded, 10k-train subset)")
	}
	return images{train: trainSet, test: test}, nil
}

// trainRanks trains the ranks of groups, this process's share of the job (all c.Workers
// of them in-process, one per process when launched), each on its own goroutine. The process
// that has rank 0 prints the results, writes -metrics and draws -plot; its summary is
// complete, the others' have no epochs.
func trainRanks(ctx context.Context, c Config, groups []comm.Group, data images, stdout, stderr io.Writer, launcher cluster.Source) (*Summary, error) {
	sum := &Summary{Config: c, Dataset: data.train.Summary, Kernels: kernels.Impl(), Summary: true, Launcher: launcher}
	start := time.Now()
	err := train.Job{Groups: groups, Flags: &c.Flags, Resume: c.Resume, Stdout: stdout, Start: start}.Run(ctx,
		func(ctx context.Context, g comm.Group, metrics *train.MetricsLog) error {
			w := &worker{cfg: c, group: g, train: data.train, test: data.test, stdout: stdout, stderr: stderr, metrics: metrics, sum: sum, start: start}
			return w.run(ctx)
		},
		func(totalSec float64) any {
			sum.TotalSec = totalSec
			if len(sum.Epochs) == 0 { // resumed after the last epoch
				fmt.Fprintf(stdout, "done: nothing left to train: the checkpoint in %s is at the end of epoch %d\n", c.Checkpoint, c.Epochs)
				return nil
			}
			last := sum.Epochs[len(sum.Epochs)-1]
			sum.FinalAcc = last.TestAcc
			_ = train.Print(stdout, "done", sum, fmt.Sprintf("done: %s %s, %d workers × batch %d, %d epochs: test acc %.2f%%, train loss %.4f, %.1f img/s, %.0fs total",
				c.Model, c.Hook, c.Workers, c.Batch, c.Epochs, 100*last.TestAcc, last.TrainLoss, last.ImgPerSec, sum.TotalSec))
			return sum
		})
	if err != nil {
		return nil, err
	}
	return sum, nil
}

// worker is one rank of a CIFAR run.
type worker struct {
	cfg         Config
	group       comm.Group
	train, test *datasets.Images
	stdout      io.Writer
	stderr      io.Writer
	metrics     *train.MetricsLog // rank 0's, with -metrics
	sum         *Summary
	start       time.Time
}

func (w *worker) run(ctx context.Context) error {
	c, g := w.cfg, w.group
	rank, world := g.Rank(), g.Size()
	model, err := c.NewModel(c.Model, models.CIFAR10, nn.NewRand(c.Seed))
	if err != nil {
		return err
	}
	if c.ChannelsLast {
		if err := models.SetChannelsLast(model, true); err != nil {
			return fmt.Errorf("-channels-last: %w", err)
		}
	}
	opts := []ddp.Option{ddp.WithBroadcastBuffers(c.DistBN == "broadcast")}
	if c.RecordGrads != "" {
		rec, err := gradrec.NewRecorder(gradrec.Config{Dir: c.RecordGrads, Schedule: gradrec.Schedule{Every: c.RecordEvery, Steps: c.RecordSteps},
			Model: c.Model, Hook: c.Hook, Params: nn.Parameters(model)})
		if err != nil {
			return err
		}
		opts = append(opts, ddp.WithBucketObserver(rec))
	}
	rep, err := train.Setup{Hook: c.hook, Flags: &c.Flags, BucketMB: c.BucketMB, Options: opts, Profile: c.Profile, Stdout: w.stdout,
		ProfileStep: func() (profile.Step, func(), error) { return w.profileStep(ctx, model) },
		Agree:       c.agreement(world, w.train, w.test)}.New(ctx, g, model)
	if err != nil {
		return err
	}
	dp, opt := rep.DDP, rep.Optimizer
	loader, err := datasets.NewLoader(w.train, TrainLoader(c.Batch, rank, world, c.Seed))
	if err != nil {
		return err
	}
	const evalBatch = 250
	evalLoader, err := datasets.NewLoader(w.test, datasets.LoaderOptions{Batch: evalBatch, Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std})
	if err != nil {
		return err
	}
	steps := loader.NumBatches()
	if c.Steps > 0 && c.Steps < steps {
		steps = c.Steps
	}
	sched, err := c.NewSchedule(c.Epochs, steps, world)
	if err != nil {
		return err
	}
	if rank == 0 {
		w.sum.Params = nn.NumParams(dp.Parameters())
		fmt.Fprintf(w.stdout, "model %s: %d parameters in %d tensors, %d buckets; hook %s; %d workers × batch %d; kernels %s, GOMAXPROCS %d\n",
			c.Model, w.sum.Params, len(dp.Parameters()), len(dp.Plan()), c.Hook, world, c.Batch, kernels.Impl(), runtime.GOMAXPROCS(0))
	}
	tape := nn.NewTape()
	loop := &train.Loop[datasets.Batch]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Schedule: sched, Epochs: c.Epochs, StepsPerEpoch: steps,
		AverageBuffers: c.DistBN == "reduce",
		Batches:        loader.EpochFrom,
		Step:           train.ClassifierStep(dp, tape, 3, 32, 32),
		EndEpoch: func(ctx context.Context, es train.EpochStats) error {
			testLoss, testAcc, err := train.Evaluate(ctx, g, dp, model, tape, evalLoader, c.EvalLimit, 3, 32, 32)
			if err != nil {
				return err
			}
			if rank != 0 {
				return nil
			}
			res := Epoch{Epoch: es.Epoch, Steps: es.Steps, TrainLoss: es.Loss, TrainAcc: es.Acc, TestLoss: testLoss, TestAcc: testAcc,
				ImgPerSec: es.Samples / es.TrainSec, TrainSec: es.TrainSec, TotalSec: time.Since(w.start).Seconds(), LR: opt.LR()}
			w.sum.Epochs = append(w.sum.Epochs, res)
			w.sum.CommStats = rep.Traffic()
			_ = train.Print(w.stdout, "epoch", res, fmt.Sprintf("epoch %d train_loss %.4f train_acc %.4f test_loss %.4f test_acc %.4f img_s %.1f train_s %.1f total_s %.1f",
				res.Epoch, res.TrainLoss, res.TrainAcc, res.TestLoss, res.TestAcc, res.ImgPerSec, res.TrainSec, res.TotalSec))
			return w.metrics.Write(res)
		},
		LogEvery: c.LogEvery,
		Start:    w.start,
	}
	if c.Checkpoint != "" {
		loop.Checkpoints = &train.Checkpointer{Dir: c.Checkpoint, Every: c.CheckpointEvery, Keep: c.Keep, Resume: c.Resume, Meta: c.checkpointMeta(world), Saved: c.Saved}
	}
	loop.Report(rank, w.metrics, c.Progress, w.stdout, w.stderr, func(pos checkpoint.Position) string {
		return fmt.Sprintf("epoch %d, step %d, iteration %d", pos.Epoch+1, pos.Step, pos.Iteration)
	})
	return loop.Run(ctx)
}

// TrainLoader is the training loader's options of the CIFAR program on rank of world:
// batch images per rank, reshuffled every epoch from seed, random crop and flip, the last
// short batch dropped, CIFAR-10's normalisation.
func TrainLoader(batch, rank, world int, seed uint64) datasets.LoaderOptions {
	return datasets.LoaderOptions{Batch: batch, Rank: rank, World: world, Seed: seed, Shuffle: true, Augment: true,
		DropLast: true, Mean: datasets.CIFAR10Mean, Std: datasets.CIFAR10Std}
}

// checkpointMeta describes the run for checkpoints: resuming requires the same model, hook
// (compared in canonical form: the same hook written differently resumes) and the flags that
// change the trajectory (-epochs may grow; -data, -eval-limit, -metrics, -log-every, -plot and
// -progress may change). The world size may differ only from a checkpoint at an epoch's end
// (checkpoint.Load: residuals are redistributed, other hook state is reset with a warning).
func (c Config) checkpointMeta(world int) checkpoint.Meta {
	cfg := c.Flags.MetaConfig()
	cfg["batch"] = strconv.Itoa(c.Batch)
	cfg["steps"] = strconv.Itoa(c.Steps)
	cfg["seed"] = strconv.FormatUint(c.Seed, 10)
	cfg["bucket_mb"] = strconv.FormatFloat(c.BucketMB, 'g', -1, 64)
	cfg["dist_bn"] = c.DistBN
	return checkpoint.Meta{Model: c.Model, Hook: c.hook.String(), World: world, Config: cfg, Canonical: c.Flags.CanonicalSpec}
}

// agreement is what every rank must share besides train.Setup's own fields: what resuming
// requires (checkpointMeta), the epochs, the collective periods (evaluation, checkpoints),
// whether the run resumes, and the data loaded (file names and record counts, not -data's
// path, which may differ between hosts).
func (c Config) agreement(world int, trainSet, test *datasets.Images) []comm.Field {
	return train.MetaFields(c.checkpointMeta(world), train.CheckpointFields(c.Checkpoint, c.CheckpointEvery, c.Resume, map[string]string{
		"epochs": strconv.Itoa(c.Epochs), "eval_limit": strconv.Itoa(c.EvalLimit), "data": trainSet.Summary + "; " + test.Summary}))
}

// profileStep makes the program's profile step (train.Setup.ProfileStep): one forward and
// backward of model on this rank's next training batch.
func (w *worker) profileStep(ctx context.Context, model nn.Module) (profile.Step, func(), error) {
	c, g := w.cfg, w.group
	loader, err := datasets.NewLoader(w.train, TrainLoader(c.Batch, g.Rank(), g.Size(), c.Seed))
	if err != nil {
		return nil, nil, err
	}
	next, stop := train.EpochCycle(ctx, loader.Epoch)
	tape := nn.NewTape()
	nn.SetTraining(model, true)
	return func(backward func(*nn.Var) error) error {
		b, err := next()
		if err != nil {
			return err
		}
		x, err := nn.FromSlice(b.X, b.N, 3, 32, 32)
		if err != nil {
			return err
		}
		tape.Reset()
		return backward(nn.CrossEntropy(model.Forward(tape.Const(x)), b.Y))
	}, stop, nil
}
