package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func init() {
	helperRoles["launch-echo"] = func() int {
		for _, v := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "SPARGO_RUN_ID", "SPARGO_RESTART_COUNT"} {
			fmt.Printf("%s=%s\n", v, os.Getenv(v))
		}
		fmt.Printf("secret bytes %d\n", len(os.Getenv("SPARGO_SECRET")))
		fmt.Printf("secret file %q\n", os.Getenv("SPARGO_SECRET_FILE"))
		fmt.Printf("timeout %q\n", os.Getenv("SPARGO_TIMEOUT"))
		fmt.Printf("inherited TORCHELASTIC_RUN_ID %q\n", os.Getenv("TORCHELASTIC_RUN_ID"))
		fmt.Fprintln(os.Stderr, "a line on stderr")
		fmt.Print("no newline at the end")
		return 0
	}
	// launch-fail: rank FAIL_RANK exits 3 at once; the others run until signalled.
	helperRoles["launch-fail"] = func() int {
		if os.Getenv("RANK") == os.Getenv("FAIL_RANK") {
			time.Sleep(200 * time.Millisecond)
			fmt.Println("failing on purpose")
			return 3
		}
		ctx, stop := NotifyContext(context.Background(), "rank "+os.Getenv("RANK"), nil)
		defer stop()
		select {
		case <-ctx.Done():
			return 1
		case <-time.After(time.Minute):
			return 0
		}
	}
	// launch-stubborn: like launch-fail, but the survivors ignore SIGTERM.
	helperRoles["launch-stubborn"] = func() int {
		if os.Getenv("RANK") == "1" {
			time.Sleep(200 * time.Millisecond)
			return 5
		}
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ignoring SIGTERM")
		time.Sleep(time.Minute)
		return 0
	}
	// launch-restart: rank 1 fails on the first attempt only.
	helperRoles["launch-restart"] = func() int {
		if os.Getenv("RANK") == "1" && os.Getenv("SPARGO_RESTART_COUNT") == "0" {
			return 4
		}
		fmt.Printf("attempt %s done\n", os.Getenv("SPARGO_RESTART_COUNT"))
		return 0
	}
}

func launchHelper(t *testing.T, role string, n int, env ...string) LaunchConfig {
	return LaunchConfig{
		NProc:   n,
		Program: os.Args[0],
		Args:    []string{"-test.run=^TestHelperProcess$"},
		Env:     append(append(helperEnv(role), "TORCHELASTIC_RUN_ID=stale-job", "RANK=99"), env...),
		Grace:   2 * time.Second,
	}
}

func TestLaunchEnvironmentAndOutput(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cfg := launchHelper(t, "launch-echo", 3)
	cfg.Stdout, cfg.Stderr = &stdout, &stderr
	cfg.Timeout = 7 * time.Second
	if err := Launch(testCtx(t), cfg); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	port := regexp.MustCompile(`\[rank 0\] MASTER_PORT=(\d+)\n`).FindStringSubmatch(out)
	if port == nil {
		t.Fatalf("no MASTER_PORT in output:\n%s", out)
	}
	runID := regexp.MustCompile(`\[rank 0\] SPARGO_RUN_ID=(launch-[0-9a-f]+)\n`).FindStringSubmatch(out)
	if runID == nil {
		t.Fatalf("no SPARGO_RUN_ID in output:\n%s", out)
	}
	for r := range 3 {
		for _, want := range []string{
			fmt.Sprintf("RANK=%d", r), "WORLD_SIZE=3", fmt.Sprintf("LOCAL_RANK=%d", r), "LOCAL_WORLD_SIZE=3", "GROUP_RANK=0",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port[1], "SPARGO_RUN_ID=" + runID[1], "SPARGO_RESTART_COUNT=0",
			"secret bytes 64", `secret file ""`, `timeout "7s"`, `inherited TORCHELASTIC_RUN_ID ""`,
			"no newline at the end",
		} {
			if line := fmt.Sprintf("[rank %d] %s\n", r, want); !strings.Contains(out, line) {
				t.Errorf("stdout lacks %q", line)
			}
		}
		if line := fmt.Sprintf("[rank %d] a line on stderr\n", r); !strings.Contains(stderr.String(), line) {
			t.Errorf("stderr lacks %q:\n%s", line, stderr.String())
		}
	}
	// A secret file replaces the random secret.
	path := t.TempDir() + "/secret"
	os.WriteFile(path, []byte("file-secret\n"), 0o600)
	stdout.Reset()
	cfg.SecretFile = path
	cfg.NProc = 1
	if err := Launch(testCtx(t), cfg); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("secret file %q", path); !strings.Contains(stdout.String(), want) || !strings.Contains(stdout.String(), "secret bytes 0") {
		t.Errorf("with a secret file: %s", stdout.String())
	}
	cfg.SecretFile = t.TempDir() + "/missing"
	if err := Launch(testCtx(t), cfg); err == nil || !strings.Contains(err.Error(), "secret file") {
		t.Errorf("missing secret file: %v", err)
	}
}

