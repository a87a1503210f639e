package comm

import (
	"context"
	"crypto/hmac"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// TCPConfig configures one rank of a TCP group (see NewTCP).
type TCPConfig struct {
	// Rank is this process's rank in [0, Size); Size the number of ranks.
	Rank, Size int
	// Listener is already bound by the caller; the transport accepts its peers on it and closes
	// it when the group is closed (or when NewTCP fails). Required when Size > 1.
	Listener net.Listener
	// Addrs[r] is the "host:port" where rank r's Listener accepts connections; this rank's own
	// entry is ignored. Required when Size > 1.
	Addrs []string
	// Secret is the shared secret of the HMAC-SHA256 challenge-response run on every connection
	// before any data. Empty means no authentication: anyone who can reach the ports can join
	// the mesh or inject data. Only use it on a trusted network (or loopback).
	Secret []byte
	// Timeout is the peer failure timeout: a peer from which nothing arrives (not even the
	// heartbeats sent every Timeout/4 on idle connections) for this long is declared failed.
	// 0 means 30s. Every rank of a group must use the same value: a rank sends heartbeats at
	// the pace of its own Timeout.
	Timeout time.Duration
	// DialTimeout bounds the whole mesh set-up; peers that start later are retried with backoff
	// until then. 0 means 60s.
	DialTimeout time.Duration
	// OpTimeout bounds every operation with a peer (0: none): a send or receive not complete
	// this long after it started fails the group, naming that peer as failed (a PeerError whose
	// cause says it is alive but never took part), as gloo's per-operation timeout does. It
	// catches a live peer that is out of step (ran fewer steps, waits under another tag),
	// which heartbeats cannot. It must exceed the longest time one rank may wait for another
	// between matching operations (an evaluation or checkpoint on one rank only). A context
	// deadline bounds a single operation instead: it fails with the context's error, naming
	// the peer and tag, and leaves the group usable.
	OpTimeout time.Duration
	// Logf reports rejected connections and peer failures; nil means log.Printf.
	Logf func(format string, args ...any)
	// MaxMessage is the largest message, in bytes, this rank accepts from a peer (and sends);
	// a peer announcing a longer one breaks the protocol and is declared failed. 0 means 1 GiB.
	MaxMessage int
}

const (
	tcpDefaultTimeout     = 30 * time.Second
	tcpDefaultDialTimeout = 60 * time.Second
	tcpDefaultMaxMessage  = 1 << 30

	// tcpHandshakeTimeout bounds one connection's authentication: a stranger that connects and
	// says nothing is dropped after it.
	tcpHandshakeTimeout = 5 * time.Second
	// tcpMaxHandshakes caps the connections authenticating at once during set-up; more are
	// refused at once, so a flood of strangers costs bounded memory.
	tcpMaxHandshakes = 64
	// tcpCloseGrace is how long Close waits for live peers to acknowledge its goodbye.
	tcpCloseGrace = 2 * time.Second
)

// aLongTimeAgo is a deadline in the past: setting it wakes a goroutine blocked on the socket.
var aLongTimeAgo = time.Unix(1, 0)

// NewTCP connects this rank to every other rank over TCP and returns its Group once the full mesh
// is up: one persistent connection per pair of ranks (the lower rank dials the higher one),
// each authenticated both ways with an HMAC-SHA256 challenge-response over cfg.Secret before any
// data moves. Connections that fail authentication (a wrong secret, none, garbage, silence) are
// closed and logged, and the rank keeps accepting its real peers; after set-up every new
// connection is refused and logged. If the mesh is not complete after cfg.DialTimeout (or when
// ctx ends), NewTCP fails naming the ranks it could not connect with; cfg.Listener is its own
// from the call on. Messages are framed with a validated header and sent in 1 MiB chunks so
// that a large message does not hold up small ones under other tags; sending to oneself copies
// in memory.
//
// A peer whose connection breaks, that breaks the wire protocol, or that is silent for
// cfg.Timeout fails the whole group: every pending and later operation returns an error naming
// that peer ("comm: rank 0: recv from rank 1 tag 3: peer rank 2 failed: silent for 30s"), and
// the rank says goodbye to the other peers with that failure as the reason, so that they fail
// too, naming the same rank ("… peer rank 2 failed: silent for 30s (reported by rank 0)"). A
// peer that closes its group says goodbye without a reason; afterwards operations that need it
// fail with ErrClosed, and messages it sent before stay readable. Closing waits (briefly) for
// the live peers to acknowledge the goodbye, never for a failed one, and leaves no goroutine
// behind.
func NewTCP(ctx context.Context, cfg TCPConfig) (Group, error) {
	g, err := newTCPGroup(cfg)
	if err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	dialTimeout := cfg.DialTimeout
	if dialTimeout <= 0 {
		dialTimeout = tcpDefaultDialTimeout
	}
	if g.size > 1 {
		if err := g.connect(ctx, cfg.Addrs, dialTimeout); err != nil {
			return nil, err
		}
	}
	g.start()
	return g, nil
}

// tcpGroup is one rank of a TCP mesh.
type tcpGroup struct {
	rank, size int
	timeout    time.Duration
	opTimeout  time.Duration
	watch      opWatch // operations under opTimeout
	maxMessage int
	secret     []byte
	logf       func(format string, args ...any)
	rejects    *LogLimiter // rejected connections: the first per interval, then a count
	counters   Counters
	msgs       sizedPool  // messages that arrived before their receive was posted
	peers      []*tcpPeer // peers[rank] is the in-memory loop back
	ln         net.Listener

	closed  atomic.Bool
	failure atomic.Pointer[error] // the first peer failure; every operation fails with it
	failed  chan struct{}         // closed when failure is set
	done    chan struct{}         // closed by Close
	wg      sync.WaitGroup        // the acceptor, readers, writers and the monitor

	meshUp   atomic.Bool // set-up is over: new connections are refused
	lnClosed atomic.Bool // the listener is closed: the acceptor returns

	hsMu       sync.Mutex
	handshakes map[net.Conn]bool // connections authenticating during set-up

	// stallForTest makes the writers send nothing, heartbeats included: a hung peer.
	stallForTest atomic.Bool
}

var _ Group = (*tcpGroup)(nil)

func newTCPGroup(cfg TCPConfig) (*tcpGroup, error) {
	switch {
	case cfg.Size < 1:
		return nil, fmt.Errorf("comm: NewTCP: size %d, want >= 1", cfg.Size)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return nil, fmt.Errorf("comm: NewTCP: rank %d out of range [0, %d)", cfg.Rank, cfg.Size)
	case cfg.Size > 1 && cfg.Listener == nil:
		return nil, fmt.Errorf("comm: NewTCP: rank %d: no Listener", cfg.Rank)
	case cfg.Size > 1 && len(cfg.Addrs) != cfg.Size:
		return nil, fmt.Errorf("comm: NewTCP: rank %d: %d addresses for %d ranks", cfg.Rank, len(cfg.Addrs), cfg.Size)
	case cfg.Size > 1<<24:
		return nil, fmt.Errorf("comm: NewTCP: size %d is too large", cfg.Size)
	}
	g := &tcpGroup{
		rank:       cfg.Rank,
		size:       cfg.Size,
		timeout:    cfg.Timeout,
		opTimeout:  cfg.OpTimeout,
		maxMessage: cfg.MaxMessage,
		secret:     slices.Clone(cfg.Secret),
		logf:       cfg.Logf,
		ln:         cfg.Listener,
		done:       make(chan struct{}),
		failed:     make(chan struct{}),
		handshakes: make(map[net.Conn]bool),
	}
	if g.timeout <= 0 {
		g.timeout = tcpDefaultTimeout
	}
	if g.maxMessage <= 0 {
		g.maxMessage = tcpDefaultMaxMessage
	}
	if g.logf == nil {
		g.logf = log.Printf
	}
	g.rejects = NewLogLimiter(g.logf, 0, 0, fmt.Sprintf("connections refused or rejected by rank %d", g.rank))
	g.peers = make([]*tcpPeer, g.size)
	for r := range g.peers {
		g.peers[r] = newTCPPeer(g, r, nil)
	}
	return g, nil
}

func (g *tcpGroup) Rank() int           { return g.rank }
func (g *tcpGroup) Size() int           { return g.size }
func (g *tcpGroup) Counters() *Counters { return &g.counters }

// termErr is why every operation of this rank fails now (closed, or a peer failed), or nil.
func (g *tcpGroup) termErr() error {
	if g.closed.Load() {
		return ErrClosed
	}
	if f := g.failure.Load(); f != nil {
		return *f
	}
	return nil
}

// failedSignal is closed when a peer failure has failed the group (failureSignaller).
func (g *tcpGroup) failedSignal() <-chan struct{} { return g.failed }

// opErr is an operation's error in the words of the Group contract.
func (g *tcpGroup) opErr(op string, peer int, tag uint32, err error) error {
	return fmt.Errorf("comm: rank %d: %s rank %d tag %d: %w", g.rank, op, peer, tag, err)
}

func (g *tcpGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	_, err := g.Isend(ctx, to, tag, payload).Wait()
	return err
}

func (g *tcpGroup) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	return g.Irecv(ctx, from, tag, buf).Wait()
}

