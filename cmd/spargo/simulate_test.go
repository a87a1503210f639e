package main

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/hooks"
)

// simJSON runs `spargo simulate ARGS -json` and returns its lines by hook.
func simJSON(t *testing.T, args ...string) map[string]simResult {
	t.Helper()
	var out, errb bytes.Buffer
	if code := dispatch(append(append([]string{"simulate"}, args...), "-json"), &out, &errb); code != 0 {
		t.Fatalf("simulate %v: exit %d: %s", args, code, errb.String())
	}
	got := map[string]simResult{}
	dec := json.NewDecoder(&out)
	for dec.More() {
		var r simResult
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		got[r.Hook] = r
	}
	return got
}

// The ring all-reduce at P = 4 on the command line: 2(P-1)(α + (n/P)·4β) exactly.
func TestSimulateRing(t *testing.T) {
	r := simJSON(t, "-n", "4000", "-workers", "4", "-hook", "allreduce:algorithm=ring", "-compute", "none",
		"-bandwidth", "1gbit", "-latency", "50us")["allreduce:algorithm=ring"]
	want := 2 * 3 * (50e-6 + 1000*4*8e-9) * 1e3
	if math.Abs(r.TimeMS-want) > 1e-9 || r.Rounds != 6 || r.BytesReceived != 6*4000 || r.ComputeMS != 0 {
		t.Errorf("got %+v, want %.6f ms, 6 rounds, 24000 bytes", r, want)
	}
	if r.Formula != "2n(P-1)/P" || r.FormulaWords != 6000 || r.WordsReceived != 6000 {
		t.Errorf("formula %q = %v, simulated %d words; want 2n(P-1)/P = 6000", r.Formula, r.FormulaWords, r.WordsReceived)
	}
}

