//go:build linux

package comm

import (
	"context"
	"encoding/binary"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

func shmTestConfig(dir string, rank, size int) ShmConfig {
	return ShmConfig{Rank: rank, Size: size, Job: "segtest", Secret: []byte("secret"), Dir: dir,
		JoinTimeout: 2 * time.Second, Logf: func(string, ...any) {}}
}

// A segment left by a job whose processes are gone is replaced at the next start; one whose
// creator lives is refused.
func TestShmStaleSegment(t *testing.T) {
	dir := t.TempDir()
	cfg := shmTestConfig(dir, 0, 2)
	l, err := newShmLayout(2, 64<<10, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	path := shmPath(cfg)
	// A dead job's segment: its creator's pid names no process.
	stale, err := createShmSegment(cfg, l, path, 1)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint64(stale.mem[hCreatorPid:], 1<<22+12345)
	stale.unmap()

	ctx := context.Background()
	var groups [2]Group
	var errs [2]error
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { groups[r], errs[r] = NewShm(ctx, shmTestConfig(dir, r, 2)) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left after the set-up: %v", ents)
	}
	// A second job with the same name while this one's creator lives: the file is gone, so
	// a new rank 0 creates a fresh segment, and a stale-looking one of a live process is refused.
	live, err := createShmSegment(cfg, l, path, mustStart(t))
	if err != nil {
		t.Fatal(err)
	}
	live.unmap()
	if _, err := NewShm(ctx, cfg); err == nil || !strings.Contains(err.Error(), "in use by process") {
		t.Errorf("second rank 0 while the first lives: %v", err)
	}
	os.Remove(path)
	closeAll(groups[:])
}

func mustStart(t *testing.T) uint64 {
	s, err := myStart()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A rank that does not know the secret cannot join: the name differs, and a segment under the
// right name made with another secret is refused; so is a file others may open.
func TestShmStranger(t *testing.T) {
	dir := t.TempDir()
	cfg := shmTestConfig(dir, 0, 2)
	l, _ := newShmLayout(2, 64<<10, 16<<10)
	path := shmPath(cfg)
	if other := shmPath(ShmConfig{Job: cfg.Job, Secret: []byte("guess"), Dir: dir}); other == path {
		t.Fatal("the secret does not change the segment's name")
	}
	seg, err := createShmSegment(cfg, l, path, mustStart(t))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.unmap()
	stranger := shmTestConfig(dir, 1, 2)
	stranger.Secret = []byte("guess")
	if _, _, err := tryOpenShm(stranger, path); err == nil || !strings.Contains(err.Error(), "not made with this job's secret") {
		t.Errorf("wrong secret: %v", err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("segment mode %v, want 0600", fi.Mode().Perm())
	}
	os.Chmod(path, 0o644)
	if _, _, err := tryOpenShm(shmTestConfig(dir, 1, 2), path); err == nil || !strings.Contains(err.Error(), "lets other users in") {
		t.Errorf("mode 0644: %v", err)
	}
	os.Remove(path)
	// A rank 0 whose peers never come fails naming them and removes its segment.
	cfg.JoinTimeout = 100 * time.Millisecond
	if _, err := NewShm(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "rank(s) [1] did not join") {
		t.Errorf("missing rank: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left after a failed set-up: %v", ents)
	}
}

// FuzzShmHeader: a corrupt segment header or message header is an error, never a panic.
func FuzzShmHeader(f *testing.F) {
	l, _ := newShmLayout(2, 64<<10, 16<<10)
	good := make([]byte, shmPage)
	writeShmHeader(good, l, 1, 1, make([]byte, 32), make([]byte, 32))
	f.Add(good[:128], int64(l.total))
	f.Add([]byte{1, 2, 3}, int64(10))
	f.Fuzz(func(t *testing.T, head []byte, size int64) {
		m := make([]byte, shmPage)
		copy(m, head)
		if l, err := readShmHeader(m, size); err == nil {
			if l.total != int(size) || l.size < 1 || l.ringBytes < shmMinRing {
				t.Fatalf("accepted %+v for a file of %d bytes", l, size)
			}
		}
		if len(head) >= shmMsgHeader {
			if _, n, err := decodeShmMsg(head, 1<<20); err == nil && (n < 0 || n > 1<<20) {
				t.Fatalf("accepted a message of %d bytes", n)
			}
		}
	})
}

// A corrupt message header in a ring fails the group naming the writer, not a panic.
func TestShmCorruptRing(t *testing.T) {
	groups := newShm(t, 2, func(c *ShmConfig) { c.Timeout = time.Minute })
	g1 := groups[1].(*shmGroup)
	// Forge a message header of an unknown kind in rank 0's ring to rank 1.
	off := g1.seg.ringOff(0, 1)
	copy(g1.mem[off+shmRingCtl:], []byte{1, 0, 0, 0, 9, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0})
	binary.LittleEndian.PutUint64(g1.mem[off+cHead:], shmMsgHeader)
	ring(g1.mem.u32(g1.slot(1)+sInbox), g1.mem.u32(g1.slot(1)+sInboxSleep))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := groups[1].Recv(ctx, 0, 1, make([]byte, 4))
	if err == nil || !strings.Contains(err.Error(), "peer rank 0 failed: corrupt message header") {
		t.Errorf("recv after a corrupt header: %v", err)
	}
}

// Shared all-reduces under different tags, started concurrently on every rank in whatever
// order the goroutines run, take turns: each gets the pairwise rank-order sum, bit for bit, across
// several passes of a small reduce slot.
func TestShmConcurrentSharedAllReduce(t *testing.T) {
	const p, n, iters = 3, 10_000, 4
	groups := newShm(t, p, func(c *ShmConfig) { c.ReduceBytes = 16 << 10 })
	tags := []uint32{1, 2, 3}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make([][][]float32, p) // [rank][tag]
	var wg sync.WaitGroup
	errs := make(chan error, p*len(tags))
	for r, g := range groups {
		out[r] = make([][]float32, len(tags))
		for i, tag := range tags {
			wg.Go(func() {
				for it := range iters {
					v := rankData(uint64(10*tag)+uint64(it), r, n)
					if err := AllReduce(ctx, g, tag, v, Auto); err != nil {
						errs <- err
						return
					}
					out[r][i] = v
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, tag := range tags {
		want := treeSum(p, func(r int) []float32 { return rankData(uint64(10*tag)+iters-1, r, n) })
		for r := range p {
			for k := range want {
				if out[r][i][k] != want[k] {
					t.Fatalf("tag %d rank %d element %d: %v, want %v", tag, r, k, out[r][i][k], want[k])
				}
			}
		}
	}
}

// A cancelled shared all-reduce whose group is closed right after it returns: the
// context's AfterFunc, which wakes the waiting ranks, may run only after Close has
// unmapped the segment (it faulted once in CI, under load). The hook holds it until then.
func TestShmCancelledAllReduceThenClose(t *testing.T) {
	entered, closed := make(chan struct{}), make(chan struct{})
	shmCancelHook = func() { close(entered); <-closed }
	defer func() { shmCancelHook = nil }()
	dir := t.TempDir()
	groups, err := newShmLocal(context.Background(), 2, func(c *ShmConfig) { c.Dir = dir })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Rank 1 never joins; the cancelled context ends the call.
	if err := AllReduce(ctx, groups[0], 1, make([]float32, 64), SharedMemory); err == nil {
		t.Fatal("the all-reduce returned without its peer or an error")
	}
	<-entered
	closeAll(groups)
	close(closed)
	// The held AfterFunc now runs against the unmapped group: it must return without a fault.
	time.Sleep(50 * time.Millisecond)
}
