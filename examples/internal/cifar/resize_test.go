package cifar

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/safetensors"
)

// resizeRun is a run of the tiny model on the fixture with workers ranks × batch 2, 2 steps
// per epoch, a sparse hook that keeps residuals, saving into dir at every epoch's end.
func resizeRun(hook, dir string, workers, epochs int, resume bool) Config {
	c := resumeRun(hook, dir, epochs, resume)
	c.Workers, c.Batch, c.Flags.LR = workers, 2, 0.02
	return c
}

// residualSums returns, per "<hook>.bucket<i>.residual" key, the element-wise sum over the
// states given (float64), and the element-wise sum of their absolute values.
func residualSums(t *testing.T, states []map[string][]float32) (sum, abs map[string][]float64) {
	t.Helper()
	sum, abs = map[string][]float64{}, map[string][]float64{}
	for _, st := range states {
		for k, v := range st {
			if !strings.HasSuffix(k, ".residual") {
				continue
			}
			if sum[k] == nil {
				sum[k], abs[k] = make([]float64, len(v)), make([]float64, len(v))
			}
			if len(sum[k]) != len(v) {
				t.Fatalf("%s: %d values on one rank, %d on another", k, len(sum[k]), len(v))
			}
			for j, x := range v {
				sum[k][j] += float64(x)
				abs[k][j] += math.Abs(float64(x))
			}
		}
	}
	return sum, abs
}

// savedHookStates reads the hook state of every rank file of the checkpoint at path.
func savedHookStates(t *testing.T, path string, world int) []map[string][]float32 {
	t.Helper()
	var out []map[string][]float32
	for r := range world {
		f, err := safetensors.ReadFile(filepath.Join(path, fmt.Sprintf("rank-%d.safetensors", r)))
		if err != nil {
			t.Fatal(err)
		}
		st := map[string][]float32{}
		for _, name := range f.Names() {
			if k, ok := strings.CutPrefix(name, "hook/"); ok {
				if st[k], err = f.Tensors[name].Float32(); err != nil {
					t.Fatal(err)
				}
			}
		}
		out = append(out, st)
	}
	return out
}

// loadOn loads the checkpoint at path on world in-process ranks (the tiny model, DDP with
// hook) and returns each rank's hook state after loading and what was logged; the error is
// the first rank's.
func loadOn(t *testing.T, path, hook string, world int) ([]map[string][]float32, string, error) {
	t.Helper()
	meta, _, err := checkpoint.ReadInfo(path)
	if err != nil {
		t.Fatal(err)
	}
	meta.World = world
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	defer slog.SetDefault(prev)
	groups, err := comm.NewLocal(world)
	if err != nil {
		t.Fatal(err)
	}
	states := make([]map[string][]float32, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			errs[r] = func() error {
				model, err := tinyNet("tiny", models.CIFAR10, rand.New(rand.NewPCG(uint64(r), 9)))
				if err != nil {
					return err
				}
				h, err := hooks.Parse(hook)
				if err != nil {
					return err
				}
				dp, err := ddp.New(context.Background(), model, groups[r], ddp.WithCommHook(h))
				if err != nil {
					return err
				}
				if _, err := checkpoint.Load(path, checkpoint.State{Model: model, DDP: dp}, meta); err != nil {
					return err
				}
				states[r], err = h.(ddp.Stateful).State()
				return err
			}()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return nil, logged.String(), fmt.Errorf("rank %d of %d: %w", r, world, err)
		}
	}
	return states, logged.String(), nil
}

// checkSum fails unless the residual sums of after equal want's within the tolerance of
// hooks.Memory.Redistribute (one float32 rounding per new rank: |Δ| ≤ 2^-24 Σ|new values|).
func checkSum(t *testing.T, want map[string][]float64, after []map[string][]float32) {
	t.Helper()
	got, abs := residualSums(t, after)
	for k, w := range want {
		g := got[k]
		if len(g) != len(w) {
			t.Fatalf("%s: %d values over %d ranks, %d saved", k, len(g), len(after), len(w))
		}
		for j := range w {
			if d, tol := math.Abs(g[j]-w[j]), abs[k][j]*0x1p-24; d > tol {
				t.Fatalf("%s[%d]: residual sum %g over %d ranks, %g saved (|Δ| %g > %g)", k, j, g[j], len(after), w[j], d, tol)
			}
		}
	}
}

