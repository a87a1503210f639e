package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// StoreOptions configure a StoreServer and a Store client. The zero value speaks the plain
// PyTorch protocol with PyTorch's defaults.
type StoreOptions struct {
	// Secret, when non-empty, makes every connection start with the HMAC challenge–response
	// described in the package doc. Server and clients must have the same secret; PyTorch
	// clients cannot connect to a server that has one.
	Secret []byte
	// Timeout is how long a client's Get and Wait wait for missing keys, and how long
	// DialStore retries a refused connection, when the context has no deadline (0 = 300 s,
	// PyTorch's default store timeout).
	Timeout time.Duration
	// HandshakeTimeout bounds the authentication exchange (0 = DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// MaxValueBytes caps one key or value on the wire (0 = DefaultMaxValueBytes).
	MaxValueBytes int
	// Logf receives the server's notes: rejected connections and protocol errors
	// (nil = the standard logger). Rejections are logged at most 10 per 10 s, then counted.
	Logf func(format string, args ...any)
	// MaxConnsPerSource caps the open connections from one IP address
	// (0 = DefaultMaxConnsPerSource); more are refused at once.
	MaxConnsPerSource int
	// UnauthenticatedBytes is, for a server without a Secret, the budget of the keys and
	// values it stores (0 = DefaultUnauthenticatedBytes): a SET beyond it is refused and the
	// connection closed, so a stranger cannot grow the rank that hosts the store.
	UnauthenticatedBytes int
}

// DefaultStoreTimeout is PyTorch's default store timeout.
const DefaultStoreTimeout = 300 * time.Second

func (o StoreOptions) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return DefaultStoreTimeout
}

func (o StoreOptions) handshakeTimeout() time.Duration {
	if o.HandshakeTimeout > 0 {
		return o.HandshakeTimeout
	}
	return DefaultHandshakeTimeout
}

func (o StoreOptions) maxValue() int {
	if o.MaxValueBytes > 0 {
		return o.MaxValueBytes
	}
	return DefaultMaxValueBytes
}

func (o StoreOptions) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
		return
	}
	log.Printf(format, args...)
}

// StoreServer is a key-value store speaking PyTorch 1.13's TCPStore protocol (see
// store_protocol.go for the wire format), so PyTorch and spargo clients can rendezvous through
// it. It keeps every key in memory until Close.
type StoreServer struct {
	ln   net.Listener
	opts StoreOptions
	stop func() bool // unregisters the context watcher

	mu       sync.Mutex
	closed   bool
	data     map[string][]byte
	waiting  map[string][]*serverConn // key → connections whose WAIT still misses it
	watchers map[string][]*serverConn // key → connections that sent WATCH_KEY for it
	conns    map[net.Conn]*serverConn // every open connection, authenticated or not

	perSource      map[string]int // open connections by source IP
	authenticating int            // connections in the handshake now
	authBySource   map[string]int // of those, by source IP
	dataBytes      int            // keys and values stored

	rejects *comm.LogLimiter // notes of refused and rejected connections

	wg sync.WaitGroup // the accept loop and every connection's goroutines
}

// maxAuthenticating caps the connections in the authentication handshake at once; more are
// refused at once, so a flood of strangers costs bounded memory and goroutines.
const maxAuthenticating = 64

// serverConn is one client connection. Replies are queued under the server lock (so they
// leave in the order the store changed) and written by the connection's own writer, so a
// client that stops reading blocks nobody but itself.
type serverConn struct {
	c        net.Conn
	peer     string
	source   string // the peer's IP address
	awaiting int    // keys of the pending WAIT not yet set; guarded by StoreServer.mu

	outMu     sync.Mutex
	out       [][]byte
	outBytes  int
	outSignal chan struct{} // capacity 1: "out is not empty"
	done      chan struct{} // closed when the connection is torn down
	closeOnce sync.Once
}

// NewStoreServer listens on addr ("host:port"; port 0 picks a free one) and serves until ctx
// is cancelled or Close is called.
func NewStoreServer(ctx context.Context, addr string, opts StoreOptions) (*StoreServer, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dist: store server: listen on %s: %w", addr, err)
	}
	return ServeStore(ctx, ln, opts), nil
}

