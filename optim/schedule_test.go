package optim

// Goldens: testdata/goldens/lr_schedule.json from scripts/gen_optim_goldens.py
// (torch.optim.lr_scheduler's StepLR, MultiStepLR, CosineAnnealingLR, and LambdaLR with
// transformers' warm-up lambdas):
//
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_optim_goldens.py testdata/goldens

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
)

// Every golden sequence is checked twice: against the schedule built from its fields and
// against the one ParseSchedule builds from a spec string.
func TestSchedulesMatchTorch(t *testing.T) {
	f := golden.MustLoad(t, "lr_schedule")
	kinds := map[string]bool{}
	for i := range f.Cases {
		c := &f.Cases[i]
		t.Run(c.Name, func(t *testing.T) {
			base, spe, n := c.Float("base"), c.Int("steps_per_epoch"), c.Int("n")
			var direct Schedule
			var spec string
			epochs := 0 // the run's length for ParseSchedule
			switch kind := c.Str("kind"); kind {
			case "steplr":
				direct = StepLR{Base: base, StepSize: c.Int("step_size"), Gamma: c.Float("gamma")}
				spec, epochs = fmt.Sprintf("step:size=%d,gamma=%v", c.Int("step_size"), c.Float("gamma")), n
			case "multistep":
				var ms []string
				var mi []int
				for _, m := range c.Config["milestones"].([]any) {
					mi = append(mi, int(m.(float64)))
					ms = append(ms, fmt.Sprint(m))
				}
				direct = MultiStep{Base: base, Milestones: mi, Gamma: c.Float("gamma")}
				spec, epochs = fmt.Sprintf("multistep:milestones=%s,gamma=%v", strings.Join(ms, "/"), c.Float("gamma")), n
			case "cosine_epoch":
				direct = EpochWise{Cosine{Base: base, Min: c.Float("min"), TotalSteps: c.Int("epochs")}}
				spec, epochs = fmt.Sprintf("cosine:per=epoch,min=%v", c.Float("min")), c.Int("epochs")
			case "cosine":
				w, total := c.Int("warmup_steps"), c.Int("total_steps")
				direct = Cosine{Base: base, Min: c.Float("min"), WarmupSteps: w, TotalSteps: total}
				spec, epochs = fmt.Sprintf("cosine:warmup=%v,min=%v", float64(w)/float64(spe), c.Float("min")), total/spe
			case "linear":
				w, total := c.Int("warmup_steps"), c.Int("total_steps")
				direct = LinearWarmupDecay{Base: base, WarmupSteps: w, TotalSteps: total}
				spec, epochs = fmt.Sprintf("linear:warmup_steps=%d", w), total/spe
			default:
				t.Fatalf("unknown kind %q", kind)
			}
			kinds[c.Str("kind")] = true
			parsed, err := ParseSchedule(spec, base, epochs, spe)
			if err != nil {
				t.Fatalf("ParseSchedule(%q): %v", spec, err)
			}
			for k, w := range c.Config["lrs"].([]any) {
				want := w.(float64)
				epoch, step := k/spe, k%spe
				for _, s := range []struct {
					name string
					s    Schedule
				}{{"direct", direct}, {spec, parsed}} {
					got := s.s.LR(epoch, step, spe)
					if math.Abs(got-want) > 1e-14*math.Abs(want)+1e-18 {
						t.Fatalf("%s: unit %d (epoch %d, step %d): lr %.17g, torch %.17g", s.name, k, epoch, step, got, want)
					}
				}
				if spe > 1 && c.Str("kind") != "cosine" && c.Str("kind") != "linear" {
					// An epoch schedule holds its rate through the epoch.
					if got := direct.LR(epoch, spe-1, spe); got != direct.LR(epoch, 0, spe) {
						t.Fatalf("rate changes within epoch %d", epoch)
					}
				}
			}
		})
	}
	for _, k := range []string{"steplr", "multistep", "cosine_epoch", "cosine", "linear"} {
		if !kinds[k] {
			t.Errorf("no golden case of kind %s", k)
		}
	}
}

