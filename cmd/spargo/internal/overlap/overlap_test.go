package overlap

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// tinyCNN is a four-tensor image classifier small enough for a test.
var tinyCNN = models.Entry{Name: "tiny-cnn", Family: "test", Input: models.Dataset{Name: "tiny", Classes: 3, Channels: 2, Size: 6},
	Build: func(rng *rand.Rand) (nn.Module, error) {
		return nn.NewSequential(nn.NewConv2d(2, 4, 3, 1, 1, true, rng), nn.ReLU{}, nn.Flatten{}, nn.NewLinear(4*6*6, 3, true, rng)), nil
	}}

// tinyLM is a two-layer LSTM language model of 11 tensors.
var tinyLM = models.Entry{Name: "tiny-lm", Family: "lstm",
	Build: func(rng *rand.Rand) (nn.Module, error) {
		return models.NewLSTMLM(models.LSTMLMConfig{Vocab: 23, Embed: 6, Hidden: 5, Layers: 2}, rng)
	}}

// dense_below=0: every tensor of these tiny models is sparsified, so each group has phases.
var overlapSpecs = []string{"topka:density=0.1", "lags:density=0.1,dense_below=0", "mgs:density=0.1,dense_below=0,threshold=40", "omgs:density=0.1,dense_below=0"}

