//go:build linux

package comm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// NewShm joins this process, as rank cfg.Rank, to the shared-memory group of the job
// cfg.Job: every rank runs on this host and maps one segment (see the package doc, "Shared-memory
// transport"). Rank 0 creates the segment (removing a stale one of a dead job with the same
// name), the others wait for it, check that it was made with the job's secret and prove they
// know it; once every rank has mapped it, rank 0 removes the file, so nothing is left behind
// whatever happens to the job afterwards. NewShm returns when every rank has joined, or fails
// after cfg.JoinTimeout (or when ctx ends) naming the ranks that did not.
//
// The group has the Group contract of NewTCP, with the same failure semantics: a peer whose
// process is gone, or whose heartbeat stops for cfg.Timeout (a stopped process), fails every
// pending and later operation with a PeerError naming it ("peer rank 2 failed: silent for
// 30s"), and the rank reports the failure in its slot so that the others name the same rank.
func NewShm(ctx context.Context, cfg ShmConfig) (Group, error) {
	switch {
	case cfg.Size < 1 || cfg.Size > shmMaxRanks:
		return nil, fmt.Errorf("comm: NewShm: size %d, want 1 to %d", cfg.Size, shmMaxRanks)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return nil, fmt.Errorf("comm: NewShm: rank %d out of range [0, %d)", cfg.Rank, cfg.Size)
	case cfg.Job == "":
		return nil, fmt.Errorf("comm: NewShm: rank %d: no Job name", cfg.Rank)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = shmDefaultTimeout
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = shmDefaultJoinTimeout
	}
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = shmDefaultMaxMessage
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	start, err := myStart()
	if err != nil {
		return nil, fmt.Errorf("comm: NewShm: rank %d: %w", cfg.Rank, err)
	}
	path := shmPath(cfg)
	jctx, cancel := context.WithTimeout(ctx, cfg.JoinTimeout)
	defer cancel()
	var seg *shmSegment
	if cfg.Rank == 0 {
		ringBytes, reduceBytes := defaultShmSizes(cfg.Size, cfg.RingBytes, cfg.ReduceBytes)
		l, err := newShmLayout(cfg.Size, ringBytes, reduceBytes)
		if err != nil {
			return nil, fmt.Errorf("comm: NewShm: rank 0: %w", err)
		}
		if seg, err = createShmSegment(cfg, l, path, start); err != nil {
			return nil, fmt.Errorf("comm: NewShm: rank 0: %w", err)
		}
		if err = seg.attach(cfg, start); err == nil {
			err = seg.waitJoined(jctx, cfg)
		}
		if err != nil {
			os.Remove(path)
			seg.unmap()
			return nil, fmt.Errorf("comm: NewShm: rank 0 of %d, job %q: %w", cfg.Size, cfg.Job, err)
		}
	} else {
		if seg, err = openShmSegment(jctx, cfg, path); err != nil {
			return nil, fmt.Errorf("comm: NewShm: rank %d of %d, job %q: %w", cfg.Rank, cfg.Size, cfg.Job, err)
		}
		if err = seg.attach(cfg, start); err == nil {
			err = seg.waitReady(jctx)
		}
		if err != nil {
			seg.unmap()
			return nil, fmt.Errorf("comm: NewShm: rank %d of %d, job %q: %w", cfg.Rank, cfg.Size, cfg.Job, err)
		}
	}
	g := newShmGroup(cfg, seg)
	g.start()
	return g, nil
}

