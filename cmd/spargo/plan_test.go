package main

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/hooks/profile"
)

// vggProfile is the VGG-16 profile measured by examples/vgg at P = 4 in-process (see
// hooks/omgs_plan_test.go); it predates the all-reduce timings, so the rows use dense_below=0.
const vggProfile = "../../hooks/testdata/vgg16_p4.profile.json"

// planRun runs `spargo plan ARGS` and returns its standard output.
func planRun(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := dispatch(append([]string{"plan"}, args...), &out, &errb); code != 0 {
		t.Fatalf("plan %v: exit %d: %s", args, code, errb.String())
	}
	return out.String()
}

// planJSON runs `spargo plan ARGS -json`.
func planJSON(t *testing.T, args ...string) planOutput {
	t.Helper()
	var got planOutput
	if err := json.Unmarshal([]byte(planRun(t, append(args, "-json")...)), &got); err != nil {
		t.Fatal(err)
	}
	return got
}

// expectedRows plans prof with the planner functions directly: TopK-SGD, lags, mgs and omgs
// exact on the DDP timeline; TopK-SGD, omgs exact and Algorithm 1 on the paper's.
func expectedRows(t *testing.T, prof *profile.Profile, density float64) []planRow {
	t.Helper()
	order := prof.Order()
	var rows []planRow
	for _, tl := range []hooks.Timeline{hooks.DDPTimeline, hooks.PaperTimeline} {
		m := hooks.NewMergeModel(prof, order, density, tl)
		exact, err := hooks.OptimalMerge(m)
		if err != nil {
			t.Fatal(err)
		}
		row := func(name string, plan []int) planRow {
			return planRow{Plan: name, Timeline: tl.String(), Groups: len(plan), TensorsPerGroup: plan,
				PredictedMS: 1e3 * m.Predict(plan), TopKSGDMS: 1e3 * m.Predict(hooks.PlanSingle(len(order))),
				LAGSMS: 1e3 * m.Predict(hooks.PlanLAGS(len(order)))}
		}
		rows = append(rows, row("topk-sgd", hooks.PlanSingle(len(order))))
		if tl == hooks.DDPTimeline {
			rows = append(rows, row("lags", hooks.PlanLAGS(len(order))), row("mgs", hooks.PlanThreshold(m.Sizes, hooks.DefaultMGSThreshold)),
				row("omgs", exact))
			continue
		}
		alg1, _, err := hooks.FindMergedLayers(m)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, row("omgs:timeline=paper", exact), row("omgs:planner=paper,timeline=paper", alg1))
	}
	return rows
}

// checkRows compares the command's rows with the planner functions' (times to 1 µs: the
// command rounds through time.Duration).
func checkRows(t *testing.T, got []planRow, want []planRow) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if !strings.HasPrefix(g.Plan, w.Plan) || g.Timeline != w.Timeline {
			t.Errorf("row %d is %s on %s, want %s on %s", i, g.Plan, g.Timeline, w.Plan, w.Timeline)
		}
		if g.Groups != w.Groups || !slices.Equal(g.TensorsPerGroup, w.TensorsPerGroup) {
			t.Errorf("%s (%s): groups %v, the planner's %v", g.Plan, g.Timeline, g.TensorsPerGroup, w.TensorsPerGroup)
		}
		for _, c := range []struct {
			name      string
			got, want float64
		}{{"predicted", g.PredictedMS, w.PredictedMS}, {"TopK-SGD", g.TopKSGDMS, w.TopKSGDMS}, {"LAGS", g.LAGSMS, w.LAGSMS}} {
			if math.Abs(c.got-c.want) > 1e-3 {
				t.Errorf("%s (%s): %s %.6f ms, the cost model's %.6f ms", g.Plan, g.Timeline, c.name, c.got, c.want)
			}
		}
		if math.Abs(g.Speedup-g.TopKSGDMS/g.PredictedMS) > 1e-6 {
			t.Errorf("%s: TopK-SGD ÷ plan %v, want %v", g.Plan, g.Speedup, g.TopKSGDMS/g.PredictedMS)
		}
	}
}

