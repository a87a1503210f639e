package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/datasets"
)

// cifarOrSkip returns the CIFAR-10 directory, or skips the test outside CI without one.
func cifarOrSkip(t *testing.T) string {
	t.Helper()
	dir, err := datasets.FindCIFAR10("")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI has ../shared/data beside the clone: %v", err)
		}
		t.Skipf("no CIFAR-10 copy on this machine (it is looked for in ../shared/data/cifar10/approx and $SPARGO_DATA): %v", err)
	}
	return dir
}

// Two steps of the program as shipped (2 workers, SparDL, the gorgonia head) on a few images,
// then the same with the spargo head: data, DDP, the Block's forward and backward, the hook
// and evaluation (on a short last batch: another graph) all run, and both heads start from the
// same weights, so their first-epoch numbers are close.
func TestRunFewSteps(t *testing.T) {
	dir := cifarOrSkip(t)
	results := map[string][]float64{}
	for _, head := range []string{"gorgonia", "spargo"} {
		var out, errb bytes.Buffer
		c := config{Data: dir, Workers: 2, Hook: "spardl", Head: head, Hidden: 32, Batch: 4, Epochs: 1, Steps: 2,
			LR: 0.02, Momentum: 0.9, WD: 5e-4, EvalLimit: 21, PrintEvery: 1}
		if err := run(context.Background(), c, &out, &errb); err != nil {
			t.Fatalf("%s head: %v\n%s%s", head, err, out.String(), errb.String())
		}
		s := out.String()
		for _, want := range []string{"model: spargo conv stack + " + head + " MLP head", "epoch 1 step 2/2: loss", "epoch 1 train_loss", "done: " + head + " head, hook spardl, 2 workers"} {
			if !strings.Contains(s, want) {
				t.Fatalf("%s head: output lacks %q:\n%s", head, want, s)
			}
		}
		m := regexp.MustCompile(`epoch 1 train_loss ([0-9.]+) train_acc [0-9.]+ test_loss ([0-9.]+) test_acc ([0-9.]+)`).FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("%s head: no epoch line:\n%s", head, s)
		}
		for _, v := range m[1:] {
			f, _ := strconv.ParseFloat(v, 64)
			results[head] = append(results[head], f)
		}
		t.Logf("%s head: %s", head, m[0])
	}
	for i, what := range []string{"train loss", "test loss"} {
		g, s := results["gorgonia"][i], results["spargo"][i]
		if d := g - s; d > 1e-3 || d < -1e-3 {
			t.Errorf("%s: gorgonia head %v, spargo head %v", what, g, s)
		}
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	var out bytes.Buffer
	for _, c := range []config{
		{Workers: 0, Batch: 1, Epochs: 1, Hidden: 1, Head: "gorgonia", Hook: "spardl"},
		{Workers: 1, Batch: 1, Epochs: 1, Hidden: 1, Head: "tensorflow", Hook: "spardl"},
		{Workers: 1, Batch: 1, Epochs: 1, Hidden: 1, Head: "gorgonia", Hook: "nosuch"},
	} {
		if err := run(context.Background(), c, &out, &out); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
