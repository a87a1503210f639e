package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// benchCommand is one `spargo bench NAME` measurement. Each lives in its own
// file (bench_train.go, bench_comm.go, …) and registers itself in init.
type benchCommand struct {
	summary string
	run     func(args []string, stdout io.Writer) error
}

var benchCommands = map[string]benchCommand{}

func registerBench(name string, c benchCommand) {
	if _, dup := benchCommands[name]; dup {
		panic("spargo: bench " + name + " registered twice")
	}
	benchCommands[name] = c
}

func init() {
	commands["bench"] = command{"measure training throughput and communication (spargo bench help)", runBench}
}

func runBench(args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		benchUsage(stdout)
		return nil
	}
	c, ok := benchCommands[args[0]]
	if !ok {
		return fmt.Errorf("bench: unknown measurement %q (have: %s)", args[0], benchNames())
	}
	return c.run(args[1:], stdout)
}

func benchNames() string {
	return strings.Join(slices.Sorted(maps.Keys(benchCommands)), ", ")
}

func benchUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: spargo bench <measurement> [flags]\n\nmeasurements:")
	for _, n := range slices.Sorted(maps.Keys(benchCommands)) {
		fmt.Fprintf(w, "  %-10s %s\n", n, benchCommands[n].summary)
	}
	fmt.Fprintln(w, "\nRun `spargo bench <measurement> -h` for its flags.")
}
