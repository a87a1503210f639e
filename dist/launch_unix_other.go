//go:build unix && !linux

package dist

import "syscall"

func setParentDeathSignal(*syscall.SysProcAttr) {}
