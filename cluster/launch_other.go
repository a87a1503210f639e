//go:build !unix

package cluster

import (
	"os"
	"os/exec"
)

var (
	sigTerm = os.Kill // no SIGTERM: stopping kills at once
	sigKill = os.Kill
)

func setProcessGroup(*exec.Cmd) {}

func signalProcessGroup(cmd *exec.Cmd, sig os.Signal) {
	if cmd.Process != nil {
		cmd.Process.Signal(sig)
	}
}