// ServeStore serves the store on an already bound listener, which it closes on Close.
func ServeStore(ctx context.Context, ln net.Listener, opts StoreOptions) *StoreServer {
	s := &StoreServer{
		ln:       ln,
		opts:     opts,
		data:     make(map[string][]byte),
		waiting:  make(map[string][]*serverConn),
		watchers: make(map[string][]*serverConn),
		conns:    make(map[net.Conn]*serverConn),

		perSource:    make(map[string]int),
		authBySource: make(map[string]int),
	}
	s.rejects = comm.NewLogLimiter(opts.logf, 0, 0, "connections refused or rejected by the store")
	s.stop = context.AfterFunc(ctx, func() { s.Close() })
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// Addr is the address the server listens on.
func (s *StoreServer) Addr() net.Addr { return s.ln.Addr() }

// Port is the TCP port the server listens on.
func (s *StoreServer) Port() int {
	if a, ok := s.ln.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Close stops accepting, closes every connection and waits for the server's goroutines.
// It is safe to call more than once.
func (s *StoreServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.stop()
	err := s.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	s.wg.Wait()
	s.rejects.Close()
	return err
}

func (s *StoreServer) acceptLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary trouble such as running out of file descriptors: wait and go on.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.opts.logf("dist: store server %s: accept: %v (retrying in %v)", s.ln.Addr(), err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		sc := &serverConn{c: c, peer: c.RemoteAddr().String(), source: sourceOf(c), outSignal: make(chan struct{}, 1), done: make(chan struct{})}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if !s.admitLocked(sc) {
			s.mu.Unlock()
			s.rejects.Logf("dist: store server %s: refused connection from %s: %d connections from %s are open", s.ln.Addr(), sc.peer, s.opts.maxConnsPerSource(), sc.source)
			c.Close()
			continue
		}
		s.conns[c] = sc
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(sc)
	}
}

// serveConn authenticates the connection (when the server has a secret) and then answers its
// queries until it closes or breaks the protocol.
func (s *StoreServer) serveConn(sc *serverConn) {
	defer s.wg.Done()
	defer s.dropConn(sc)
	if len(s.opts.Secret) > 0 {
		if !s.startAuth(sc) {
			s.rejects.Logf("dist: store server %s: refused connection from %s: too many connections authenticating", s.ln.Addr(), sc.peer)
			return
		}
		sc.c.SetDeadline(time.Now().Add(s.opts.handshakeTimeout()))
		err := serverAuth(sc.c, s.opts.Secret)
		s.endAuth(sc)
		if err != nil {
			s.rejects.Logf("dist: store server %s: rejected connection from %s: %v", s.ln.Addr(), sc.peer, err)
			return
		}
		sc.c.SetDeadline(time.Time{})
	} else {
		// Without a secret, a client must say something within the handshake deadline: idle
		// strangers do not hold connections open.
		sc.c.SetReadDeadline(time.Now().Add(s.opts.handshakeTimeout()))
	}
	s.wg.Add(1)
	go s.writeLoop(sc)
	r := &wireReader{r: bufio.NewReaderSize(sc.c, 64<<10), maxValue: s.opts.maxValue()}
	for first := true; ; first = false {
		q, err := r.byte()
		if first && len(s.opts.Secret) == 0 {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				s.rejects.Logf("dist: store server %s: closed connection from %s: no query within %v", s.ln.Addr(), sc.peer, s.opts.handshakeTimeout())
				return
			}
			sc.c.SetReadDeadline(time.Time{})
		}
		if err != nil {
			if !isClosedErr(err) {
				s.opts.logf("dist: store server %s: connection from %s: %v", s.ln.Addr(), sc.peer, err)
			}
			return
		}
		if err := s.query(sc, q, r); err != nil {
			if !isClosedErr(err) {
				s.opts.logf("dist: store server %s: %s from %s: %v; closing the connection", s.ln.Addr(), queryName(q), sc.peer, err)
			}
			return
		}
	}
}

// isClosedErr reports the ordinary ends of a connection: EOF, and closing it ourselves.
func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}

// dropConn forgets the connection's waits and watches and closes it.
func (s *StoreServer) dropConn(sc *serverConn) {
	s.mu.Lock()
	if _, ok := s.conns[sc.c]; ok {
		delete(s.conns, sc.c)
		s.releaseLocked(sc)
	}
	s.clearWaitLocked(sc)
	for k, list := range s.watchers {
		if list = removeConn(list, sc); len(list) == 0 {
			delete(s.watchers, k)
		} else {
			s.watchers[k] = list
		}
	}
	s.mu.Unlock()
	sc.shutdown()
}