func mustHooks(t *testing.T, specs ...string) []Hook {
	t.Helper()
	hs, err := ParseHooks(specs...)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// checkReport checks what holds for any report, whatever the timings.
func checkReport(t *testing.T, rep *Report, cfg Config) {
	t.Helper()
	if rep.Workers != 2 || rep.Iters != cfg.Iters || rep.Transport != "in-process" || len(rep.Hooks) != len(cfg.Hooks) {
		t.Fatalf("report header %+v for %d hooks", rep, len(cfg.Hooks))
	}
	for i, h := range rep.Hooks {
		if h.Hook != cfg.Hooks[i].Label {
			t.Errorf("hook %d is %q, want %q (in the order given)", i, h.Hook, cfg.Hooks[i].Label)
		}
		sum := 0
		for _, n := range h.GroupElements {
			sum += n
		}
		if h.Groups != len(h.GroupElements) || sum != rep.Params || h.Groups < 1 || h.Groups > rep.Tensors {
			t.Errorf("%s: %d groups of %v elements for %d parameters in %d tensors", h.Hook, h.Groups, h.GroupElements, rep.Params, rep.Tensors)
		}
		switch name, _, _ := strings.Cut(h.Hook, ":"); name {
		case "topka":
			if h.Plan != "single" || h.Groups != 1 || h.Profiled {
				t.Errorf("topka: plan %s, %d groups, profiled %v; want TopK-SGD's single group", h.Plan, h.Groups, h.Profiled)
			}
		case "lags":
			if h.Plan != "hook" || h.Groups != rep.Tensors {
				t.Errorf("lags: plan %s with %d groups, want one per tensor (%d)", h.Plan, h.Groups, rep.Tensors)
			}
		case "omgs":
			if !h.Profiled {
				t.Errorf("omgs planned without a profile")
			}
		}
		if h.Plan == "hook" && h.Profiled != slices.ContainsFunc(cfg.Hooks, func(h Hook) bool { return h.Config.Name() == "omgs" }) {
			t.Errorf("%s: profiled %v, but a profile is measured exactly when omgs is among the hooks", h.Hook, h.Profiled)
		}
		if len(h.NonOverlappedEach) != cfg.Iters || len(h.BackwardEach) != cfg.Iters || len(h.IterationEach) != cfg.Iters {
			t.Fatalf("%s: %d/%d/%d per-iteration values for %d iterations", h.Hook, len(h.NonOverlappedEach), len(h.BackwardEach), len(h.IterationEach), cfg.Iters)
		}
		for j, no := range h.NonOverlappedEach {
			if no < 0 || h.BackwardEach[j] < 0 || h.BackwardEach[j] > h.IterationEach[j] {
				t.Errorf("%s: iteration %d: backward %v ms, iteration %v ms, non-overlapped %v ms", h.Hook, j, h.BackwardEach[j], h.IterationEach[j], no)
			}
		}
		if h.NonOverlappedMS < 0 || h.NonOverlappedMS != median(h.NonOverlappedEach) || h.BackwardMS > h.IterationMS {
			t.Errorf("%s: medians backward %v, iteration %v, non-overlapped %v of %v", h.Hook, h.BackwardMS, h.IterationMS, h.NonOverlappedMS, h.NonOverlappedEach)
		}
		if h.DoneInBackward < 0 || h.DoneInBackward > float64(h.Groups) {
			t.Errorf("%s: %v groups done during backward of %d", h.Hook, h.DoneInBackward, h.Groups)
		}
		tr := h.Trace
		if tr == nil || len(tr.Groups) != h.Groups {
			t.Fatalf("%s: trace %+v for %d groups", h.Hook, tr, h.Groups)
		}
		if tr.BackwardEndMS > tr.EndMS {
			t.Errorf("%s: trace: backward ended at %v after the end %v", h.Hook, tr.BackwardEndMS, tr.EndMS)
		}
		for j, g := range tr.Groups {
			if g.Bucket != j || g.Elements != h.GroupElements[j] {
				t.Errorf("%s: trace group %d is bucket %d of %d elements, want %d", h.Hook, j, g.Bucket, g.Elements, h.GroupElements[j])
			}
			if g.SelectedMS == nil || g.SentMS == nil {
				t.Fatalf("%s: group %d has no selection or all-gather moment (every tensor is sparsified here)", h.Hook, j)
			}
			if !(0 <= g.ReadyMS && g.ReadyMS <= g.HookMS && g.HookMS <= *g.SelectedMS && *g.SelectedMS <= *g.SentMS && *g.SentMS <= g.DoneMS && g.DoneMS <= tr.EndMS) {
				t.Errorf("%s: group %d out of order: %+v (selected %v, sent %v), end %v", h.Hook, j, g, *g.SelectedMS, *g.SentMS, tr.EndMS)
			}
			if j > 0 && g.HookMS < tr.Groups[j-1].DoneMS {
				t.Errorf("%s: group %d's hook called at %v, before group %d was done at %v (DDP runs them one after the other)", h.Hook, j, g.HookMS, j-1, tr.Groups[j-1].DoneMS)
			}
		}
	}
}

func TestRunLocalImageInvariants(t *testing.T) {
	cfg := Config{Model: tinyCNN, Hooks: mustHooks(t, overlapSpecs...), SingleBucket: true, Batch: 3, Warmup: 1, Iters: 3, Seed: 5, Trace: true}
	rep, err := RunLocal(context.Background(), 2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, cfg)
	if !strings.Contains(rep.Input, "random images 2×6×6") {
		t.Errorf("input %q", rep.Input)
	}
	if testing.Verbose() {
		rep.WriteText(os.Stdout)
	}
}

func TestRunLocalLanguageModelInvariants(t *testing.T) {
	tokens := make([]int32, 400)
	for i := range tokens {
		tokens[i] = int32(i*7) % 23
	}
	for _, tc := range []struct {
		name   string
		tokens []int32
		input  string
	}{{"random", nil, "random tokens (uniform over 23), windows of 4 × 3"}, {"stream", tokens, "token windows of 4 × 3, consecutive in each rank's shard (200 of 400 tokens)"}} {
		t.Run(tc.name, func(t *testing.T) {
			// lags and mgs without omgs: no profile, reverse declaration order.
			cfg := Config{Model: tinyLM, Hooks: mustHooks(t, overlapSpecs[:3]...), SingleBucket: true, Batch: 3, BPTT: 4, Tokens: tc.tokens, Warmup: 1, Iters: 2, Seed: 1, Trace: true}
			rep, err := RunLocal(context.Background(), 2, cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkReport(t, rep, cfg)
			if rep.Tensors != 11 || rep.Input != tc.input || rep.BPTT != 4 {
				t.Errorf("%d tensors, input %q, bptt %d", rep.Tensors, rep.Input, rep.BPTT)
			}
		})
	}
}

func TestRunLocalErrors(t *testing.T) {
	base := Config{Model: tinyLM, Hooks: mustHooks(t, "topka"), Batch: 2, BPTT: 3, Iters: 1}
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"unparsed hook", func(c *Config) { c.Hooks = []Hook{{Label: "topka"}} }, `hook 0 ("topka") has no configuration`},
		{"no hooks", func(c *Config) { c.Hooks = nil }, "no hook"},
		{"token out of vocabulary", func(c *Config) { c.Tokens = []int32{1, 2, 30, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14} }, "vocabulary of 23"},
		{"no bptt", func(c *Config) { c.BPTT = 0 }, "bptt 0"},
		{"not an image or LM model", func(c *Config) {
			c.Model = models.Entry{Name: "plain", Family: "test", Build: func(rng *rand.Rand) (nn.Module, error) { return nn.NewLinear(2, 2, true, rng), nil }}
		}, "neither an image classifier nor an LSTM language model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.edit(&cfg)
			_, err := RunLocal(context.Background(), 2, cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one that mentions %q", err, tc.want)
			}
		})
	}
	if _, err := ParseHooks("topka", "nosuchhook"); err == nil || !strings.Contains(err.Error(), `unknown hook "nosuchhook"`) {
		t.Errorf("ParseHooks(nosuchhook) = %v", err)
	}
}
