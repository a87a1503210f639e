//go:build linux

package comm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The default segment sizes: 6 MiB at 2 ranks, 20 at 4, 40 at 8 (the rings of 8 ranks fit in
// the 32 MiB budget), so that one job of 8 ranks fits a container's 64 MiB /dev/shm.
func TestShmDefaultSegmentSizes(t *testing.T) {
	for _, c := range []struct{ size, ring, mib int }{{2, 1 << 20, 6}, {4, 1 << 20, 20}, {5, 1 << 20, 30}, {8, 512 << 10, 40}, {16, 128 << 10, 48}, {64, 64 << 10, 321}} {
		ring, reduce := defaultShmSizes(c.size, 0, 0)
		l, err := newShmLayout(c.size, ring, reduce)
		if err != nil {
			t.Fatal(err)
		}
		if ring != c.ring || (l.total+(1<<19))>>20 != c.mib {
			t.Errorf("%d ranks: rings of %d bytes, %d bytes in all; want rings of %d, %d MiB", c.size, ring, l.total, c.ring, c.mib)
		}
	}
}

// reserveFile gives the file its whole size with storage behind it.
func TestReserveFile(t *testing.T) {
	f, err := os.Create(t.TempDir() + "/seg")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const n = 3<<20 + 4096
	if err := reserveFile(f, n); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Size() != n || st.Blocks*512 < n {
		t.Fatalf("size %d with %d bytes allocated, want %d of both", fi.Size(), st.Blocks*512, n)
	}
}

// A file system too small for the segment (a container's /dev/shm) stops the job at start-up
// with an error that says how much it needs and has, instead of a SIGBUS when a rank first
// touches a page that has no memory behind it. The test mounts an 8 MiB tmpfs in a mount
// namespace of its own (as root, or in a user namespace where the kernel allows one) and runs
// in a child process there.
const smallShmVar = "SPARGO_TEST_SMALL_SHM"

func TestShmFileSystemTooSmall(t *testing.T) {
	if dir := os.Getenv(smallShmVar); dir != "" {
		smallShmChild(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestShmFileSystemTooSmall$", "-test.v")
	cmd.Env = append(os.Environ(), smallShmVar+"="+dir)
	attr := &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if os.Getuid() != 0 {
		attr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		}
	}
	cmd.SysProcAttr = attr
	out, err := cmd.CombinedOutput()
	if s := string(out); strings.Contains(s, "SKIP-NO-MOUNT") || (err != nil && len(out) == 0) {
		// No mount namespace here (an unprivileged container without user namespaces): the
		// error's text is still checked below, on a fake.
		t.Logf("no private mount here (%v; %s); checking the message only", err, strings.TrimSpace(s))
		msg := (&shmSpaceError{dir: "/dev/shm", need: 20 << 20, free: 8 << 20}).Error()
		for _, want := range []string{"needs 20.0 MiB in /dev/shm", "8.0 MiB free", "--shm-size", "SPARGO_SHM=0"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%q lacks %q", msg, want)
			}
		}
		return
	}
	t.Logf("child:\n%s", out)
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func smallShmChild(t *testing.T, dir string) {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		t.Logf("SKIP-NO-MOUNT: make / private: %v", err)
		return
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=8m,mode=0700"); err != nil {
		t.Logf("SKIP-NO-MOUNT: mount a tmpfs: %v", err)
		return
	}
	defer syscall.Unmount(dir, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	inDir := func(c *ShmConfig) { c.Dir = dir }
	// 2 ranks (6 MiB) fit in 8 MiB.
	groups, err := NewShmLocal(ctx, 2, inDir)
	if err != nil {
		t.Fatalf("2 ranks in an 8 MiB file system: %v", err)
	}
	buf := [][]float32{{1, 2}, {3, 4}}
	errs := make(chan error, 2)
	for r, g := range groups {
		go func() { errs <- AllReduce(ctx, g, 0, buf[r], Auto) }()
	}
	for range groups {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if buf[0][0] != 4 || buf[1][1] != 6 {
		t.Fatalf("sums %v, want [4 6] on both", buf)
	}
	for _, g := range groups {
		g.Close()
	}
	// 4 ranks (20 MiB) do not: an error at start-up that names the sizes and the remedies.
	_, err = NewShmLocal(ctx, 4, inDir)
	var space *shmSpaceError
	if !errors.As(err, &space) {
		t.Fatalf("4 ranks in an 8 MiB file system: %v, want a shmSpaceError", err)
	}
	msg := err.Error()
	for _, want := range []string{"rank 0", "needs 20.0 MiB in " + dir, "MiB free", "--shm-size", "RingBytes", "SPARGO_SHM=0"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	if space.free < 0 || space.free > 8<<20 {
		t.Errorf("free %d bytes, want what the 8 MiB file system has", space.free)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("files left in %s: %v", dir, left)
	}
}