func (sc *serverConn) shutdown() {
	sc.closeOnce.Do(func() {
		close(sc.done)
		sc.c.Close()
	})
}

func removeConn(list []*serverConn, sc *serverConn) []*serverConn {
	out := list[:0]
	for _, x := range list {
		if x != sc {
			out = append(out, x)
		}
	}
	return out
}

// clearWaitLocked drops a pending WAIT of sc.
func (s *StoreServer) clearWaitLocked(sc *serverConn) {
	if sc.awaiting == 0 {
		return
	}
	for k, list := range s.waiting {
		if list = removeConn(list, sc); len(list) == 0 {
			delete(s.waiting, k)
		} else {
			s.waiting[k] = list
		}
	}
	sc.awaiting = 0
}

// send queues one reply. It is called with s.mu held, which orders replies and watch updates
// on each connection the way the store changed. A client that lets more than a few values
// pile up unread is disconnected.
func (s *StoreServer) send(sc *serverConn, msg []byte) {
	sc.outMu.Lock()
	sc.out = append(sc.out, msg)
	sc.outBytes += len(msg)
	over := sc.outBytes > 4*s.opts.maxValue()
	sc.outMu.Unlock()
	if over {
		s.opts.logf("dist: store server %s: %s does not read its replies; closing the connection", s.ln.Addr(), sc.peer)
		sc.shutdown()
		return
	}
	select {
	case sc.outSignal <- struct{}{}:
	default:
	}
}

func (s *StoreServer) writeLoop(sc *serverConn) {
	defer s.wg.Done()
	for {
		select {
		case <-sc.done:
			return
		case <-sc.outSignal:
		}
		sc.outMu.Lock()
		batch := sc.out
		sc.out, sc.outBytes = nil, 0
		sc.outMu.Unlock()
		bufs := net.Buffers(batch)
		if _, err := bufs.WriteTo(sc.c); err != nil {
			sc.shutdown()
			return
		}
	}
}

