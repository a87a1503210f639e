// Command spargo is spargo's command-line tool.
//
//	spargo hooks          list every registered comm hook with its options and defaults
//	spargo models         list the model catalogue with parameter counts (-json; names or families select)
//	spargo bench train    single-process training images/s or sequences/s (-model, -batch, -seq, -steps, -json)
//	spargo bench comm     comm hook cost on in-process workers (-hook, -workers, -n, -transport, -json)
//	spargo bench overlap  communication left after backward per hook (-model, -hook, -workers, -trace, -json; in-process or under a launcher)
//	spargo simulate       comm hook cost on a simulated α-β network of up to thousands of workers
//	spargo plan           merge plans of omgs, mgs, lags and TopK-SGD with predicted iteration times (-profile or -measure; cost overrides)
//	spargo bench allreduce  all-reduce throughput between processes over TCP (-n, -workers, -algorithm, -json)
//	spargo launch         run N local processes as one job (-n, -restarts, -timeout, -secret-file)
//	spargo diff           compare two checkpoints bit for bit (-json; exit status 1 when they differ)
//
// Later subcommands (plot) join the same dispatch table; later
// measurements join `spargo bench` by registering in their own file.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spargo-dl/spargo/hooks"
)

type command struct {
	summary string
	run     func(args []string, stdout io.Writer) error
}

var commands = map[string]command{
	"hooks":  {"list the comm hooks usable with -hook, with options and defaults", runHooks},
	"models": {"list the built-in models and their parameter counts", runModels},
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "spargo: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := c.run(args[1:], stdout); err != nil {
		fmt.Fprintln(stderr, "spargo:", err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: spargo <command> [arguments]\n\ncommands:")
	for _, n := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
}

func runHooks(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("hooks takes no arguments")
	}
	fmt.Fprintln(stdout, "comm hooks (select with -hook NAME[:key=value,...]):")
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, hooks.Help())
	return nil
}

// parseFlags parses a subcommand's flags: -h prints help (the text, then the flags) and
// reports helped; an argument left over is an error. An empty help keeps the usage function
// the flag set already has.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer, help string) (helped bool, err error) {
	if helped, err := parseFlagArgs(fs, args, stdout, help); helped || err != nil {
		return helped, err
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("%s: unexpected argument %q", strings.TrimPrefix(fs.Name(), "spargo "), fs.Arg(0))
	}
	return false, nil
}

// parseFlagArgs is parseFlags for a subcommand that takes arguments after its flags
// (fs.Args()): it leaves them to the caller.
func parseFlagArgs(fs *flag.FlagSet, args []string, stdout io.Writer, help string) (helped bool, err error) {
	if help != "" {
		fs.Usage = func() {
			fmt.Fprint(stdout, help)
			fmt.Fprintln(stdout, "\nflags:")
			fs.PrintDefaults()
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	return false, nil
}
