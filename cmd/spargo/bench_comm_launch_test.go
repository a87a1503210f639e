package main

import (
	"bytes"
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// decodeCommResults reads the JSON lines of bench comm -json.
func decodeCommResults(t *testing.T, out *bytes.Buffer) []commResult {
	t.Helper()
	var rs []commResult
	dec := json.NewDecoder(out)
	for dec.More() {
		var r commResult
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("%v in %s", err, out.String())
		}
		rs = append(rs, r)
	}
	return rs
}

// sameCounts checks that launched has one result per in-process result with the same hook,
// workers, size, buckets and counts.
func sameCounts(t *testing.T, launched, inproc []commResult) {
	t.Helper()
	if len(launched) != len(inproc) || len(inproc) == 0 {
		t.Fatalf("%d launched results, %d in-process", len(launched), len(inproc))
	}
	for i, l := range launched {
		in := inproc[i]
		if l.Transport != "launch" || l.Hook != in.Hook || l.Workers != in.Workers || l.N != in.N || l.Buckets != in.Buckets ||
			l.Calls != in.Calls || l.Rounds != in.Rounds || l.BytesReceived != in.BytesReceived || l.WordsReceived != in.WordsReceived ||
			l.FormulaWords != in.FormulaWords || !(l.TimeMS > 0) {
			t.Errorf("launched %+v\nin-process %+v", l, in)
		}
	}
}

// Two ranks in this process (one goroutine each) join through the launcher environment on
// loopback, as processes in network namespaces do, each generating only its own worker's
// gradients (or reading its own rank of a recording): rank 0 reports the rounds, bytes and words of the in-process run of the same
// seeded gradients, and rank 1 prints nothing.
func TestBenchCommLaunchedRanks(t *testing.T) {
	synth := []string{"-workers", "2", "-iters", "2", "-warmup", "1", "-seed", "7", "-json"}
	for _, args := range [][]string{
		slices.Concat(synth, []string{"-n", "4k", "-hook", "spardl", "-hook", "oktopk", "-hook", "topka", "-hook", "gtopk", "-hook", "allreduce"}),
		slices.Concat(synth, []string{"-model", "resnet20", "-hook", "spardl", "-hook", "topkdsa", "-density", "0.05"}),
		// each rank replays its own rank of a recording with disjoint top-k sets
		{"-grads", writeRecording(t, false), "-warmup", "0", "-density", "0.1", "-hook", "spardl", "-hook", "topka", "-json"},
	} {
		var in bytes.Buffer
		if err := benchComm(args, &in, nil); err != nil {
			t.Fatal(err)
		}
		port := freePort(t)
		outs, errs := make([]bytes.Buffer, 2), make([]error, 2)
		var wg sync.WaitGroup
		for r := range 2 {
			env := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "SPARGO_RUN_ID": "bench-comm-test"}
			lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
			wg.Go(func() { errs[r] = benchComm(args, &outs[r], lookup) })
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%v: rank %d: %v", args, r, err)
			}
		}
		if outs[1].Len() != 0 {
			t.Errorf("rank 1 printed:\n%s", outs[1].String())
		}
		sameCounts(t, decodeCommResults(t, &outs[0]), decodeCommResults(t, &in))
	}
}

// -transport launch without a launcher starts the processes itself and prints rank 0's
// table; the counts are the in-process run's.
func TestBenchCommLaunchProcesses(t *testing.T) {
	t.Setenv(runAsSpargoVar, "1")
	args := []string{"-workers", "2", "-n", "2k", "-iters", "1", "-warmup", "1", "-hook", "spardl", "-hook", "topka"}
	var in, out, errb bytes.Buffer
	if err := benchComm(append(args, "-json"), &in, nil); err != nil {
		t.Fatal(err)
	}
	if code := dispatch(append([]string{"bench", "comm", "-transport", "launch", "-json"}, args...), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	sameCounts(t, decodeCommResults(t, &out), decodeCommResults(t, &in))
	out.Reset()
	if code := dispatch(append([]string{"bench", "comm", "-transport", "launch"}, args...), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"P=2 processes, one worker each (transport launch", "spardl:density=0.01", "topka:density=0.01"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBenchCommLaunchErrors(t *testing.T) {
	launcher := map[string]string{"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-transport", "launch", "-workers", "1"}, nil, "-transport launch wants at least 2 processes"},
		{[]string{"-transport", "tcp"}, launcher, "-transport tcp: the launcher (torchrun) started 3 processes"},
		{[]string{"-workers", "2"}, launcher, "-workers 2, but the launcher (torchrun) started 3 processes"},
	} {
		lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
		err := benchComm(append([]string{"-n", "100"}, tc.args...), &bytes.Buffer{}, lookup)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// Four ranks on two nodes (SPARGO_NODE, two launchers' LOCAL_RANK): hier:SPEC's row reports the
// words that crossed nodes next to CostSplit's formula for them, and a formula that is hier's
// for 2 nodes × 2 ranks, not SPEC's flat one.
func TestBenchCommLaunchedHier(t *testing.T) {
	args := []string{"-workers", "4", "-n", "800", "-iters", "1", "-warmup", "1", "-hook", "hier:allreduce", "-hook", "hier:spardl:density=0.01", "-json"}
	port := freePort(t)
	outs, errs := make([]bytes.Buffer, 4), make([]error, 4)
	var wg sync.WaitGroup
	for r := range 4 {
		env := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "4", "LOCAL_RANK": strconv.Itoa(r % 2), "LOCAL_WORLD_SIZE": "2",
			"SPARGO_NODE": "n" + strconv.Itoa(r/2), "SPARGO_SECRET": "bench-comm-hier", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "SPARGO_RUN_ID": "bench-comm-hier-" + port}
		lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
		wg.Go(func() { errs[r] = benchComm(args, &outs[r], lookup) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// 2(n/L)(H-1)/H = 400 and 4k'(H-1)/H with k' = max(1, int(0.01·400)) = 4: 8
	want := map[string]float64{"hier:allreduce": 400, "hier:spardl:density=0.01": 8}
	res := decodeCommResults(t, &outs[0])
	if len(res) != 2 {
		t.Fatalf("%d results", len(res))
	}
	for _, r := range res {
		if r.Nodes != 2 || r.InterFormulaWords != want[r.Hook] || float64(r.InterWordsReceived) != r.InterFormulaWords ||
			!strings.Contains(r.Formula, "across") {
			t.Errorf("%s: %d nodes, %d words across (formula %q = %v, want %v); formula %q", r.Hook, r.Nodes, r.InterWordsReceived,
				r.InterFormula, r.InterFormulaWords, want[r.Hook], r.Formula)
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago, for a job's MASTER_PORT.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}
