package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LaunchConfig describes a local multi-process job for Launch (what `spargo launch` runs).
type LaunchConfig struct {
	// NProc is the number of processes (ranks) to start, >= 1.
	NProc int
	// Program and Args are the command each rank runs; Program is looked up in PATH.
	Program string
	Args    []string
	// Restarts is how many times the whole set is restarted after a rank fails. Each
	// attempt gets a new MASTER_PORT and SPARGO_RESTART_COUNT = attempt number, so a program
	// can resume from its latest checkpoint.
	Restarts int
	// Timeout, when > 0, is given to the ranks as SPARGO_TIMEOUT: how long a rank waits for
	// a silent peer before failing with an error naming it.
	Timeout time.Duration
	// OpTimeout, when > 0, is given to the ranks as SPARGO_OP_TIMEOUT: how long an operation
	// with a live peer may wait before the group fails naming it (Options.OpTimeout).
	OpTimeout time.Duration
	// SecretFile, when set, is given to the ranks as SPARGO_SECRET_FILE. Otherwise a
	// SPARGO_SECRET or SPARGO_SECRET_FILE already in Env is kept (an empty one counts as
	// none), and failing that each job gets a fresh random secret in SPARGO_SECRET. The ranks'
	// MASTER_ADDR is 127.0.0.1, so rank 0's store listens on loopback only unless SPARGO_BIND
	// in Env says otherwise.
	SecretFile string
	// Grace is how long stopped ranks get between SIGTERM and SIGKILL (0 = 10 s).
	Grace time.Duration
	// Env is the ranks' base environment (nil = os.Environ()). Variables Launch sets
	// replace any of the same name in it.
	Env []string
	// Stdout and Stderr receive the ranks' output, each line prefixed with "[rank R] "
	// (nil = os.Stdout, os.Stderr).
	Stdout, Stderr io.Writer
	// Logf receives the launcher's own messages (nil = Stderr with a "[launch] " prefix).
	Logf func(format string, args ...any)
}

// DefaultGrace is how long stopped ranks get between SIGTERM and SIGKILL.
const DefaultGrace = 10 * time.Second

// RankError reports the rank whose failure ended a launched job.
type RankError struct {
	Rank    int
	Attempt int // 0 for the first attempt
	Err     error
	// Also are the ranks that failed on their own right after Rank, before the launcher
	// stopped the rest, in the order observed. When ranks fail within a millisecond of one
	// another (one dies, its peers notice), the first observed is not always the one that
	// failed first: look at all of them, and at Blamed.
	Also []RankFailure
	// Blamed is the rank the ranks' own output says failed (-1: none said): the rank most
	// ranks name in a comm.PeerError ("peer rank 2 failed: …") or a failed checkpoint save
	// ("rank 0 failed to save its part"). A stalled or partitioned rank does not exit by
	// itself, so it is often not Rank; a rank that cannot write often exits after the peers
	// it told. BlamedBy are the ranks that named it and Cause what the first one said.
	Blamed   int
	BlamedBy []int
	Cause    string
	// Stopped are the ranks still running when the launcher stopped them (SIGTERM).
	Stopped []int
}

// RankFailure is one rank's exit error.
type RankFailure struct {
	Rank int
	Err  error
}

func (e *RankError) Unwrap() error { return e.Err }

// variables that Launch sets (or removes) in every rank's environment; inherited values of
// these would describe some other job.
var launchVars = []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
	"GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
	"TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
	"SPARGO_RESTART_COUNT", "SPARGO_RUN_ID", "SPARGO_MASTER_ADDR", "SPARGO_MASTER_PORT"}