func (g *tcpGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *Request {
	if err := sendRefusal(ctx, g.rank, g.size, to, tag, g.termErr(), len(payload), g.maxMessage); err != nil {
		return DoneRequest(0, err)
	}
	if to == g.rank {
		return DoneRequest(len(payload), g.peers[to].sendSelf(tag, payload))
	}
	return g.watchOp(g.peers[to].isend(ctx, tag, payload), "send to", to, tag)
}

func (g *tcpGroup) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *Request {
	if err := checkPeer("recv from", g.rank, from, g.size, tag); err != nil {
		return DoneRequest(0, err)
	}
	return g.watchOp(g.peers[from].irecv(ctx, tag, buf), "recv from", from, tag)
}

// Close says goodbye to every peer, fails this rank's pending and later operations with
// ErrClosed, waits up to tcpCloseGrace for the live peers to acknowledge (never for a failed
// one), then closes the connections and the listener and waits for its goroutines. After a
// failure the goodbye carries it (see PeerError). Closing twice is a no-op.
func (g *tcpGroup) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	close(g.done)
	g.closeListener()
	for _, p := range g.peers {
		p.failReceives(ErrClosed)
		if p.conn != nil {
			p.stopWriter(true, ErrClosed)
		}
	}
	grace := time.NewTimer(min(tcpCloseGrace, g.timeout))
	defer grace.Stop()
wait:
	for _, p := range g.peers {
		if p.conn == nil || p.failed.Load() {
			continue
		}
		select {
		case <-p.readerDone:
		case <-grace.C:
			break wait
		}
	}
	for _, p := range g.peers {
		if p.conn != nil {
			p.conn.Close()
		}
	}
	g.wg.Wait()
	g.rejects.Close()
	return nil
}