// The plans printed for the committed VGG-16 profile are the planner functions' plans, as
// JSON and in the table; and cost overrides change the predictions as the cost model says.
func TestPlanVGG16Profile(t *testing.T) {
	prof, err := profile.Load(vggProfile)
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"-profile", vggProfile, "-model", "vgg16", "-density", "0.001", "-dense-below", "0"}
	got := planJSON(t, base...)
	checkRows(t, got.Rows, expectedRows(t, prof, 0.001))

	// The table shows the same group counts.
	table := planRun(t, base...)
	var counts []int
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && (f[1] == "ddp" || f[1] == "paper") {
			n, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			counts = append(counts, n)
		}
	}
	var want []int
	for _, r := range got.Rows {
		want = append(want, r.Groups)
	}
	if !slices.Equal(counts, want) {
		t.Errorf("the table's groups %v, the JSON's %v:\n%s", counts, want, table)
	}

	// The OMGS reference's 1 GbE all-gather and a GPU-like compute: the same planners on the
	// profile with those costs.
	over := planJSON(t, append(base, "-allgather-alpha", "22ms", "-allgather-beta", "272", "-compute-scale", "0.1")...)
	q := *prof
	q.AllGather = profile.AllGatherCost{Alpha: 22e-3, Beta: 272e-9}
	q.Forward, q.Backward = prof.Forward/10, prof.Backward/10
	q.ParamBackward = nil
	for _, d := range prof.ParamBackward {
		q.ParamBackward = append(q.ParamBackward, time.Duration(math.Round(float64(d)/10)))
	}
	checkRows(t, over.Rows, expectedRows(t, &q, 0.001))
	if over.AllGather.Alpha != 22e-3 || math.Abs(over.AllGather.Beta-272e-9) > 1e-18 || math.Abs(over.ForwardMS-ms(prof.Forward)/10) > 1e-6 {
		t.Errorf("costs %+v, forward %v ms", over.AllGather, over.ForwardMS)
	}
	// TopK-SGD's one group on the DDP timeline: forward + backward + selection + one
	// all-gather of 8·ρ·n bytes, so the overrides move it by exactly the compute removed and
	// the all-gather's change.
	n := float64(got.Elements)
	wantDelta := -0.9*(ms(prof.Forward)+ms(prof.ParamBackward[prof.Order()[len(prof.Params)-1]])) +
		1e3*((22e-3-prof.AllGather.Alpha)+(272e-9-prof.AllGather.Beta)*8*0.001*n)
	if d := over.Rows[0].PredictedMS - got.Rows[0].PredictedMS; math.Abs(d-wantDelta) > 1e-3 {
		t.Errorf("TopK-SGD moved by %.6f ms, the cost model says %.6f ms", d, wantDelta)
	}
	// The paper's case: with GPU-like compute on 1 GbE omgs merges VGG-16 into 2 groups
	// (BENCHMARKS.md), and Algorithm 1 into one.
	if over.Rows[3].Groups != 2 || over.Rows[6].Groups != 1 {
		t.Errorf("omgs %d groups, Algorithm 1 %d; BENCHMARKS.md has 2 and 1", over.Rows[3].Groups, over.Rows[6].Groups)
	}

	// -network: rings of 16 ranks on 1 Gbit/s with 50 µs latency.
	ring := planJSON(t, append(base, "-network", "1gbit,50us", "-network-workers", "16")...)
	if math.Abs(ring.AllGather.Alpha-15*50e-6) > 1e-12 || math.Abs(ring.AllGather.Beta-15*8e-9) > 1e-18 ||
		math.Abs(ring.AllReduce.Alpha-30*50e-6) > 1e-12 || math.Abs(ring.AllReduce.Beta-2*15.0/16*8e-9) > 1e-18 {
		t.Errorf("ring costs: all-gather %+v, all-reduce %+v", ring.AllGather, ring.AllReduce)
	}
	q = *prof
	q.AllGather = profile.AllGatherCost{Alpha: 15 * 50e-6, Beta: 15 * 8e-9}
	checkRows(t, ring.Rows, expectedRows(t, &q, 0.001))
}

