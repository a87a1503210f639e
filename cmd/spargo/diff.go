package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/spargo-dl/spargo/checkpoint"
)

func init() {
	commands["diff"] = command{"compare two checkpoints bit for bit (exit status 1 when they differ)", runDiff}
}

const diffHelp = `usage: spargo diff [-json] A B

Compares two checkpoints bit for bit: meta.json (model, hook, world size, configuration,
position; not the spargo version) and every safetensors file (model, optimizer, each rank's
hook, DDP, generator and loop state) tensor by tensor. A and B are checkpoint directories
(ckpt-…) or runs' -checkpoint directories, which stand for their latest checkpoint. Prints
one line per difference (for float32 tensors how many elements differ and the largest
difference) and exits with status 1 when there is any: the check of an exact resume.
`

func runDiff(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo diff", flag.ContinueOnError)
	fs.SetOutput(stdout)
	asJSON := fs.Bool("json", false, "print a JSON array of {file, tensor, what}")
	if helped, err := parseFlagArgs(fs, args, stdout, diffHelp); helped || err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("diff: want two checkpoints, got %d arguments (spargo diff -h)", fs.NArg())
	}
	diffs, err := checkpoint.Diff(fs.Arg(0), fs.Arg(1))
	if err != nil {
		return fmt.Errorf("diff: %w", err)
	}
	if *asJSON {
		type row struct {
			File   string `json:"file"`
			Tensor string `json:"tensor,omitempty"`
			What   string `json:"what"`
		}
		rows := make([]row, 0, len(diffs))
		for _, d := range diffs {
			rows = append(rows, row{d.File, d.Tensor, d.What})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return err
		}
	} else {
		for _, d := range diffs {
			fmt.Fprintln(stdout, d)
		}
	}
	if len(diffs) > 0 {
		if len(diffs) == 1 {
			return fmt.Errorf("diff: the checkpoints differ in 1 place")
		}
		return fmt.Errorf("diff: the checkpoints differ in %d places", len(diffs))
	}
	if !*asJSON {
		fmt.Fprintln(stdout, "the checkpoints hold the same state")
	}
	return nil
}
