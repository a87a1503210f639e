package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// cifarMini is the committed CIFAR-10 fixture: 16 training and 8 test records.
const cifarMini = "../../testdata/cifar10-mini"

// Two steps of the program as shipped (2 workers, SparDL, the gorgonia head) on a few images,
// then the same with the spargo head: data, DDP, the Block's forward and backward, the hook
// and evaluation (on a short last batch: another graph) all run, and both heads start from the
// same weights, so their first-epoch numbers are close.
func TestRunFewSteps(t *testing.T) {
	dir := cifarMini
	results := map[string][]float64{}
	for _, head := range []string{"gorgonia", "spargo"} {
		var out, errb bytes.Buffer
		c := config{Data: dir, Workers: 2, Hook: "spardl", Head: head, Hidden: 32, Batch: 4, Epochs: 1, Steps: 2,
			LR: 0.02, Momentum: 0.9, WD: 5e-4, EvalLimit: 21, PrintEvery: 1, Progress: true}
		if err := run(context.Background(), c, &out, &errb); err != nil {
			t.Fatalf("%s head: %v\n%s%s", head, err, out.String(), errb.String())
		}
		s := out.String()
		for _, want := range []string{"model: spargo conv stack + " + head + " MLP head", "epoch 1 step 1/2: loss", "epoch 1 step 2/2: loss", "epoch 1 train_loss", "done: " + head + " head, hook spardl, 2 workers"} {
			if !strings.Contains(s, want) {
				t.Fatalf("%s head: output lacks %q:\n%s", head, want, s)
			}
		}
		// Progress on a stderr that is not a terminal: plain lines, the epoch's and the
		// evaluation's (the fixture's 8 test images), each ending at 100%, without carriage returns.
		if e := errb.String(); strings.Contains(e, "\r") || !strings.Contains(e, "step 2/2 (100%)") || !strings.Contains(e, "8/8 img (100%)") {
			t.Fatalf("%s head: progress on stderr:\n%q", head, e)
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

// Each bad flag is an error naming it, before the data is looked for (noData does not exist),
// except -batch, checked against a rank's share once the data is loaded.
func TestRunRejectsBadFlags(t *testing.T) {
	noData := filepath.Join(t.TempDir(), "no-data-here")
	for _, tc := range []struct {
		change func(*config)
		want   string
	}{
		{func(c *config) { c.Workers = 0 }, "-workers 0: want at least 1"},
		{func(c *config) { c.Head = "tensorflow" }, `-head "tensorflow"`},
		{func(c *config) { c.Hook = "nosuch" }, `-hook "nosuch": hooks: unknown hook`},
		{func(c *config) { c.Steps = -1 }, "-steps -1"},
		{func(c *config) { c.EvalLimit = -5 }, "-eval-limit -5"},
		{func(c *config) { c.Epochs = 0 }, "-epochs 0: want at least 1"},
		{func(c *config) { c.Data, c.Batch = cifarMini, 100000 }, "-batch 100000 is larger than a rank's share of the training data: 8 of"},
		{func(c *config) { c.Data, c.Batch = cifarMini, 9 }, "-batch 9 is larger than a rank's share"},
	} {
		c := config{Data: noData, Workers: 2, Batch: 4, Epochs: 1, Hidden: 8, Head: "gorgonia", Hook: "spardl"}
		tc.change(&c)
		var out bytes.Buffer
		if err := run(context.Background(), c, &out, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
}
