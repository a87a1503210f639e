package train

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
)

// Program is what Main needs from an example: its flags (registered on flag.CommandLine
// before Main parses them) and how it trains in-process or as one rank of a launched job.
type Program struct {
	// Name prefixes every message (the command's name).
	Name string
	// Flags are the program's shared training flags, checked after parsing.
	Flags *Flags
	// LogLevel and LogFormat are the -log-level and -log-format values (SetupLogging).
	LogLevel, LogFormat *string
	// Workers is -workers, reconciled with a launcher's world size.
	Workers *int
	// AfterParse, when set, runs after flag parsing with a test of which flags were given
	// (a program whose defaults depend on another flag fills them in here).
	AfterParse func(set func(flag string) bool)
	// InProcess trains with *Workers ranks in this process.
	InProcess func(ctx context.Context, stdout, stderr io.Writer) error
	// Process trains this process's rank of a job that a launcher started (env.WorldSize > 1).
	Process func(ctx context.Context, env cluster.Env, stdout, stderr io.Writer) error
}

// Main parses the command line (the program has registered its flags on
// flag.CommandLine) and trains, in-process with -workers ranks or, under a launcher
// (cluster.DetectEnv finds a world size above 1), one rank per process. It exits the process:
// 0 when training ends (or for -optim help / -schedule help), 2 on a flag error, 1
// otherwise. SIGINT and SIGTERM stop training between steps.
func Main(p Program) {
	name := p.Name
	flag.Parse()
	if p.AfterParse != nil {
		given := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
		p.AfterParse(func(name string) bool { return given[name] })
	}
	if err := p.Flags.Check(); errors.Is(err, ErrHelp) {
		fmt.Print(HelpText())
		os.Exit(0)
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	if err := SetupLogging(*p.LogLevel, *p.LogFormat, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	stdout, stderr, _ := Outputs(*p.LogFormat) // every line in -log-format
	fail := func(code int, err error) {
		_ = stdout.Flush()
		_ = stderr.Error(name, err, fmt.Sprintf("%s: %v", name, err))
		os.Exit(code)
	}
	env, err := cluster.DetectEnv(cluster.Overrides{})
	if err != nil {
		fail(2, err)
	}
	trainFn := p.InProcess
	if env.WorldSize > 1 {
		// One rank per process.
		name = fmt.Sprintf("%s: rank %d", name, env.Rank)
		workersSet := false
		flag.Visit(func(f *flag.Flag) { workersSet = workersSet || f.Name == "workers" })
		if err := checkWorkers(p.Workers, workersSet, env); err != nil {
			fail(2, err)
		}
		trainFn = func(ctx context.Context, stdout, stderr io.Writer) error { return p.Process(ctx, env, stdout, stderr) }
	}
	// The first SIGINT or SIGTERM stops the loop at its next step, after a checkpoint.
	ctx, stop := cluster.NotifyGraceful(context.Background(), name, func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		_ = stderr.Record(msg, nil, msg)
	})
	defer stop()
	if err := trainFn(ctx, stdout.Out(), stderr.Out()); err != nil {
		var sig *cluster.SignalError
		if errors.As(context.Cause(ctx), &sig) && !errors.As(err, new(*StoppedError)) {
			err = fmt.Errorf("stopped: %v", sig)
		}
		stop()
		fail(1, err)
	}
	_ = stdout.Flush()
}

// checkWorkers reconciles -workers with a launcher's world size: left out, 1 (one worker per
// process) or equal to it are fine, and *workers becomes the world size.
func checkWorkers(workers *int, workersSet bool, env cluster.Env) error {
	if workersSet && *workers != 1 && *workers != env.WorldSize {
		return fmt.Errorf("-workers %d, but %s started %d processes: one worker per process; leave -workers out or give 1 or %d",
			*workers, env.Source, env.WorldSize, env.WorldSize)
	}
	*workers = env.WorldSize
	return nil
}

// SetupLogging installs the default slog handler the hooks log through (-log-level,
// -log-format): text or JSON lines on w. Main gives a program Printers of the same format
// for its stdout and stderr (Outputs), so that with -log-format json every line is JSON.
func SetupLogging(level, format string, w io.Writer) error {
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

// JoinJob joins this process's rank of a launched job of workers ranks (cluster.Init) and
// returns its group, the writer rank 0 prints on (io.Discard on the other ranks) and
// progress as it is: rank 0 reports progress under a launcher too, as plain lines on its pipe
// (Loop.Progress draws a bar only on a terminal). The caller closes the group (CloseGroup).
func JoinJob(ctx context.Context, workers int, stdout, stderr io.Writer, progress bool) (comm.Group, io.Writer, bool, error) {
	g, _, err := cluster.Init(ctx, cluster.Options{})
	if err != nil {
		return nil, nil, false, err
	}
	if g.Size() != workers {
		g.Close()
		return nil, nil, false, fmt.Errorf("joined a group of %d ranks, expected %d", g.Size(), workers)
	}
	if g.Rank() != 0 {
		stdout = io.Discard
	}
	return g, stdout, progress, nil
}

// CloseGroup closes g at the end of a launched rank's run and keeps the run's error, if any,
// else reports the close's: defer train.CloseGroup(g, &err).
func CloseGroup(g comm.Group, err *error) {
	if cerr := g.Close(); *err == nil && cerr != nil {
		*err = fmt.Errorf("close the group: %w", cerr)
	}
}

// RunRanks is the per-rank runner: it runs rank(ctx, g) for every group on its own goroutine
// (all of a job's ranks in-process, or this process's one) and returns their distinct
// errors joined; the first failure cancels the others' context so that no rank waits for it.
func RunRanks(ctx context.Context, groups []comm.Group, rank func(ctx context.Context, g comm.Group) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() {
			if errs[i] = rank(ctx, g); errs[i] != nil {
				cancel() // unblock the other ranks
			}
		})
	}
	wg.Wait()
	// Ranks that fail alike (a flag every rank checks) report it once.
	var distinct []error
	seen := map[string]bool{}
	for _, err := range errs {
		if err != nil && !seen[err.Error()] {
			seen[err.Error()] = true
			distinct = append(distinct, err)
		}
	}
	return errors.Join(distinct...)
}

