package cluster

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// torchrunPath returns a working torchrun, or skips the test.
func torchrunPath(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("torchrun")
	if err != nil {
		if _, statErr := exec.LookPath("/usr/bin/torchrun"); statErr != nil {
			t.Skip("skipping torchrun interop: torchrun not found (install python3-torch)")
		}
		path = "/usr/bin/torchrun"
	}
	if out, err := exec.Command(path, "--help").CombinedOutput(); err != nil {
		t.Skipf("skipping torchrun interop: %s --help fails: %v\n%s", path, err, lastLines(string(out), 3))
	}
	return path
}

// TestTorchrunLaunchesSpargo has torchrun (PyTorch's launcher) start a 2-process spargo job,
// the DDP equivalence training, in both of its store modes: the default static rendezvous,
// whose agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True), and the c10d rendezvous,
// where rank 0 hosts it on MASTER_PORT. The flags are spelled with underscores, which every
// torchrun accepts (1.13 knows no --nproc-per-node). --redirects=1 --tee=1 work around a bug
// of torch 1.13 under Python 3.11 (Debian's python3-torch): the default "0" parses to None
// because Python 3.11 no longer iterates over IntFlag's zero member, and torchrun crashes
// before starting any worker ("'NoneType' object has no attribute 'get'").
func TestTorchrunLaunchesSpargo(t *testing.T) {
	torchrun := torchrunPath(t)
	for _, tc := range []struct {
		name       string
		agentStore bool
		flags      func(port int) []string
	}{
		{"agent store", true, func(port int) []string {
			return []string{"--master_addr=127.0.0.1", "--master_port=" + strconv.Itoa(port)}
		}},
		{"rank 0 hosts the store", false, func(port int) []string {
			return []string{"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + strconv.Itoa(port)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			outDir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			args := append([]string{"--nnodes=1", "--nproc_per_node=2", "--max_restarts=0", "--monitor_interval=0.2", "--redirects=1", "--tee=1"}, tc.flags(port)...)
			args = append(args, "--no_python", helperBinary(t), "-test.run=^TestHelperProcess$")
			cmd := exec.CommandContext(ctx, torchrun, args...)
			cmd.Env = append(helperEnv("ddp"), "OUT_DIR="+outDir, "SPARGO_SECRET=torchrun-job-secret", "TMPDIR="+t.TempDir())
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("torchrun %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			t.Logf("torchrun ran the 2-process job in %v", time.Since(start).Round(time.Millisecond))
			results := readResults[ddpResult](t, outDir, 2)
			for r, res := range results {
				if res.Source != SourceTorchrun || res.AgentStore != tc.agentStore {
					t.Errorf("rank %d detected %s with agent store %v, want torchrun with %v", r, res.Source, res.AgentStore, tc.agentStore)
				}
			}
			checkDDP(t, results, 2)
		})
	}
}

// helperBinary is the path of this test binary, which torchrun runs as the program.
func helperBinary(t *testing.T) string {
	path, err := exec.LookPath(testBinary())
	if err != nil {
		t.Fatal(err)
	}
	return path
}