// PeerError is why every operation of a TCP group's rank fails once a rank of its group
// failed: the failed rank and what was seen (silence, a broken connection, a protocol error),
// observed by this rank itself or reported in a peer's goodbye. Reports carry the first
// failure their sender knew of, so every survivor names the same rank, not the one that left
// because of it. Programs find it with errors.As to learn which rank failed:
//
//	var pe *comm.PeerError
//	if errors.As(err, &pe) {
//		log.Printf("rank %d failed: %v", pe.Rank, pe.Cause)
//	}
type PeerError struct {
	Rank  int   // the failed rank
	Cause error // what was observed
	// ReportedBy is the peer whose goodbye reported the failure; -1 when this rank observed
	// it itself.
	ReportedBy int
	self       int // this rank
}

func (f *PeerError) Error() string {
	switch {
	case f.ReportedBy < 0 && f.Rank == f.self:
		return fmt.Sprintf("this rank (%d) failed: %v", f.Rank, f.Cause)
	case f.ReportedBy < 0:
		return fmt.Sprintf("peer rank %d failed: %v", f.Rank, f.Cause)
	case f.Rank == f.self:
		return fmt.Sprintf("peer rank %d reports that this rank (%d) failed: %v", f.ReportedBy, f.Rank, f.Cause)
	}
	return fmt.Sprintf("peer rank %d failed: %v (reported by rank %d)", f.Rank, f.Cause, f.ReportedBy)
}

