package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/spargo-dl/spargo/cluster"
)

func init() {
	commands["launch"] = command{"start N local processes of a program as one job (spargo launch -h)", runLaunch}
}

const launchUsage = `usage: spargo launch -n N [-restarts K] [-timeout D] [-op-timeout D] [-secret-file F] [-grace D] -- program [args...]

Starts N processes of program on this machine as one data-parallel job, like
torchrun --standalone: each gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK=0 (one node: the ranks share this host), MASTER_ADDR=127.0.0.1, a free MASTER_PORT, SPARGO_RUN_ID, SPARGO_RESTART_COUNT and
a shared secret (a random SPARGO_SECRET per job unless -secret-file or an inherited
SPARGO_SECRET / SPARGO_SECRET_FILE gives one); cluster.Init in the program does the rest.
Output lines are prefixed with "[rank R] ". When a rank fails, the others get SIGTERM
and, after -grace, SIGKILL; the job is restarted -restarts times (SPARGO_RESTART_COUNT
tells the program which attempt it is: spargo's programs with -checkpoint DIR then
resume from DIR's latest checkpoint, or start afresh when there is none) and then launch
exits non-zero naming the rank that failed: the one the ranks' own errors blame
("peer rank 2 failed: …"), which for a stalled rank is not the first to exit, then the
first to exit and the ranks it had to stop. SIGINT or SIGTERM to launch stops the ranks
the same way. Rank 0's store listens on 127.0.0.1 only (set SPARGO_BIND to change it).

flags:
`

func runLaunch(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo launch", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprint(stdout, launchUsage)
		fs.PrintDefaults()
	}
	n := fs.Int("n", 0, "number of processes (ranks) to start")
	restarts := fs.Int("restarts", 0, "restart all processes up to this many times after a failure")
	timeout := fs.Duration("timeout", 0, "peer failure timeout given to the ranks as SPARGO_TIMEOUT (0: the ranks' default, 30s)")
	opTimeout := fs.Duration("op-timeout", 0, "per-operation timeout given to the ranks as SPARGO_OP_TIMEOUT: a live rank out of step fails the job, named (0: none)")
	secretFile := fs.String("secret-file", "", "file holding the job's shared secret, given to the ranks as SPARGO_SECRET_FILE")
	grace := fs.Duration("grace", cluster.DefaultGrace, "time between SIGTERM and SIGKILL when stopping ranks")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	prog := fs.Args()
	switch {
	case *n < 1:
		return fmt.Errorf("launch: -n must be at least 1 (got %d); see spargo launch -h", *n)
	case len(prog) == 0:
		return errors.New("launch: no program given; usage: spargo launch -n N -- program [args...]")
	}
	ctx, stop := cluster.NotifyContext(context.Background(), "launch", nil)
	defer stop()
	return cluster.Launch(ctx, cluster.LaunchConfig{
		NProc:      *n,
		Program:    prog[0],
		Args:       prog[1:],
		Restarts:   *restarts,
		Timeout:    *timeout,
		OpTimeout:  *opTimeout,
		SecretFile: *secretFile,
		Grace:      *grace,
		Stdout:     stdout,
		Stderr:     os.Stderr,
	})
}
