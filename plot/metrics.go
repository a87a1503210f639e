// Package plot draws training curves from the metrics files spargo's examples write
// (-metrics FILE.jsonl), as PNG images, with gonum.org/v1/plot.
//
//	plot.File("run.jsonl", "run.png")                                 // one run: what -plot does
//	plot.Compare([]string{"dense.jsonl", "spardl.jsonl"}, "cmp.png")   // runs overlaid, one colour each
//
// The image is a grid of panels: one row per quantity (loss; accuracy or perplexity
// when the records have them), one column per x axis (Options.Axes: optimizer steps,
// wall time, epochs; steps and time by default). Training values are solid lines,
// test (validation) values dashed; per-epoch values carry markers. `spargo plot` is the
// command-line front end.
//
// # Metrics file schema
//
// A metrics file is JSON Lines: one JSON object per line (blank lines are skipped). Three
// kinds of records are read; any other object is ignored, so files may carry more:
//
//   - A step record has "step": the number of optimizer steps done (global, counted from
//     the start of the run, not reset per epoch). Its values are training values of that
//     step (or of the steps since the last step record).
//   - An epoch record has "epoch" (1-based, written at the end of that epoch) and no
//     "step". "steps" is the number of steps the epoch took (for the steps axis, summed
//     over the epochs); examples/vgg writes these.
//   - A summary has "summary": true. Its "config"."hook" names the run; its "epochs"
//     array of epoch records is used only when the file has no epoch lines of its own.
//
// Fields read from step and epoch records (all optional; numbers unless said):
//
//	loss, train_loss             training loss (mean cross-entropy)
//	test_loss, val_loss          test or validation loss (epoch records)
//	acc, train_acc               training accuracy, as a fraction
//	test_acc, val_acc            test or validation accuracy
//	ppl, train_ppl               training perplexity (language models)
//	test_ppl, val_ppl            test or validation perplexity
//	total_s, wall_s, time_s      wall seconds since the run started, at the record
//	steps_per_epoch              (step records) places steps on the epochs axis
//	hook                         (string, any record) names the run, as a summary's config.hook
//
// A run is labelled by its hook ("allreduce", "spardl:density=0.01", …) or, without one,
// by its file name; for a value present in both step and epoch records the step records
// give the curve.
package plot

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Quantities of a Point's Values.
const (
	TrainLoss = "train_loss"
	TestLoss  = "test_loss"
	TrainAcc  = "train_acc"
	TestAcc   = "test_acc"
	TrainPPL  = "train_ppl"
	TestPPL   = "test_ppl"
)

// fieldAliases maps record fields to the quantity they carry.
var fieldAliases = map[string]string{
	"loss": TrainLoss, "train_loss": TrainLoss, "test_loss": TestLoss, "val_loss": TestLoss,
	"acc": TrainAcc, "train_acc": TrainAcc, "test_acc": TestAcc, "val_acc": TestAcc,
	"ppl": TrainPPL, "train_ppl": TrainPPL, "test_ppl": TestPPL, "val_ppl": TestPPL,
}

// timeFields are the names a record's wall time may have, in order of preference.
var timeFields = []string{"total_s", "wall_s", "time_s"}

// Point is one record of a run. Coordinates that the record does not give are NaN.
type Point struct {
	Step   float64            // optimizer steps done
	Epoch  float64            // epochs done
	Time   float64            // wall seconds since the start
	Values map[string]float64 // by quantity (TrainLoss, TestAcc, …)
}

// Run is one metrics file.
type Run struct {
	Name   string  // legend label: the run's hook, or its file name
	Path   string  // the file read
	Steps  []Point // step records, in file order
	Epochs []Point // epoch records, in file order
	// HeldOut names the held-out series in legends: "validation" when the records carry
	// val_* fields (a validation set, as the language models report), else "test".
	HeldOut string
}

// Read reads a metrics file (see the package doc for the schema).
func Read(path string) (*Run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("plot: %w", err)
	}
	defer f.Close()
	return ReadFrom(f, path)
}

