package cluster

import "syscall"

// setParentDeathSignal has the kernel kill a rank whose launcher dies, even by SIGKILL,
// so no rank outlives its job.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
