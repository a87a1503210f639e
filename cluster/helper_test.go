package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The multi-process tests start this test binary again as their ranks, the standard Go way:
// `<test binary> -test.run=TestHelperProcess` with SPARGO_TEST_ROLE naming what the process
// does. Each role is a function in helperRoles; it returns the process's exit code.

const roleVar = "SPARGO_TEST_ROLE"

// helperRoles is filled by the test files that define roles.
var helperRoles = map[string]func() int{}

func TestHelperProcess(t *testing.T) {
	role := os.Getenv(roleVar)
	if role == "" {
		return // not started as a helper: nothing to do
	}
	fn, ok := helperRoles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown helper role %q\n", role)
		os.Exit(2)
	}
	os.Exit(fn())
}

// helperCommand returns the command that runs this test binary as a helper with role, and
// env added to the test's environment.
func helperCommand(t *testing.T, role string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(helperEnv(role), env...)
	return cmd
}

// helperEnv is the test's environment without variables that would make a helper think it
// belongs to another job, plus the role.
func helperEnv(role string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if contains(launchVars, name) || strings.HasPrefix(name, "SPARGO_") || strings.HasPrefix(name, "SLURM_") ||
			strings.HasPrefix(name, "OMPI_") || strings.HasPrefix(name, "PMI_") || strings.HasPrefix(name, "PET_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, roleVar+"="+role)
}

// testBinary is the running test binary.
func testBinary() string { return os.Args[0] }