// Launch runs cfg.NProc copies of cfg.Program on this machine as one job, the way torchrun
// --standalone does: each gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK=0
// and GROUP_WORLD_SIZE=1 (its node: all ranks share it), MASTER_ADDR=127.0.0.1, a free MASTER_PORT, SPARGO_RUN_ID, SPARGO_RESTART_COUNT and the
// secret, so cluster.Init in the program finds its place. Their output lines are prefixed with
// the rank. When a rank exits with an error, the others get SIGTERM 200 ms later (ranks that
// fail on their own meanwhile are recorded with it) and SIGKILL after cfg.Grace more; then the
// job is restarted (cfg.Restarts) or Launch returns a *RankError naming the failed ranks. When
// ctx is cancelled, the ranks are stopped the same way and ctx's cause is returned. The
// error names the rank the ranks' own output blames (RankError.Blamed), the first to exit and
// the ranks the launcher stopped. Launch
// returns nil when every rank exits 0.
func Launch(ctx context.Context, cfg LaunchConfig) error {
	if cfg.NProc < 1 {
		return fmt.Errorf("dist: launch: %d processes, want >= 1", cfg.NProc)
	}
	if cfg.Restarts < 0 {
		return fmt.Errorf("dist: launch: %d restarts, want >= 0", cfg.Restarts)
	}
	if cfg.Program == "" {
		return errors.New("dist: launch: no program to run")
	}
	program, err := exec.LookPath(cfg.Program)
	if err != nil {
		return fmt.Errorf("dist: launch: %w", err)
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	stdout, stderr := &lockedWriter{w: cfg.Stdout}, &lockedWriter{w: cfg.Stderr}
	if cfg.Stdout == cfg.Stderr {
		stderr = stdout
	}
	if cfg.Logf == nil {
		cfg.Logf = func(format string, args ...any) {
			stderr.Write([]byte("[launch] " + fmt.Sprintf(format, args...) + "\n"))
		}
	}
	base, secretEnv, err := launchBaseEnv(cfg)
	if err != nil {
		return err
	}
	runID := "launch-" + randomHex(6)
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return fmt.Errorf("dist: launch: find a free MASTER_PORT: %w", err)
		}
		env := append(base[:len(base):len(base)], secretEnv...)
		env = append(env,
			"WORLD_SIZE="+strconv.Itoa(cfg.NProc),
			"LOCAL_WORLD_SIZE="+strconv.Itoa(cfg.NProc),
			"GROUP_RANK=0", "GROUP_WORLD_SIZE=1", // one node, as torchrun --standalone says
			"MASTER_ADDR=127.0.0.1",
			"MASTER_PORT="+strconv.Itoa(port),
			"SPARGO_RUN_ID="+runID,
			"SPARGO_RESTART_COUNT="+strconv.Itoa(attempt))
		if cfg.Timeout > 0 {
			env = append(env, "SPARGO_TIMEOUT="+cfg.Timeout.String())
		}
		if cfg.OpTimeout > 0 {
			env = append(env, "SPARGO_OP_TIMEOUT="+cfg.OpTimeout.String())
		}
		err = runAttempt(ctx, cfg, program, env, stdout, stderr, attempt)
		var rankErr *RankError
		if !errors.As(err, &rankErr) || attempt >= cfg.Restarts || ctx.Err() != nil {
			return err
		}
		cfg.Logf("%v; restarting all %d processes (restart %d of %d)", err, cfg.NProc, attempt+1, cfg.Restarts)
	}
}

// launchBaseEnv is cfg.Env without the variables Launch sets, and the secret variable to add.
func launchBaseEnv(cfg LaunchConfig) (base, secret []string, err error) {
	var inheritedSecret []string
	for _, kv := range cfg.Env {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "SPARGO_SECRET" || name == "SPARGO_SECRET_FILE":
			if _, v, _ := strings.Cut(kv, "="); strings.TrimSpace(v) != "" { // set but empty counts as none
				inheritedSecret = append(inheritedSecret, kv)
			}
		case !contains(launchVars, name):
			base = append(base, kv)
		}
	}
	switch {
	case cfg.SecretFile != "":
		if _, err := readSecretFile(cfg.SecretFile); err != nil {
			return nil, nil, fmt.Errorf("dist: launch: %w", err)
		}
		secret = []string{"SPARGO_SECRET_FILE=" + cfg.SecretFile}
	case len(inheritedSecret) > 0:
		secret = inheritedSecret
	default:
		secret = []string{"SPARGO_SECRET=" + randomHex(32)}
	}
	return base, secret, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runAttempt starts every rank, waits for them and stops them all when one fails or ctx ends.