// Unwrap returns the cause.
func (f *PeerError) Unwrap() error { return f.Cause }

// byeReason is what this rank's goodbyes say: its failure, if it has one.
func (g *tcpGroup) byeReason() byeReason {
	if p := g.failure.Load(); p != nil {
		var f *PeerError
		if errors.As(*p, &f) {
			return byeReason{failedRank: f.Rank, cause: f.Cause.Error()}
		}
	}
	return byeReason{failedRank: -1}
}

// peerFailed declares peer p failed for cause, unless the failure is expected (this rank is
// closing or said goodbye to p, or p said goodbye).
func (g *tcpGroup) peerFailed(p *tcpPeer, cause error) {
	if g.closed.Load() || p.gone.Load() || p.saidBye.Load() {
		return // expected
	}
	if p.failed.Swap(true) {
		// Already declared (its reader and writer both notice, or a report named it). The
		// other goroutine may be between marking p and failing the group: wait for the
		// group's failure, so that this caller's operations end with the PeerError and not
		// with their raw connection error (a send's "connection reset by peer" did, once).
		for g.failure.Load() == nil {
			runtime.Gosched()
		}
		return
	}
	// Stop reading from p at once. The writer still says goodbye with the failure if it can,
	// so that a peer that is alive after all (one that was stopped and resumed) learns why
	// instead of blaming this rank; Close closes the connection without waiting for p.
	if tc, ok := p.conn.(*net.TCPConn); ok {
		tc.CloseRead()
	} else {
		p.conn.Close()
	}
	g.fail(&PeerError{Rank: p.rank, Cause: cause, ReportedBy: -1, self: g.rank})
}

// peerReported handles a goodbye from reporter that says rank r failed: this rank fails too,
// with the same failed rank. The connection with r stays open, so that this rank's goodbye
// can tell r why (if r is alive after all, it learns that it was declared failed), but Close
// does not wait for r.
func (g *tcpGroup) peerReported(reporter int, r byeReason) {
	if g.closed.Load() {
		return
	}
	if r.failedRank != g.rank {
		g.peers[r.failedRank].failed.Store(true)
	}
	g.fail(&PeerError{Rank: r.failedRank, Cause: errors.New(r.cause), ReportedBy: reporter, self: g.rank})
}

// fail makes f this rank's failure: the first one fails every pending and later operation and
// says goodbye at once, with f as the reason, to every peer that has not left, so they stop
// too and name the same failed rank. The connections stay up (half-closed) so that no peer
// blames this rank for the failure; Close closes them.
func (g *tcpGroup) fail(f *PeerError) {
	var err error = f
	if !g.failure.CompareAndSwap(nil, &err) {
		// A report of the failure this rank already has is the echo of its own goodbyes.
		if first, ok := (*g.failure.Load()).(*PeerError); f.ReportedBy < 0 || !ok || first.Rank != f.Rank {
			g.logf("comm: rank %d: %v (after an earlier failure)", g.rank, err)
		}
		return
	}
	close(g.failed)
	g.logf("comm: rank %d: %v", g.rank, err)
	for _, q := range g.peers {
		q.failReceives(err)
		if q.conn != nil {
			q.stopWriter(!q.gone.Load(), err)
		}
	}
}

