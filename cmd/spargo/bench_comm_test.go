package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/gradrec"
	"github.com/spargo-dl/spargo/hooks"
)

// Small n: every default hook runs, the JSON has the stable keys, and SparDL's counts match
// its cost oracle (P=4, n=4000, density 0.01: k_b = 10, 2·ceil(log2 4) = 4 rounds,
// 4(P-1)·k_b = 120 words; synthetic gradients have no zeros).
func TestBenchCommJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"bench", "comm", "-workers", "4", "-n", "4k", "-iters", "2", "-json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	got := map[string]map[string]any{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var res map[string]any
		if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
			t.Fatalf("line is not a JSON object: %v\n%s", err, sc.Text())
		}
		for _, k := range []string{"hook", "workers", "n", "density", "time_ms", "rounds", "bytes_received", "words_received"} {
			if _, ok := res[k]; !ok {
				t.Errorf("JSON lacks key %q: %s", k, sc.Text())
			}
		}
		got[res["hook"].(string)] = res
	}
	for _, h := range []string{"spardl:density=0.01", "topka:density=0.01", "topkdsa:density=0.01", "gtopk:density=0.01", "allreduce"} {
		if got[h] == nil {
			t.Errorf("no result for %s in\n%s", h, out.String())
		}
	}
	s := got["spardl:density=0.01"]
	if s["rounds"] != float64(4) || s["words_received"] != float64(120) || s["bytes_received"] != float64(480) || s["n"] != float64(4000) || s["workers"] != float64(4) {
		t.Errorf("spardl: %v, want 4 rounds, 120 words", s)
	}
	if got["allreduce"]["density"] != float64(1) || got["topka:density=0.01"]["words_received"] != float64(2*40*3) {
		t.Errorf("allreduce %v, topka %v", got["allreduce"], got["topka:density=0.01"])
	}
}

// Over TCP on loopback the counts are those of the in-process run, and the formula column
// holds the cost formula (P=4, n=4000, density 0.01: SparDL 4k(P-1)/P = 120 words).
func TestBenchCommTCP(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"bench", "comm", "-workers", "4", "-n", "4k", "-iters", "1", "-transport", "tcp", "-hook", "spardl", "-hook", "allreduce", "-json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	dec := json.NewDecoder(&out)
	seen := 0
	for dec.More() {
		var r commResult
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		seen++
		if r.Transport != "tcp" || float64(r.WordsReceived) != r.FormulaWords {
			t.Errorf("%+v: want transport tcp and words received = formula", r)
		}
	}
	if seen != 2 {
		t.Errorf("%d results, want 2:\n%s", seen, out.String())
	}
}

func TestBenchCommTable(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"bench", "comm", "-workers", "3", "-n", "900", "-iters", "1", "-hook", "spardl:teams=3", "-hook", "topkdsa", "-density", "0.05"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"time_ms", "rounds", "words_received", "spardl:teams=3,density=0.05", "topkdsa:density=0.05"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "gtopk") {
		t.Errorf("gtopk listed without being asked:\n%s", out.String())
	}
}

func TestBenchCommErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-workers", "0"}, "-workers 0"},
		{[]string{"-n", "0"}, `-n "0"`},
		{[]string{"-n", "lots"}, `-n "lots"`},
		{[]string{"-iters", "0"}, "-iters 0"},
		{[]string{"-density", "2"}, "-density 2"},
		{[]string{"-transport", "udp"}, `-transport "udp"`},
		{[]string{"-hook", "nosuch"}, `unknown hook "nosuch"`},
		{[]string{"-hook", "spardl:density=x"}, `density="x"`},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"bench", "comm"}, tc.args...)
		if code := dispatch(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

// A hook that cannot run at this world size gets its refusal in its row (ddp.CheckWorldSize,
// what ddp.New refuses), and the other -hooks still run.
func TestBenchCommRefusesAndGoesOn(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"bench", "comm", "-workers", "6", "-n", "600", "-iters", "1", "-warmup", "0",
		"-hook", "gtopk", "-hook", "spardl:teams=4", "-hook", "topka"}
	if code := dispatch(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(out.String(), "\n")
	for _, want := range []string{
		"gtopk:density=0.01 ", "refused: ddp: hook gtopk cannot run at world size P=6: gtopk needs a power-of-two number of workers",
		"spardl:teams=4,density=0.01 ", "refused: ddp: hook spardl cannot run at world size P=6: spardl option teams=4 does not divide the world size (divisors of 6: [1 2 3 6]",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	var topka string
	for _, l := range lines {
		if strings.HasPrefix(l, "topka:density=0.01 ") {
			topka = l
		}
	}
	// 600 elements, k = 6, P = 6: TopkA's all-gather brings 5·6 pairs of 8 bytes.
	if f := strings.Fields(topka); len(f) < 6 || f[5] != "240" {
		t.Errorf("topka's row %q: want it measured after the refusals, 240 bytes received:\n%s", topka, out.String())
	}
	out.Reset()
	if code := dispatch(append(args, "-json"), &out, &errb); code != 0 {
		t.Fatalf("-json: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), `"refused":"ddp: hook gtopk cannot run at world size P=6`) {
		t.Errorf("-json lacks gtopk's refusal:\n%s", out.String())
	}
}

func TestParseCount(t *testing.T) {
	for s, want := range map[string]int{"14.7M": 14_700_000, "4k": 4000, "1000": 1000, "2G": 2_000_000_000} {
		if got, err := parseCount(s); err != nil || got != want {
			t.Errorf("parseCount(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "1.5", "-3", "3G", "M"} {
		if _, err := parseCount(s); err == nil {
			t.Errorf("parseCount(%q) accepted", s)
		}
	}
}

// writeRecording writes a P=2 recording of two iterations of two parameters (100 elements
// each) in which rank r's 20 largest entries are at 20 positions of its own (disjoint: the
// first 20 of parameter a for rank 0, the first 20 of b for rank 1) or, with shared, the
// same 20 on both ranks. Everything else is small.
func writeRecording(t *testing.T, shared bool) string {
	t.Helper()
	dir := t.TempDir()
	l := &gradrec.Layout{Model: "toy", Hook: "allreduce", World: 2, Names: []string{"a", "b"}, Shapes: [][]int{{10, 10}, {100}}, Buckets: [][]int{{1, 0}}}
	for _, it := range []int64{7, 8} {
		for r := range 2 {
			g := [][]float32{make([]float32, 100), make([]float32, 100)}
			for i := range 100 {
				g[0][i], g[1][i] = 1e-4*float32(i%7), 1e-4*float32(i%5)
			}
			big := r
			if shared {
				big = 0
			}
			for i := range 20 {
				g[big][i] = 1 + float32(i+r)
			}
			if err := gradrec.WriteIteration(dir, l, r, it, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// -grads replays the recording: TopkA's volume is exact (2k(P-1) words, k = 20 of the
// 200-element bucket), and SparDL's union/k and overlap are 2 and 0 for disjoint selections,
// 1 and 1 for shared ones; with 4 workers each rank is replayed twice.
func TestBenchCommGrads(t *testing.T) {
	for _, tc := range []struct {
		shared           bool
		workers          string
		union, overlap   float64
		topkaWords, wrks float64
	}{
		{false, "", 2, 0, 40, 2},
		{true, "", 1, 1, 40, 2},
		{false, "4", 2, 1.0 / 3, 120, 4}, // pairs (0,2) and (1,3) of six share all of k
	} {
		dir := writeRecording(t, tc.shared)
		args := []string{"bench", "comm", "-grads", dir, "-warmup", "0", "-json", "-density", "0.1", "-hook", "spardl", "-hook", "topka"}
		if tc.workers != "" {
			args = append(args, "-workers", tc.workers)
		}
		var out, errb bytes.Buffer
		if code := dispatch(args, &out, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		got := map[string]map[string]any{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var res map[string]any
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				t.Fatalf("%v: %s", err, line)
			}
			got[res["hook"].(string)] = res
		}
		s, k := got["spardl:density=0.1"], got["topka:density=0.1"]
		if s == nil || k == nil {
			t.Fatalf("missing rows:\n%s", out.String())
		}
		if s["union_k"] != tc.union || math.Abs(s["overlap"].(float64)-tc.overlap) > 1e-9 || s["calls"] != float64(2) || s["n"] != float64(200) ||
			s["grads"] != dir || s["model"] != "toy" || s["workers"] != tc.wrks || s["buckets"] != float64(1) {
			t.Errorf("shared=%v workers=%q: spardl %v, want union_k %v, overlap %v", tc.shared, tc.workers, s, tc.union, tc.overlap)
		}
		if k["words_received"] != tc.topkaWords || k["union_k"] != nil {
			t.Errorf("shared=%v workers=%q: topka %v, want %v words and no overlap columns", tc.shared, tc.workers, k, tc.topkaWords)
		}
	}
}

// -model takes the layout from the model: DDP's three size-capped buckets of VGG-11.
func TestBenchCommModel(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"bench", "comm", "-model", "vgg11", "-workers", "1", "-iters", "1", "-warmup", "0", "-hook", "allreduce"}
	if code := dispatch(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "n=9231114") || !regexp.MustCompile(`allreduce\s+1\s+3\s`).MatchString(out.String()) {
		t.Errorf("want n=9231114 and 3 buckets:\n%s", out.String())
	}
}

// Any catalogue model: ResNet-20's 269,722 parameters fit DDP's 1 MiB first bucket and one more.
func TestBenchCommResNet(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"bench", "comm", "-model", "resnet20", "-workers", "2", "-iters", "1", "-warmup", "0", "-hook", "allreduce"}
	if code := dispatch(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "n=269722") || !regexp.MustCompile(`allreduce\s+1\s+2\s`).MatchString(out.String()) {
		t.Errorf("want n=269722 and 2 buckets:\n%s", out.String())
	}
}

func TestBenchCommGradsErrors(t *testing.T) {
	dir := writeRecording(t, false)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-grads", dir, "-iters", "3"}, "-iters does not apply with -grads"},
		{[]string{"-grads", dir, "-n", "10"}, "-n does not apply"},
		{[]string{"-grads", dir, "-model", "vgg11"}, "-model does not apply with -grads"},
		{[]string{"-grads", dir, "-warmup", "2"}, "-warmup 2: the recording in " + dir + " has 2 iterations [7 8]"},
		{[]string{"-grads", dir, "-warmup", "0", "-workers", "3"}, "-workers 3: the recording in " + dir + " has P=2 ranks"},
		{[]string{"-grads", t.TempDir()}, "-grads: gradrec:"},
		{[]string{"-model", "vgg7"}, `-model: models: unknown model "vgg7"`},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"bench", "comm", "-hook", "topka"}, tc.args...)
		if code := dispatch(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

// A -hook's density joins the innermost spec's options, also under hier's colon, and the
// label parses back to the same hook.
func TestHierHookRowLabels(t *testing.T) {
	for spec, want := range map[string]string{
		"spardl":                         "spardl:density=0.02",
		"spardl:teams=2":                 "spardl:teams=2,density=0.02",
		"fp16+topka":                     "fp16+topka:density=0.02",
		"hier:spardl":                    "hier:spardl:density=0.02",
		"hier:spardl:teams=2":            "hier:spardl:teams=2,density=0.02",
		"hier:oktopk:density=0.05":       "hier:oktopk:density=0.05",
		"hier:allreduce":                 "hier:allreduce",
		"hier:fp16+topka:dense_warmup=1": "hier:fp16+topka:dense_warmup=1,density=0.02",
	} {
		row, err := withDensity(spec, 0.02)
		if err != nil || row.label != want {
			t.Errorf("withDensity(%q) = %q, %v; want %q", spec, row.label, err, want)
			continue
		}
		if c, err := hooks.ParseConfig(row.label); err != nil || c.String() != row.config.String() {
			t.Errorf("label %q parses to %v, %v; the row's config is %q", row.label, c, err, row.config)
		}
	}
}

// spargo hooks lists hier with its description and how to write it.
func TestHierInHooksCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"hooks"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"\nhier\n", "hierarchical", "wrapper: hier:SPEC"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("spargo hooks lacks %q:\n%s", want, out.String())
		}
	}
}
