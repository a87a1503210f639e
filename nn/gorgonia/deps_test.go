package gorgonia

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const module = "github.com/spargo-dl/spargo"

// mayLinkGorgonia are the only packages of the module whose builds may contain gorgonia: this
// bridge and the program that shows it.
var mayLinkGorgonia = []string{module + "/nn/gorgonia", module + "/examples/gorgonia"}

// mustBeChecked are packages the architecture names: if one of them disappears from
// `go list ./...` the test fails rather than passing vacuously.
var mustBeChecked = []string{"nn", "ddp", "hooks", "comm", "cluster", "models", "train", "spec", "optim", "datasets", "examples/vgg", "cmd/spargo"}

// The core never links gorgonia: `go list -deps` of every package of the module except this
// bridge and its example has no gorgonia.org/ package, and no other package's tests import
// gorgonia or the bridge. (Importing gorgonia.org/tensor alone links Apache Arrow, two
// protobuf stacks and flatbuffers; see docs/ARCHITECTURE.md.)
func TestCoreDoesNotImportGorgonia(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go tool is not on PATH (%v): cannot run go list", err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// One line per package: import path | dependencies (what `go list -deps` of that package
	// prints) | test imports.
	cmd := exec.CommandContext(ctx, goTool, "list", "-f",
		`{{.ImportPath}}|{{join .Deps " "}}|{{join .TestImports " "}} {{join .XTestImports " "}}`, "./...")
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list in %s: %v\n%s", root, err, stderr.String())
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		parts := strings.SplitN(line, "|", 3)
		if len(parts) != 3 {
			t.Fatalf("go list line %q", line)
		}
		pkg, deps, testImports := parts[0], strings.Fields(parts[1]), strings.Fields(parts[2])
		seen[pkg] = true
		hasGorgonia := slices.ContainsFunc(deps, func(d string) bool { return strings.HasPrefix(d, "gorgonia.org/") })
		if slices.Contains(mayLinkGorgonia, pkg) {
			if !hasGorgonia {
				// The check below must be able to see gorgonia where it is.
				t.Errorf("%s: go list -deps shows no gorgonia.org/ package: the test cannot see gorgonia", pkg)
			}
			continue
		}
		for _, d := range deps {
			if strings.HasPrefix(d, "gorgonia.org/") || d == module+"/nn/gorgonia" {
				t.Errorf("%s depends on %s: only %v may link gorgonia", pkg, d, mayLinkGorgonia)
				break
			}
		}
		for _, d := range testImports {
			if strings.HasPrefix(d, "gorgonia.org/") || d == module+"/nn/gorgonia" {
				t.Errorf("the tests of %s import %s", pkg, d)
			}
		}
	}
	for _, p := range append(slices.Clone(mayLinkGorgonia), prefixed(mustBeChecked)...) {
		if !seen[p] {
			t.Errorf("go list ./... did not list %s", p)
		}
	}

	// The same, spelled as the architecture states it: go list -deps of the core packages.
	args := []string{"list", "-deps"}
	for _, p := range mustBeChecked {
		args = append(args, "./"+p)
	}
	cmd = exec.CommandContext(ctx, goTool, args...)
	cmd.Dir = root
	stdout.Reset()
	stderr.Reset()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	for _, dep := range strings.Fields(stdout.String()) {
		if strings.HasPrefix(dep, "gorgonia.org/") || dep == module+"/nn/gorgonia" {
			t.Errorf("go list -deps %v lists %s", mustBeChecked, dep)
		}
	}
}

func prefixed(rel []string) []string {
	out := make([]string, len(rel))
	for i, r := range rel {
		out[i] = module + "/" + r
	}
	return out
}
