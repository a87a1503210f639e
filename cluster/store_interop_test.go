package cluster

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// These tests run PyTorch's own TCPStore (Debian's python3-torch, 1.13) against this package:
// a Python client against StoreServer and a Go client against PyTorch's server. They skip when
// python3 or torch.distributed is missing.

// torchPython returns a python3 that can import torch.distributed, or skips the test. It tries
// $SPARGO_PYTHON, python3 from PATH and /usr/bin/python3 (Debian's python3-torch lives there
// even when PATH prefers another Python).
func torchPython(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, py := range []string{os.Getenv("SPARGO_PYTHON"), "python3", "/usr/bin/python3"} {
		if py == "" {
			continue
		}
		path, err := exec.LookPath(py)
		if err != nil {
			tried = append(tried, py+": not found")
			continue
		}
		out, err := exec.Command(path, "-c", "import torch, torch.distributed as d; assert d.is_available(); print(torch.__version__)").CombinedOutput()
		if err != nil {
			tried = append(tried, path+": "+lastLines(string(out), 1))
			continue
		}
		t.Logf("using %s with PyTorch %s", path, strings.TrimSpace(string(out)))
		return path
	}
	t.Skipf("skipping PyTorch interop: no python3 that imports torch.distributed (install python3-torch, or set SPARGO_PYTHON): %s", strings.Join(tried, "; "))
	return ""
}

// pythonCtx bounds a test that starts Python: importing torch takes seconds on a busy machine.
func pythonCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// pythonClientScript uses every query PyTorch 1.13's Python API exposes (it has no check) against the server at argv[1]:argv[2]. The Go side has
// set "from-go" = "hello" first, and sets "late" 300 ms after the script says it is waiting
// for it, so the script's get("late") blocks on the server.
const pythonClientScript = `
import sys, time
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore(sys.argv[1], int(sys.argv[2]), None, False, timedelta(seconds=20))
assert s.get("from-go") == b"hello", s.get("from-go")
s.set("from-py", "world")
assert s.add("cnt", 5) == 5
assert s.add("cnt", -2) == 3
assert s.get("cnt") == b"3"
assert s.compare_set("cas", "", "first") == b"first"
assert s.compare_set("cas", "wrong", "second") == b"first"
assert s.compare_set("cas", "first", "second") == b"second"
assert s.delete_key("cas")
assert not s.delete_key("cas")
s.wait(["from-go", "cnt"])
s.set("py-waiting", "1")
t0 = time.monotonic()
assert s.get("late") == b"set-by-go-later"
print("blocked %.3f" % (time.monotonic() - t0))
p = dist.PrefixStore("job7", s)
p.set("inner", "x")
print("numkeys", s.num_keys())
print("ok")
`

func TestInteropPythonClientGoServer(t *testing.T) {
	py := torchPython(t)
	srv := startServer(t, StoreOptions{Logf: t.Logf})
	host, port := "127.0.0.1", strconv.Itoa(srv.Port())
	goClient := dial(t, srv, StoreOptions{})
	ctx := pythonCtx(t)
	if err := goClient.Set(ctx, "from-go", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	setter := dial(t, srv, StoreOptions{})
	go func() {
		if setter.Wait(ctx, "py-waiting") == nil {
			time.Sleep(300 * time.Millisecond)
			setter.Set(ctx, "late", []byte("set-by-go-later"))
		}
	}()
	out, err := exec.CommandContext(ctx, py, "-c", pythonClientScript, host, port).CombinedOutput()
	if err != nil {
		t.Fatalf("python client: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ok") {
		t.Fatalf("python client output:\n%s", out)
	}
	var blocked float64
	m := regexp.MustCompile(`blocked ([0-9.]+)`).FindSubmatch(out)
	if m != nil {
		blocked, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if blocked < 0.25 {
		t.Fatalf("python get(\"late\") did not wait for Go to set it (blocked %gs):\n%s", blocked, out)
	}
	// What Python wrote is visible to Go under the same names.
	for key, want := range map[string]string{"from-py": "world", "cnt": "3", "job7/inner": "x"} {
		if v, err := goClient.Get(ctx, key); err != nil || string(v) != want {
			t.Errorf("Go Get(%q) = %q, %v; want %q", key, v, err, want)
		}
	}
	// from-go, from-py, cnt, py-waiting, late, job7/inner.
	if !strings.Contains(string(out), "numkeys 6") {
		t.Errorf("python saw a different key count:\n%s", out)
	}
}

// pythonServerScript hosts a PyTorch TCPStore, prints its port, seeds keys, waits for the Go
// client's "go-done" and checks what the Go client wrote.
const pythonServerScript = `
import sys
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=20), wait_for_workers=False)
print("port", s.port, flush=True)
s.set("seed", "from-python")
s.wait(["go-done"])
assert s.get("from-go") == b"\x00\x01binary\xff", s.get("from-go")
assert s.get("added") == b"42"
assert s.get("swapped") == b"new"
assert s.num_keys() == 6, s.num_keys()  # the five above and go-done; "deleted" is gone
assert dist.PrefixStore("/worker/attempt_0", s).get("spargo/addr/0") == b"host:1"
s.set("python-done", "1")
print("ok", flush=True)
`

func TestInteropGoClientPythonServer(t *testing.T) {
	py := torchPython(t)
	ctx := pythonCtx(t)
	cmd := exec.CommandContext(ctx, py, "-c", pythonServerScript)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("python server printed nothing: %s", stderr.String())
	}
	port := strings.TrimPrefix(lines.Text(), "port ")

	s, err := DialStore(ctx, "127.0.0.1:"+port, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := s.Get(ctx, "seed"); err != nil || string(v) != "from-python" {
		t.Fatalf("Get seed = %q, %v", v, err)
	}
	steps := []func() error{
		func() error { return s.Set(ctx, "from-go", []byte("\x00\x01binary\xff")) },
		func() error { _, err := s.Add(ctx, "added", 40); return err },
		func() error { _, err := s.Add(ctx, "added", 2); return err },
		func() error { _, err := s.CompareSet(ctx, "swapped", nil, []byte("old")); return err },
		func() error { _, err := s.CompareSet(ctx, "swapped", []byte("old"), []byte("new")); return err },
		func() error { return s.Set(ctx, "deleted", nil) },
		func() error { _, err := s.Delete(ctx, "deleted"); return err },
		// torchrun's agent-store namespace, as Init uses it.
		func() error { return s.WithPrefix("/worker/attempt_0").Set(ctx, "spargo/addr/0", []byte("host:1")) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if ok, err := s.Check(ctx, "from-go", "added"); err != nil || !ok {
		t.Fatalf("Check = %v, %v", ok, err)
	}
	if v, err := s.CompareSet(ctx, "swapped", []byte("stale"), []byte("x")); err != nil || string(v) != "new" {
		t.Fatalf("CompareSet with a stale expected value = %q, %v", v, err)
	}
	n, err := s.NumKeys(ctx)
	if err != nil || n != 5 { // seed, from-go, added, swapped, the prefixed address
		t.Fatalf("NumKeys = %d, %v; want 5", n, err)
	}
	if err := s.Set(ctx, "go-done", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, "python-done"); err != nil {
		t.Fatalf("python server did not confirm: %v\n%s", err, stderr.String())
	}
	if !lines.Scan() || lines.Text() != "ok" {
		t.Fatalf("python server: %q\n%s", lines.Text(), stderr.String())
	}
}