func TestParseScheduleBuilds(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Schedule
	}{
		{"", Constant(0.1)},
		{"constant", Constant(0.1)},
		{"cosine", Cosine{Base: 0.1, TotalSteps: 50}},
		{"cosine:warmup=2", Cosine{Base: 0.1, WarmupSteps: 20, TotalSteps: 50}},
		{"cosine:warmup=0.25, min=1e-4", Cosine{Base: 0.1, Min: 1e-4, WarmupSteps: 3, TotalSteps: 50}},
		{"cosine:per=epoch,warmup=1", EpochWise{Cosine{Base: 0.1, WarmupSteps: 1, TotalSteps: 5}}},
		{"linear:warmup_steps=7,total_steps=40", LinearWarmupDecay{Base: 0.1, WarmupSteps: 7, TotalSteps: 40}},
		{"step:size=2", StepLR{Base: 0.1, StepSize: 2, Gamma: 0.1}},
	} {
		got, err := ParseSchedule(tc.spec, 0.1, 5, 10)
		if err != nil {
			t.Errorf("ParseSchedule(%q): %v", tc.spec, err)
			continue
		}
		if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", tc.want) {
			t.Errorf("ParseSchedule(%q) = %#v, want %#v", tc.spec, got, tc.want)
		}
	}
	s, err := ParseSchedule("warmupstep:warmup=2,from=0.01,milestones=3/4,gamma=0.5", 0.1, 5, 10)
	if err != nil {
		t.Fatal(err)
	}
	if ws, ok := s.(WarmupStep); !ok || ws.WarmupFrom != 0.01 || ws.WarmupEpochs != 2 || len(ws.Milestones) != 2 || ws.Gamma != 0.5 {
		t.Errorf("warmupstep: %#v", s)
	}
}

