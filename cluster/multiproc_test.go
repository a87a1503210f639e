package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// Multi-process tests: P copies of this test binary (see helper_test.go) form one job over
// loopback TCP through Init, exactly as a user's program would under spargo launch, torchrun,
// Slurm or mpirun. The parent starts them with the environment a launcher gives, collects
// their results from files and compares with an in-process reference.

// The model and data of ddp/ddp_test.go's TestDDPEquivalentToSingleProcess.

// smallNet is a CNN without BatchNorm, so P workers on B samples each compute exactly the
// gradient of one worker on P·B samples.
func smallNet(seed uint64) nn.Module {
	rng := nn.NewRand(seed)
	m := nn.NewSequential(
		nn.NewConv2d(3, 8, 3, 1, 1, true, rng), nn.ReLU{}, nn.MaxPool2d{Kernel: 2},
		nn.NewConv2d(8, 16, 3, 1, 1, true, rng), nn.ReLU{}, nn.AvgPool2d{Kernel: 2},
		nn.Flatten{}, nn.NewLinear(16*2*2, 32, true, rng), nn.ReLU{}, nn.NewLinear(32, 5, true, rng))
	nn.Parameters(m)
	return m
}

func syntheticBatch(seed uint64, n int) (*nn.Tensor, []int) {
	rng := nn.NewRand(seed)
	x := nn.NewTensor(n, 3, 8, 8)
	for i := range x.Data {
		x.Data[i] = float32(rng.NormFloat64())
	}
	y := make([]int, n)
	for i := range y {
		y[i] = rng.IntN(5)
	}
	return x, y
}

func paramHash(ps []*nn.Param) uint64 {
	h := fnv.New64a()
	for _, p := range ps {
		for _, v := range p.Value.Data {
			b := math.Float32bits(v)
			h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
		}
	}
	return h.Sum64()
}

const ddpSteps, ddpBatch = 20, 4

var ddpSGD = optim.SGDConfig{LR: 0.05, Momentum: 0.9, WeightDecay: 5e-4}

// referenceParams trains one process on the concatenated batch of P·B, as the ddp test does.
func referenceParams(t *testing.T, p int) [][]float32 {
	t.Helper()
	ref := smallNet(1)
	params := nn.Parameters(ref)
	opt, err := optim.NewSGD(params, ddpSGD)
	if err != nil {
		t.Fatal(err)
	}
	tape := nn.NewTape()
	for s := range ddpSteps {
		x, y := syntheticBatch(uint64(100+s), p*ddpBatch)
		tape.Reset()
		opt.ZeroGrad()
		if err := tape.Backward(nn.CrossEntropy(ref.Forward(tape.Const(x)), y)); err != nil {
			t.Fatal(err)
		}
		opt.Step()
	}
	out := make([][]float32, len(params))
	for i, p := range params {
		out[i] = p.Value.Data
	}
	return out
}

// ddpResult is what a rank of the "ddp" role writes to $OUT_DIR/rank<R>.json.
type ddpResult struct {
	Rank, WorldSize int
	Source          Source
	AgentStore      bool
	Hashes          []uint64    // parameter hash after every step
	Params          [][]float32 // final parameters
}

// trainDDP runs the ddp test's data-parallel loop on g; steps < 0 trains until ctx ends or a
// step fails, calling onStep after each step.
func trainDDP(ctx context.Context, g comm.Group, steps int, onStep func(step int)) (ddpResult, error) {
	res := ddpResult{Rank: g.Rank(), WorldSize: g.Size()}
	p, rank := g.Size(), g.Rank()
	// Ranks start from different seeds: ddp.New must broadcast rank 0's weights.
	m := smallNet(uint64(1 + 7*rank))
	dp, err := ddp.New(ctx, m, g, ddp.WithBucketCap(2048, 8192))
	if err != nil {
		return res, err
	}
	opt, err := optim.NewSGD(dp.Parameters(), ddpSGD)
	if err != nil {
		return res, err
	}
	tape := nn.NewTape()
	for s := 0; steps < 0 || s < steps; s++ {
		if err := ctx.Err(); err != nil {
			return res, context.Cause(ctx)
		}
		x, y := syntheticBatch(uint64(100+s%ddpSteps), p*ddpBatch)
		per := x.Len() / p
		xr, err := nn.FromSlice(x.Data[rank*per:(rank+1)*per], ddpBatch, 3, 8, 8)
		if err != nil {
			return res, err
		}
		tape.Reset()
		opt.ZeroGrad()
		if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(xr)), y[rank*ddpBatch:(rank+1)*ddpBatch])); err != nil {
			return res, fmt.Errorf("step %d: %w", s+1, err)
		}
		opt.Step()
		res.Hashes = append(res.Hashes, paramHash(dp.Parameters()))
		if onStep != nil {
			onStep(s + 1)
		}
	}
	if len(dp.Plan()) < 2 {
		return res, fmt.Errorf("want several buckets, got %d", len(dp.Plan()))
	}
	for _, p := range dp.Parameters() {
		res.Params = append(res.Params, p.Value.Data)
	}
	return res, nil
}

