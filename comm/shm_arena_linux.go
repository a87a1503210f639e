//go:build linux

package comm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// Shared buffers (AllocShared): each rank of a shared-memory group creates a file of its own
// next to the segment's name, every rank maps every rank's file, and once all have mapped them
// each rank removes its own, so, as with the segment, nothing is left in the directory while
// the job runs. A rank's buffer is then readable by its peers in place: the shared all-reduce
// of a slice of it skips the copies through the segment's reduce slots (shm_allreduce_linux.go).
//
// A file's name carries its rank and its process's pid and start time: a job that dies between
// creating and removing one leaves it behind, and the next job of the same name and secret
// removes it when it creates its segment (removeStaleArenas).

// shmArena is one collective allocation: this rank's mapping of every rank's file.
type shmArena struct {
	maps [][]byte // by rank; maps[rank] is this rank's own buffer
}

// allocSharedBytes is AllocShared's shared memory: n bytes on a shared-memory group (or a view
// of one), nil elsewhere or when the ranks could not share it.
func allocSharedBytes(ctx context.Context, g Group, tag uint32, n int) ([]byte, error) {
	sg := shmUnder(g)
	if sg == nil {
		return nil, nil
	}
	return sg.allocShared(ctx, tag, n)
}

// arenaFile is the path of rank r's file of the group's k-th allocation.
func (g *shmGroup) arenaFile(k, r int) string {
	pid, start := g.mem.load64(g.slot(r)+sPid), g.mem.load64(g.slot(r)+sStart)
	return fmt.Sprintf("%s.b%d.r%d.%d-%d", g.seg.path, k, r, pid, start)
}

// allocShared is AllocShared on a shared-memory group: n bytes (n > 0) every rank maps, or nil
// when some rank could not make or map its file (the reasons are logged: a full /dev/shm,
// say); every rank returns the same verdict. Collective under tag.
func (g *shmGroup) allocShared(ctx context.Context, tag uint32, n int) ([]byte, error) {
	if !g.enter() { // before arenaMu, as Close takes them
		return nil, ErrClosed
	}
	defer g.leave()
	g.arenaMu.Lock()
	defer g.arenaMu.Unlock()
	k := g.arenaCount
	g.arenaCount++
	size := alignUp(n, shmPage)
	own := g.arenaFile(k, g.rank)
	maps := make([][]byte, g.size)
	release := func() {
		for _, m := range maps {
			if m != nil {
				unmapFile(m)
			}
		}
	}
	defer os.Remove(own) // once every rank has mapped it, or on failure

	// Step 1: every rank makes its file; step 2: every rank maps the others'. After each, the
	// ranks agree on whether all succeeded (an all-reduce of the failure count).
	var why error
	if m, err := createArenaFile(own, size); err != nil {
		why = err
	} else {
		maps[g.rank] = m
	}
	ok, err := g.agree(ctx, tag, why)
	if err != nil || !ok {
		release()
		return nil, err
	}
	for r := range g.size {
		if r != g.rank && why == nil {
			maps[r], why = openArenaFile(g.arenaFile(k, r), size)
		}
	}
	if ok, err = g.agree(ctx, tag, why); err != nil || !ok {
		release()
		return nil, err
	}
	g.arenas = append(g.arenas, &shmArena{maps: maps})
	return maps[g.rank][:n:n], nil
}

// agree logs why (when not nil) and reports whether no rank had a why.
func (g *shmGroup) agree(ctx context.Context, tag uint32, why error) (bool, error) {
	fails := []int32{0}
	if why != nil {
		fails[0] = 1
		g.logf("comm: AllocShared: rank %d: %v; the ranks use private memory instead", g.rank, why)
	}
	// Messages, not the shared all-reduce: its owner word is taken by calls in turn, and a
	// caller may hold this group's reduce area in another goroutine.
	if err := ringAllReduce(ctx, g, tag, fails, func(dst, a, b []int32) {
		for i := range dst {
			dst[i] = a[i] + b[i]
		}
	}); err != nil {
		return false, fmt.Errorf("comm: AllocShared: rank %d of %d, tag %d: %w", g.rank, g.size, tag, err)
	}
	return fails[0] == 0, nil
}

