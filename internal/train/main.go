package train

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/spargo-dl/spargo/dist"
)

// program is what runMain needs of a training program whose flags are registered on
// flag.CommandLine: its shared flags, its logging flags, its -workers, and how it trains
// in-process (all ranks as goroutines) and as one rank of a launched job.
type program struct {
	name                string
	flags               *Flags
	logLevel, logFormat *string
	workers             *int
	// afterParse, when set, runs after flag parsing with a test of which flags were given.
	afterParse func(set func(flag string) bool)
	inProcess  func(ctx context.Context, stdout, stderr io.Writer) error
	launched   func(ctx context.Context, env dist.Env, stdout, stderr io.Writer) error
}

// runMain parses the command line and trains, in-process with -workers ranks or, under a
// launcher (dist.DetectEnv finds a world size above 1), one rank per process. It exits the
// process: 0 when training ends, 2 on a flag error, 1 otherwise. SIGINT and SIGTERM stop
// training between steps.
func runMain(p program) {
	flag.Parse()
	if p.afterParse != nil {
		given := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
		p.afterParse(func(name string) bool { return given[name] })
	}
	name := p.name
	if err := p.flags.Check(); errors.Is(err, ErrHelp) {
		fmt.Print(HelpText())
		os.Exit(0)
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	if err := SetupLogging(*p.logLevel, *p.logFormat, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	env, err := dist.DetectEnv(dist.Overrides{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	trainFn := p.inProcess
	if env.WorldSize > 1 {
		// One rank per process.
		name = fmt.Sprintf("%s: rank %d", name, env.Rank)
		workersSet := false
		flag.Visit(func(f *flag.Flag) { workersSet = workersSet || f.Name == "workers" })
		if err := checkWorkers(p.workers, workersSet, env); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(2)
		}
		trainFn = func(ctx context.Context, stdout, stderr io.Writer) error { return p.launched(ctx, env, stdout, stderr) }
	}
	ctx, stop := dist.NotifyContext(context.Background(), name, nil)
	defer stop()
	if err := trainFn(ctx, os.Stdout, os.Stderr); err != nil {
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
// process) or equal to it are fine, and *workers becomes the world size.
func checkWorkers(workers *int, workersSet bool, env dist.Env) error {
	if workersSet && *workers != 1 && *workers != env.WorldSize {
		return fmt.Errorf("-workers %d, but %s started %d processes: one worker per process; leave -workers out or give 1 or %d",
			*workers, env.Source, env.WorldSize, env.WorldSize)
	}
	*workers = env.WorldSize
	return nil
}
