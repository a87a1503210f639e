package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/examples/internal/cifar"
)

// The test switches of the program this test binary runs as (TestMain with runAsVGGVar):
// tinyVar builds resume_test.go's tiny model instead of a VGG (-model is then only a name);
// exitAtVar=N makes rank 1 of a launched job's first attempt (restart count 0) exit with
// status 3 right after the checkpoint at iteration N is saved, a crash for the restart test.
// Neither exists outside the tests.
const (
	tinyVar   = "SPARGO_TEST_VGG_TINY"
	exitAtVar = "SPARGO_TEST_VGG_EXIT_AT"
)

// runAsProgram is main with the test switches applied.
func runAsProgram() {
	c := defaults()
	if os.Getenv(tinyVar) == "1" {
		c.NewModel, c.CheckModel = tinyVGG, nil
	}
	if at := os.Getenv(exitAtVar); at != "" {
		env, err := cluster.DetectEnv(cluster.Overrides{})
		n, perr := strconv.ParseInt(at, 10, 64)
		if err != nil || perr != nil {
			fmt.Fprintf(os.Stderr, "%s=%s: %v %v\n", exitAtVar, at, err, perr)
			os.Exit(2)
		}
		if env.Rank == 1 && env.RestartCount == 0 {
			c.Saved = func(_ string, pos checkpoint.Position) {
				if pos.Iteration == n {
					fmt.Fprintf(os.Stderr, "test: rank 1 exits after the checkpoint at iteration %d\n", n)
					os.Exit(3)
				}
			}
		}
	}
	cifar.Main("vgg", c)
}

// programEnv is this process's environment without spargo's and torchrun's variables, with
// the switch that makes the test binary the program.
func programEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "SPARGO_") && !strings.HasPrefix(name, "TORCHELASTIC_") && !strings.HasPrefix(name, "MASTER_") &&
			name != "RANK" && name != "WORLD_SIZE" && name != "LOCAL_RANK" && name != "LOCAL_WORLD_SIZE" {
			env = append(env, kv)
		}
	}
	return append(append(env, runAsVGGVar+"=1"), extra...)
}

