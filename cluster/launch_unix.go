//go:build unix

package cluster

import (
	"os/exec"
	"syscall"
)

var (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

// setProcessGroup puts the rank in a process group of its own, so stopping it also stops
// the processes it started, and a terminal's Ctrl-C reaches the launcher, which stops the
// ranks in order, rather than every rank at once.
func setProcessGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	setParentDeathSignal(cmd.SysProcAttr)
}

// signalProcessGroup sends sig to the rank's process group. Errors (the group is gone) are
// ignored: the rank has exited, which is what stopping wants.
func signalProcessGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, sig)
	}
}