// Job runs this process's ranks of a program's run with rank 0's -metrics open: all of
// them in-process, or one launched rank.
type Job struct {
	Groups []comm.Group
	// Flags are the run's -metrics (appended to when Resume) and -plot.
	Flags  *Flags
	Resume bool
	Stdout io.Writer // where -plot's line goes
	// Start is when the run started (zero: when Run is called), for Done's seconds.
	Start time.Time
}

// Run opens -metrics in the process that has rank 0, runs rank on every group (RunRanks)
// with it (nil in the other processes: a nil *MetricsLog writes nothing), and then, in the
// process that has rank 0, calls done with the run's seconds: it prints the result and
// returns the summary that ends -metrics (nil: the run trained nothing, and the file gets no
// summary). Finish then closes the file and draws -plot.
func (j Job) Run(ctx context.Context, rank func(ctx context.Context, g comm.Group, metrics *MetricsLog) error, done func(totalSec float64) (summary any)) error {
	start := j.Start
	if start.IsZero() {
		start = time.Now()
	}
	hasRank0 := j.Groups[0].Rank() == 0
	var metrics *MetricsLog
	if hasRank0 {
		m, err := OpenMetricsLog(j.Flags.Metrics, j.Resume)
		if err != nil {
			return err
		}
		defer m.Close()
		metrics = m
	}
	err := RunRanks(ctx, j.Groups, func(ctx context.Context, g comm.Group) error { return rank(ctx, g, metrics) })
	if err != nil || !hasRank0 {
		return err
	}
	summary := done(time.Since(start).Seconds())
	if summary == nil {
		return nil
	}
	return metrics.Finish(summary, j.Flags, j.Stdout)
}