// query reads the arguments of one query of type q and answers it.
func (s *StoreServer) query(sc *serverConn, q byte, r *wireReader) error {
	switch q {
	case querySet, queryAppend:
		key, err := r.string("key")
		if err != nil {
			return err
		}
		value, err := r.bytes("value")
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if q == queryAppend {
			if old, ok := s.data[key]; ok {
				if len(old)+len(value) > s.opts.maxValue() {
					return fmt.Errorf("APPEND to %q would make a value of %d bytes, over the limit of %d", key, len(old)+len(value), s.opts.maxValue())
				}
				value = append(bytes.Clone(old), value...)
			}
		}
		if err := s.budgetLocked(key, value); err != nil {
			return err
		}
		s.setLocked(key, value)
		return nil

	case queryCompareSet:
		key, err := r.string("key")
		if err != nil {
			return err
		}
		expected, err := r.bytes("expected value")
		if err != nil {
			return err
		}
		desired, err := r.bytes("desired value")
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.budgetLocked(key, desired); err != nil {
			return err
		}
		old, exists := s.data[key]
		switch {
		case !exists && len(expected) == 0:
			s.setLocked(key, desired)
			s.send(sc, appendBytes(nil, desired))
		case !exists:
			s.send(sc, appendBytes(nil, expected))
		case bytes.Equal(old, expected):
			s.setLocked(key, desired)
			s.send(sc, appendBytes(nil, desired))
		default:
			s.send(sc, appendBytes(nil, old))
		}
		return nil

	case queryGet:
		key, err := r.string("key")
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		v, ok := s.data[key]
		if !ok {
			return fmt.Errorf("key %q does not exist", key)
		}
		s.send(sc, appendBytes(nil, v))
		return nil

	case queryAdd:
		key, err := r.string("key")
		if err != nil {
			return err
		}
		delta, err := r.int64()
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		sum := delta
		if old, ok := s.data[key]; ok {
			v, err := strconv.ParseInt(string(old), 10, 64)
			if err != nil {
				return fmt.Errorf("key %q holds %q, not an integer", key, truncate(old))
			}
			sum += v
		}
		if err := s.budgetLocked(key, []byte(strconv.FormatInt(sum, 10))); err != nil {
			return err
		}
		s.setLocked(key, []byte(strconv.FormatInt(sum, 10)))
		s.send(sc, appendUint64(nil, uint64(sum)))
		return nil

	case queryCheck:
		keys, err := r.keys()
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.missingLocked(keys) == 0 {
			s.send(sc, []byte{checkReady})
		} else {
			s.send(sc, []byte{checkNotReady})
		}
		return nil

	case queryWait:
		keys, err := r.keys()
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		// A client whose earlier WAIT timed out may send another; the new one replaces it.
		s.clearWaitLocked(sc)
		seen := make(map[string]bool, len(keys))
		for _, k := range keys {
			if _, ok := s.data[k]; !ok && !seen[k] {
				seen[k] = true
				s.waiting[k] = append(s.waiting[k], sc)
				sc.awaiting++
			}
		}
		if sc.awaiting == 0 {
			s.send(sc, []byte{waitStopWaiting})
		}
		return nil

	case queryCancelWait:
		s.mu.Lock()
		defer s.mu.Unlock()
		s.clearWaitLocked(sc)
		s.send(sc, []byte{waitCanceled})
		return nil

	case queryNumKeys:
		s.mu.Lock()
		defer s.mu.Unlock()
		s.send(sc, appendUint64(nil, uint64(len(s.data))))
		return nil

	case queryDeleteKey:
		key, err := r.string("key")
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		var n uint64
		if old, ok := s.data[key]; ok {
			delete(s.data, key)
			s.accountLocked(key, old, true, nil, false)
			s.notifyWatchersLocked(key, watchDeleted, old, nil)
			n = 1
		}
		s.send(sc, appendUint64(nil, n))
		return nil

	case queryWatchKey:
		key, err := r.string("key")
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.watchers[key] = append(s.watchers[key], sc)
		s.send(sc, []byte{watchRegistered})
		return nil

	case queryMultiGet:
		keys, err := r.keys()
		if err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		var msg []byte
		for _, k := range keys {
			v, ok := s.data[k]
			if !ok {
				return fmt.Errorf("key %q does not exist", k)
			}
			msg = appendBytes(msg, v)
		}
		s.send(sc, msg)
		return nil

	case queryMultiSet:
		n, err := r.uint64()
		if err != nil {
			return err
		}
		if n > maxKeysPerQuery {
			return fmt.Errorf("%d keys in one query exceeds the limit of %d", n, maxKeysPerQuery)
		}
		for range n {
			key, err := r.string("key")
			if err != nil {
				return err
			}
			value, err := r.bytes("value")
			if err != nil {
				return err
			}
			s.mu.Lock()
			err = s.budgetLocked(key, value)
			if err == nil {
				s.setLocked(key, value)
			}
			s.mu.Unlock()
			if err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown query type %d (is the client newer than PyTorch 2.1, which adds a per-query magic number?)", q)
}

// setLocked stores value, wakes connections waiting for the key and tells its watchers.
func (s *StoreServer) setLocked(key string, value []byte) {
	old, existed := s.data[key]
	s.data[key] = value
	s.accountLocked(key, old, existed, value, true)
	for _, sc := range s.waiting[key] {
		if sc.awaiting--; sc.awaiting == 0 {
			s.send(sc, []byte{waitStopWaiting})
		}
	}
	delete(s.waiting, key)
	if existed {
		s.notifyWatchersLocked(key, watchUpdated, old, value)
	} else {
		s.notifyWatchersLocked(key, watchCreated, nil, value)
	}
}

func (s *StoreServer) notifyWatchersLocked(key string, kind byte, old, value []byte) {
	for _, sc := range s.watchers[key] {
		msg := append([]byte{kind}, appendString(nil, key)...)
		msg = appendBytes(msg, old)
		msg = appendBytes(msg, value)
		s.send(sc, msg)
	}
}

func (s *StoreServer) missingLocked(keys []string) int {
	n := 0
	for _, k := range keys {
		if _, ok := s.data[k]; !ok {
			n++
		}
	}
	return n
}

// truncate shortens a value for an error message.
func truncate(b []byte) []byte {
	if len(b) > 40 {
		return append(b[:40:40], "…"...)
	}
	return b
}