func TestParseScheduleErrors(t *testing.T) {
	for _, tc := range []struct {
		spec          string
		epochs, steps int
		want          string
	}{
		{"cosin", 5, 10, `unknown schedule "cosin"`},
		{"cosine:warmup=x", 5, 10, `schedule cosine: option warmup: "x" is not a number`},
		{"cosine:warmup=-1", 5, 10, "option warmup: -1 is negative"},
		{"cosine:warmpu=1", 5, 10, `schedule cosine has no option "warmpu" (options: warmup, warmup_steps, min, per, total_steps)`},
		{"cosine:warmup", 5, 10, `option "warmup" is not key=value`},
		{"cosine:warmup=5", 5, 10, "the warm-up (50 steps) must be shorter than the run (50 steps)"},
		{"cosine:warmup=1,warmup_steps=3", 5, 10, "not both"},
		{"cosine:per=batch", 5, 10, `option per: "batch" is neither step nor epoch`},
		{"cosine:per=epoch,warmup_steps=3", 5, 10, "per=epoch counts epochs"},
		{"cosine:min=1,min=2", 5, 10, "option min given twice"},
		{"cosine", 0, 10, "epochs 0 and steps per epoch 10 must be at least 1"},
		{"linear:total_steps=0", 5, 10, "option total_steps: 0 is below 1"},
		{"step", 5, 10, "option size: required"},
		{"step:size=0", 5, 10, "option size: 0 is below 1"},
		{"multistep:gamma=0.5", 5, 10, "option milestones: required"},
		{"multistep:milestones=3,x", 5, 10, `option "x" is not key=value`},
		{"multistep:milestones=3;5", 5, 10, `option milestones: "3;5" is not whole numbers separated by /`},
		{"multistep:milestones=3/-5", 5, 10, `option milestones: "-5" is not a non-negative epoch`},
		{"cosine+constant", 5, 10, `schedule cosine in "cosine+constant" wraps nothing`},
		{"constant:lr=1", 5, 10, `constant takes no options, got "lr"`},
	} {
		_, err := ParseSchedule(tc.spec, 0.1, tc.epochs, tc.steps)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSchedule(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
	if _, err := ParseSchedule("cosine", math.NaN(), 5, 10); err == nil {
		t.Error("ParseSchedule accepted a NaN base rate")
	}
}

func TestScheduleHelpListsEverySchedule(t *testing.T) {
	h := ScheduleHelp()
	for _, s := range schedules {
		if !strings.Contains(h, s.name+"\n") {
			t.Errorf("ScheduleHelp lacks %s", s.name)
		}
		for _, o := range s.options {
			if !strings.Contains(h, "    "+o.Name+" ") {
				t.Errorf("ScheduleHelp lacks %s's option %s", s.name, o.Name)
			}
		}
	}
}

func TestApplySetsTheRate(t *testing.T) {
	opt, _ := NewSGD(nil, SGDConfig{LR: 1})
	if lr := Apply(opt, LinearWarmupDecay{Base: 0.2, WarmupSteps: 2, TotalSteps: 10}, 0, 1, 4); lr != 0.1 || opt.LR() != 0.1 {
		t.Errorf("Apply: %v, LR %v", lr, opt.LR())
	}
}

func mustSchedule(t *testing.T, s string) ScheduleConfig {
	t.Helper()
	c, err := ParseScheduleConfig(s)
	if err != nil {
		t.Fatalf("ParseScheduleConfig(%q): %v", s, err)
	}
	return c
}

// The same schedule written differently has one canonical String; different ones differ.
func TestScheduleConfigCanonical(t *testing.T) {
	for want, same := range map[string][]string{
		"constant":                               {"", " ", "constant"},
		"cosine:warmup=2,min=0,per=step":         {"cosine:warmup=2", "cosine:per=step,warmup=2.0", "cosine : warmup=2,min=0"},
		"cosine:warmup_steps=2,min=0,per=step":   {"cosine:warmup_steps=02"},
		"multistep:milestones=150/250,gamma=0.1": {"multistep:milestones=150/250", "multistep:milestones=150 / 0250,gamma=0.10"},
		"ptb:after=4,decay=0.5":                  {"ptb", "ptb:decay=5e-1"},
	} {
		for _, s := range same {
			if got := mustSchedule(t, s).String(); got != want {
				t.Errorf("ParseScheduleConfig(%q).String() = %q, want %q", s, got, want)
			}
		}
	}
	// The canonical form builds the same schedule.
	for _, s := range []string{"cosine:warmup=0.5,min=1e-4", "warmupstep:warmup=2,from=0.025,milestones=3/4", "linear:warmup_steps=7,total_steps=40"} {
		a, errA := ParseSchedule(s, 0.1, 5, 10)
		b, errB := mustSchedule(t, s).New(0.1, 5, 10)
		if errA != nil || errB != nil || fmt.Sprintf("%#v", a) != fmt.Sprintf("%#v", b) {
			t.Errorf("%s: %#v (%v) vs canonical %#v (%v)", s, a, errA, b, errB)
		}
	}
}

// What depends on the run's length is New's to check; With sets an option (a program's
// -warmup) and refuses what the schedule refuses.
func TestScheduleConfigRunLengthAndWith(t *testing.T) {
	c := mustSchedule(t, "cosine:warmup=5")
	if _, err := c.New(0.1, 5, 10); err == nil || !strings.Contains(err.Error(), "the warm-up (50 steps) must be shorter than the run (50 steps)") {
		t.Errorf("cosine:warmup=5 for 5 epochs: %v", err)
	}
	mustSchedule(t, "cosine:warmup=1,total_steps=500")
	w, err := mustSchedule(t, "cosine:min=1e-4").With("warmup", "3")
	if err != nil || !w.Given("warmup") || w.Given("min") == false || w.Option("warmup") != "3" {
		t.Errorf("With(warmup=3): %v, given %v, %q", err, w.Given("warmup"), w.Option("warmup"))
	}
	if _, err := mustSchedule(t, "cosine:warmup_steps=10").With("warmup", "3"); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("warmup_steps then With(warmup) = %v", err)
	}
	if _, err := mustSchedule(t, "step:size=3").With("warmup", "3"); err == nil || !strings.Contains(err.Error(), `schedule step has no option "warmup" (options: size, gamma)`) {
		t.Errorf("step With(warmup) = %v", err)
	}
	if c.Name() != "cosine" || !c.Given("warmup") || c.Given("min") {
		t.Errorf("cosine:warmup=5: name %q, given warmup %v min %v", c.Name(), c.Given("warmup"), c.Given("min"))
	}
}
