package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
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
		{[]string{"-hook", "gtopk", "-workers", "3", "-n", "100"}, "power-of-two number of workers, have P=3"},
		{[]string{"-hook", "spardl:teams=2", "-workers", "3", "-n", "100"}, "teams=2 does not divide the world size P=3"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"bench", "comm"}, tc.args...)
		if code := dispatch(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
		}
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
