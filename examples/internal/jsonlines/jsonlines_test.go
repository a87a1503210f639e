package jsonlines

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/train"
)

// What a program prints through its Printers comes back as records: plain lines as msg
// records, train.Print's with their fields.
func TestParseReadsPrinterOutput(t *testing.T) {
	stdout, stderr := NewOutput(), NewOutput()
	fmt.Fprintln(stdout.Printer, "data: somewhere")
	if err := train.Print(stdout.Printer, "epoch", map[string]float64{"train_loss": 2.5}, "epoch 1 train_loss 2.5000"); err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(stderr.Printer, "a line without its newline")
	recs, err := Parse(stdout.String(), stderr.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[0].Msg() != "data: somewhere" || recs[2].Msg() != "a line without its newline" {
		t.Fatalf("records %v", recs)
	}
	epoch := recs.Find("epoch")
	if len(epoch) != 1 || epoch[0]["train_loss"] != 2.5 || len(epoch[0].Missing("train_loss", "level")) != 0 {
		t.Fatalf("epoch records %v", epoch)
	}
	if miss := epoch[0].Missing("test_acc", "train_loss"); len(miss) != 1 || miss[0] != "test_acc" {
		t.Fatalf("Missing: %v", miss)
	}
}

// Capture hands run JSON Printers, parses both outputs, and returns run's error with its
// stderr; Phases names the progress records' phases and units, Completed counts the phases
// that reached their total.
func TestCapture(t *testing.T) {
	recs, err := Capture(func(stdout, stderr io.Writer) error {
		for _, p := range []struct {
			phase       string
			done, total int
		}{{"train", 1, 2}, {"train", 2, 2}, {"eval", 1, 4}, {"eval", 0, 0}} {
			if err := train.Print(stderr, "progress", map[string]any{"phase": p.phase, "unit": "img", "done": p.done, "total": p.total}, "progress"); err != nil {
				return err
			}
		}
		_, err := fmt.Fprintln(stdout, "done")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if phases := recs.Phases(); len(recs) != 5 || len(phases) != 2 || !phases["train img"] || !phases["eval img"] {
		t.Fatalf("records %v, phases %v", recs, recs.Phases())
	}
	if recs.Completed("train") != 1 || recs.Completed("eval") != 0 {
		t.Fatalf("completed: train %d, eval %d; want 1 and 0", recs.Completed("train"), recs.Completed("eval"))
	}
	_, err = Capture(func(stdout, stderr io.Writer) error {
		fmt.Fprintln(stderr, "why it failed")
		return errors.New("bad flag")
	})
	if err == nil || !strings.Contains(err.Error(), "bad flag") || !strings.Contains(err.Error(), `"msg":"why it failed"`) {
		t.Fatalf("Capture of a failing run: %v", err)
	}
}

// A text line, an object without msg, or output cut mid-line is an error naming the line.
func TestParseRejects(t *testing.T) {
	good := `{"time":"t","level":"INFO","msg":"ok"}` + "\n"
	for _, tc := range []struct{ out, want string }{
		{good + "epoch 1 train_loss 2.5\n", "output 0, line 2 is not a JSON object"},
		{`{"time":"t","level":"INFO"}` + "\n", "output 0, line 1 lacks [msg]"},
		{`{"time":"t","level":"INFO","msg":""}` + "\n", "has an empty msg"},
		{good + `{"msg":"cut`, "does not end with a newline"},
	} {
		if _, err := Parse(tc.out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want an error containing %q", tc.out, err, tc.want)
		}
	}
}