func runAttempt(ctx context.Context, cfg LaunchConfig, program string, env []string, stdout, stderr *lockedWriter, attempt int) error {
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, cfg.NProc)
	procs := make([]*exec.Cmd, 0, cfg.NProc)
	stop := func() {
		for _, p := range procs {
			signalProcessGroup(p, sigTerm)
		}
	}
	// The ranks write into pipes of ours, not through exec's copying goroutines, so a rank's
	// Wait returns the moment it exits: the order of exits is then the order the ranks died
	// in, and the first failure reported is the rank that failed first, not a peer that
	// noticed it a millisecond later.
	var output outputCopier
	defer output.finish(cfg.Grace)
	blamed := newBlame()
	running := map[int]bool{}
	for r := range cfg.NProc {
		cmd := exec.Command(program, cfg.Args...)
		cmd.Env = append(env[:len(env):len(env)], "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r))
		prefix := fmt.Sprintf("[rank %d] ", r)
		line := func(l []byte) { blamed.observe(r, l) }
		var err error
		if cmd.Stdout, err = output.pipe(&prefixWriter{w: stdout, prefix: prefix, line: line}); err == nil {
			cmd.Stderr, err = output.pipe(&prefixWriter{w: stderr, prefix: prefix, line: line})
		}
		if err == nil {
			setProcessGroup(cmd)
			err = cmd.Start()
		}
		output.started()
		if err != nil {
			stop()
			for _, p := range procs {
				p.Wait()
			}
			return fmt.Errorf("dist: launch: start rank %d: %w", r, err)
		}
		procs = append(procs, cmd)
		running[r] = true
		go func() { exits <- exit{r, cmd.Wait()} }()
	}

	// After the first failure, exits during failureWindow are failures of their own (often
	// peers that noticed it), not effects of our SIGTERM: they are reported with it.
	var failure *RankError
	var stopErr error
	var window, kill <-chan time.Time
	done := ctx.Done()
	stopAll := func() {
		window = nil
		if failure != nil {
			failure.Stopped = slices.Sorted(maps.Keys(running))
		}
		stop()
		kill = time.After(cfg.Grace)
	}
	for remaining := cfg.NProc; remaining > 0; {
		select {
		case e := <-exits:
			remaining--
			delete(running, e.rank)
			switch {
			case e.err == nil:
			case failure == nil && stopErr == nil:
				failure = &RankError{Rank: e.rank, Attempt: attempt, Err: e.err, Blamed: -1}
				if remaining > 0 {
					cfg.Logf("rank %d failed (%v); stopping the other ranks", e.rank, e.err)
					window = time.After(failureWindow)
				}
			case window != nil:
				failure.Also = append(failure.Also, RankFailure{Rank: e.rank, Err: e.err})
			}
		case <-window:
			stopAll()
		case <-done:
			done = nil
			if failure == nil && stopErr == nil {
				stopErr = fmt.Errorf("dist: launch: %w; stopped all ranks", context.Cause(ctx))
				stopAll()
			}
		case <-kill:
			kill = nil
			cfg.Logf("ranks still running %v after SIGTERM; sending SIGKILL", cfg.Grace)
			for _, p := range procs {
				signalProcessGroup(p, sigKill)
			}
		}
	}
	if failure != nil {
		output.finish(cfg.Grace) // every line read, for the verdict
		failure.Blamed, failure.BlamedBy, failure.Cause = blamed.verdict()
		return failure
	}
	return stopErr
}

// failureWindow is how long Launch waits after a rank fails before stopping the others: ranks
// that fail in it failed on their own and are named in the error. A rank's peers notice its
// death within a millisecond or so, and the order in which the launcher observes exits that
// close together is not the order they happened in.
const failureWindow = 200 * time.Millisecond

// outputCopier moves the ranks' output from pipes into prefixWriters.
type outputCopier struct {
	readers, writers []*os.File // writers: the ranks' ends, closed here once started
	copying          sync.WaitGroup
	flush            []*prefixWriter
}

// pipe returns the write end of a new pipe whose output goes to w.
func (o *outputCopier) pipe(w *prefixWriter) (*os.File, error) {
	r, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	o.readers, o.writers, o.flush = append(o.readers, r), append(o.writers, pw), append(o.flush, w)
	o.copying.Go(func() { io.Copy(w, r) })
	return pw, nil
}

// started closes this process's copies of the write ends, so the readers see EOF when the
// rank (and whatever it started) has exited.
func (o *outputCopier) started() {
	for _, w := range o.writers {
		w.Close()
	}
	o.writers = nil
}

// finish waits for the output to drain, at most grace (a grandchild may hold a pipe open),
// and flushes unterminated last lines.
func (o *outputCopier) finish(grace time.Duration) {
	o.started()
	drained := make(chan struct{})
	go func() { o.copying.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(grace):
		for _, r := range o.readers {
			r.Close()
		}
		<-drained
	}
	for _, r := range o.readers {
		r.Close()
	}
	for _, w := range o.flush {
		w.Flush()
	}
}

// freePort asks the kernel for a free TCP port on the loopback interface. Another program
// could take it before rank 0 binds it; the window is short.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails on supported platforms
	return hex.EncodeToString(b)
}

// lockedWriter serializes whole-line writes of several ranks to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// prefixWriter puts prefix in front of every line and hands complete lines to w, so lines of
// different ranks never interleave mid-line. A line longer than maxPartialLine is passed on in
// pieces, each with the prefix.
type prefixWriter struct {
	w       io.Writer
	prefix  string
	line    func([]byte) // when set, sees every complete line (without its newline)
	mu      sync.Mutex
	partial []byte
}

const maxPartialLine = 64 << 10

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(b)
	var out []byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.partial = append(p.partial, b...)
			if len(p.partial) >= maxPartialLine {
				out = append(append(append(out, p.prefix...), p.partial...), '\n')
				p.partial = p.partial[:0]
			}
			break
		}
		out = append(append(append(out, p.prefix...), p.partial...), b[:i+1]...)
		if p.line != nil {
			p.line(append(p.partial, b[:i]...))
		}
		p.partial = p.partial[:0]
		b = b[i+1:]
	}
	if len(out) > 0 {
		if _, err := p.w.Write(out); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// Flush writes an unterminated last line.
func (p *prefixWriter) Flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.partial) > 0 {
		p.w.Write(append(append([]byte(p.prefix), p.partial...), '\n'))
		p.partial = nil
	}
}