// Measuring: an image classifier and an LSTM language model on random inputs, quickly.
func TestPlanMeasure(t *testing.T) {
	for _, args := range [][]string{
		{"-model", "resnet20", "-batch", "2"},
		{"-model", "lstm-ptb-small", "-batch", "2", "-bptt", "3", "-density", "0.005"},
	} {
		got := planJSON(t, append([]string{"-measure", "-workers", "2", "-warmup", "0", "-iters", "1"}, args...)...)
		if got.P != 2 || len(got.Rows) != 7 || got.ForwardMS <= 0 {
			t.Fatalf("%v: P=%d, %d rows, forward %v ms", args, got.P, len(got.Rows), got.ForwardMS)
		}
		want := map[string]int{"resnet20": 59, "lstm-ptb-small": 11}[args[1]]
		if got.Tensors != want || got.Rows[1].Groups != want {
			t.Errorf("%s: %d tensors, lags %d groups; want %d", args[1], got.Tensors, got.Rows[1].Groups, want)
		}
		for _, r := range got.Rows {
			if planTensorsSum(r.TensorsPerGroup) != want || !(r.PredictedMS > 0) {
				t.Errorf("%s: row %+v", args[1], r)
			}
		}
	}
}

func planTensorsSum(groups []int) int {
	s := 0
	for _, g := range groups {
		s += g
	}
	return s
}

func TestPlanErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "-profile FILE or -measure"},
		{[]string{"-profile", vggProfile, "-measure", "-model", "vgg16"}, "one of them"},
		{[]string{"-measure"}, "needs -model"},
		{[]string{"-profile", vggProfile, "-batch", "4"}, "go with -measure"},
		{[]string{"-profile", vggProfile, "-hook", "topka"}, "does not merge"},
		{[]string{"-profile", vggProfile, "-model", "vgg11"}, "does not fit -model vgg11"},
		{[]string{"-profile", vggProfile, "-network", "1gbit", "-allgather-alpha", "1ms"}, "not both"},
		{[]string{"-profile", vggProfile, "-network", "fast"}, "-network"},
		{[]string{"-profile", vggProfile, "-compute-scale", "0"}, "-compute-scale"},
		{[]string{"-profile", vggProfile, "-hook", "lags:density=0.01", "-hook", "omgs:density=0.001"}, "same"},
		// The saved profile has no all-reduce timings: omgs with dense tensors refuses it.
		{[]string{"-profile", vggProfile}, "no all-reduce timings"},
		{[]string{"-measure", "-model", "bert-tiny", "-workers", "1"}, "-measure feeds images"},
	} {
		var out, errb bytes.Buffer
		code := dispatch(append([]string{"plan"}, c.args...), &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("plan %v: exit %d, %q; want an error with %q", c.args, code, errb.String(), c.want)
		}
	}
}

// The ResNet-50 and LSTM-PTB profiles of BENCHMARKS.md (measured with spargo plan -measure,
// see there) give the cost-independent plans of the OMGS paper's Table V exactly: LAGS 161
// and 11 groups, MGS (threshold 8192) 53 and 9.
func TestPlanTableVProfiles(t *testing.T) {
	for _, c := range []struct {
		file, density string
		tensors, mgs  int
	}{
		{"../../hooks/testdata/resnet50_p2_b8.profile.json", "0.001", 161, 53},
		{"../../hooks/testdata/lstm-ptb_p2_b100.profile.json", "0.005", 11, 9},
	} {
		got := planJSON(t, "-profile", c.file, "-density", c.density, "-dense-below", "0")
		if got.Tensors != c.tensors || got.Rows[1].Groups != c.tensors || got.Rows[2].Groups != c.mgs {
			t.Errorf("%s: %d tensors, lags %d groups, mgs %d; want %d, %d, %d", c.file, got.Tensors, got.Rows[1].Groups,
				got.Rows[2].Groups, c.tensors, c.tensors, c.mgs)
		}
	}
}