// counterResult is what a rank of the "counters" role writes: the traffic of each operation.
type counterResult struct {
	Rank  int
	Stats []comm.Stats
}

// collectiveSequence runs a fixed mix of collectives and returns each one's traffic on g.
// Sizes cover the small-message paths, uneven blocks and several algorithms.
func collectiveSequence(ctx context.Context, g comm.Group) ([]comm.Stats, error) {
	var stats []comm.Stats
	run := func(name string, op func(tag uint32) error) error {
		before := g.Counters().Snapshot()
		if err := op(uint32(len(stats) + 1)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		stats = append(stats, g.Counters().Snapshot().Sub(before))
		return nil
	}
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(g.Rank()*n + i)
		}
		return v
	}
	p := g.Size()
	ops := []struct {
		name string
		op   func(tag uint32) error
	}{
		{"allreduce 100 auto", func(tag uint32) error { return comm.AllReduce(ctx, g, tag, vec(100), comm.Auto) }},
		{"allreduce 100003 auto", func(tag uint32) error { return comm.AllReduce(ctx, g, tag, vec(100003), comm.Auto) }},
		{"allreduce 50001 ring", func(tag uint32) error { return comm.AllReduce(ctx, g, tag, vec(50001), comm.Ring) }},
		{"allreduce 50001 rabenseifner", func(tag uint32) error { return comm.AllReduce(ctx, g, tag, vec(50001), comm.Rabenseifner) }},
		{"allreduce 1000 recursive doubling", func(tag uint32) error {
			return comm.AllReduce(ctx, g, tag, vec(1000), comm.RecursiveDoubling)
		}},
		{"broadcast 777 from 1", func(tag uint32) error { return comm.Broadcast(ctx, g, tag, 1, vec(777)) }},
		{"allgather 1000 auto", func(tag uint32) error {
			return comm.AllGather(ctx, g, tag, vec(1000), make([]float32, 1000*p), comm.Auto)
		}},
		{"allgather 333 bruck", func(tag uint32) error {
			return comm.AllGather(ctx, g, tag, vec(333), make([]float32, 333*p), comm.Bruck)
		}},
		{"allgatherv", func(tag uint32) error { _, err := comm.AllGatherV(ctx, g, tag, vec(10+37*g.Rank())); return err }},
		{"allgather bytes", func(tag uint32) error {
			_, err := comm.AllGatherBytes(ctx, g, tag, make([]byte, 5+g.Rank()))
			return err
		}},
		{"barrier", func(tag uint32) error { return comm.Barrier(ctx, g, tag) }},
	}
	for _, o := range ops {
		if err := run(o.name, o.op); err != nil {
			return stats, err
		}
	}
	return stats, nil
}

