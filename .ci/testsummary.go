// Command testsummary reads `go test -json` on stdin and prints what a
// person wants from a whole-tree run: each package's result, each failed
// test with its output, and each skipped test with the reason it gave.
// Used by .ci/fresh-clone.sh.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

func main() {
	output := map[string][]string{} // package/test → its output lines
	var failed, skipped []string
	pkgs := map[string]string{}
	passed := 0
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<26)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Println(sc.Text()) // a build error line, not an event
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if line := strings.TrimRight(e.Output, "\n"); !strings.HasPrefix(strings.TrimSpace(line), "=== ") {
				output[key] = append(output[key], line)
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				pkgs[e.Package] = e.Action
				continue
			}
			switch e.Action {
			case "pass":
				passed++
			case "fail":
				failed = append(failed, key)
			case "skip":
				skipped = append(skipped, key)
			}
		}
	}
	names := make([]string, 0, len(pkgs))
	for p := range pkgs {
		names = append(names, p)
	}
	sort.Strings(names)
	var bad []string
	for _, p := range names {
		if pkgs[p] == "fail" {
			bad = append(bad, p)
		}
	}
	fmt.Printf("%d packages, %d failed; tests: %d passed, %d failed, %d skipped\n", len(names), len(bad), passed, len(failed), len(skipped))
	for _, p := range bad {
		fmt.Println("FAIL package", p)
		if len(output[p+" "]) > 0 && !hasTestFailure(failed, p) {
			printIndented(output[p+" "], 30)
		}
	}
	for _, k := range failed {
		fmt.Println("FAIL", k)
		printIndented(output[k], 30)
	}
	for _, k := range skipped {
		fmt.Println("SKIP", k)
		printIndented(output[k], 5)
	}
}

func hasTestFailure(failed []string, pkg string) bool {
	for _, k := range failed {
		if strings.HasPrefix(k, pkg+" ") {
			return true
		}
	}
	return false
}

// printIndented prints the last n lines, without the --- result lines.
func printIndented(lines []string, n int) {
	var keep []string
	for _, l := range lines {
		if t := strings.TrimSpace(l); !strings.HasPrefix(t, "--- ") {
			keep = append(keep, l)
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	for _, l := range keep {
		fmt.Println("    " + strings.TrimSpace(l))
	}
}
