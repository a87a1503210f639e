package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/spargo-dl/spargo/plot"
)

func init() {
	commands["plot"] = command{"draw metrics files (-metrics JSONL) as a PNG, runs overlaid (spargo plot -h)", runPlot}
}

const plotUsage = `usage: spargo plot FILE.jsonl [FILE.jsonl...] -o OUT.png [-x steps|time|epochs] [-width W] [-height H] [-title T] [-log-ppl]

Draws the metrics files the examples write with -metrics as one PNG: loss, and accuracy
or perplexity when the records have them, against optimizer steps, wall time or epochs
(-x takes one axis or a comma-separated list, one column each). Several files are
overlaid, one colour per run, labelled by the run's hook: dense all-reduce against each
sparse hook. Training values are solid, test (validation) values dashed. The record
schema is in the documentation of package github.com/spargo-dl/spargo/plot.

Flags may come before or after the files.

flags:
`

func runPlot(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo plot", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprint(stdout, plotUsage)
		fs.PrintDefaults()
	}
	out := fs.String("o", "", "output PNG file (required)")
	x := fs.String("x", "steps,time", "x axes: steps, time, epochs, or a comma-separated list")
	width := fs.Int("width", 0, "image width in pixels (0: 560 per x axis)")
	height := fs.Int("height", 0, "image height in pixels (0: 380 per quantity drawn)")
	title := fs.String("title", "", "title above the panels")
	logPPL := fs.Bool("log-ppl", false, "draw perplexity on a logarithmic axis (language models: it falls by orders of magnitude)")
	// The flag package stops at the first file name: parse the flags between the files too.
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return fmt.Errorf("plot: %w", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			files = append(files, args[1:]...)
			break
		}
		files, args = append(files, args[0]), args[1:]
	}
	switch {
	case len(files) == 0:
		return errors.New("plot: no metrics files given; usage: spargo plot FILE.jsonl... -o OUT.png")
	case *out == "":
		return errors.New("plot: -o OUT.png is required")
	}
	axes, err := plot.ParseAxes(*x)
	if err != nil {
		return fmt.Errorf("-x: %w", err)
	}
	if err := plot.CompareWith(files, *out, plot.Options{Axes: axes, Width: *width, Height: *height, Title: *title, LogPerplexity: *logPPL}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", *out)
	return nil
}
