//go:build unix && !linux

package cluster

import "syscall"

func setParentDeathSignal(*syscall.SysProcAttr) {}