// ReadFrom reads metrics records from r; name is the file name used in errors and, when
// the records name no hook, as the run's label. Malformed JSON, or a field of the wrong
// type, is an error naming the file and line.
func ReadFrom(r io.Reader, name string) (*Run, error) {
	run := &Run{Path: name, HeldOut: "test"}
	var summaryEpochs []Point
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20) // summaries hold every epoch and the config
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, line)
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("plot: %s: %w", where, err)
		}
		for _, k := range []string{"val_loss", "val_acc", "val_ppl"} {
			if _, ok := rec[k]; ok {
				run.HeldOut = "validation"
			}
		}
		if err := readHook(rec, where, run); err != nil {
			return nil, err
		}
		if _, ok := rec["summary"]; ok {
			var sum bool
			if err := field(rec, "summary", &sum, where); err != nil {
				return nil, err
			}
			if sum {
				var eps []map[string]json.RawMessage
				if err := field(rec, "epochs", &eps, where); err != nil {
					return nil, err
				}
				summaryEpochs = summaryEpochs[:0]
				for i, e := range eps {
					p, err := point(e, fmt.Sprintf("%s: epochs[%d]", where, i))
					if err != nil {
						return nil, err
					}
					summaryEpochs = append(summaryEpochs, p)
				}
				continue
			}
		}
		_, isStep := rec["step"]
		_, isEpoch := rec["epoch"]
		if !isStep && !isEpoch {
			continue
		}
		p, err := point(rec, where)
		if err != nil {
			return nil, err
		}
		if isStep {
			run.Steps = append(run.Steps, p)
		} else {
			run.Epochs = append(run.Epochs, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("plot: %s:%d: %w", name, line+1, err)
	}
	if len(run.Epochs) == 0 {
		run.Epochs = summaryEpochs
	}
	run.placeOnAxes()
	if run.Name == "" {
		run.Name = strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	}
	return run, nil
}

// readHook takes the run's name from a record's "hook" or "config"."hook".
func readHook(rec map[string]json.RawMessage, where string, run *Run) error {
	var hook string
	if _, ok := rec["hook"]; ok {
		if err := field(rec, "hook", &hook, where); err != nil {
			return err
		}
	}
	if raw, ok := rec["config"]; ok && hook == "" {
		var cfg map[string]json.RawMessage
		if json.Unmarshal(raw, &cfg) == nil {
			if _, ok := cfg["hook"]; ok {
				if err := field(cfg, "hook", &hook, where+`: "config"`); err != nil {
					return err
				}
			}
		}
	}
	if hook != "" {
		run.Name = hook
	}
	return nil
}

// field decodes rec[key] into v, with an error naming where and the key.
func field(rec map[string]json.RawMessage, key string, v any, where string) error {
	raw, ok := rec[key]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("plot: %s: field %q: %s is not a %s", where, key, raw, kind(v))
	}
	return nil
}

func kind(v any) string {
	switch v.(type) {
	case *float64:
		return "number"
	case *string:
		return "string"
	case *bool:
		return "boolean"
	}
	return "list of records"
}

// point reads a step or epoch record.
func point(rec map[string]json.RawMessage, where string) (Point, error) {
	p := Point{Step: math.NaN(), Epoch: math.NaN(), Time: math.NaN(), Values: map[string]float64{}}
	num := func(key string) (float64, bool, error) {
		if _, ok := rec[key]; !ok {
			return 0, false, nil
		}
		var x float64
		err := field(rec, key, &x, where)
		return x, err == nil, err
	}
	for key, q := range fieldAliases {
		x, ok, err := num(key)
		if err != nil {
			return p, err
		}
		if ok {
			p.Values[q] = x
		}
	}
	for _, key := range timeFields {
		x, ok, err := num(key)
		if err != nil {
			return p, err
		}
		if ok && math.IsNaN(p.Time) {
			p.Time = x
		}
	}
	for key, dst := range map[string]*float64{"step": &p.Step, "epoch": &p.Epoch} {
		x, ok, err := num(key)
		if err != nil {
			return p, err
		}
		if ok {
			*dst = x
		}
	}
	// Kept in Values under their record names for placeOnAxes; removed there.
	for _, key := range []string{"steps", "steps_per_epoch"} {
		x, ok, err := num(key)
		if err != nil {
			return p, err
		}
		if ok {
			p.Values["."+key] = x
		}
	}
	return p, nil
}

// placeOnAxes fills the coordinates the records give only indirectly: an epoch record's
// step is the sum of the epochs' "steps"; a step record's epoch is step / steps per epoch
// (its own "steps_per_epoch", else the first epoch record's "steps").
func (r *Run) placeOnAxes() {
	total, known := 0.0, true
	perEpoch := math.NaN()
	for i := range r.Epochs {
		p := &r.Epochs[i]
		n, ok := p.Values[".steps"]
		if !ok {
			known = false
		} else if math.IsNaN(perEpoch) && n > 0 {
			perEpoch = n
		}
		total += n
		if known {
			p.Step = total
		}
		delete(p.Values, ".steps")
		delete(p.Values, ".steps_per_epoch")
	}
	for i := range r.Steps {
		p := &r.Steps[i]
		spe := perEpoch
		if n, ok := p.Values[".steps_per_epoch"]; ok && n > 0 {
			spe = n
		}
		p.Epoch = p.Step / spe
		delete(p.Values, ".steps")
		delete(p.Values, ".steps_per_epoch")
	}
}