func TestLaunchStopsAllWhenOneFails(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cfg := launchHelper(t, "launch-fail", 3, "FAIL_RANK=2")
	cfg.Stdout, cfg.Stderr = &stdout, &stderr
	start := time.Now()
	err := Launch(testCtx(t), cfg)
	var rankErr *RankError
	if !errors.As(err, &rankErr) || rankErr.Rank != 2 || !strings.Contains(err.Error(), "rank 2 failed: exit status 3") {
		t.Fatalf("Launch = %v\nstderr:\n%s", err, stderr.String())
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("stopping took %v", d)
	}
	for _, r := range []int{0, 1} {
		if want := fmt.Sprintf("[rank %d] rank %d: received SIGTERM, shutting down", r, r); !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	if !strings.Contains(stderr.String(), "[launch] rank 2 failed (exit status 3); stopping the other ranks") {
		t.Errorf("launcher did not say what it does:\n%s", stderr.String())
	}
}

func TestLaunchKillsRanksThatIgnoreSIGTERM(t *testing.T) {
	var out bytes.Buffer
	cfg := launchHelper(t, "launch-stubborn", 2)
	cfg.Stdout, cfg.Stderr = &out, &out
	cfg.Grace = 300 * time.Millisecond
	start := time.Now()
	err := Launch(testCtx(t), cfg)
	var rankErr *RankError
	if !errors.As(err, &rankErr) || rankErr.Rank != 1 {
		t.Fatalf("Launch = %v\n%s", err, out.String())
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("SIGKILL after the grace period took %v", d)
	}
	if !strings.Contains(out.String(), "sending SIGKILL") {
		t.Errorf("no SIGKILL note:\n%s", out.String())
	}
}

func TestLaunchRestarts(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cfg := launchHelper(t, "launch-restart", 2)
	cfg.Stdout, cfg.Stderr = &stdout, &stderr
	cfg.Restarts = 1
	if err := Launch(testCtx(t), cfg); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "rank 1 failed: exit status 4; restarting all 2 processes (restart 1 of 1)") {
		t.Errorf("no restart note:\n%s", stderr.String())
	}
	for r := range 2 {
		if want := fmt.Sprintf("[rank %d] attempt 1 done", r); !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	// Without restarts the same job fails, naming the rank.
	cfg.Restarts = 0
	err := Launch(testCtx(t), cfg)
	var rankErr *RankError
	if !errors.As(err, &rankErr) || rankErr.Rank != 1 {
		t.Fatalf("without restarts: %v", err)
	}
}

func TestLaunchCancel(t *testing.T) {
	var out bytes.Buffer
	cfg := launchHelper(t, "launch-fail", 2, "FAIL_RANK=none")
	cfg.Stdout, cfg.Stderr = &out, &out
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		time.Sleep(500 * time.Millisecond)
		cancel(&SignalError{Signal: syscall.SIGTERM})
	}()
	err := Launch(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "received SIGTERM; stopped all ranks") {
		t.Fatalf("Launch = %v\n%s", err, out.String())
	}
}

func TestLaunchErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  LaunchConfig
		want string
	}{
		{LaunchConfig{NProc: 0, Program: "true"}, "0 processes"},
		{LaunchConfig{NProc: 1, Program: "true", Restarts: -1}, "-1 restarts"},
		{LaunchConfig{NProc: 1}, "no program"},
		{LaunchConfig{NProc: 1, Program: "/nonexistent/program"}, "/nonexistent/program"},
	} {
		if err := Launch(context.Background(), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Launch(%+v) = %v, want error with %q", tc.cfg, err, tc.want)
		}
	}
}

func TestPrefixWriter(t *testing.T) {
	var buf bytes.Buffer
	w := &prefixWriter{w: &buf, prefix: "[rank 7] "}
	for _, s := range []string{"one\ntw", "o\n", "", "three\nfour\nfi", "ve"} {
		w.Write([]byte(s))
	}
	w.Flush()
	want := "[rank 7] one\n[rank 7] two\n[rank 7] three\n[rank 7] four\n[rank 7] five\n"
	if buf.String() != want {
		t.Fatalf("got %q, want %q", buf.String(), want)
	}
	buf.Reset()
	w.Write(bytes.Repeat([]byte("x"), maxPartialLine+10))
	w.Write([]byte("\n"))
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "[rank 7] ") || len(lines[0])+len(lines[1]) != 2*len("[rank 7] ")+maxPartialLine+10 {
		t.Fatalf("long line split into %d pieces", len(lines))
	}
}
