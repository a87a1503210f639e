// Package layout holds one test: every library package of spargo imports only packages on
// lower floors of docs/ARCHITECTURE.md's table, so the layering it describes is the code's.
// Programs (cmd/..., examples/..., scripts/...) and their internal packages sit on the top
// floor and may import any library package.
package layout

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/spargo-dl/spargo/"

// floors is docs/ARCHITECTURE.md's table: a library package may import only packages on
// strictly lower floors. A new package must be added here (and to that table).
var floors = map[string]int{
	"internal/kernels": 0, "internal/golden": 0, "safetensors": 0, "plot": 0, "datasets": 0, "spec": 0,
	"nn": 1, "comm": 1,
	"optim": 2, "models": 2, "ddp": 2, "nn/gorgonia": 2, "hooks/profile": 2, "comm/simnet": 2, "comm/commtest": 2, "cluster": 2,
	"hooks": 3, "checkpoint": 3, "gradrec": 3, "models/internal/parity": 3,
	"train": 4,
}

// program reports whether dir is a program or a program's own package (top floor).
func program(dir string) bool {
	for _, p := range []string{"cmd/", "examples/", "scripts/"} {
		if strings.HasPrefix(dir, p) {
			return true
		}
	}
	return strings.HasSuffix(dir, "/export") // models/internal/parity/export: a development command
}

func TestPackageFloors(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "asmgen") {
			return filepath.SkipDir
		}
		dirs = append(dirs, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, abs := range dirs {
		pkg, err := build.ImportDir(abs, 0)
		if err != nil {
			if _, ok := err.(*build.NoGoError); ok {
				continue
			}
			t.Fatalf("%s: %v", abs, err)
		}
		rel, _ := filepath.Rel(root, abs)
		rel = filepath.ToSlash(rel)
		if pkg.Name == "main" || program(rel) || rel == "internal/layout" {
			continue
		}
		floor, ok := floors[rel]
		if !ok {
			t.Errorf("package %s has no floor: add it to this test's table and to docs/ARCHITECTURE.md", rel)
			continue
		}
		seen++
		var bad []string
		for _, imp := range pkg.Imports {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			if f, known := floors[dep]; !known || f >= floor {
				bad = append(bad, dep)
			}
		}
		sort.Strings(bad)
		if len(bad) > 0 {
			t.Errorf("%s (floor %d) imports %s, which is not on a lower floor", rel, floor, strings.Join(bad, ", "))
		}
	}
	if seen < 10 {
		t.Fatalf("checked only %d library packages under %s", seen, root)
	}
	if _, err := os.Stat(filepath.Join(root, "docs", "ARCHITECTURE.md")); err != nil {
		t.Errorf("the floor table's home: %v", err)
	}
}
