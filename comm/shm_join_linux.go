//go:build linux

package comm

import (
	"context"
	"crypto/hmac"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"
)

// shmSegment is one rank's mapping of the job's segment.
type shmSegment struct {
	mem    shmMem
	layout shmLayout
	file   *os.File
	path   string
	nonce  []byte
}

func (s *shmSegment) slot(r int) int { return s.layout.slots + r*shmSlotBytes }

// ringOff is the offset of the control block of the ring from rank i to rank j; its data
// follows it.
func (s *shmSegment) ringOff(i, j int) int {
	return s.layout.rings + (i*s.layout.size+j)*(shmRingCtl+s.layout.ringBytes)
}

func (s *shmSegment) reduceOff(r int) int { return s.layout.reduce + r*s.layout.reduceBytes }

func (s *shmSegment) unmap() {
	if s.mem != nil {
		unmapFile(s.mem)
		s.mem = nil
	}
	if s.file != nil {
		s.file.Close()
		s.file = nil
	}
}

// createShmSegment is rank 0's side of the set-up: it removes a stale segment of the same
// name left by a dead job, then builds the segment under a temporary name and links it into
// place, so the other ranks never see it half written.
func createShmSegment(cfg ShmConfig, l shmLayout, path string, start uint64) (*shmSegment, error) {
	if err := removeStaleShm(path); err != nil {
		return nil, err
	}
	removeStaleArenas(path)
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp)
	if err := reserveFile(f, l.total); err != nil {
		f.Close()
		return nil, err
	}
	mem, err := mapFile(f, l.total)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("map %d bytes: %w", l.total, err)
	}
	s := &shmSegment{mem: mem, layout: l, file: f, path: path, nonce: make([]byte, 32)}
	if _, err := crand.Read(s.nonce); err != nil {
		s.unmap()
		return nil, err
	}
	writeShmHeader(s.mem, l, os.Getpid(), start, s.nonce, shmCreatorMAC(cfg.Secret, cfg.Job, s.nonce, l))
	if err := os.Link(tmp, path); err != nil {
		s.unmap()
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%s appeared while rank 0 created it: is another rank 0 of this job running?", path)
		}
		return nil, err
	}
	return s, nil
}

