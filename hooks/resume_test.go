package hooks

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks/profile"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// resumeSpecs is one spec per registered hook for TestResumeIsExactForEveryHook: options that
// make the state matter within a few steps (dense warm-ups ending before or after the save,
// short schedules) and fix what would otherwise be measured (covap's interval, osp's budget),
// since measured timings differ from run to run.
var resumeSpecs = map[string]string{
	"allreduce": "allreduce",
	"bf16":      "bf16+topka:density=0.05",
	"fp16":      "fp16+powersgd:rank=2,start_iter=2",
	"covap":     "covap:interval=3,init=0.5,ascend_steps=2,dense_warmup=1",
	"gaussiank": "gaussiank:density=0.05,dense_warmup=1",
	"gtopk":     "gtopk:density=0.05",
	"hier":      "hier:spardl:density=0.05,teams=2,dense_warmup=1", // 2 ranks, 2 nodes: spardl itself (hier_test.go resumes 2×2)
	"lags":      "lags:density=0.05,dense_warmup=4",
	"mgs":       "mgs:density=0.05",
	"noop":      "noop",
	"oktopk":    "oktopk:density=0.05,tau=2,tau_prime=3",
	"omgs":      "omgs:density=0.05",
	"osp":       "osp:budget=0.5,dense_warmup=1",
	"powersgd":  "powersgd:rank=2,start_iter=2",
	"spardl":    "spardl:density=0.05,teams=2,dense_warmup=1",
	"topka":     "topka:density=0.05",
	"topkdsa":   "topkdsa:density=0.05",
}

// Exact resume (issue 10), for every registered hook: K steps of DDP training (2 ranks,
// several buckets, SGD with momentum; osp with LGP), a checkpoint, then M steps of fresh
// models, DDPs, hooks and optimizers that loaded it give every rank bit-identical parameters
// after every step to K+M steps without a stop. The checkpoint is taken without Flush, so
// osp's pending late results go through DDP's state too; noop's replicas diverge, so its
// ranks' differing parameters go through the rank files.
func TestResumeIsExactForEveryHook(t *testing.T) {
	const p, k, m = 2, 3, 3
	for _, s := range Registered() {
		spec, ok := resumeSpecs[s.Name]
		if !ok {
			t.Errorf("hook %s has no spec in resumeSpecs: add one whose state matters within %d steps", s.Name, k+m)
			continue
		}
		t.Run(s.Name, func(t *testing.T) {
			o := ddpTraining{bucketCap: smallBuckets, anyLoss: s.Name == "noop", lgp: true}
			if _, ok := mustParse(t, spec).(ProfiledPlanner); ok {
				o.profile, o.profiles = true, make([]*profile.Profile, p) // measured once, the same plan in every run
			}
			if strings.HasPrefix(spec, "spardl") || strings.HasPrefix(spec, "hier:spardl") {
				o.bucketCap = [2]int{} // spardl plans one bucket
			}
			straight := trainDDP(t, spec, p, k+m, o)

			dir := t.TempDir()
			meta := checkpoint.Meta{Model: "tinyNet", Hook: spec}
			first := o
			first.end = func(ctx context.Context, r int, model nn.Module, dp *ddp.DDP, opt *optim.SGD) error {
				_, err := checkpoint.Saver{Dir: dir, Keep: 1}.Save(ctx, checkpoint.State{Model: model, DDP: dp, Optimizer: opt}, meta,
					checkpoint.Position{Step: k, Iteration: k})
				if sh, ok := dp.Hook().(ddp.Stateful); ok && err == nil {
					if st, serr := sh.State(); serr != nil || len(st) == 0 {
						return fmt.Errorf("the hook saved no state after %d steps (%v)", k, serr)
					}
				}
				return err
			}
			trainDDP(t, spec, p, k, first)

			second := o
			second.firstStep = k
			second.begin = func(ctx context.Context, r int, model nn.Module, dp *ddp.DDP, opt *optim.SGD) error {
				path, err := checkpoint.Latest(dir)
				if err != nil {
					return err
				}
				pos, err := checkpoint.Load(path, checkpoint.State{Model: model, DDP: dp, Optimizer: opt}, meta)
				if err == nil && (pos.Step != k || dp.Iteration() != k) {
					err = fmt.Errorf("restored position %+v, DDP iteration %d", pos, dp.Iteration())
				}
				return err
			}
			resumed := trainDDP(t, spec, p, m, second)
			for r := range p {
				for s := range m {
					if resumed.hashes[r][s] != straight.hashes[r][k+s] {
						t.Fatalf("%s: rank %d, step %d: resumed parameters differ from the uninterrupted run's", spec, r, k+s+1)
					}
				}
			}
			if s.Name != "noop" && straight.hashes[0][k-1] == straight.hashes[0][k+m-1] {
				t.Fatalf("%s: training did not move the parameters", spec)
			}
		})
	}
}

func mustParse(t *testing.T, spec string) ddp.CommHook {
	t.Helper()
	h, err := Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A checkpoint does not load into a run with another hook spec (the error names both), and a
// hook refuses state saved under another bucket plan when its first bucket runs.
func TestResumeRefusesOtherHookOrPlan(t *testing.T) {
	const p = 2
	dir := t.TempDir()
	spec := "topka:density=0.05"
	trainDDP(t, spec, p, 2, ddpTraining{bucketCap: smallBuckets, end: func(ctx context.Context, r int, model nn.Module, dp *ddp.DDP, opt *optim.SGD) error {
		_, err := checkpoint.Saver{Dir: dir}.Save(ctx, checkpoint.State{Model: model, DDP: dp, Optimizer: opt},
			checkpoint.Meta{Model: "tinyNet", Hook: spec}, checkpoint.Position{Iteration: 2})
		return err
	}})
	path, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec string
		caps [2]int
		want string
	}{
		{"spardl:density=0.05", smallBuckets, `hook "topka:density=0.05", this run "spardl:density=0.05"`},
		{spec, [2]int{1 << 20, 1 << 20}, "different bucket plan"},
	} {
		groups := commtest.Groups(t, p)
		_, err = onEveryRank(groups, 30*time.Second, func(ctx context.Context, r int) error {
			h, _ := Parse(tc.spec)
			model := tinyNet(1)
			dp, err := ddp.New(ctx, model, groups[r], ddp.WithCommHook(h), ddp.WithBucketCap(tc.caps[0], tc.caps[1]))
			if err != nil {
				return err
			}
			opt, _ := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.1})
			st := checkpoint.State{Model: model, DDP: dp, Optimizer: opt}
			if _, err := checkpoint.Load(path, st, checkpoint.Meta{Model: "tinyNet", Hook: tc.spec}); err != nil {
				return err
			}
			x, y := syntheticBatch(1, 4)
			return dp.Backward(ctx, nn.CrossEntropy(dp.Forward(nn.NewTape().Const(x)), y))
		})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("%s with bucket caps %v: %v, want %q on every rank", tc.spec, tc.caps, err, tc.want)
		}
	}
}
