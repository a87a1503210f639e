package main

import (
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/spargo-dl/spargo/examples/internal/jsonlines"
)

// Under -log-format json (the Printers Main hands a program) every line of a masked-LM run on
// the committed PTB fixture is a JSON object: each evaluation round's line (msg "epoch", the
// -metrics record) and the done line carry their fields, and the held-out evaluation's
// progress (rank 0's, in sequences over all ranks) comes as progress records.
func TestJSONLogFormat(t *testing.T) {
	c := smallConfig(filepath.Join("..", "..", "testdata", "ptb-mini"))
	c.Batch, c.Steps, c.EvalEvery, c.VocabSize, c.Progress = 1, 2, 1, 200, true
	recs, err := jsonlines.Capture(func(stdout, stderr io.Writer) error {
		_, err := RunMLM(context.Background(), c, stdout, stderr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rounds := recs.Find("epoch")
	if len(rounds) != 2 || rounds[0]["at_step"] != 1.0 || rounds[1]["at_step"] != 2.0 {
		t.Fatalf("round records %v, want rounds at steps 1 and 2: %v", rounds, recs)
	}
	if miss := rounds[1].Missing("epoch", "steps", "train_loss", "train_acc", "val_loss", "val_acc", "seq_s", "train_s", "total_s", "lr"); len(miss) > 0 {
		t.Errorf("round record lacks %v: %v", miss, rounds[1])
	}
	if done := recs.Find("done"); len(done) != 1 || len(done[0].Missing("final_val_loss", "final_val_acc", "epochs", "config")) > 0 {
		t.Errorf("done records %v", done)
	}
	if phases := recs.Phases(); !phases["train seq"] || !phases["eval seq"] {
		t.Errorf("progress records of phases %v, want train and eval in seq", phases)
	}
	// Each round's evaluation counts up to its total: 2 held-out sequences.
	if n := recs.Completed("eval"); n != len(rounds) {
		t.Errorf("%d evaluations' progress reached its total, want %d: %v", n, len(rounds), recs.Find("progress"))
	}
}