// A run saved by 4 ranks resumes on 2 (issue 22): each new rank's residuals are the sum of
// its old ranks' (r mod 2), so the sum over the ranks of every residual element is kept, up
// to one float32 rounding per new rank (|Δ| ≤ 2^-24 Σ|new values|, the tolerance
// hooks.Memory.Redistribute states); one warning names the hook and what was reset (Ok-Topk's
// thresholds and boundaries); and the run trains on: its training loss goes down.
func TestResumeOnFewerRanksKeepsResidualSum(t *testing.T) {
	for _, hook := range []string{"spardl:density=0.05", "oktopk:density=0.05"} {
		name, _, _ := strings.Cut(hook, ":")
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			runOrFatal(t, resizeRun(hook, dir, 4, 2, false))
			path, err := checkpoint.Latest(dir)
			if err != nil {
				t.Fatal(err)
			}
			before := savedHookStates(t, path, 4)
			after, logged, err := loadOn(t, path, hook, 2)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := residualSums(t, before)
			if len(want) == 0 {
				t.Fatal("the 4-rank checkpoint holds no residuals")
			}
			nonzero := 0
			for _, w := range want {
				for _, x := range w {
					if x != 0 {
						nonzero++
					}
				}
			}
			if nonzero == 0 {
				t.Fatal("every saved residual is zero: the test shows nothing")
			}
			checkSum(t, want, after)
			if n := strings.Count(logged, "level=WARN"); n != 1 || !strings.Contains(logged, "hook "+name+": reset") {
				t.Fatalf("want one warning naming hook %s and what was reset, got:\n%s", name, logged)
			}
			if name == "oktopk" && !strings.Contains(logged, "local_th") {
				t.Fatalf("the warning does not name Ok-Topk's thresholds:\n%s", logged)
			}

			// Growing to 8: old rank r's residuals go to rank r, ranks 4–7 start at zero.
			grown, _, err := loadOn(t, path, hook, 8)
			if err != nil {
				t.Fatal(err)
			}
			checkSum(t, want, grown)
			for r, st := range grown[4:] {
				for k, v := range st {
					if strings.HasSuffix(k, ".residual") && slices.ContainsFunc(v, func(x float32) bool { return x != 0 }) {
						t.Fatalf("rank %d of 8 (no old rank) starts with a non-zero residual %s", r+4, k)
					}
				}
			}

			var out bytes.Buffer
			sum, err := Run(context.Background(), resizeRun(hook, dir, 2, 6, true), &out, &out)
			if err != nil {
				t.Fatalf("resumed on 2 ranks: %v\n%s", err, out.String())
			}
			if len(sum.Epochs) < 2 {
				t.Fatalf("resumed run recorded %d epochs, want 4", len(sum.Epochs))
			}
			first, last := sum.Epochs[0].TrainLoss, sum.Epochs[len(sum.Epochs)-1].TrainLoss
			t.Logf("%s: resumed on 2 ranks, train loss %.4f → %.4f over %d epochs", hook, first, last, len(sum.Epochs))
			if !(last < first) {
				t.Fatalf("resumed on 2 ranks, the train loss went from %g to %g: not down\n%s", first, last, out.String())
			}
		})
	}
}

// A different world size resumes only from an epoch's end: a mid-epoch checkpoint is
// refused, naming both world sizes (the refusal of per-rank model state is checkpoint's
// TestResizeRefusesPerRankState).
func TestResumeOnOtherRanksRefuses(t *testing.T) {
	const hook = "spardl:density=0.05"
	dir := t.TempDir()
	runOrFatal(t, resizeRun(hook, dir, 4, 1, false))
	path, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	rewriteInfo(t, path, func(info map[string]any) { info["position"].(map[string]any)["step"] = 1 })
	_, _, err = loadOn(t, path, hook, 2)
	if err == nil || !strings.Contains(err.Error(), "saved by 4 ranks at step 1") || !strings.Contains(err.Error(), "resuming on 2") {
		t.Fatalf("resumed a mid-epoch 4-rank checkpoint on 2 ranks: %v, want an error naming both world sizes", err)
	}

}