// The Must-show for finding 1: two ranks started by hand with torchrun's variables,
// one with -lr 0.01 and one with -lr 0.02 (which trained on silently, every replica apart),
// and -steps 3 against -steps 6 (which deadlocked): both processes exit non-zero at start-up,
// before the first step, and each says which setting differs, both values and the ranks.
func TestHandStartedRanksRefuseOtherSettings(t *testing.T) {
	base := []string{"-data", cifarMini, "-model", "vgg11", "-batch", "4", "-epochs", "1", "-steps", "2", "-eval-limit", "8", "-progress=false"}
	for _, tc := range []struct {
		name       string
		rank0, one []string
		want       string
	}{
		{"lr", []string{"-lr", "0.01"}, []string{"-lr", "0.02"}, `lr is "0.01" on rank 0, "0.02" on rank 1`},
		{"steps", []string{"-steps", "3"}, []string{"-steps", "6"}, `steps is "3" on rank 0, "6" on rank 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			l.Close()
			// A generous bound that only says "did not hang"; the time taken is logged.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			start := time.Now()
			type result struct {
				err            error
				stdout, stderr string
				took           time.Duration
			}
			results := make([]result, 2)
			var wg sync.WaitGroup
			for r, own := range [][]string{tc.rank0, tc.one} {
				cmd := exec.CommandContext(ctx, os.Args[0], append(append([]string{}, base...), own...)...)
				cmd.Env = programEnv("RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r), "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2",
					"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "SPARGO_SECRET=agree-test-secret")
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					err := cmd.Wait()
					results[r] = result{err: err, stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
				})
			}
			wg.Wait()
			if ctx.Err() != nil {
				t.Fatalf("the ranks did not end: %+v", results)
			}
			for r, res := range results {
				t.Logf("rank %d exited after %v: %v\n%s", r, res.took.Round(time.Millisecond), res.err, res.stderr)
				var exit *exec.ExitError
				if res.err == nil || !errorsAs(res.err, &exit) || exit.ExitCode() != 1 {
					t.Fatalf("rank %d: %v, want exit status 1\n%s", r, res.err, res.stderr)
				}
				if !strings.Contains(res.stderr, tc.want) || !strings.Contains(res.stderr, fmt.Sprintf("rank %d", r)) {
					t.Fatalf("rank %d's stderr does not say %q:\n%s", r, tc.want, res.stderr)
				}
				if strings.Contains(res.stdout, "epoch 1 train_loss") || !strings.Contains(res.stdout+res.stderr, "data:") && r == 0 {
					t.Fatalf("rank %d trained, or never loaded its data:\n%s%s", r, res.stdout, res.stderr)
				}
			}
		})
	}
}

// errorsAs is errors.As for *exec.ExitError.
func errorsAs(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*target = e
	return ok
}

// The Must-show for finding 5: `spargo launch -restarts 1` with -checkpoint, rank 1
// killed mid-run (after the checkpoint of iteration 4, in epoch 2): the restarted job resumes
// from that checkpoint instead of starting over, finishes, and its final checkpoint holds
// bit-identically the state of an uninterrupted run's.
func TestRestartResumesFromCheckpoint(t *testing.T) {
	tmp := t.TempDir()
	flags := func(dir string) []string {
		return []string{"-data", cifarMini, "-model", "tiny", "-hook", "spardl:density=0.05,dense_warmup=1", "-batch", "2", "-epochs", "2",
			"-steps", "3", "-lr", "0.05", "-seed", "3", "-eval-limit", "16", "-progress=false", "-checkpoint", dir, "-checkpoint-every", "2", "-keep", "0"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	launch := func(dir string, restarts int, extra ...string) string {
		var mu sync.Mutex
		var out bytes.Buffer
		w := &lockedBuffer{mu: &mu, b: &out}
		err := cluster.Launch(ctx, cluster.LaunchConfig{NProc: 2, Program: os.Args[0], Args: flags(dir), Env: programEnv(append([]string{tinyVar + "=1"}, extra...)...),
			Restarts: restarts, Stdout: w, Stderr: w, Grace: 5 * time.Second})
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Fatalf("launch: %v\n%s", err, out.String())
		}
		return out.String()
	}
	whole, restarted := filepath.Join(tmp, "whole"), filepath.Join(tmp, "restarted")
	launch(whole, 0)
	out := launch(restarted, 1, exitAtVar+"=4")
	for _, want := range []string{"rank 1 exits after the checkpoint at iteration 4", "restarting all 2 processes", "restart 1: resuming from " + filepath.Join(restarted, "ckpt-")} {
		if !strings.Contains(out, want) {
			t.Fatalf("the restarted job's output does not say %q:\n%s", want, out)
		}
	}
	a, err := checkpoint.Latest(whole)
	if err != nil {
		t.Fatal(err)
	}
	b, err := checkpoint.Latest(restarted)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(a) != filepath.Base(b) {
		t.Fatalf("the runs ended at %s and %s", a, b)
	}
	sameState(t, "restarted against uninterrupted", a, b)
	// The restart resumed instead of starting over: epoch 1 was trained (and iteration 2
	// saved) once, by the first attempt.
	if n, m := strings.Count(out, "epoch 1 train_loss"), strings.Count(out, "ckpt-0000000002 ("); n != 1 || m != 1 {
		t.Fatalf("epoch 1 reported %d times, iteration 2's checkpoint saved %d times:\n%s", n, m, out)
	}
	_, pos, err := checkpoint.ReadInfo(b)
	if err != nil || pos.Iteration != 6 {
		t.Fatalf("final checkpoint %s at %+v: %v", b, pos, err)
	}
}