// newShmLocal is NewShmLocal with a hook that adjusts each rank's configuration.
func newShmLocal(ctx context.Context, size int, configure func(*ShmConfig)) ([]Group, error) {
	if size < 1 {
		return nil, fmt.Errorf("comm: NewShmLocal: size %d, want >= 1", size)
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	dir := shmDefaultDir
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = os.TempDir()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	groups := make([]Group, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			cfg := ShmConfig{Rank: r, Size: size, Job: "local-" + hex.EncodeToString(id[:8]), Secret: id[8:], Dir: dir}
			if configure != nil {
				configure(&cfg)
			}
			groups[r], errs[r] = NewShm(ctx, cfg)
			if errs[r] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, g := range groups {
			if g != nil {
				g.Close()
			}
		}
		return nil, err
	}
	return groups, nil
}

// shmGroup is one rank of a shared-memory group.
type shmGroup struct {
	rank, size int
	job        string
	timeout    time.Duration
	opTimeout  time.Duration
	watch      opWatch       // receives and sends under opTimeout
	waitTick   time.Duration // the longest a waiter sleeps before it looks again
	maxMessage int
	logf       func(format string, args ...any)
	seg        *shmSegment
	mem        shmMem
	counters   Counters
	msgs       sizedPool // messages that arrived before their receive was posted
	spinFor    time.Duration
	peers      []*shmPeer

	closed  atomic.Bool
	failure atomic.Pointer[error]
	done    chan struct{}
	wg      sync.WaitGroup

	ar shmReduceState // the shared all-reduce (shm_allreduce_linux.go)

	// Shared buffers (shm_arena_linux.go). arenaMu is taken after the live lock's read side.
	arenaMu    sync.Mutex
	arenaCount int
	arenas     []*shmArena

	// live guards the mapping against Close: callers' goroutines that touch it hold it for
	// reading (enter, leave); Close unmaps under the write lock.
	live     sync.RWMutex
	unmapped bool

	// stallForTest stops the heartbeat and the readers: a rank whose process is stopped.
	stallForTest atomic.Bool
}

var (
	_ Group      = (*shmGroup)(nil)
	_ Topologist = (*shmGroup)(nil)
)

func newShmGroup(cfg ShmConfig, seg *shmSegment) *shmGroup {
	g := &shmGroup{
		rank: cfg.Rank, size: cfg.Size, job: cfg.Job, timeout: cfg.Timeout, opTimeout: max(cfg.OpTimeout, 0),
		maxMessage: cfg.MaxMessage, logf: cfg.Logf, seg: seg, mem: seg.mem, done: make(chan struct{}),
		spinFor: shmSpinFor, waitTick: shmTick(cfg.Timeout),
	}
	if g.opTimeout > 0 {
		g.waitTick = min(g.waitTick, opWatchTick(g.opTimeout))
	}
	if cfg.Size > runtime.NumCPU() {
		g.spinFor = 0
	}
	g.peers = make([]*shmPeer, g.size)
	for r := range g.peers {
		g.peers[r] = newShmPeer(g, r)
	}
	return g
}

func (g *shmGroup) Rank() int           { return g.rank }
func (g *shmGroup) Size() int           { return g.size }
func (g *shmGroup) Counters() *Counters { return &g.counters }

func (g *shmGroup) slot(r int) int { return g.seg.slot(r) }

// termErr is why every operation of this rank fails now (closed, or a peer failed), or nil.
func (g *shmGroup) termErr() error {
	if g.closed.Load() {
		return ErrClosed
	}
	if f := g.failure.Load(); f != nil {
		return *f
	}
	return nil
}

func (g *shmGroup) opErr(op string, peer int, tag uint32, err error) error {
	return fmt.Errorf("comm: rank %d: %s rank %d tag %d: %w", g.rank, op, peer, tag, err)
}

func (g *shmGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	_, err := g.Isend(ctx, to, tag, payload).Wait()
	return err
}

func (g *shmGroup) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	return g.Irecv(ctx, from, tag, buf).Wait()
}

