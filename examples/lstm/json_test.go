package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/spargo-dl/spargo/examples/internal/jsonlines"
)

// ptbMini is the committed PTB fixture (40 training lines, 3 validation and 3 test lines).
var ptbMini = filepath.Join("..", "..", "testdata", "ptb-mini")

// Under -log-format json (the Printers Main hands a program) every line of -task lm on
// stdout and stderr is a JSON object: the epoch, mid-epoch evaluation and done lines carry
// their fields, and the evaluations' progress (rank 0's, in words over all ranks) comes as
// progress records.
func TestLMJSONLogFormat(t *testing.T) {
	c := smallConfig(ptbMini)
	c.Epochs, c.Steps, c.EvalEvery, c.Progress = 1, 2, 1, true
	stdout, stderr := jsonlines.NewOutput(), jsonlines.NewOutput()
	if _, err := RunLM(context.Background(), c, stdout.Printer, stderr.Printer); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	recs, err := jsonlines.Parse(stdout.String(), stderr.String())
	if err != nil {
		t.Fatal(err)
	}
	epochs := recs.Find("epoch")
	if len(epochs) != 1 {
		t.Fatalf("%d epoch records, want 1:\n%s", len(epochs), stdout.String())
	}
	if miss := epochs[0].Missing("epoch", "steps", "train_loss", "train_ppl", "val_loss", "val_ppl", "test_ppl", "words_s", "lr", "total_s"); len(miss) > 0 {
		t.Errorf("epoch record lacks %v: %v", miss, epochs[0])
	}
	// -eval-every 1 over 2 steps: a validation record after each step (the last at the epoch's end).
	evals := recs.Find("eval")
	if len(evals) != 2 || evals[0]["step"] != 1.0 || evals[1]["step"] != 2.0 || len(evals[1].Missing("val_loss", "val_ppl", "total_s")) > 0 {
		t.Errorf("eval records %v", evals)
	}
	if done := recs.Find("done"); len(done) != 1 || len(done[0].Missing("final_val_ppl", "test_ppl", "epochs", "config")) > 0 {
		t.Errorf("done records %v", done)
	}
	if phases := progressPhases(recs); !phases["train words"] || !phases["eval words"] {
		t.Errorf("progress records of phases %v, want train and eval in words:\n%s", phases, stderr.String())
	}
	// Every evaluation (one window per rank here) ends at its total: the words of both ranks' shards.
	for _, r := range recs.Find("progress") {
		if r["phase"] == "eval" && (r["done"] != r["total"] || r["total"] == 0.0) {
			t.Errorf("an evaluation's progress ends at %v of %v words", r["done"], r["total"])
		}
	}
}

// -task imdb in JSON: its epoch and done lines carry their fields too.
func TestIMDBJSONLogFormat(t *testing.T) {
	c := imdbConfig(t)
	c.Epochs, c.Steps, c.Progress = 1, 2, true
	stdout, stderr := jsonlines.NewOutput(), jsonlines.NewOutput()
	if _, err := RunIMDB(context.Background(), c, stdout.Printer, stderr.Printer); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	recs, err := jsonlines.Parse(stdout.String(), stderr.String())
	if err != nil {
		t.Fatal(err)
	}
	epochs := recs.Find("epoch")
	if len(epochs) != 1 || len(epochs[0].Missing("train_loss", "train_acc", "val_loss", "test_acc", "words_s")) > 0 {
		t.Fatalf("epoch records %v:\n%s", epochs, stdout.String())
	}
	if done := recs.Find("done"); len(done) != 1 || len(done[0].Missing("final_test_acc", "epochs")) > 0 {
		t.Errorf("done records %v", done)
	}
	if phases := progressPhases(recs); !phases["train reviews"] {
		t.Errorf("progress records of phases %v, want train in reviews:\n%s", phases, stderr.String())
	}
}

// progressPhases are the phase and unit of a run's progress records.
func progressPhases(recs jsonlines.Records) map[string]bool {
	seen := map[string]bool{}
	for _, r := range recs.Find("progress") {
		seen[fmt.Sprint(r["phase"], " ", r["unit"])] = true
	}
	return seen
}