// start runs the readers, writers and the failure monitor of an established mesh.
func (g *tcpGroup) start() {
	for _, p := range g.peers {
		if p.conn == nil {
			continue
		}
		g.wg.Add(2)
		go func() { defer g.wg.Done(); p.readLoop() }()
		go func() { defer g.wg.Done(); p.writeLoop() }()
	}
	if g.size > 1 {
		g.wg.Add(1)
		go func() { defer g.wg.Done(); g.monitor() }()
	}
	if g.size > 1 && g.opTimeout > 0 {
		g.wg.Add(1)
		go func() { defer g.wg.Done(); g.opWatcher() }()
	}
}

// monitor asks idle connections for heartbeats every Timeout/4 and declares failed a peer from
// which nothing has arrived for Timeout.
func (g *tcpGroup) monitor() {
	tick := time.NewTicker(g.timeout / 4)
	defer tick.Stop()
	start := time.Now()
	lastReads := make([]int64, g.size)
	lastWrites := make([]int64, g.size)
	lastHeard := make([]time.Time, g.size)
	for r := range lastHeard {
		lastHeard[r] = start
	}
	for {
		var now time.Time
		select {
		case <-g.done:
			return
		case now = <-tick.C:
		}
		for _, p := range g.peers {
			if p.conn == nil || p.gone.Load() {
				continue
			}
			if n := p.reads.Load(); n != lastReads[p.rank] {
				lastReads[p.rank], lastHeard[p.rank] = n, now
			} else if g.failure.Load() == nil && now.Sub(lastHeard[p.rank]) >= g.timeout {
				g.peerFailed(p, fmt.Errorf("silent for %v", g.timeout))
			}
			if n := p.writes.Load(); n == lastWrites[p.rank] {
				p.requestHeartbeat()
			} else {
				lastWrites[p.rank] = n
			}
		}
	}
}

func (g *tcpGroup) closeListener() {
	if g.ln != nil {
		g.lnClosed.Store(true)
		g.ln.Close()
	}
}

// killForTest drops this rank off the network without a goodbye, as if its process died: the
// listener and every connection are closed abruptly (with a reset where the socket allows).
func (g *tcpGroup) killForTest() {
	g.stallForTest.Store(true)
	g.closeListener()
	for _, p := range g.peers {
		if tc, ok := p.conn.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		if p.conn != nil {
			p.conn.Close()
		}
	}
}

// connect builds the mesh: it dials every higher rank and accepts every lower one, retrying
// dials with backoff until dialTimeout.
func (g *tcpGroup) connect(ctx context.Context, addrs []string, dialTimeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	type arrival struct {
		rank int
		conn net.Conn
	}
	arrivals := make(chan arrival)
	setupDone := make(chan struct{})
	deliver := func(r int, c net.Conn) {
		select {
		case arrivals <- arrival{r, c}:
		case <-setupDone:
			c.Close()
		}
	}
	g.wg.Add(1)
	go func() { defer g.wg.Done(); g.acceptLoop(deliver) }()

	dialErrs := make([]error, g.size)
	var dialers sync.WaitGroup
	for r := g.rank + 1; r < g.size; r++ {
		dialers.Go(func() {
			c, err := g.dial(ctx, r, addrs[r])
			if err != nil {
				dialErrs[r] = err
				return
			}
			deliver(r, c)
		})
	}
	conns := make([]net.Conn, g.size)
	missing := g.size - 1
	for missing > 0 && ctx.Err() == nil {
		select {
		case a := <-arrivals:
			if old := conns[a.rank]; old != nil {
				// The peer dialled again: its view of the old connection is that it failed.
				g.logf("comm: rank %d: rank %d connected again; dropping its earlier connection", g.rank, a.rank)
				old.Close()
			} else {
				missing--
			}
			conns[a.rank] = a.conn
		case <-ctx.Done():
		}
	}
	g.meshUp.Store(true)
	close(setupDone)
	cancel()
	dialers.Wait()
	g.hsMu.Lock()
	for c := range g.handshakes {
		c.Close() // unfinished handshakes: their goroutines return at once
	}
	g.hsMu.Unlock()

	if missing > 0 {
		var lost []int
		var errs []error
		for r, c := range conns {
			if r == g.rank {
				continue
			}
			if c != nil {
				c.Close()
				continue
			}
			lost = append(lost, r)
			if dialErrs[r] != nil {
				errs = append(errs, dialErrs[r])
			}
		}
		g.closeListener()
		g.wg.Wait()
		g.rejects.Close()
		err := fmt.Errorf("comm: rank %d: mesh not complete after %v: no connection with rank(s) %v (lower ranks dial higher ones)", g.rank, dialTimeout, lost)
		return errors.Join(append([]error{err}, errs...)...)
	}
	for r, c := range conns {
		if c != nil {
			tuneConn(c)
			g.peers[r] = newTCPPeer(g, r, c)
		}
	}
	return nil
}

