package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// rankEnv is the environment spargo launch gives rank r of p, plus extra "K=V" pairs.
func rankEnv(r, p, port int, extra ...string) func(string) (string, bool) {
	m := map[string]string{
		"RANK": strconv.Itoa(r), "WORLD_SIZE": strconv.Itoa(p), "LOCAL_RANK": strconv.Itoa(r),
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(port), "SPARGO_RUN_ID": "unit",
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return lookupMap(m)
}

// initRanks runs Init for p ranks in this process (one goroutine each).
func initRanks(t *testing.T, p int, opts func(r int) Options) ([]comm.Group, []Env, []error) {
	t.Helper()
	groups, envs, errs := make([]comm.Group, p), make([]Env, p), make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() { groups[r], envs[r], errs[r] = Init(testCtx(t), opts(r)) })
	}
	wg.Wait()
	return groups, envs, errs
}

func TestInitSingleProcess(t *testing.T) {
	g, env, err := Init(context.Background(), Options{Lookup: lookupMap(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Size() != 1 || g.Rank() != 0 || env.Source != SourceSingle {
		t.Fatalf("single process: size %d rank %d source %s", g.Size(), g.Rank(), env.Source)
	}
}

func TestInitInProcessRanksAndClose(t *testing.T) {
	before := runtime.NumGoroutine()
	const p = 3
	port, _ := freePort()
	logs := &logSink{}
	groups, envs, errs := initRanks(t, p, func(r int) Options {
		extra := []string{"SPARGO_SECRET=unit-secret", "SPARGO_TIMEOUT=5"}
		if r == 2 {
			extra = append(extra, "SPARGO_BIND=0.0.0.0") // listen everywhere, advertise 127.0.0.1
		}
		return Options{Lookup: rankEnv(r, p, port, extra...), Logf: logs.logf}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	sums := make([][]float32, p)
	for r, g := range groups {
		if g.Rank() != r || g.Size() != p || envs[r].Rank != r {
			t.Fatalf("rank %d: group rank %d size %d", r, g.Rank(), g.Size())
		}
		wg.Go(func() {
			sums[r] = []float32{float32(r), 1}
			if err := comm.AllReduce(testCtx(t), g, 1, sums[r], comm.Auto); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for r := range p {
		if sums[r][0] != 3 || sums[r][1] != 3 {
			t.Fatalf("rank %d: all-reduce gave %v", r, sums[r])
		}
	}
	// Closing every group (rank 0's with its store server) leaves nothing running.
	for _, g := range groups {
		wg.Go(func() {
			if err := g.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before Init, %d after Close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
	// The store port is free again.
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("MASTER_PORT still in use after Close: %v", err)
	}
	ln.Close()
}

// torchrun's static rendezvous: the agent hosts a plain store and the workers put their keys
// under /worker/attempt_<restart count>, as PyTorch's own workers do.
func TestInitAgentStore(t *testing.T) {
	agent := startServer(t, StoreOptions{Logf: t.Logf}) // stands in for torchrun's agent
	const p = 2
	groups, _, errs := initRanks(t, p, func(r int) Options {
		return Options{Lookup: rankEnv(r, p, agent.Port(), "TORCHELASTIC_USE_AGENT_STORE=True",
			"TORCHELASTIC_RESTART_COUNT=1", "SPARGO_SECRET=data-secret")}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		defer g.Close()
	}
	s := dial(t, agent, StoreOptions{})
	for r := range p {
		key := fmt.Sprintf("/worker/attempt_1/spargo/unit/addr/%d", r)
		if ok, err := s.Check(testCtx(t), key); err != nil || !ok {
			t.Errorf("agent store lacks %q: %v", key, err)
		}
	}
}

func TestInitErrors(t *testing.T) {
	port, _ := freePort()
	secretFile := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(secretFile, []byte("\n"), 0o600)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := busy.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"half-set environment", Options{Lookup: lookupMap(map[string]string{"RANK": "0"})}, "RANK is set but WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not"},
		{"bad timeout", Options{Lookup: rankEnv(0, 2, port, "SPARGO_TIMEOUT=soon")}, `SPARGO_TIMEOUT="soon"`},
		{"empty secret file", Options{Lookup: rankEnv(0, 2, port, "SPARGO_SECRET_FILE="+secretFile)}, "is empty"},
		{"bind on MASTER_PORT", Options{Lookup: rankEnv(1, 2, port, "SPARGO_BIND=127.0.0.1:"+strconv.Itoa(port))}, "uses MASTER_PORT"},
		{"bad bind port", Options{Bind: "127.0.0.1:http2", Lookup: rankEnv(1, 2, port)}, "bad port"},
		{"MASTER_PORT taken", Options{Lookup: rankEnv(0, 2, busyPort)}, "host the store"},
		{"a rank that never comes", Options{Lookup: rankEnv(0, 2, port), RendezvousTimeout: 300 * time.Millisecond},
			"rank 1 never published its address"},
		{"no store", Options{Lookup: rankEnv(1, 2, port), RendezvousTimeout: 200 * time.Millisecond}, "rendezvous"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, _, err := Init(testCtx(t), tc.opts)
			if err == nil {
				g.Close()
				t.Fatal("Init succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q lacks %q", err, tc.want)
			}
		})
	}
}

func TestSplitBind(t *testing.T) {
	for _, tc := range []struct {
		in   string
		host string
		port int
	}{{"", "", 0}, {"10.0.0.2", "10.0.0.2", 0}, {"10.0.0.2:7000", "10.0.0.2", 7000}, {":7000", "", 7000},
		{"[::1]:7000", "::1", 7000}, {"node7", "node7", 0}} {
		h, p, err := splitBind(tc.in)
		if err != nil || h != tc.host || p != tc.port {
			t.Errorf("splitBind(%q) = %q, %d, %v", tc.in, h, p, err)
		}
	}
}

func TestParseTimeout(t *testing.T) {
	for in, want := range map[string]time.Duration{"90s": 90 * time.Second, "2m": 2 * time.Minute, "45": 45 * time.Second, "1.5": 1500 * time.Millisecond} {
		if got, err := parseTimeout("T", in); err != nil || got != want {
			t.Errorf("parseTimeout(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0", "-3s", "soon"} {
		if _, err := parseTimeout("T", bad); err == nil {
			t.Errorf("parseTimeout(%q) accepted", bad)
		}
	}
}

func TestNotifyContext(t *testing.T) {
	logs := &logSink{}
	// Without a signal, stop releases the handler. (The first use of os/signal also starts
	// its own process-wide goroutine, hence the count after this.)
	_, stop0 := NotifyContext(context.Background(), "rank 0", logs.logf)
	stop0()
	before := runtime.NumGoroutine()
	ctx, stop := NotifyContext(context.Background(), "rank 3", logs.logf)
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not cancel the context")
	}
	var sigErr *SignalError
	if !errors.As(context.Cause(ctx), &sigErr) || sigErr.Signal != syscall.SIGTERM {
		t.Fatalf("cause %v", context.Cause(ctx))
	}
	if !logs.contains("rank 3: received SIGTERM, shutting down") {
		t.Fatalf("log: %q", logs.lines)
	}
	stop()
	_, stop2 := NotifyContext(context.Background(), "rank 0", logs.logf)
	stop2()
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines before, %d after stop", before, n)
	}
}
