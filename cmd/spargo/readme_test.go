package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeCommand is one command line of a README shell block that runs spargo or an
// example program.
type readmeCommand struct {
	doc, line string
	prog      string   // "spargo" or an example's directory ("examples/vgg")
	args      []string // after the program (and its subcommands for spargo)
	sub       []string // spargo's subcommand path: ["bench", "train"]
}

// readmeCommands extracts the command lines of the ```sh blocks of a Markdown file,
// continuation lines joined, comments and environment assignments removed. A line that
// runs spargo (`go run ./cmd/spargo`, `./spargo`, `spargo`) or an example (`go run
// ./examples/X`, the binaries the README builds: `./vgg`) becomes one readmeCommand; a
// `spargo launch … -- PROG …` line becomes two.
func readmeCommands(t *testing.T, path string) []readmeCommand {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	in, cont := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		trim := strings.TrimSpace(l)
		if strings.HasPrefix(trim, "```") {
			in = !in && (trim == "```sh" || trim == "```bash" || trim == "```shell")
			continue
		}
		if !in {
			continue
		}
		if strings.HasSuffix(trim, "\\") {
			cont += strings.TrimSuffix(trim, "\\") + " "
			continue
		}
		lines = append(lines, cont+trim)
		cont = ""
	}
	var cmds []readmeCommand
	for _, l := range lines {
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		cmds = append(cmds, parseReadmeLine(filepath.Base(path), l)...)
	}
	return cmds
}

var envAssign = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=\S*$`)

func parseReadmeLine(doc, line string) []readmeCommand {
	for _, sep := range []string{"&&", ";", "|"} { // only the first command of a chain
		if i := strings.Index(line, sep); i >= 0 && !strings.Contains(line[:i], "--") {
			line = line[:i]
		}
	}
	fields := strings.Fields(line)
	for len(fields) > 0 && (envAssign.MatchString(fields[0]) || fields[0] == "sudo" || fields[0] == "env") {
		fields = fields[1:]
	}
	for len(fields) > 0 && strings.HasPrefix(fields[0], "scripts/netns-job.sh") { // netns-job.sh P PROG …
		fields = fields[min(2, len(fields)):]
	}
	if len(fields) == 0 {
		return nil
	}
	var prog string
	switch {
	case len(fields) >= 3 && fields[0] == "go" && fields[1] == "run" && strings.HasPrefix(fields[2], "./"):
		prog = strings.TrimPrefix(fields[2], "./")
		fields = fields[3:]
	case fields[0] == "./spargo" || fields[0] == "spargo":
		prog = "cmd/spargo"
		fields = fields[1:]
	case fields[0] == "./vgg":
		prog = "examples/vgg"
		fields = fields[1:]
	default:
		return nil
	}
	if prog != "cmd/spargo" && !strings.HasPrefix(prog, "examples/") {
		return nil
	}
	c := readmeCommand{doc: doc, line: line, prog: prog}
	if prog == "cmd/spargo" {
		for len(fields) > 0 && !strings.HasPrefix(fields[0], "-") && len(c.sub) < 2 {
			c.sub = append(c.sub, fields[0])
			fields = fields[1:]
			if len(c.sub) == 1 && c.sub[0] != "bench" {
				break
			}
		}
	}
	var rest []readmeCommand
	for i, f := range fields {
		if f == "--" { // spargo launch … -- PROG ARGS
			rest = parseReadmeLine(doc, strings.Join(fields[i+1:], " "))
			fields = fields[:i]
			break
		}
	}
	c.args = fields
	return append([]readmeCommand{c}, rest...)
}

// TestReadmeCommandsExist checks every spargo and example command line of the README and
// docs/*.md against the programs: each subcommand exists and each -flag is one the program
// defines (its -h lists it). A renamed subcommand or flag then fails here, not in a reader's
// terminal.
func TestReadmeCommandsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every example program")
	}
	root := filepath.Join("..", "..")
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append([]string{filepath.Join(root, "README.md")}, docs...)
	var cmds []readmeCommand
	for _, d := range docs {
		cmds = append(cmds, readmeCommands(t, d)...)
	}
	if len(cmds) < 10 {
		t.Fatalf("found only %d spargo or example commands in %v", len(cmds), docs)
	}
	bin := t.TempDir()
	built := map[string]string{}
	build := func(prog string) string {
		if p, ok := built[prog]; ok {
			return p
		}
		out := filepath.Join(bin, strings.ReplaceAll(prog, "/", "_"))
		cmd := exec.Command("go", "build", "-o", out, "./"+prog)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./%s: %v\n%s", prog, err, b)
		}
		built[prog] = out
		return out
	}
	helps := map[string]string{}
	help := func(c readmeCommand) (string, error) {
		key := c.prog + " " + strings.Join(c.sub, " ")
		if h, ok := helps[key]; ok {
			return h, nil
		}
		args := append(append([]string{}, c.sub...), "-h")
		out, err := exec.Command(build(c.prog), args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() <= 2 { // flag's -h exits 0 or 2
			err = nil
		}
		helps[key] = string(out)
		return string(out), err
	}
	flagName := regexp.MustCompile(`^--?([A-Za-z0-9][A-Za-z0-9_-]*)`)
	for _, c := range cmds {
		h, err := help(c)
		if err != nil {
			t.Errorf("%s: `%s`: %s %s -h: %v\n%s", c.doc, c.line, c.prog, strings.Join(c.sub, " "), err, h)
			continue
		}
		if strings.Contains(h, "unknown command") || strings.Contains(h, "unknown benchmark") {
			t.Errorf("%s: `%s`: no subcommand %q in %s:\n%s", c.doc, c.line, strings.Join(c.sub, " "), c.prog, h)
			continue
		}
		for _, a := range c.args {
			m := flagName.FindStringSubmatch(a)
			if m == nil {
				continue
			}
			name, _, _ := strings.Cut(m[1], "=")
			if !strings.Contains(h, "  -"+name+" ") && !strings.Contains(h, "  -"+name+"\n") &&
				!strings.Contains(h, "  --"+name+" ") && !strings.Contains(h, "  --"+name+"\n") {
				t.Errorf("%s: `%s`: %s %s has no flag -%s", c.doc, c.line, c.prog, strings.Join(c.sub, " "), name)
			}
		}
	}
	t.Logf("checked %d command lines against %d programs", len(cmds), len(built))
}