// acceptLoop accepts connections until the listener closes. During set-up each one is
// authenticated on its own goroutine and handed to deliver; afterwards each one is refused.
func (g *tcpGroup) acceptLoop(deliver func(int, net.Conn)) {
	var handshakers sync.WaitGroup
	defer handshakers.Wait()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || g.lnClosed.Load() {
				return
			}
			// Out of file descriptors and the like: the listener is still good.
			g.logf("comm: rank %d: accept: %v", g.rank, err)
			select {
			case <-g.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if g.meshUp.Load() {
			g.rejects.Logf("comm: rank %d: refused connection from %s: the mesh is complete", g.rank, c.RemoteAddr())
			c.Close()
			continue
		}
		g.hsMu.Lock()
		if len(g.handshakes) >= tcpMaxHandshakes || g.meshUp.Load() {
			g.hsMu.Unlock()
			g.rejects.Logf("comm: rank %d: refused connection from %s: too many connections authenticating", g.rank, c.RemoteAddr())
			c.Close()
			continue
		}
		g.handshakes[c] = true
		g.hsMu.Unlock()
		handshakers.Go(func() {
			r, err := g.acceptHandshake(c)
			g.hsMu.Lock()
			delete(g.handshakes, c)
			g.hsMu.Unlock()
			if err != nil {
				if !g.meshUp.Load() {
					g.rejects.Logf("comm: rank %d: rejected connection from %s: %v", g.rank, c.RemoteAddr(), err)
				}
				c.Close()
				return
			}
			deliver(r, c)
		})
	}
}