func init() {
	// ddp: Init, then the ddp equivalence test's training; HOLD_FILE (optional) makes the
	// ranks print "ready" and wait for that file before training.
	helperRoles["ddp"] = func() int {
		return helperMain(func(ctx context.Context, g comm.Group, env Env) error {
			if hold := os.Getenv("HOLD_FILE"); hold != "" {
				fmt.Println("ready")
				for {
					if _, err := os.Stat(hold); err == nil {
						break
					}
					select {
					case <-ctx.Done():
						return context.Cause(ctx)
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
			res, err := trainDDP(ctx, g, ddpSteps, nil)
			if err != nil {
				return err
			}
			res.Source, res.AgentStore = env.Source, env.UseAgentStore
			return writeResult(g.Rank(), res)
		})
	}
	helperRoles["counters"] = func() int {
		return helperMain(func(ctx context.Context, g comm.Group, env Env) error {
			stats, err := collectiveSequence(ctx, g)
			if err != nil {
				return err
			}
			return writeResult(g.Rank(), counterResult{Rank: g.Rank(), Stats: stats})
		})
	}
	// train-forever: trains until killed or failed, printing "step N" after each step;
	// DIE_RANK / DIE_AT make that rank exit 3 at that step (the launch test).
	helperRoles["train-forever"] = func() int {
		return helperMain(func(ctx context.Context, g comm.Group, env Env) error {
			die, _ := strconv.Atoi(os.Getenv("DIE_AT"))
			_, err := trainDDP(ctx, g, -1, func(step int) {
				fmt.Printf("step %d\n", step)
				if die > 0 && step == die && os.Getenv("DIE_RANK") == strconv.Itoa(g.Rank()) {
					fmt.Fprintf(os.Stderr, "rank %d: dying on purpose at step %d\n", g.Rank(), step)
					os.Exit(3)
				}
				time.Sleep(5 * time.Millisecond)
			})
			return err
		})
	}
}

// helperMain is the shape of a rank's main: signals, Init, work, Close, exit code.
func helperMain(work func(ctx context.Context, g comm.Group, env Env) error) int {
	ctx, stop := NotifyContext(context.Background(), "rank "+os.Getenv("RANK"), nil)
	defer stop()
	start := time.Now()
	g, env, err := Init(ctx, Options{RendezvousTimeout: 30 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "rank %d of %d (%s): group up in %v\n", env.Rank, env.WorldSize, env.Source, time.Since(start).Round(time.Millisecond))
	err = work(ctx, g, env)
	if cerr := g.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: FAILED: %v\n", env.Rank, err)
		return 1
	}
	return 0
}

func writeResult(rank int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(os.Getenv("OUT_DIR"), fmt.Sprintf("rank%d.json", rank)), b, 0o644)
}

func readResults[T any](t *testing.T, dir string, p int) []T {
	t.Helper()
	out := make([]T, p)
	for r := range p {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d.json", r)))
		if err != nil {
			t.Fatalf("rank %d wrote no result: %v", r, err)
		}
		if err := json.Unmarshal(b, &out[r]); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

// job is P helper processes started with a launcher's environment.
type job struct {
	t       *testing.T
	role    string
	env     []string
	procs   []*exec.Cmd
	stdout  []*lineLog
	stderr  []*lineLog
	outDir  string
	port    int
	secret  string
	runID   string
	waitErr []error
	done    []chan struct{}
}

// lineLog keeps a process's output lines and lets the test wait for one.
type lineLog struct {
	mu    sync.Mutex
	lines []string
	added chan struct{}
	eof   chan struct{} // closed when the output ends (the process and its children exited)
}

func newLineLog(r io.Reader) *lineLog {
	l := &lineLog{added: make(chan struct{}, 1), eof: make(chan struct{})}
	go func() {
		defer close(l.eof)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.mu.Lock()
			l.lines = append(l.lines, sc.Text())
			l.mu.Unlock()
			select {
			case l.added <- struct{}{}:
			default:
			}
		}
	}()
	return l
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// waitFor waits until some line contains sub.
func (l *lineLog) waitFor(sub string, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		if strings.Contains(l.String(), sub) {
			return true
		}
		select {
		case <-l.added:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			return false
		}
	}
}

// startJob starts p ranks of role with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, a
// secret and a run id, as spargo launch would; env adds variables for every rank.
func startJob(t *testing.T, role string, p int, env ...string) *job {
	t.Helper()
	j := newJob(t, role, p, env...)
	for r := range p {
		j.startRank(r)
	}
	return j
}

// newJob prepares a job of p ranks without starting any (see startRank).
func newJob(t *testing.T, role string, p int, env ...string) *job {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	j := &job{t: t, role: role, env: env, outDir: t.TempDir(), port: port, secret: "job-secret-" + randomHex(8), runID: "test-" + randomHex(4),
		procs: make([]*exec.Cmd, p), stdout: make([]*lineLog, p), stderr: make([]*lineLog, p),
		waitErr: make([]error, p), done: make([]chan struct{}, p)}
	t.Cleanup(j.kill)
	return j
}

func (j *job) startRank(r int) {
	t, p := j.t, len(j.procs)
	t.Helper()
	cmd := helperCommand(t, j.role, append([]string{
		"RANK=" + strconv.Itoa(r), "WORLD_SIZE=" + strconv.Itoa(p), "LOCAL_RANK=" + strconv.Itoa(r),
		"LOCAL_WORLD_SIZE=" + strconv.Itoa(p), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(j.port),
		"SPARGO_SECRET=" + j.secret, "SPARGO_RUN_ID=" + j.runID, "OUT_DIR=" + j.outDir,
	}, j.env...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	j.procs[r] = cmd
	j.stdout[r], j.stderr[r] = newLineLog(stdout), newLineLog(stderr)
	done := make(chan struct{})
	j.done[r] = done
	go func() {
		// Wait closes the pipes: read them to the end first, or the last lines may be lost.
		<-j.stdout[r].eof
		<-j.stderr[r].eof
		j.waitErr[r] = cmd.Wait()
		close(done)
	}()
}

func (j *job) kill() {
	for r, c := range j.procs {
		if c == nil {
			continue
		}
		select {
		case <-j.done[r]:
		default:
			c.Process.Kill()
			<-j.done[r]
		}
	}
}

// wait waits for every rank and fails the test if any exits non-zero.
func (j *job) wait(timeout time.Duration) {
	j.t.Helper()
	deadline := time.After(timeout)
	for r := range j.procs {
		select {
		case <-j.done[r]:
		case <-deadline:
			j.kill()
			j.t.Fatalf("rank %d did not finish within %v\n%s", r, timeout, j.logs())
		}
	}
	for r, err := range j.waitErr {
		if err != nil {
			j.t.Fatalf("rank %d: %v\n%s", r, err, j.logs())
		}
	}
}

func (j *job) logs() string {
	var b strings.Builder
	for r := range j.procs {
		fmt.Fprintf(&b, "--- rank %d stdout:\n%s\n--- rank %d stderr:\n%s\n", r, j.stdout[r], r, j.stderr[r])
	}
	return b.String()
}

// checkDDP compares the ranks' results with the single-process reference: parameter hashes
// identical across ranks after every step, final parameters within 1e-5 of the reference.
func checkDDP(t *testing.T, results []ddpResult, p int) {
	t.Helper()
	for r, res := range results {
		if len(res.Hashes) != ddpSteps || res.WorldSize != p {
			t.Fatalf("rank %d: %d steps in a world of %d, want %d in %d", r, len(res.Hashes), res.WorldSize, ddpSteps, p)
		}
	}
	for s := range ddpSteps {
		for r := 1; r < p; r++ {
			if results[r].Hashes[s] != results[0].Hashes[s] {
				t.Fatalf("step %d: rank %d's parameters differ from rank 0's", s+1, r)
			}
		}
	}
	ref := referenceParams(t, p)
	var worst float64
	for i := range ref {
		for j, v := range ref[i] {
			worst = max(worst, math.Abs(float64(v-results[0].Params[i][j])))
		}
	}
	t.Logf("P=%d over TCP: max |ddp - single| after %d steps = %.3g", p, ddpSteps, worst)
	if worst > 1e-5 {
		t.Fatalf("max abs parameter difference %.3g > 1e-5", worst)
	}
}

func TestMultiProcessDDPEquivalence(t *testing.T) {
	for _, p := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			j := startJob(t, "ddp", p)
			j.wait(60 * time.Second)
			results := readResults[ddpResult](t, j.outDir, p)
			if results[0].Source != SourceTorchrun {
				t.Errorf("detected source %q", results[0].Source)
			}
			checkDDP(t, results, p)
		})
	}
}

func TestMultiProcessCountersMatchInProcess(t *testing.T) {
	for _, p := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			// TCP between the processes (the shared all-reduce counts its own way; comm's shm
			// tests check it against the in-process transport).
			j := startJob(t, "counters", p, "SPARGO_SHM=0")
			// The in-process reference, while the processes run.
			groups, err := comm.NewLocal(p)
			if err != nil {
				t.Fatal(err)
			}
			want := make([][]comm.Stats, p)
			errs := make([]error, p)
			var wg sync.WaitGroup
			for r := range p {
				wg.Go(func() { want[r], errs[r] = collectiveSequence(testCtx(t), groups[r]) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			j.wait(60 * time.Second)
			got := readResults[counterResult](t, j.outDir, p)
			for r := range p {
				if len(got[r].Stats) != len(want[r]) {
					t.Fatalf("rank %d: %d operations measured, want %d", r, len(got[r].Stats), len(want[r]))
				}
				for i := range want[r] {
					if got[r].Stats[i] != want[r][i] {
						t.Errorf("rank %d op %d: TCP %+v, in-process %+v", r, i, got[r].Stats[i], want[r][i])
					}
				}
			}
			var total comm.Stats
			for r := range p {
				for _, s := range got[r].Stats {
					total = total.Add(s)
				}
			}
			t.Logf("P=%d: %d operations per rank, %d bytes, %d messages in all; equal per rank and op", p, len(want[0]), total.BytesSent, total.MsgsSent)
			if total.BytesSent == 0 || total.BytesSent != total.BytesRecv {
				t.Fatalf("totals: %+v", total)
			}
		})
	}
}

// TestMultiProcessPeerFailure kills (SIGKILL) or freezes (SIGSTOP) rank 1 of 3 in the middle of
// training: ranks 0 and 2 must both exit with an error naming rank 1, and no other, within the
// failure timeout.
func TestMultiProcessPeerFailure(t *testing.T) {
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{{"killed", syscall.SIGKILL}, {"stalled", syscall.SIGSTOP}} {
		t.Run(tc.name, func(t *testing.T) {
			j := startJob(t, "train-forever", 3, "SPARGO_TIMEOUT="+timeout.String())
			for r := range 3 {
				if !j.stdout[r].waitFor("step 3", 60*time.Second) {
					t.Fatalf("rank %d did not reach step 3\n%s", r, j.logs())
				}
			}
			start := time.Now()
			if err := j.procs[1].Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			for _, r := range []int{0, 2} {
				select {
				case <-j.done[r]:
				case <-time.After(timeout + 10*time.Second):
					t.Fatalf("rank %d still running %v after rank 1 was %s\n%s", r, time.Since(start), tc.name, j.logs())
				}
			}
			elapsed := time.Since(start)
			t.Logf("ranks 0 and 2 exited %v after rank 1 was %s (timeout %v)", elapsed.Round(time.Millisecond), tc.name, timeout)
			if elapsed > timeout+5*time.Second {
				t.Errorf("took %v, want about the %v timeout or less", elapsed, timeout)
			}
			// Every survivor names rank 1: a killed rank's connections break at once, so both
			// see it themselves; a frozen one is noticed by the first survivor's timer, whose
			// goodbye carries the failure to the other (which may also notice on its own).
			for _, r := range []int{0, 2} {
				if j.waitErr[r] == nil {
					t.Errorf("rank %d exited 0", r)
				}
				errLine := j.stderr[r].String()
				for _, l := range strings.Split(errLine, "\n") {
					if strings.Contains(l, "FAILED") {
						t.Logf("%s", l)
					}
				}
				if !strings.Contains(errLine, "FAILED") || !strings.Contains(errLine, "peer rank 1 failed") {
					t.Errorf("rank %d did not fail naming rank 1:\n%s", r, errLine)
				}
				for _, other := range []string{"peer rank 0 failed", "peer rank 2 failed", "closed its group"} {
					if strings.Contains(errLine, other) {
						t.Errorf("rank %d blames another rank (%q):\n%s", r, other, errLine)
					}
				}
			}
			j.procs[1].Process.Kill()
		})
	}
}

// TestLaunchPeerFailure runs the training job under Launch; rank 1 exits 3 at step 5.
// Launch must stop the rest and fail naming rank 1.
func TestLaunchPeerFailure(t *testing.T) {
	var stdout, stderr strings.Builder
	var mu sync.Mutex
	cfg := LaunchConfig{
		NProc:   3,
		Program: os.Args[0],
		Args:    []string{"-test.run=^TestHelperProcess$"},
		Env:     append(helperEnv("train-forever"), "DIE_RANK=1", "DIE_AT=5"),
		Timeout: 2 * time.Second,
		Grace:   5 * time.Second,
		Stdout:  &syncWriter{mu: &mu, w: &stdout},
		Stderr:  &syncWriter{mu: &mu, w: &stderr},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := Launch(ctx, cfg)
	mu.Lock()
	defer mu.Unlock()
	var rankErr *RankError
	// Ranks 0 and 2 fail a millisecond after rank 1, on their own; the launcher may observe
	// one of them first, and names all three then.
	if !errors.As(err, &rankErr) || !slices.Contains(rankErr.Ranks(), 1) || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Launch = %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("launch: %v", err)
	if !strings.Contains(stderr.String(), "[rank 1] rank 1: dying on purpose at step 5") {
		t.Errorf("stderr lacks rank 1's last words:\n%s", stderr.String())
	}
}

type syncWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestMultiProcessStrangerRejected attacks a 3-rank job while ranks 0 and 1 are setting up
// and rank 2 has not started: store clients with the wrong secret and with none, garbage on
// the data ports, and a would-be rank 0 with the wrong secret that speaks the real protocol.
// All are turned away and logged, and the job then trains exactly as it should.
func TestMultiProcessStrangerRejected(t *testing.T) {
	const p = 3
	hold := filepath.Join(t.TempDir(), "go")
	j := newJob(t, "ddp", p, "HOLD_FILE="+hold)
	j.startRank(0)
	j.startRank(1)
	ctx := testCtx(t)
	master := "127.0.0.1:" + strconv.Itoa(j.port)

	// The store, with the wrong secret and with none (a PyTorch client's GET).
	if _, err := DialStore(ctx, master, StoreOptions{Secret: []byte("wrong")}); !errors.Is(err, ErrAuth) {
		t.Errorf("store accepted a wrong secret: %v", err)
	}
	c, err := net.Dial("tcp", master)
	if err != nil {
		t.Fatal(err)
	}
	c.Write(appendString([]byte{queryGet}, "/spargo/"+j.runID+"/addr/0"))
	c.SetReadDeadline(time.Now().Add(time.Second))
	got, _ := io.ReadAll(c) // the challenge, and no answer to the query
	if len(got) != len(authMagic)+authNonceLen || string(got[:len(authMagic)]) != authMagic {
		t.Errorf("store answered a client without the secret with %q", got)
	}
	c.Close()

	// Ranks 0 and 1's data ports, as published (read with the right secret).
	st, err := DialStore(ctx, master, StoreOptions{Secret: []byte(j.secret)})
	if err != nil {
		t.Fatal(err)
	}
	addrs := make([]string, p)
	for r := range 2 {
		v, err := st.WithPrefix("spargo/"+j.runID).Get(ctx, "addr/"+strconv.Itoa(r))
		if err != nil {
			t.Fatal(err)
		}
		addrs[r] = string(v)
	}
	st.Close()
	addrs[2] = addrs[0] // the fake rank's connection for "rank 2" lands on rank 0

	// Garbage and the fake rank connect now; the ranks accept them as soon as rank 2's arrival
	// lets them start connecting the mesh.
	var attacks sync.WaitGroup
	for r := range 2 {
		attacks.Go(func() {
			c, err := net.Dial("tcp", addrs[r])
			if err != nil {
				t.Errorf("rank %d's data port %s: %v", r, addrs[r], err)
				return
			}
			defer c.Close()
			c.Write([]byte("GET / HTTP/1.0\r\n\r\n not a spargo peer, but long enough to be read as a hello"))
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("rank %d kept a garbage connection open: %v", r, err)
			}
		})
	}
	attacks.Go(func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Error(err)
			return
		}
		fake, err := comm.NewTCP(ctx, comm.TCPConfig{Rank: 0, Size: p, Listener: ln, Addrs: addrs,
			Secret: []byte("wrong"), DialTimeout: 3 * time.Second, Logf: func(string, ...any) {}})
		if err == nil {
			fake.Close()
			t.Error("a rank with the wrong secret joined the mesh")
			return
		}
		t.Logf("the fake rank gave up: %v", err)
	})
	time.Sleep(300 * time.Millisecond)
	j.startRank(2)
	attacks.Wait()

	// The job goes on and trains exactly as it should.
	for r := range p {
		if !j.stdout[r].waitFor("ready", 60*time.Second) {
			t.Fatalf("rank %d not ready\n%s", r, j.logs())
		}
	}
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	j.wait(60 * time.Second)
	checkDDP(t, readResults[ddpResult](t, j.outDir, p), p)
	if !strings.Contains(j.stderr[0].String(), "dist: store server") || !strings.Contains(j.stderr[0].String(), "rejected connection") {
		t.Errorf("rank 0 did not log the store's rejections:\n%s", j.stderr[0])
	}
	for r := range 2 {
		if want := fmt.Sprintf("comm: rank %d: rejected connection", r); !strings.Contains(j.stderr[r].String(), want) {
			t.Errorf("rank %d did not log %q:\n%s", r, want, j.stderr[r])
		}
	}
	t.Logf("rank 1's log:\n%s", j.stderr[1])
}