// Recursive doubling on nodes of R workers: the first log2 R steps swap the whole vector
// through shared memory, the other log2(P/R) across nodes, so a call takes exactly
// log2(R)(α' + 4nβ') + log2(P/R)(α + 4nβ), and a worker receives log2(P/R)·n words from other
// nodes.
func TestSimulateRanksPerNode(t *testing.T) {
	const n, p = 4000, 8
	alpha, beta, intraAlpha, intraBeta := 50e-6, 8e-9, 2e-6, 8.0/40e9
	for _, r := range []int{1, 2, 4, 8} {
		spec := "allreduce:algorithm=recursive_doubling"
		res := simJSON(t, "-n", "4000", "-workers", "8", "-hook", spec, "-compute", "none", "-bandwidth", "1gbit", "-latency", "50us",
			"-ranks-per-node", strconv.Itoa(r), "-intra-bandwidth", "40gbit", "-intra-latency", "2us")[spec]
		intraSteps, interSteps := math.Log2(float64(r)), math.Log2(float64(p/r))
		want := (intraSteps*(intraAlpha+4*n*intraBeta) + interSteps*(alpha+4*n*beta)) * 1e3
		if math.Abs(res.TimeMS-want) > 1e-9*want {
			t.Errorf("R=%d: %.9f ms, want log2(R)(α'+4nβ') + log2(P/R)(α+4nβ) = %.9f ms", r, res.TimeMS, want)
		}
		if r == 1 {
			if res.RanksPerNode != 0 || res.InterWordsReceived != 0 {
				t.Errorf("R=1 reports nodes: %+v", res)
			}
			continue
		}
		if res.RanksPerNode != r || res.InterWordsReceived != int64(interSteps)*n || res.WordsReceived != int64(math.Log2(p))*n {
			t.Errorf("R=%d: %d of %d words from other nodes, want %d of %d (%+v)", r, res.InterWordsReceived, res.WordsReceived,
				int64(interSteps)*n, int64(math.Log2(p))*n, res)
		}
	}
	// The table shows the inter-node traffic next to the totals.
	var out, errb bytes.Buffer
	if code := dispatch([]string{"simulate", "-n", "4000", "-workers", "4", "-ranks-per-node", "2", "-hook", "allreduce", "-compute", "none"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, w := range []string{"2 nodes of R=2 workers; inside a node shared memory of 80 Gbit/s, α'=1µs", "inter_recv", "from other nodes"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
}

// fixedRates is a cost model with round numbers, so that runs are comparable bit for bit.
var fixedRates = kernelRates{
	pass:      1e-9,
	topk:      func(n, k int) float64 { return 3e-9 * float64(n) },
	blockTopk: func(c, kb, n int) float64 { return 4e-9 * float64(n) },
	filter:    5e-10, kth: 2e-9, sparseIn: 4e-9,
	work: [hooks.NumWork]float64{hooks.WorkAdd: 1e-9, hooks.WorkCopy: 1e-9, hooks.WorkClear: 5e-10, hooks.WorkScale: 1e-9,
		hooks.WorkKth: 2e-9, hooks.WorkScan: 5e-10, hooks.WorkGather: 3e-9, hooks.WorkAppend: 2e-9, hooks.WorkPack: 1e-9,
		hooks.WorkUnpack: 2e-9, hooks.WorkScatterAdd: 4e-9, hooks.WorkScatterSet: 3e-9, hooks.WorkWalk: 2e-9, hooks.WorkHistogram: 1e-9},
}

// Ok-Topk is charged exactly the work it reports (hooks.WorkMeter), each unit at its rate,
// times the down-scaling factor and the -cores contention, and nothing else: with only the
// dense add and scale priced, every worker is charged (rate_add + rate_scale)·n per call.
func TestSimulateOkTopkChargesReportedWork(t *testing.T) {
	const p, nSim, scale = 4, 8000, 3
	var rates kernelRates
	rates.work[hooks.WorkAdd], rates.work[hooks.WorkScale] = 1e-9, 3e-9
	o := simOptions{model: "test", workers: p, alpha: 20e-6, beta: 1e-9, bandwidthBits: 8e9, iters: 2, warmup: 1,
		compute: "measure", rates: &rates, mem: 1 << 30, cores: 2}
	res, err := simulateHook(o, scalePlan{nSim: nSim, scale: scale}, testRow(t, "oktopk:density=0.01"))
	if err != nil {
		t.Fatal(err)
	}
	want := 4e-9 * nSim * scale * (p / 2) * 1e3 // ms per call
	if math.Abs(res.ComputeMS-want) > 1e-9*want {
		t.Errorf("compute %.9f ms per call, want (1+3) ns × %d × M=%d × P/cores=%d = %.9f ms", res.ComputeMS, nSim, scale, p/2, want)
	}
	// Every piece priced: more than the two passes, and no piece is free.
	all := o
	all.rates = &fixedRates
	full, err := simulateHook(all, scalePlan{nSim: nSim, scale: scale}, testRow(t, "oktopk:density=0.01"))
	if err != nil {
		t.Fatal(err)
	}
	if full.ComputeMS <= res.ComputeMS {
		t.Errorf("all pieces priced: %.6f ms, want more than add and scale alone (%.6f ms)", full.ComputeMS, res.ComputeMS)
	}
}

// Down-scaling: a run on n/M elements per worker with every message counted M times predicts
// the time, volume and rounds of the full run, exactly for the schedules whose sizes follow k
// or n, and within a few per cent for the data-dependent Ok-Topk and TopkDSA.
func TestSimulateScaledMatchesFull(t *testing.T) {
	const p = 8
	specs := []string{"spardl:density=0.01", "spardl:density=0.01,teams=2", "topka:density=0.01", "gtopk:density=0.01",
		"allreduce", "oktopk:density=0.01", "topkdsa:density=0.01"}
	base := simOptions{model: "test", workers: p, alpha: 20e-6, beta: 1e-9, bandwidthBits: 8e9, iters: 2, warmup: 1,
		compute: "measure", rates: &fixedRates, mem: 1 << 30}
	for _, spec := range specs {
		scaled, err := simulateHook(base, scalePlan{nSim: 800 * 10, scale: 16}, testRow(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		full, err := simulateHook(base, scalePlan{nSim: 800 * 10 * 16, scale: 1}, testRow(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		tol := 1e-9
		if strings.HasPrefix(spec, "oktopk") || strings.HasPrefix(spec, "topkdsa") {
			tol = 0.05
		}
		rel := func(a, b float64) float64 { return math.Abs(a-b) / b }
		if rel(scaled.TimeMS, full.TimeMS) > tol || rel(float64(scaled.BytesReceived), float64(full.BytesReceived)) > tol ||
			rel(scaled.ComputeMS, full.ComputeMS) > tol || scaled.Rounds != full.Rounds {
			t.Errorf("%s: scaled %.6f ms (compute %.6f), %d bytes, %d rounds; full %.6f ms (compute %.6f), %d bytes, %d rounds",
				spec, scaled.TimeMS, scaled.ComputeMS, scaled.BytesReceived, scaled.Rounds, full.TimeMS, full.ComputeMS, full.BytesReceived, full.Rounds)
		}
		if full.TimeMS <= full.ComputeMS || full.ComputeMS <= 0 {
			t.Errorf("%s: time %.6f ms, compute %.6f ms: want both charged", spec, full.TimeMS, full.ComputeMS)
		}
	}
}

// -scale auto shrinks only when P·n does not fit -mem, each hook to a multiple of its own
// unit: P/density for the hooks that split the vector into P blocks, 1/density for those
// that gather whole selections.
func TestPlanScale(t *testing.T) {
	o := simOptions{workers: 1024, nModel: 14_728_266, specs: []string{"spardl:density=0.01", "allreduce"}, densities: []float64{0.01, 1}, mem: 2 << 30}
	for i, unit := range []int{102400, 1024} {
		plan, err := planScale(o, i)
		if err != nil {
			t.Fatal(err)
		}
		if plan.nSim%unit != 0 || math.Abs(float64(plan.nSim*plan.scale)/14_728_266-1) > 0.005 ||
			int64(plan.nSim)*1024*simBytesPerElement > o.mem {
			t.Errorf("%s: plan %+v: want a multiple of %d within -mem, M·nSim within 0.5 %% of n", o.specs[i], plan, unit)
		}
	}
	// VGG-19 on CIFAR-100 at P = 14 (SparDL's setting): the largest vector that fits is
	// between n/2 and n, so M = 2; M·nSim must still be within 0.5 % of n (it was +7 %).
	o = simOptions{workers: 14, nModel: 20_086_692, specs: []string{"topka:density=0.01"}, densities: []float64{0.01}, mem: 2 << 30}
	plan, err := planScale(o, 0)
	if err != nil || plan.scale != 2 || plan.nSim%100 != 0 || math.Abs(float64(plan.nSim*plan.scale)/20_086_692-1) > 0.005 {
		t.Errorf("vgg19 P=14: plan %+v, %v; want M = 2, a multiple of 100, M·nSim within 0.5 %% of n", plan, err)
	}
	// VGG-16 at P = 256: units of 25,600 elements; M = 22 (the smallest that fits) leaves
	// 22·26 = 572 of 575 units (−0.6 %), M = 23 gives 23·25 = 575.
	o = simOptions{workers: 256, nModel: 14_728_266, specs: []string{"spardl:density=0.01"}, densities: []float64{0.01}, mem: 2 << 30}
	plan, err = planScale(o, 0)
	if err != nil || plan.nSim%25600 != 0 || math.Abs(float64(plan.nSim*plan.scale)/14_728_266-1) > 0.002 ||
		int64(plan.nSim)*256*simBytesPerElement > o.mem {
		t.Errorf("vgg16 P=256: plan %+v, %v; want a multiple of 25600 within -mem, M·nSim within 0.2 %% of n", plan, err)
	}
	o.workers, o.nModel = 4, 1000
	if plan, err := planScale(o, 0); err != nil || plan != (scalePlan{nSim: 1000, scale: 1}) {
		t.Errorf("small run: %+v, %v; want no scaling", plan, err)
	}
	// TopkA at P = 1024 holds P·k entries per worker: its k shrinks to a whole number (not a
	// multiple of P), so 1024 workers fit 2 GiB with their gathered selections.
	o = simOptions{workers: 1024, nModel: 20_040_522, specs: []string{"topka:density=0.01"}, densities: []float64{0.01}, mem: 2 << 30}
	plan, err = planScale(o, 0)
	gathered := int64(plan.nSim) * 1024 * (simBytesPerElement + 16*1024/100)
	if err != nil || plan.nSim%100 != 0 || gathered > o.mem || math.Abs(float64(plan.nSim*plan.scale)/20_040_522-1) > 0.005 {
		t.Errorf("topka at P=1024 in 2 GiB: plan %+v (%d MiB), %v; want a multiple of 100 within -mem", plan, gathered>>20, err)
	}
	o.mem = 1 << 20
	if _, err := planScale(o, 0); err == nil || !strings.Contains(err.Error(), "-mem 1 MiB is too small for topka:density=0.01") {
		t.Errorf("topka at P=1024 in 1 MiB: %v, want -mem too small, naming the hook", err)
	}
}

// Same seed, same output, bit for bit (the cost model fixed: measured rates vary run to run).
func TestSimulateDeterministic(t *testing.T) {
	o := simOptions{model: "test", workers: 6, alpha: 5e-5, beta: 8e-9, bandwidthBits: 1e9, iters: 2, warmup: 1,
		compute: "measure", rates: &fixedRates, mem: 1 << 30, seed: 3}
	for _, spec := range []string{"spardl:density=0.01,teams=3", "oktopk:density=0.01", "topkdsa:density=0.01"} {
		a, err := simulateHook(o, scalePlan{nSim: 60000, scale: 1}, testRow(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		b, err := simulateHook(o, scalePlan{nSim: 60000, scale: 1}, testRow(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Errorf("%s: two runs differ:\n%+v\n%+v", spec, a, b)
		}
	}
}

func TestSimulateTable(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"simulate", "-model", "vgg11", "-workers", "4", "-scale", "64", "-hook", "spardl", "-hook", "topka"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"vgg11: 9", "= 64 ×", "spardl:density=0.01", "topka:density=0.01", "4k(P-1)/P", "2k(P-1)", "comm_ms",
		"every message counted 64 times: exact (message sizes follow k or n)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// -model takes any catalogue name.
func TestSimulateResNet(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"simulate", "-model", "resnet20", "-workers", "4", "-hook", "allreduce", "-iters", "1", "-warmup", "0"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "resnet20: 269722") {
		t.Errorf("output lacks the ResNet-20 size:\n%s", out.String())
	}
}

func TestSimulateErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-workers", "0"}, "-workers 0"},
		{[]string{"-workers", "4", "-bandwidth", "fast"}, `-bandwidth "fast"`},
		{[]string{"-workers", "4", "-bandwidth", "0gbit"}, `-bandwidth "0gbit"`},
		{[]string{"-workers", "4", "-latency", "-1ms"}, "-latency -1ms"},
		{[]string{"-workers", "4", "-compute", "wall"}, `-compute "wall"`},
		{[]string{"-workers", "4", "-scale", "0"}, `-scale "0"`},
		{[]string{"-workers", "4", "-mem", "lots"}, `-mem "lots"`},
		{[]string{"-workers", "4", "-model", "alexnet"}, `-model "alexnet"`},
		{[]string{"-workers", "4", "-n", "x"}, `-n "x"`},
		{[]string{"-workers", "4", "-iters", "0"}, "-iters 0"},
		{[]string{"-workers", "4", "-density", "0"}, "-density 0"},
		{[]string{"-workers", "4", "-hook", "nosuch"}, `unknown hook "nosuch"`},
		{[]string{"-workers", "3", "-n", "3000", "-hook", "gtopk"}, "hook gtopk cannot run at world size P=3: gtopk needs a power-of-two number of workers"},
		{[]string{"-workers", "64", "-n", "1M", "-scale", "1", "-mem", "1MiB"}, "-scale 1: 64 workers"},
		{[]string{"-workers", "1024", "-n", "1M", "-mem", "1MiB"}, "-mem 1 MiB is too small"},
		{[]string{"-workers", "1", "-validate"}, "-workers 1: want at least 2"},
		{[]string{"-workers", "4", "extra"}, `unexpected argument "extra"`},
		{[]string{"-workers", "8", "-ranks-per-node", "3"}, "-ranks-per-node 3 does not divide -workers 8: every node needs the same number of workers"},
		{[]string{"-workers", "8", "-ranks-per-node", "0"}, "-ranks-per-node 0: want at least 1"},
		{[]string{"-workers", "8", "-ranks-per-node", "2", "-intra-bandwidth", "fast"}, `-intra-bandwidth "fast"`},
		{[]string{"-workers", "8", "-ranks-per-node", "2", "-intra-latency", "-1us"}, "-intra-latency -1µs"},
		{[]string{"-workers", "4", "-ranks-per-node", "2", "-validate"}, "-validate runs every worker over TCP on loopback, with no nodes"},
	} {
		var out, errb bytes.Buffer
		if code := dispatch(append([]string{"simulate"}, tc.args...), &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

func TestParseBandwidth(t *testing.T) {
	for s, want := range map[string]float64{"1gbit": 1e9, "10Gbit": 1e10, "100mbit": 1e8, "2.5gbps": 2.5e9, "800kbit": 8e5} {
		if got, err := parseBandwidth(s); err != nil || got != want {
			t.Errorf("parseBandwidth(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "1", "gbit", "-1gbit", "1gb"} {
		if _, err := parseBandwidth(s); err == nil {
			t.Errorf("parseBandwidth(%q) accepted", s)
		}
	}
}

// -validate runs over real TCP and prints measured, predicted and the error (the accuracy
// itself is a measurement: BENCHMARKS.md).
func TestSimulateValidate(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"simulate", "-validate", "-workers", "2", "-n", "64k", "-iters", "1", "-hook", "topka"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"fitted α", "measured_ms", "predicted_ms", "topka:density=0.01"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// -backward: covap:interval=auto profiles the simulated all-reduce against the backward and
// picks I = ⌈CCR⌉; its time per call is then the all-reduce's over I (a whole number of
// intervals is timed), its traffic the mean per call; the backward itself stays out of
// time_ms (the all-reduce's is the same with and without it); without -backward, auto is a
// clear error.
func TestSimulateBackwardCovapAuto(t *testing.T) {
	args := []string{"-n", "12000", "-workers", "4", "-compute", "none", "-bandwidth", "1gbit", "-latency", "50us"}
	plain := simJSON(t, append(args, "-hook", "allreduce:algorithm=ring")...)["allreduce:algorithm=ring"]
	r := simJSON(t, append(args, "-backward", "400us", "-hook", "allreduce:algorithm=ring", "-hook", "covap:interval=auto,algorithm=ring")...)
	ar, cv := r["allreduce:algorithm=ring"], r["covap:interval=auto,algorithm=ring"]
	if math.Abs(ar.TimeMS-plain.TimeMS) > 1e-9 || ar.BackwardMS != 0.4 {
		t.Errorf("all-reduce with -backward: %v ms (backward %v), without %v ms", ar.TimeMS, ar.BackwardMS, plain.TimeMS)
	}
	ccr := ar.TimeMS / 0.4 // 2·3·(50 µs + 3000·4·8 ns) = 0.876 ms against 0.4 ms: CCR 2.19, I = 3
	if math.Abs(cv.CovapCCR-ccr) > 1e-6 || cv.CovapInterval != int(math.Ceil(ccr)) || cv.CovapInterval != 3 {
		t.Errorf("covap: CCR %v, I %d; want %v, %d", cv.CovapCCR, cv.CovapInterval, ccr, int(math.Ceil(ccr)))
	}
	if math.Abs(cv.TimeMS-ar.TimeMS/3) > 1e-9 || cv.BytesReceived != ar.BytesReceived/3 || cv.FormulaWords != float64(cv.WordsReceived) {
		t.Errorf("covap per call: %v ms, %d bytes, formula %q = %v vs %d words; want %v ms, %d bytes",
			cv.TimeMS, cv.BytesReceived, cv.Formula, cv.FormulaWords, cv.WordsReceived, ar.TimeMS/3, ar.BytesReceived/3)
	}
	var out, errb bytes.Buffer
	if code := dispatch(append([]string{"simulate"}, append(args, "-hook", "covap")...), &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "give -backward") {
		t.Errorf("covap auto without -backward: exit %d, %q", code, errb.String())
	}
}

// testRow parses spec as a -hook row; the spec sets its density (dense hooks: 1).
func testRow(t testing.TB, spec string) hookRow {
	t.Helper()
	row, err := withDensity(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// From P = 512 one timed call is the default, and the header says so; -iters overrides it.
func TestSimulateLargePDefaultIters(t *testing.T) {
	for _, c := range []struct {
		args []string
		note bool
	}{
		{[]string{"simulate", "-n", "4k", "-workers", "512", "-hook", "allreduce", "-compute", "none", "-warmup", "0"}, true},
		{[]string{"simulate", "-n", "4k", "-workers", "512", "-hook", "allreduce", "-compute", "none", "-warmup", "0", "-iters", "2"}, false},
		{[]string{"simulate", "-n", "4k", "-workers", "256", "-hook", "allreduce", "-compute", "none", "-warmup", "0"}, false},
	} {
		var out, errb bytes.Buffer
		if code := dispatch(c.args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, errb.String())
		}
		if got := strings.Contains(out.String(), "-iters 1 (the default from P=512"); got != c.note {
			t.Errorf("%v: note of -iters 1 %v, want %v:\n%s", c.args, got, c.note, out.String())
		}
	}
}