// dial connects to rank r at addr and authenticates, retrying with backoff until ctx ends.
func (g *tcpGroup) dial(ctx context.Context, r int, addr string) (net.Conn, error) {
	backoff := 10 * time.Millisecond
	var last error
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			if err = g.dialHandshake(ctx, c, r); err == nil {
				return c, nil
			}
			c.Close()
			if ctx.Err() == nil {
				g.logf("comm: rank %d: handshake with rank %d at %s failed (retrying): %v", g.rank, r, addr, err)
			}
		}
		last = err
		wait := time.NewTimer(backoff + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			wait.Stop()
			return nil, fmt.Errorf("comm: rank %d: connect to rank %d at %s: %w (last attempt: %v)", g.rank, r, addr, ctx.Err(), last)
		case <-wait.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (g *tcpGroup) newHello(to int) (hello, error) {
	h := hello{version: frameVersion, hasSecret: len(g.secret) > 0, size: uint32(g.size), from: uint32(g.rank), to: uint32(to)}
	_, err := crand.Read(h.nonce[:])
	return h, err
}

// checkHello verifies a peer's hello against what this rank expects of it.
func (g *tcpGroup) checkHello(h hello, wantFrom func(int) error) error {
	if int(h.size) != g.size {
		return fmt.Errorf("peer is in a group of %d ranks, this one has %d", h.size, g.size)
	}
	if int(h.to) != g.rank {
		return fmt.Errorf("peer wants rank %d, this is rank %d", h.to, g.rank)
	}
	if err := wantFrom(int(h.from)); err != nil {
		return err
	}
	if mine := len(g.secret) > 0; h.hasSecret != mine {
		if mine {
			return fmt.Errorf("peer claiming rank %d has no secret", h.from)
		}
		return fmt.Errorf("peer claiming rank %d has a secret and this rank has none", h.from)
	}
	return nil
}

// handshakeDeadline is when a handshake must be over.
func handshakeDeadline(ctx context.Context) time.Time {
	d := time.Now().Add(tcpHandshakeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	return d
}

// dialHandshake runs the dialer's side of the handshake with rank r on c.
func (g *tcpGroup) dialHandshake(ctx context.Context, c net.Conn, r int) error {
	c.SetDeadline(handshakeDeadline(ctx))
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(aLongTimeAgo) })
	defer stop()
	mine, err := g.newHello(r)
	if err != nil {
		return err
	}
	hd := mine.encode()
	if _, err := c.Write(hd); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	resp := make([]byte, helloLen+helloMACLen)
	if _, err := io.ReadFull(c, resp); err != nil {
		return fmt.Errorf("no complete answer to the hello (does the peer have another secret, or none?): %w", err)
	}
	ha := resp[:helloLen]
	theirs, err := decodeHello(ha)
	if err != nil {
		return err
	}
	err = g.checkHello(theirs, func(from int) error {
		if from != r {
			return fmt.Errorf("rank %d answered at rank %d's address", from, r)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !hmac.Equal(resp[helloLen:], helloMAC(g.secret, "acceptor", hd, ha)) {
		return fmt.Errorf("rank %d did not prove it knows the secret (another secret?)", r)
	}
	if _, err := c.Write(helloMAC(g.secret, "dialer", hd, ha)); err != nil {
		return fmt.Errorf("send proof: %w", err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil || ack[0] != tcpHelloAck {
		return fmt.Errorf("rank %d refused the connection (ack %v, %v)", r, ack[0], err)
	}
	return c.SetDeadline(time.Time{})
}

// acceptHandshake runs the acceptor's side of the handshake on c and returns the peer's rank.
func (g *tcpGroup) acceptHandshake(c net.Conn) (int, error) {
	c.SetDeadline(time.Now().Add(tcpHandshakeTimeout))
	hd := make([]byte, helloLen)
	if _, err := io.ReadFull(c, hd); err != nil {
		return 0, fmt.Errorf("no complete hello: %w", err)
	}
	theirs, err := decodeHello(hd)
	if err != nil {
		return 0, err
	}
	err = g.checkHello(theirs, func(from int) error {
		if from >= g.rank {
			return fmt.Errorf("peer claims rank %d; only lower ranks dial rank %d", from, g.rank)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	from := int(theirs.from)
	mine, err := g.newHello(from)
	if err != nil {
		return 0, err
	}
	ha := mine.encode()
	if _, err := c.Write(append(ha, helloMAC(g.secret, "acceptor", hd, ha)...)); err != nil {
		return 0, fmt.Errorf("send hello: %w", err)
	}
	proof := make([]byte, helloMACLen)
	if _, err := io.ReadFull(c, proof); err != nil {
		return 0, fmt.Errorf("peer claiming rank %d sent no proof: %w", from, err)
	}
	if !hmac.Equal(proof, helloMAC(g.secret, "dialer", hd, ha)) {
		return 0, fmt.Errorf("peer claiming rank %d failed authentication (wrong secret)", from)
	}
	if _, err := c.Write([]byte{tcpHelloAck}); err != nil {
		return 0, fmt.Errorf("send ack: %w", err)
	}
	return from, c.SetDeadline(time.Time{})
}

// tuneConn sets TCP_NODELAY: frames are whole when written, and Nagle would only delay the
// small ones. Socket buffers are left to the kernel on purpose: on Linux, setting SO_SNDBUF or
// SO_RCVBUF turns off autotuning, which grows the buffers up to net.ipv4.tcp_rmem/tcp_wmem's
// maximum (often 4-32 MiB), while an explicit size is capped by net.core.rmem_max/wmem_max
// (often 208 KiB). Setting 4 MiB explicitly measured no faster on loopback.
func tuneConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}

// isTimeout reports a deadline error: in the transport's goroutines, a wake-up call.
func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
