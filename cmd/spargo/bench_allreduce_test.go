package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
)

// runAsSpargoVar makes this test binary behave as the spargo command (see TestMain), so that
// `bench allreduce` can launch copies of itself and `launch` can start it as a program.
const runAsSpargoVar = "SPARGO_TEST_RUN_AS_SPARGO"

func TestMain(m *testing.M) {
	if os.Getenv(runAsSpargoVar) == "1" {
		os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// P=2 and P=3 processes launched by the command itself, small vectors: one JSON object with
// the stable keys, busbw = algbw·2(P-1)/P, the algorithm Auto picks.
func TestBenchAllReduceJSON(t *testing.T) {
	t.Setenv(runAsSpargoVar, "1")
	for _, tc := range []struct {
		args    []string
		workers int
		alg     string
	}{
		{[]string{"-workers", "2", "-n", "64KiB"}, 2, "shared_memory"}, // one host: shared memory
		{[]string{"-workers", "3", "-n", "64KiB", "-buffer", "shared"}, 3, "shared_memory"},
		{[]string{"-workers", "2", "-n", "64KiB", "-transport", "tcp"}, 2, "rabenseifner"},
		{[]string{"-workers", "3", "-n", "40000", "-algorithm", "recursive_doubling"}, 3, "recursive_doubling"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"bench", "allreduce", "-iters", "3", "-warmup", "1", "-json"}, tc.args...)
		if code := dispatch(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errb.String())
		}
		var res map[string]any
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
		}
		for _, k := range []string{"workers", "bytes", "algorithm", "transport", "buffer", "time_ms", "min_ms", "algbw_mb_s", "busbw_mb_s", "iters"} {
			if _, ok := res[k]; !ok {
				t.Errorf("JSON lacks key %q: %s", k, out.String())
			}
		}
		p := float64(tc.workers)
		algbw, busbw := res["algbw_mb_s"].(float64), res["busbw_mb_s"].(float64)
		if res["workers"] != p || res["iters"] != float64(3) || res["algorithm"] != tc.alg || !(algbw > 0) ||
			math.Abs(busbw-algbw*2*(p-1)/p) > 1e-9*busbw || res["min_ms"].(float64) > res["time_ms"].(float64) {
			t.Errorf("%v: %s", tc.args, out.String())
		}
		t.Logf("%v: %s", tc.args, strings.TrimSpace(out.String()))
	}
}

// Under spargo launch every process is a rank, and rank 0 prints the table.
func TestBenchAllReduceUnderLaunch(t *testing.T) {
	t.Setenv(runAsSpargoVar, "1")
	var out, errb bytes.Buffer
	code := dispatch([]string{"launch", "-n", "2", "--", os.Args[0], "bench", "allreduce", "-n", "4KiB", "-iters", "2", "-algorithm", "ring"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"[rank 0] all-reduce of 4 KiB (1024 float32, private buffer) over P=2 processes (shared memory), ring,", "[rank 0]       2         4096  ring "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "[rank 1]") {
		t.Errorf("rank 1 printed:\n%s", out.String())
	}
}

func TestBenchAllReduceErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"-n", "6"}, nil, `-n "6": want a whole number of bytes, a multiple of 4`},
		{[]string{"-n", "lots"}, nil, `-n "lots"`},
		{[]string{"-workers", "1"}, nil, "-workers 1: want at least 2 processes"},
		{[]string{"-algorithm", "bruck"}, nil, `-algorithm "bruck"`},
		{[]string{"-iters", "0"}, nil, "-iters 0"},
		{[]string{"-workers", "2"}, []string{"RANK=0", "WORLD_SIZE=3", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"},
			"-workers 2, but the launcher (torchrun) started 3 processes"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			args := append([]string{"bench", "allreduce"}, tc.args...)
			if code := dispatch(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
			}
		})
	}
}

func TestParseBytes(t *testing.T) {
	for s, want := range map[string]int{"64MiB": 64 << 20, "4KiB": 4096, "4096": 4096, "1.5GB": 1_500_000_000, "8B": 8, "1GiB": 1 << 30} {
		if got, err := parseBytes(s); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "MiB", "2", "6", "-4", "9GiB", "1.1"} {
		if _, err := parseBytes(s); err == nil {
			t.Errorf("parseBytes(%q) accepted", s)
		}
	}
}
