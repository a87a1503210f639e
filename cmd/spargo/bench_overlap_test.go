package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/cmd/spargo/internal/overlap"
)

// In-process, the default hooks on ResNet-20 (59 tensors): one JSON report whose rows follow
// the hooks' plans. cmd/spargo/internal/overlap's tests check the timing invariants.
func TestBenchOverlapJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"bench", "overlap", "-model", "resnet20", "-workers", "2", "-batch", "1", "-iters", "1", "-warmup", "0", "-trace", "-json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep overlap.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not one JSON report: %v\n%s", err, out.String())
	}
	if rep.Model != "resnet20" || rep.Workers != 2 || rep.Transport != "in-process" || rep.Tensors != 59 || len(rep.Hooks) != 4 {
		t.Fatalf("report %+v", rep)
	}
	want := map[string]struct {
		plan   string
		groups int
	}{"topka:density=0.01": {"single", 1}, "lags:density=0.01": {"hook", 59}, "mgs:density=0.01": {"hook", -1}, "omgs:density=0.01": {"hook", -1}}
	for _, h := range rep.Hooks {
		w, ok := want[h.Hook]
		if !ok || h.Plan != w.plan || (w.groups > 0 && h.Groups != w.groups) || h.Trace == nil || len(h.Trace.Groups) != h.Groups {
			t.Errorf("%s: plan %s, %d groups, trace %v; want %+v", h.Hook, h.Plan, h.Groups, h.Trace != nil, w)
		}
		if h.Plan == "hook" && !h.Profiled {
			t.Errorf("%s did not get omgs's profile", h.Hook)
		}
	}
	for _, key := range []string{`"non_overlapped_ms"`, `"done_in_backward"`, `"backward_ms"`, `"iteration_ms"`, `"selected_ms"`, `"sent_ms"`} {
		if !strings.Contains(out.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
}

// Under spargo launch every process is a rank over TCP and rank 0 prints the table.
func TestBenchOverlapUnderLaunch(t *testing.T) {
	t.Setenv(runAsSpargoVar, "1")
	var out, errb bytes.Buffer
	code := dispatch([]string{"launch", "-n", "2", "--", os.Args[0], "bench", "overlap", "-model", "resnet20", "-batch", "1", "-iters", "1",
		"-hook", "topka", "-hook", "lags:density=0.05"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"[rank 0] model resnet20 (269722 parameters in 59 tensors), P=2 workers (TCP, one process per rank, torchrun environment)",
		"[rank 0] " + fmt.Sprintf("%-32s %-11s %7d ", "topka:density=0.01", "single", 1), "[rank 0] " + fmt.Sprintf("%-32s %-11s %7d ", "lags:density=0.05", "hook", 59)} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "[rank 1]") {
		t.Errorf("rank 1 printed:\n%s", out.String())
	}
}

func TestBenchOverlapErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-buckets", "many"}, "-buckets \"many\": want single or ddp"},
		{[]string{"-model", "vgg11", "-data", "x"}, "-data and -bptt are for the language models"},
		{[]string{"-model", "nosuch"}, "unknown model"},
		{[]string{"-hook", "nosuch"}, "nosuch"},
		{[]string{"-model", "resnet20", "-iters", "0"}, "iterations 0"},
		{[]string{"-density", "2"}, "-density 2"},
	} {
		var out, errb bytes.Buffer
		if code := dispatch(append([]string{"bench", "overlap"}, tc.args...), &out, &errb); code == 0 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error with %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
