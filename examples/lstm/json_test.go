package main

import (
	"context"
	"io"
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
	recs, err := jsonlines.Capture(func(stdout, stderr io.Writer) error {
		_, err := RunLM(context.Background(), c, stdout, stderr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	epochs := recs.Find("epoch")
	if len(epochs) != 1 {
		t.Fatalf("%d epoch records, want 1: %v", len(epochs), recs)
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
	if phases := recs.Phases(); !phases["train words"] || !phases["eval words"] {
		t.Errorf("progress records of phases %v, want train and eval in words", phases)
	}
	// Three evaluations ran to their end: the validation after each step and the final test.
	if n := recs.Completed("eval"); n != 3 {
		t.Errorf("%d evaluations' progress reached its total, want 3: %v", n, recs.Find("progress"))
	}
}

// -task imdb in JSON: its epoch and done lines carry their fields too.
func TestIMDBJSONLogFormat(t *testing.T) {
	c := imdbConfig(t)
	c.Epochs, c.Steps, c.Progress = 1, 2, true
	recs, err := jsonlines.Capture(func(stdout, stderr io.Writer) error {
		_, err := RunIMDB(context.Background(), c, stdout, stderr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	epochs := recs.Find("epoch")
	if len(epochs) != 1 || len(epochs[0].Missing("train_loss", "train_acc", "val_loss", "test_acc", "words_s")) > 0 {
		t.Fatalf("epoch records %v", epochs)
	}
	if done := recs.Find("done"); len(done) != 1 || len(done[0].Missing("final_test_acc", "epochs")) > 0 {
		t.Errorf("done records %v", done)
	}
	if phases := recs.Phases(); !phases["train reviews"] {
		t.Errorf("progress records of phases %v, want train in reviews", phases)
	}
}
