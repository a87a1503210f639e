package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/spargo-dl/spargo/checkpoint"
)

func init() {
	commands["diff"] = command{"compare two checkpoints bit for bit (exit status 1 when they differ)", runDiff}
}

const diffHelp = `usage: spargo diff [-json] [-digests] A B

Compares two checkpoints bit for bit: meta.json (model, hook, world size, configuration,
position; not the spargo version) and every safetensors file (model, optimizer, each rank's
hook, DDP, generator and loop state) tensor by tensor. A and B are checkpoint directories
(ckpt-…) or runs' -checkpoint directories, which stand for their latest checkpoint. Prints
one line per difference (for float32 tensors how many elements differ and the largest
difference) and exits with status 1 when there is any: the check of an exact resume.
Each checkpoint is also checked against the SHA-256 digests its meta.json records (per file
and per tensor): a file or tensor that does not match them is reported as corrupt. -digests
prints every file's recorded SHA-256 on both sides.
`

func runDiff(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spargo diff", flag.ContinueOnError)
	fs.SetOutput(stdout)
	asJSON := fs.Bool("json", false, "print a JSON array of {file, tensor, what}")
	showDigests := fs.Bool("digests", false, "print each file's recorded SHA-256 in both checkpoints (with -json: a row per file, what: sha256 A B)")
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
	var digestRows [][3]string
	if *showDigests {
		if digestRows, err = digestTable(fs.Arg(0), fs.Arg(1)); err != nil {
			return fmt.Errorf("diff: %w", err)
		}
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
		for _, r := range digestRows {
			rows = append(rows, row{File: r[0], What: "sha256 " + r[1] + " " + r[2]})
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
		for _, r := range digestRows {
			fmt.Fprintf(stdout, "%s: sha256 %s %s\n", r[0], r[1], r[2])
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

// digestTable lists, for every file either checkpoint records, its SHA-256 in a and in b
// ("-" where none is recorded), by file name.
func digestTable(a, b string) ([][3]string, error) {
	da, err := checkpoint.Digests(a)
	if err != nil {
		return nil, err
	}
	db, err := checkpoint.Digests(b)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for n := range da {
		names[n] = true
	}
	for n := range db {
		names[n] = true
	}
	side := func(d map[string]checkpoint.FileDigest, n string) string {
		if x, ok := d[n]; ok {
			return x.SHA256
		}
		return "-"
	}
	var rows [][3]string
	for _, n := range slices.Sorted(maps.Keys(names)) {
		rows = append(rows, [3]string{n, side(da, n), side(db, n)})
	}
	return rows, nil
}