// removeStaleShm removes the segment at path if it belongs to a job whose creator is gone
// (or if it is unreadable: half written by a creator that died); it refuses to touch a live
// job's segment or another user's file.
func removeStaleShm(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("a file %s exists and cannot be opened: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := fileOwnedByMe(fi); err != nil {
		return fmt.Errorf("a file %s exists and is not this job's: %v", path, err)
	}
	if fi.Size() >= shmPage {
		if mem, err := mapFile(f, shmPage); err == nil {
			m := shmMem(mem)
			pid, start := int(m.load64(hCreatorPid)), m.load64(hCreatorStart)
			live := m.load64(hMagic) == shmMagic && pid > 0 && processGone(pid, start) == ""
			unmapFile(mem)
			if live {
				return fmt.Errorf("the segment %s of a job with this name and secret is in use by process %d (two jobs with one name?)", path, pid)
			}
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the stale segment %s: %w", path, err)
	}
	return nil
}

// openShmSegment is the other ranks' side: it waits for rank 0's segment to appear, checks
// who made it and that its creator knows the secret, and maps it. A stale segment whose
// creator is gone is skipped: rank 0 replaces it.
func openShmSegment(ctx context.Context, cfg ShmConfig, path string) (*shmSegment, error) {
	backoff := time.Millisecond
	var last error
	for {
		s, retry, err := tryOpenShm(cfg, path)
		if err == nil {
			return s, nil
		}
		if !retry {
			return nil, err
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no segment from rank 0 at %s: %w (last: %v)", path, ctx.Err(), last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

func tryOpenShm(cfg ShmConfig, path string) (s *shmSegment, retry bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, errors.Is(err, fs.ErrNotExist), err
	}
	fail := func(retry bool, err error) (*shmSegment, bool, error) {
		f.Close()
		return nil, retry, err
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(true, err)
	}
	if err := fileOwnedByMe(fi); err != nil {
		return fail(false, fmt.Errorf("refusing the segment %s: %v", path, err))
	}
	if fi.Size() < shmPage {
		return fail(true, fmt.Errorf("segment %s of %d bytes is shorter than its header", path, fi.Size()))
	}
	hdr, err := mapFile(f, shmPage)
	if err != nil {
		return fail(true, err)
	}
	m := shmMem(hdr)
	pid, start := int(m.load64(hCreatorPid)), m.load64(hCreatorStart)
	l, err := readShmHeader(m, fi.Size())
	if err == nil && (pid <= 0 || processGone(pid, start) != "") {
		err, retry = fmt.Errorf("stale segment %s: its creator (process %d) is gone", path, pid), true
	} else if err != nil {
		retry = true // a stale, corrupt file: rank 0 removes it
	}
	if err == nil && l.size != cfg.Size {
		err = fmt.Errorf("the segment %s is for %d ranks, this rank was started with %d", path, l.size, cfg.Size)
	}
	nonce := append([]byte(nil), m[hNonce:hNonce+32]...)
	if err == nil && !hmac.Equal(m[hMAC:hMAC+32], shmCreatorMAC(cfg.Secret, cfg.Job, nonce, l)) {
		err = fmt.Errorf("the segment %s was not made with this job's secret", path)
	}
	unmapFile(hdr)
	if err != nil {
		return fail(retry, err)
	}
	mem, err := mapFile(f, l.total)
	if err != nil {
		return fail(false, fmt.Errorf("map %d bytes: %w", l.total, err))
	}
	return &shmSegment{mem: mem, layout: l, file: f, path: path, nonce: nonce}, false, nil
}

// attach writes this rank's slot: its process and its proof of the secret, then the attached
// flag. A slot already taken means two processes claim one rank.
func (s *shmSegment) attach(cfg ShmConfig, start uint64) error {
	off := s.slot(cfg.Rank)
	pid := uint64(os.Getpid())
	atomic.StoreUint64(s.mem.u64(off+sPid), pid)
	atomic.StoreUint64(s.mem.u64(off+sStart), start)
	copy(s.mem[off+sMAC:off+sMAC+32], shmRankMAC(cfg.Secret, s.nonce, cfg.Rank, pid))
	if !atomic.CompareAndSwapUint32(s.mem.u32(off+sAttached), 0, 1) {
		return fmt.Errorf("rank %d already joined this job's segment", cfg.Rank)
	}
	ring(s.mem.u32(hJoinBell), s.mem.u32(hRSleepers))
	return nil
}

// waitJoined is rank 0's wait for every rank to attach; it checks each one's proof, then
// removes the file (the mappings stay) and declares the segment ready.
func (s *shmSegment) waitJoined(ctx context.Context, cfg ShmConfig) error {
	for {
		var missing []int
		for r := range s.layout.size {
			off := s.slot(r)
			if s.mem.load32(off+sAttached) == 0 {
				missing = append(missing, r)
				continue
			}
			pid := s.mem.load64(off + sPid)
			if !hmac.Equal(s.mem[off+sMAC:off+sMAC+32], shmRankMAC(cfg.Secret, s.nonce, r, pid)) {
				return fmt.Errorf("the process (%d) that took rank %d's slot did not prove it knows the secret", pid, r)
			}
		}
		if len(missing) == 0 {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("rank(s) %v did not join: %w", missing, ctx.Err())
		}
		s.sleepOn(hJoinBell, 20*time.Millisecond)
	}
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s once every rank mapped it: %w", s.path, err)
	}
	atomic.StoreUint32(s.mem.u32(hState), 1)
	ring(s.mem.u32(hJoinBell), s.mem.u32(hRSleepers))
	return nil
}

// waitReady is the other ranks' wait for rank 0 to see everyone joined.
func (s *shmSegment) waitReady(ctx context.Context) error {
	pid, start := int(s.mem.load64(hCreatorPid)), s.mem.load64(hCreatorStart)
	for s.mem.load32(hState) != 1 {
		if ctx.Err() != nil {
			return fmt.Errorf("rank 0 did not see every rank join: %w", ctx.Err())
		}
		if why := processGone(pid, start); why != "" {
			return fmt.Errorf("rank 0 failed while the ranks joined: %s", why)
		}
		s.sleepOn(hJoinBell, 20*time.Millisecond)
	}
	return nil
}

// sleepOn waits (at most d) for the header's word at off to change.
func (s *shmSegment) sleepOn(off int, d time.Duration) {
	v := s.mem.load32(off)
	atomic.AddUint32(s.mem.u32(hRSleepers), 1)
	futexWait(s.mem.u32(off), v, d)
	atomic.AddUint32(s.mem.u32(hRSleepers), ^uint32(0))
}

// shmPath is the segment's path for cfg.
func shmPath(cfg ShmConfig) string {
	dir := cfg.Dir
	if dir == "" {
		dir = shmDefaultDir
	}
	return filepath.Join(dir, ShmSegmentName(cfg.Job, cfg.Secret))
}

// myStart is this process's start time (see procStart).
func myStart() (uint64, error) {
	s, ok := procStart(os.Getpid())
	if !ok {
		return 0, fmt.Errorf("cannot read /proc/%d/stat: %w", os.Getpid(), syscall.ENOENT)
	}
	return s, nil
}