func createArenaFile(path string, size int) ([]byte, error) {
	os.Remove(path) // a leftover of a dead job of this name and secret: its pid and start are ours now
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := reserveFile(f, size); err != nil {
		os.Remove(path)
		return nil, err
	}
	m, err := mapFile(f, size)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("map %d bytes of %s: %w", size, path, err)
	}
	return m, nil
}

func openArenaFile(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := fileOwnedByMe(fi); err != nil {
		return nil, fmt.Errorf("refusing %s: %v", path, err)
	}
	if fi.Size() != int64(size) {
		return nil, fmt.Errorf("%s has %d bytes, want %d (did every rank ask for the same size?)", path, fi.Size(), size)
	}
	m, err := mapFile(f, size)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes of %s: %w", size, path, err)
	}
	return m, nil
}

// arenaOf finds buf in this rank's shared buffers: the allocation's index and buf's byte
// offset in it, or ok = false.
func (g *shmGroup) arenaOf(p unsafe.Pointer, bytes int) (k, off int, ok bool) {
	if bytes == 0 {
		return 0, 0, false
	}
	g.arenaMu.Lock()
	defer g.arenaMu.Unlock()
	for k, a := range g.arenas {
		own := a.maps[g.rank]
		base := uintptr(unsafe.Pointer(unsafe.SliceData(own)))
		if at := uintptr(p); at >= base && at+uintptr(bytes) <= base+uintptr(len(own)) {
			return k, int(at - base), true
		}
	}
	return 0, 0, false
}

// arenaMaps is every rank's buffer of allocation k as mapped here, by rank.
func (g *shmGroup) arenaMaps(k int) [][]byte {
	g.arenaMu.Lock()
	defer g.arenaMu.Unlock()
	return g.arenas[k].maps
}

// closeArenas unmaps the peers' buffers and turns this rank's own into private memory with the
// same contents at the same address, so that slices of it stay valid after Close and the file
// system's pages are freed. Called by Close under the live lock.
func (g *shmGroup) closeArenas() {
	g.arenaMu.Lock()
	defer g.arenaMu.Unlock()
	for _, a := range g.arenas {
		for r, m := range a.maps {
			if r != g.rank {
				unmapFile(m)
				continue
			}
			keep := make([]byte, len(m))
			copy(keep, m)
			if err := remapPrivate(m); err != nil {
				// Keep the shared mapping: the slices stay valid, the pages stay allocated.
				g.logf("comm: Close: rank %d: keeping a shared buffer of %d bytes mapped: %v", g.rank, len(m), err)
				continue
			}
			copy(m, keep)
		}
	}
	g.arenas = nil
}

// remapPrivate replaces the mapping m by anonymous private memory at the same address.
func remapPrivate(m []byte) error {
	_, _, errno := syscall.Syscall6(syscall.SYS_MMAP, uintptr(unsafe.Pointer(unsafe.SliceData(m))), uintptr(len(m)),
		syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_FIXED, ^uintptr(0), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// removeStaleArenas removes the shared-buffer files of the segment at path whose process is
// gone (see arenaFile), leaving those of live processes and other users' files alone.
func removeStaleArenas(path string) {
	matches, _ := filepath.Glob(path + ".b*")
	for _, m := range matches {
		i := strings.LastIndexByte(m, '.')
		pidText, startText, found := strings.Cut(m[i+1:], "-")
		pid, err1 := strconv.Atoi(pidText)
		start, err2 := strconv.ParseUint(startText, 10, 64)
		if !found || err1 != nil || err2 != nil || processGone(pid, start) == "" {
			continue
		}
		if fi, err := os.Lstat(m); err == nil && fileOwnedByMe(fi) == nil {
			os.Remove(m)
		}
	}
}
