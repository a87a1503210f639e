package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlotCommand(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	for i, path := range []string{a, b} {
		body := `{"epoch":1,"steps":10,"train_loss":2.0,"test_acc":0.3,"total_s":5}
{"epoch":2,"steps":10,"train_loss":1.5,"test_acc":0.5,"total_s":10}
{"summary":true,"config":{"hook":"` + []string{"allreduce", "topka"}[i] + `"},"epochs":[]}
`
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "cmp.png")
	var stdout, stderr bytes.Buffer
	// Flags after the files, as in the usage line.
	if code := dispatch([]string{"plot", a, b, "-o", out, "-x", "epochs", "-width", "500"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil || cfg.Width != 500 || cfg.Height != 2*380 {
		t.Fatalf("cmp.png: %+v, %v; want 500×760", cfg, err)
	}
	if !strings.Contains(stdout.String(), "wrote "+out) {
		t.Errorf("stdout %q", stdout.String())
	}

	// -log-ppl: a language model's perplexity on a log axis.
	lm := filepath.Join(dir, "lm.jsonl")
	os.WriteFile(lm, []byte("{\"step\":10,\"val_ppl\":900,\"total_s\":3,\"steps_per_epoch\":20}\n{\"step\":20,\"val_ppl\":300,\"total_s\":6,\"steps_per_epoch\":20}\n"), 0o644)
	stdout.Reset()
	if code := dispatch([]string{"plot", lm, "-log-ppl", "-o", out}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "wrote "+out) {
		t.Fatalf("-log-ppl: exit %d: %s", code, stderr.String())
	}

	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte("{\"epoch\":1,\"train_loss\":2}\n{oops}\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plot", "-o", out}, "no metrics files given"},
		{[]string{"plot", a}, "-o OUT.png is required"},
		{[]string{"plot", a, "-o", out, "-x", "wall"}, `-x: plot: unknown x axis "wall"`},
		{[]string{"plot", "-o", out, bad}, "bad.jsonl:2: "},
		{[]string{"plot", a, "-bogus"}, "flag provided but not defined: -bogus"},
	} {
		stdout.Reset()
		stderr.Reset()
		if code := dispatch(tc.args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	stdout.Reset()
	if code := dispatch([]string{"plot", "-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "usage: spargo plot FILE.jsonl") {
		t.Errorf("plot -h: exit %d, %q", code, stdout.String())
	}
}
