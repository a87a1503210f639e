// Package jsonlines reads back what a program printed under -log-format json, for the
// examples' tests: every line must be one JSON object with the time, level and msg members of
// train.Printer's records, and a test then looks records up by their msg.
//
//	recs, err := jsonlines.Capture(func(stdout, stderr io.Writer) error {
//		_, err := cifar.Run(ctx, c, stdout, stderr)
//		return err
//	})
//	epoch := recs.Find("epoch") // the epoch records, train_loss and all
package jsonlines

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spargo-dl/spargo/train"
)

// Record is one line's JSON object.
type Record map[string]any

// Msg is the record's msg.
func (r Record) Msg() string { s, _ := r["msg"].(string); return s }

// Records are a run's lines in the order printed (stdout's, then stderr's).
type Records []Record

// Find returns the records whose msg is msg.
func (rs Records) Find(msg string) Records {
	var out Records
	for _, r := range rs {
		if r.Msg() == msg {
			out = append(out, r)
		}
	}
	return out
}

// Phases are the "phase unit" pairs of the progress records ("train img", "eval words").
func (rs Records) Phases() map[string]bool {
	seen := map[string]bool{}
	for _, r := range rs.Find("progress") {
		seen[fmt.Sprint(r["phase"], " ", r["unit"])] = true
	}
	return seen
}

// Completed counts the progress records of phase whose count reached a positive total: the
// phases that ran to their end (a phase prints its last count once).
func (rs Records) Completed(phase string) int {
	n := 0
	for _, r := range rs.Find("progress") {
		if r["phase"] == phase && r["done"] == r["total"] && r["total"] != 0.0 {
			n++
		}
	}
	return n
}

// Missing returns the members of keys that r lacks.
func (r Record) Missing(keys ...string) []string {
	var out []string
	for _, k := range keys {
		if _, ok := r[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// Output is one of a program's outputs in JSON: Printer is what the program writes on (the
// Printer Main gives it under -log-format json), over a buffer the test reads back.
type Output struct {
	Printer *train.Printer
	buf     bytes.Buffer
}

// NewOutput returns an empty output in JSON.
func NewOutput() *Output {
	o := new(Output)
	o.Printer, _ = train.NewPrinter(&o.buf, "json") // "json" is a format NewPrinter knows
	return o
}

// String is everything printed so far (a line without its newline is flushed first).
func (o *Output) String() string {
	_ = o.Printer.Flush()
	return o.buf.String()
}

// Capture runs a program's run with its stdout and stderr in JSON and parses what it printed
// (Parse); the error of run comes with what it printed on stderr.
func Capture(run func(stdout, stderr io.Writer) error) (Records, error) {
	stdout, stderr := NewOutput(), NewOutput()
	if err := run(stdout.Printer, stderr.Printer); err != nil {
		return nil, fmt.Errorf("%w\nstderr:\n%s", err, stderr.String())
	}
	return Parse(stdout.String(), stderr.String())
}

// Parse reads the outputs' lines: every non-empty output must end with a newline and every
// line must be a JSON object with "time", "level" and a non-empty "msg". The error names the
// output and line that are not.
func Parse(outputs ...string) (Records, error) {
	var recs Records
	for i, out := range outputs {
		if out == "" {
			continue
		}
		if !strings.HasSuffix(out, "\n") {
			return nil, fmt.Errorf("output %d does not end with a newline: %q", i, out[strings.LastIndexByte(out, '\n')+1:])
		}
		for n, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			var r Record
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				return nil, fmt.Errorf("output %d, line %d is not a JSON object: %v: %q", i, n+1, err, line)
			}
			if miss := r.Missing("time", "level", "msg"); len(miss) > 0 || r.Msg() == "" {
				return nil, fmt.Errorf("output %d, line %d lacks %v or has an empty msg: %q", i, n+1, miss, line)
			}
			recs = append(recs, r)
		}
	}
	return recs, nil
}
