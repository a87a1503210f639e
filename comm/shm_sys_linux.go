//go:build linux

package comm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// The operating-system side of the shared-memory transport: futex waits on words of the
// mapped segment and process liveness. Futexes are the shared (not process-private) kind, so a
// wake-up reaches waiters in other processes that map the same file.

const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *addr == val, at most d (spurious wake-ups are fine: callers loop).
func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(max(d, time.Microsecond)))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every waiter on addr.
func futexWake(addr *uint32) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, uintptr(1<<31-1), 0, 0, 0)
}

// ring bumps a doorbell word and wakes its sleepers, if any have announced themselves.
func ring(bell, sleepers *uint32) {
	atomic.AddUint32(bell, 1)
	if atomic.LoadUint32(sleepers) != 0 {
		futexWake(bell)
	}
}

// procStart returns the start time (in clock ticks after boot, field 22 of /proc/PID/stat) of
// a live process, or ok = false when pid is gone or a zombie. Together with the pid it names a
// process even after the pid is reused.
func procStart(pid int) (start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || f[0][0] == 'Z' || f[0][0] == 'X' {
		return 0, false
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	return start, err == nil
}

// processGone says why the process (pid, start) is no longer running, or "" while it runs.
func processGone(pid int, start uint64) string {
	s, ok := procStart(pid)
	switch {
	case !ok:
		return fmt.Sprintf("its process %d is gone", pid)
	case s != start:
		return fmt.Sprintf("its process %d is gone (the pid now names another process)", pid)
	}
	return ""
}

// reserveFile gives f n bytes of storage now: on a memory file system a page that is first
// touched when the file system is full (a container's /dev/shm is 64 MiB by default) raises
// SIGBUS, which no Go code can turn into an error, so the whole segment is allocated here,
// where a full file system is an error that names it. A file system without fallocate gets
// its pages on first touch, as before.
func reserveFile(f *os.File, n int) error {
	for {
		err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(n))
		switch err {
		case syscall.EINTR:
			continue
		case syscall.EOPNOTSUPP, syscall.ENOSYS:
			return f.Truncate(int64(n))
		case syscall.ENOSPC:
			return &shmSpaceError{dir: filepath.Dir(f.Name()), need: int64(n), free: freeBytes(f)}
		}
		return err
	}
}

// freeBytes is the space left on f's file system, or -1 if it cannot be read.
func freeBytes(f *os.File) int64 {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * st.Bsize
}

// mapFile maps n bytes of f shared, read-write.
func mapFile(f *os.File, n int) ([]byte, error) {
	return syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}

func unmapFile(b []byte) error { return syscall.Munmap(b) }

// fileOwnedByMe reports whether fi belongs to this user and no one else may open it.
func fileOwnedByMe(fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner information")
	}
	if int(st.Uid) != os.Getuid() {
		return fmt.Errorf("owned by uid %d, not this user (%d)", st.Uid, os.Getuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("mode %v lets other users in", fi.Mode().Perm())
	}
	return nil
}
