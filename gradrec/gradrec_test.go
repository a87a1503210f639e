package gradrec_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/gradrec"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

func tinyNet() nn.Module {
	rng := nn.NewRand(7)
	m := nn.NewSequential(nn.NewLinear(6, 16, true, rng), nn.ReLU{}, nn.NewLinear(16, 4, true, rng))
	nn.Parameters(m)
	return m
}

// batch is rank's batch of step: different data on every rank and step.
func batch(rank, step int) (*nn.Tensor, []int) {
	rng := nn.NewRand(uint64(100*rank + step))
	x := nn.NewTensor(8, 6)
	for i := range x.Data {
		x.Data[i] = float32(rng.NormFloat64())
	}
	y := make([]int, 8)
	for i := range y {
		y[i] = rng.IntN(4)
	}
	return x, y
}

// run trains the tiny net on p in-process ranks for steps steps with hook (small buckets:
// several per iteration), recording into dir when it is not empty. It returns every rank's
// final parameters and the averaged gradients of the first step.
func run(t *testing.T, hook string, p, steps int, dir string, sched gradrec.Schedule) (final, firstGrad [][][]float32) {
	t.Helper()
	groups, err := comm.NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	final, firstGrad = make([][][]float32, p), make([][][]float32, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() {
			errs[r] = func() error {
				ctx := context.Background()
				model := tinyNet()
				opts := []ddp.Option{ddp.WithCommHook(hooks.MustParse(hook)), ddp.WithBucketCap(64, 256)}
				if dir != "" {
					rec, err := gradrec.NewRecorder(gradrec.Config{Dir: dir, Schedule: sched, Model: "tiny", Hook: hook, Params: nn.Parameters(model)})
					if err != nil {
						return err
					}
					opts = append(opts, ddp.WithBucketObserver(rec))
				}
				dp, err := ddp.New(ctx, model, groups[r], opts...)
				if err != nil {
					return err
				}
				if len(dp.Plan()) < 2 {
					t.Errorf("want several buckets, have %d", len(dp.Plan()))
				}
				opt, err := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
				if err != nil {
					return err
				}
				tape := nn.NewTape()
				for step := range steps {
					tape.Reset()
					opt.ZeroGrad()
					x, y := batch(r, step)
					if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
						return err
					}
					if step == 0 {
						for _, q := range dp.Parameters() {
							firstGrad[r] = append(firstGrad[r], slices.Clone(q.Grad.Data))
						}
					}
					opt.Step()
				}
				for _, q := range dp.Parameters() {
					final[r] = append(final[r], slices.Clone(q.Value.Data))
				}
				return nil
			}()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return final, firstGrad
}

// Recording does not change training: with topka (which uses the bucket as scratch and keeps
// residuals) every rank ends with bit-identical parameters with and without a recorder.
func TestRecordingKeepsTraining(t *testing.T) {
	const hook = "topka:density=0.2"
	want, _ := run(t, hook, 2, 5, "", gradrec.Schedule{})
	dir := t.TempDir()
	got, _ := run(t, hook, 2, 5, dir, gradrec.Schedule{Every: 2, Steps: 1})
	for r := range want {
		for i := range want[r] {
			if !slices.Equal(want[r][i], got[r][i]) {
				t.Fatalf("rank %d, parameter %d differs with recording", r, i)
			}
		}
	}
	rec, err := gradrec.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.Iterations, []int64{0, 2, 4}) || rec.World != 2 || rec.Model != "tiny" || rec.Hook != hook {
		t.Errorf("recording: iterations %v, P=%d, model %q, hook %q; want [0 2 4], 2, tiny, %s", rec.Iterations, rec.World, rec.Model, rec.Hook, hook)
	}
}

// What is recorded is each rank's local gradient before communication: with the dense
// all-reduce, the two ranks' recorded gradients differ and their mean is the averaged
// gradient DDP leaves in Grad. The files name parameters by their dotted names and carry
// the bucket layout.
func TestRecordedAreLocalGradients(t *testing.T) {
	dir := t.TempDir()
	_, avg := run(t, "allreduce", 2, 1, dir, gradrec.Schedule{Steps: 1})
	rec, err := gradrec.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.Names, []string{"0.weight", "0.bias", "2.weight", "2.bias"}) || !slices.Equal(rec.Shapes[0], []int{16, 6}) {
		t.Errorf("names %v, shapes %v", rec.Names, rec.Shapes)
	}
	if len(rec.Buckets) < 2 || rec.Buckets[0][0] != 3 { // ddp's plan: reverse declaration order
		t.Errorf("buckets %v: want DDP's plan, last parameter first", rec.Buckets)
	}
	g0, err := rec.Load(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	g1, err := rec.Load(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range g0 {
		if slices.Equal(g0[i], g1[i]) {
			t.Errorf("%s: both ranks recorded the same gradient: not the local ones", rec.Names[i])
		}
		for j := range g0[i] {
			if m := (g0[i][j] + g1[i][j]) / 2; math.Abs(float64(m-avg[0][i][j])) > 1e-6 {
				t.Fatalf("%s[%d]: mean of recorded %v, averaged gradient %v", rec.Names[i], j, m, avg[0][i][j])
			}
		}
	}
}

func TestScheduleAndErrors(t *testing.T) {
	s := gradrec.Schedule{Every: 50, Steps: 3}
	for it, want := range map[int64]bool{0: true, 2: true, 3: false, 49: false, 50: true, 52: true, 53: false} {
		if s.Records(it) != want {
			t.Errorf("Every 50, Steps 3: Records(%d) = %v", it, !want)
		}
	}
	if (gradrec.Schedule{Steps: 2}).Records(2) {
		t.Error("Every 0, Steps 2 records iteration 2")
	}
	for _, tc := range []struct {
		s    gradrec.Schedule
		want string
	}{{gradrec.Schedule{Steps: 0}, "-record-steps 0"}, {gradrec.Schedule{Every: 2, Steps: 3}, "-record-every 2"}} {
		if err := tc.s.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.s, err, tc.want)
		}
	}
	dir := t.TempDir()
	if _, err := gradrec.Open(dir); err == nil || !strings.Contains(err.Error(), "no recorded gradients") {
		t.Errorf("empty dir: %v", err)
	}
	l := &gradrec.Layout{Model: "m", World: 2, Names: []string{"w"}, Shapes: [][]int{{2}}, Buckets: [][]int{{0}}}
	if err := gradrec.WriteIteration(dir, l, 0, 5, [][]float32{{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := gradrec.Open(dir); err == nil || !strings.Contains(err.Error(), "iteration 5 has files of ranks [0]") {
		t.Errorf("missing rank: %v", err)
	}
	other := *l
	other.Model = "n"
	if err := gradrec.WriteIteration(dir, &other, 1, 5, [][]float32{{3, 4}}); err != nil {
		t.Fatal(err)
	}
	rec, err := gradrec.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Load(5, 1); err == nil || !strings.Contains(err.Error(), "belongs to another recording") {
		t.Errorf("mixed recordings: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, gradrec.FileName(5, 1)), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Load(5, 1); err == nil || !strings.Contains(err.Error(), "iter-00000005-rank-1.safetensors") {
		t.Errorf("corrupt file: %v", err)
	}
}