func (g *shmGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *Request {
	if err := sendRefusal(ctx, g.rank, g.size, to, tag, g.termErr(), len(payload), g.maxMessage); err != nil {
		return DoneRequest(0, err)
	}
	if to == g.rank {
		g.peers[to].deliverSelf(tag, payload)
		g.counters.AddSent(len(payload))
		return DoneRequest(len(payload), nil)
	}
	return g.peers[to].isend(ctx, tag, payload)
}

func (g *shmGroup) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *Request {
	if err := checkPeer("recv from", g.rank, from, g.size, tag); err != nil {
		return DoneRequest(0, err)
	}
	return g.watchOp(g.peers[from].irecv(ctx, tag, buf), "recv from", from, tag)
}

// start runs the readers, the writers, the heartbeat and the monitor.
func (g *shmGroup) start() {
	if g.size == 1 {
		return
	}
	for _, p := range g.peers {
		if p.rank == g.rank {
			continue
		}
		g.wg.Add(1)
		go func() { defer g.wg.Done(); p.writeLoop() }()
	}
	g.wg.Add(2)
	go func() { defer g.wg.Done(); g.readLoop() }()
	go func() { defer g.wg.Done(); g.monitor() }()
	if g.opTimeout > 0 {
		g.wg.Add(1)
		go func() { defer g.wg.Done(); g.opWatcher() }()
	}
}

// shmTick is how often the heartbeat beats and the monitor looks: a quarter of the timeout,
// at most 250ms, so that a process that died is noticed quickly whatever the timeout.
func shmTick(timeout time.Duration) time.Duration {
	return max(min(timeout/4, 250*time.Millisecond), time.Millisecond)
}

// monitor beats this rank's heartbeat and watches the peers: a peer whose process is gone or
// whose heartbeat has not moved for Timeout has failed; a peer that reports a failure in its
// slot makes this rank fail the same way; a peer that closed is noticed by its reader.
func (g *shmGroup) monitor() {
	tick := time.NewTicker(shmTick(g.timeout))
	defer tick.Stop()
	beats := make([]uint64, g.size)
	heard := make([]time.Time, g.size)
	now := time.Now()
	for r := range heard {
		heard[r] = now
	}
	beat := g.mem.u64(g.slot(g.rank) + sBeat)
	for {
		if !g.stallForTest.Load() {
			atomic.AddUint64(beat, 1)
		}
		select {
		case <-g.done:
			return
		case now = <-tick.C:
		}
		if g.stallForTest.Load() {
			continue
		}
		for _, p := range g.peers {
			if p.rank == g.rank {
				continue
			}
			off := g.slot(p.rank)
			switch g.mem.load32(off + sState) {
			case shmClosed:
				continue
			case shmFailed:
				g.peerReported(p.rank)
				continue
			}
			if g.failure.Load() != nil {
				continue
			}
			if pid := int(g.mem.load64(off + sPid)); pid == os.Getpid() {
				// A rank of this process (NewShmLocal): alive as long as this code runs.
			} else if why := processGone(pid, g.mem.load64(off+sStart)); why != "" {
				if g.mem.load32(off+sState) == shmLive { // it may have closed just now
					g.peerFailed(p.rank, errors.New(why))
				}
				continue
			}
			if b := g.mem.load64(off + sBeat); b != beats[p.rank] {
				beats[p.rank], heard[p.rank] = b, now
			} else if now.Sub(heard[p.rank]) >= g.timeout {
				g.peerFailed(p.rank, fmt.Errorf("silent for %v", g.timeout))
			}
		}
	}
}

// peerFailed declares rank r failed for cause, unless this rank is closing.
func (g *shmGroup) peerFailed(r int, cause error) {
	if g.closed.Load() {
		return
	}
	g.fail(&PeerError{Rank: r, Cause: cause, ReportedBy: -1, self: g.rank})
}

// peerReported handles the failure reported in reporter's slot: this rank fails too, naming
// the same failed rank.
func (g *shmGroup) peerReported(reporter int) {
	if g.closed.Load() || g.failure.Load() != nil {
		return
	}
	off := g.slot(reporter)
	failed := int(int32(g.mem.load32(off + sFailed)))
	n := min(int(g.mem.load32(off+sCause)), shmCauseMax)
	cause := string(g.mem[off+sCause+4 : off+sCause+4+n])
	if failed < 0 || failed >= g.size {
		failed, cause = reporter, fmt.Sprintf("reported a failure of rank %d (out of range): %s", failed, cause)
	}
	g.fail(&PeerError{Rank: failed, Cause: errors.New(cause), ReportedBy: reporter, self: g.rank})
}

// fail makes f this rank's failure: every pending and later operation fails with it, and the
// rank's slot reports it to the others, whose monitors fail the same way.
func (g *shmGroup) fail(f *PeerError) {
	var err error = f
	if !g.failure.CompareAndSwap(nil, &err) {
		return
	}
	g.logf("comm: rank %d: %v", g.rank, err)
	off := g.slot(g.rank)
	cause := f.Cause.Error()
	if len(cause) > shmCauseMax {
		cause = cause[:shmCauseMax]
	}
	atomic.StoreUint32(g.mem.u32(off+sFailed), uint32(int32(f.Rank)))
	copy(g.mem[off+sCause+4:], cause)
	atomic.StoreUint32(g.mem.u32(off+sCause), uint32(len(cause)))
	atomic.CompareAndSwapUint32(g.mem.u32(off+sState), shmLive, shmFailed)
	g.wakeAll()
	for _, p := range g.peers {
		p.failAll(err)
	}
}

// wakeAll rings every doorbell this rank's goroutines or its peers may sleep on.
func (g *shmGroup) wakeAll() {
	for _, p := range g.peers {
		ring(g.mem.u32(g.slot(p.rank)+sInbox), g.mem.u32(g.slot(p.rank)+sInboxSleep))
		if p.rank == g.rank {
			continue
		}
		in, out := g.seg.ringOff(p.rank, g.rank), g.seg.ringOff(g.rank, p.rank)
		ring(g.mem.u32(in+cSpace), g.mem.u32(in+cTxSleep))
		ring(g.mem.u32(out+cSpace), g.mem.u32(out+cTxSleep))
	}
	ring(g.mem.u32(hRBell), g.mem.u32(hRSleepers))
}

// Close marks this rank closed in its slot (peers then read what it sent and fail what needs
// it with ErrClosed), fails its own pending and later operations with ErrClosed, stops its
// goroutines and unmaps the segment. Closing twice is a no-op.
func (g *shmGroup) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	close(g.done)
	if g.size > 1 {
		atomic.CompareAndSwapUint32(g.mem.u32(g.slot(g.rank)+sState), shmLive, shmClosed)
	}
	for _, p := range g.peers {
		p.failAll(ErrClosed)
	}
	g.wakeAll()
	g.wg.Wait()
	g.live.Lock()
	g.unmapped = true
	g.closeArenas()
	g.seg.unmap()
	g.live.Unlock()
	return nil
}

// enter reports whether the mapping may be used (the group has not unmapped it); a true answer
// must be followed by leave.
func (g *shmGroup) enter() bool {
	g.live.RLock()
	if g.unmapped {
		g.live.RUnlock()
		return false
	}
	return true
}

func (g *shmGroup) leave() { g.live.RUnlock() }

// peerState is rank r's slot state.
func (g *shmGroup) peerState(r int) uint32 { return g.mem.load32(g.slot(r) + sState) }

// Topology of a shared-memory group: every rank on one node.
func (g *shmGroup) Topology() Topology {
	t, _ := GridTopology(1, g.size)
	return t
}
