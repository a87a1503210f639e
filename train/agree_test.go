package train

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/nn"
)

// setUpRanks runs Setup.New on 2 in-process ranks, rank r with flags[r], agree[r] and a
// linear model of out[r] outputs, and returns each rank's error.
func setUpRanks(t *testing.T, flags [2]Flags, agree [2][]comm.Field, out [2]int) []error {
	t.Helper()
	groups, err := comm.NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a mismatch must not hang
	defer cancel()
	errs := make([]error, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = RunRanks(ctx, groups, func(ctx context.Context, g comm.Group) error {
			r := g.Rank()
			model := nn.NewLinear(4, out[r], true, rand.New(rand.NewPCG(1, 2)))
			f := flags[r]
			_, errs[r] = Setup{Flags: &f, Agree: agree[r]}.New(ctx, g, model)
			return nil // let every rank finish on its own: each must see the mismatch
		})
	}()
	<-done
	if ctx.Err() != nil {
		t.Fatalf("the set-up did not end: %v", errs)
	}
	return errs
}

// wantConfigError requires every rank's error to be the same ConfigError naming field with
// values a on rank 0 and b on rank 1.
func wantConfigError(t *testing.T, errs []error, field, a, b string) {
	t.Helper()
	for r, err := range errs {
		var ce *comm.ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("rank %d: %v, want a *comm.ConfigError", r, err)
		}
		if ce.Field != field || len(ce.Values) != 2 || ce.Values[0].Value != a || ce.Values[1].Value != b {
			t.Fatalf("rank %d: %+v, want %s %q on rank 0 and %q on rank 1", r, ce, field, a, b)
		}
		for _, want := range []string{field + " is", `"` + a + `" on rank 0`, `"` + b + `" on rank 1`, "different settings"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("rank %d: %q does not say %q", r, err, want)
			}
		}
	}
}

// The finding 1: a rank with another -lr trained on silently. Now every rank's set-up
// fails naming lr, both values and the ranks.
func TestSetupRefusesOtherLR(t *testing.T) {
	f := Flags{LR: 0.01, Momentum: 0.9}
	g := f
	g.LR = 0.02
	errs := setUpRanks(t, [2]Flags{f, g}, [2][]comm.Field{}, [2]int{3, 3})
	wantConfigError(t, errs, "lr", "0.01", "0.02")
}

// Other settings of the set-up and of the program are named the same way: the optimizer's
// canonical spec, the program's -steps (which deadlocked: one rank waited for steps the
// other never took), the model's shapes.
func TestSetupNamesTheDifferingField(t *testing.T) {
	base := Flags{LR: 0.1, Momentum: 0.9}
	adam := base
	adam.Optim = "adam"
	steps := func(n string) []comm.Field { return Fields(map[string]string{"model": "toy", "steps": n}) }
	t.Run("optim", func(t *testing.T) {
		errs := setUpRanks(t, [2]Flags{base, adam}, [2][]comm.Field{}, [2]int{3, 3})
		var ce *comm.ConfigError
		if !errors.As(errs[0], &ce) || ce.Field != "optim" || !strings.HasPrefix(ce.Values[1].Value, "adam") {
			t.Fatalf("%v", errs)
		}
	})
	t.Run("steps", func(t *testing.T) {
		errs := setUpRanks(t, [2]Flags{base, base}, [2][]comm.Field{steps("3"), steps("6")}, [2]int{3, 3})
		wantConfigError(t, errs, "steps", "3", "6")
	})
	t.Run("params", func(t *testing.T) {
		errs := setUpRanks(t, [2]Flags{base, base}, [2][]comm.Field{}, [2]int{3, 5})
		var ce *comm.ConfigError
		if !errors.As(errs[1], &ce) || ce.Field != "params" || !strings.Contains(ce.Values[0].Value, "15 values") || !strings.Contains(ce.Values[1].Value, "25 values") {
			t.Fatalf("%v", errs)
		}
	})
	t.Run("same", func(t *testing.T) {
		for r, err := range setUpRanks(t, [2]Flags{base, base}, [2][]comm.Field{steps("3"), steps("3")}, [2]int{3, 3}) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	})
}

func TestFieldsAreSorted(t *testing.T) {
	got := Fields(map[string]string{"seed": "1", "batch": "4", "model": "vgg11"})
	want := []comm.Field{{Name: "batch", Value: "4"}, {Name: "model", Value: "vgg11"}, {Name: "seed", Value: "1"}}
	if len(got) != len(want) {
		t.Fatalf("%v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%v, want %v", got, want)
		}
	}
}

func TestAutoResume(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	check := func(resume bool, dir string, restarts int, want bool, says string) {
		t.Helper()
		out.Reset()
		got, err := AutoResume(resume, dir, restarts, &out)
		if err != nil || got != want || !strings.Contains(out.String(), says) {
			t.Fatalf("AutoResume(%v, %q, %d) = %v, %v (said %q), want %v saying %q", resume, dir, restarts, got, err, out.String(), want, says)
		}
	}
	check(false, dir, 0, false, "")      // first attempt: as -resume says
	check(true, dir, 0, true, "")        // (the loop then refuses a missing checkpoint)
	check(false, "", 2, false, "")       // no -checkpoint: nothing to resume from
	check(true, dir, 1, false, "afresh") // a restart before any checkpoint: start fresh
	if err := os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-000000000006\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check(false, dir, 1, true, "resuming from "+filepath.Join(dir, "ckpt-000000000006"))
	check(true, dir, 0, true, "")
	if err := os.WriteFile(filepath.Join(dir, "latest"), []byte("../elsewhere\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := AutoResume(false, dir, 1, &out); err == nil || !strings.Contains(err.Error(), "restart 1: -checkpoint") {
		t.Fatalf("a bad latest file: %v", err)
	}
}
