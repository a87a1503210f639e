package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// Store is a client of a TCPStore server: a StoreServer, PyTorch's TCPStore (for example the
// store torchrun's agent hosts), or anything else that speaks the 1.13 protocol. Its methods
// are safe for concurrent use; they take turns on one connection, as PyTorch's client does.
//
// Every key is sent with the client's prefix in front: "/" for a Store from DialStore (what
// PyTorch's TCPStore adds), and more for views made by WithPrefix. So a key set here with
// s.Set(ctx, "a", …) is read in Python with TCPStore(…).get("a").
//
// Get and Wait block until their keys exist. Every method honours its context; without a
// deadline, Get and Wait give up after StoreOptions.Timeout. A call that is cancelled or times
// out in the middle of a query leaves the connection in an unknown state, so the client closes
// it; the next call connects again (the server forgets a closed connection's waits).
type Store struct {
	conn   *storeConn
	prefix string
}

// storeConn is the connection shared by a Store and its prefixed views.
type storeConn struct {
	addr string
	opts StoreOptions
	turn chan struct{} // a one-slot semaphore: holding it means owning c and r for a query
	r    *wireReader

	mu     sync.Mutex // guards c and closed, so Close can interrupt a query in progress
	c      net.Conn   // nil after a failure until the next call reconnects
	closed bool
}

// ErrStoreClosed is returned (wrapped) by calls on a closed Store.
var ErrStoreClosed = errors.New("dist: store closed")

// DialStore connects to the store server at addr ("host:port"). A refused connection is
// retried (the server may still be starting) until ctx is done or, when ctx has no deadline,
// for StoreOptions.Timeout. With a Secret it authenticates (see the package doc); a wrong
// secret fails at once with ErrAuth.
func DialStore(ctx context.Context, addr string, opts StoreOptions) (*Store, error) {
	sc := &storeConn{addr: addr, opts: opts, turn: make(chan struct{}, 1)}
	if err := sc.connect(ctx); err != nil {
		return nil, err
	}
	return &Store{conn: sc, prefix: "/"}, nil
}

// Addr is the server address the store connects to.
func (s *Store) Addr() string { return s.conn.addr }

// WithPrefix returns a view of s whose keys live under prefix, the way PyTorch's
// PrefixStore(prefix, s) names them ("prefix/key"). Views share s's connection; closing any of
// them closes it.
func (s *Store) WithPrefix(prefix string) *Store {
	return &Store{conn: s.conn, prefix: s.prefix + prefix + "/"}
}

// Close closes the connection. Calls in progress fail; later calls return ErrStoreClosed.
func (s *Store) Close() error {
	sc := s.conn
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed {
		return nil
	}
	sc.closed = true
	if sc.c != nil {
		return sc.c.Close()
	}
	return nil
}

// connect dials (retrying refusals) and authenticates. The caller owns sc or is DialStore.
func (sc *storeConn) connect(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, sc.opts.timeout())
		defer cancel()
	}
	var d net.Dialer
	backoff := 10 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", sc.addr)
		if err == nil {
			err = sc.handshake(ctx, c)
			switch {
			case err == nil:
				return sc.adopt(c)
			case !errors.Is(err, errClosedBeforeChallenge):
				c.Close()
				return fmt.Errorf("dist: store %s: %w", sc.addr, err)
			}
			c.Close() // a busy server: retry like a refused connection
		}
		if ctx.Err() != nil {
			return fmt.Errorf("dist: store %s: connect: %w (last attempt: %v)", sc.addr, ctx.Err(), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dist: store %s: connect: %w (last attempt: %v)", sc.addr, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// adopt makes c the connection, unless the store was closed meanwhile.
func (sc *storeConn) adopt(c net.Conn) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed {
		c.Close()
		return ErrStoreClosed
	}
	sc.c = c
	sc.r = &wireReader{r: bufio.NewReaderSize(c, 64<<10), maxValue: sc.opts.maxValue()}
	return nil
}

func (sc *storeConn) handshake(ctx context.Context, c net.Conn) error {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if len(sc.opts.Secret) == 0 {
		return nil
	}
	deadline := time.Now().Add(sc.opts.handshakeTimeout())
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetDeadline(deadline)
	defer c.SetDeadline(time.Time{})
	return clientAuth(c, sc.opts.Secret)
}

// do runs one query: it takes the connection's turn, reconnects when needed, arranges for ctx
// to interrupt I/O and runs fn. An error in fn drops the connection.
func (s *Store) do(ctx context.Context, what string, fn func(c net.Conn, r *wireReader) error) error {
	sc := s.conn
	select {
	case sc.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("dist: store %s: %s: %w", sc.addr, what, ctx.Err())
	}
	defer func() { <-sc.turn }()
	sc.mu.Lock()
	c, closed := sc.c, sc.closed
	sc.mu.Unlock()
	if closed {
		return fmt.Errorf("dist: store %s: %s: %w", sc.addr, what, ErrStoreClosed)
	}
	if c == nil {
		if err := sc.connect(ctx); err != nil {
			return fmt.Errorf("%w (while reconnecting for %s)", err, what)
		}
		sc.mu.Lock()
		c = sc.c
		sc.mu.Unlock()
	}
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	} else {
		c.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err := fn(c, sc.r)
	if !stop() || err != nil {
		// Interrupted or broken mid-query: the next reply on this connection would belong
		// to a query the caller has given up on.
		c.Close()
		sc.mu.Lock()
		if sc.c == c {
			sc.c = nil
		}
		closed = sc.closed
		sc.mu.Unlock()
	}
	if err != nil {
		deadline, hasDeadline := ctx.Deadline()
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case hasDeadline && !time.Now().Before(deadline) && errors.Is(err, os.ErrDeadlineExceeded):
			err = context.DeadlineExceeded // the socket's deadline fired just before ctx's timer
		case closed:
			err = ErrStoreClosed
		}
		return fmt.Errorf("dist: store %s: %s: %w", sc.addr, what, err)
	}
	return nil
}

func (s *Store) key(k string) string { return s.prefix + k }

// Set stores value under key, waking clients that wait for it.
func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	return s.do(ctx, fmt.Sprintf("set %q", key), func(c net.Conn, _ *wireReader) error {
		msg := appendString([]byte{querySet}, s.key(key))
		_, err := c.Write(appendBytes(msg, value))
		return err
	})
}

// Get returns the value of key, waiting until it is set (see Wait for the time limit).
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	var v []byte
	err := s.do(ctx, fmt.Sprintf("get %q", key), func(c net.Conn, r *wireReader) error {
		if err := waitQuery(c, r, []string{s.key(key)}); err != nil {
			return err
		}
		if _, err := c.Write(appendString([]byte{queryGet}, s.key(key))); err != nil {
			return err
		}
		var err error
		v, err = r.bytes("value")
		return err
	})
	return v, err
}

// Add adds delta to the integer stored under key (a missing key counts as 0; values are
// decimal text, as in PyTorch) and returns the sum.
func (s *Store) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var sum int64
	err := s.do(ctx, fmt.Sprintf("add %d to %q", delta, key), func(c net.Conn, r *wireReader) error {
		msg := appendString([]byte{queryAdd}, s.key(key))
		if _, err := c.Write(appendUint64(msg, uint64(delta))); err != nil {
			return err
		}
		var err error
		sum, err = r.int64()
		return err
	})
	return sum, err
}

// CompareSet sets key to desired if its value is expected (or if it is missing and expected
// is empty) and returns the value now stored. When the key is missing and expected is not
// empty, nothing is stored and the reply is expected: PyTorch's protocol cannot tell that case
// from a successful swap to expected, so callers compare with desired.
func (s *Store) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	var v []byte
	err := s.do(ctx, fmt.Sprintf("compare-set %q", key), func(c net.Conn, r *wireReader) error {
		msg := appendString([]byte{queryCompareSet}, s.key(key))
		msg = appendBytes(msg, expected)
		if _, err := c.Write(appendBytes(msg, desired)); err != nil {
			return err
		}
		var err error
		v, err = r.bytes("value")
		return err
	})
	return v, err
}

// Check reports whether every key exists, without waiting.
func (s *Store) Check(ctx context.Context, keys ...string) (bool, error) {
	var ready bool
	err := s.do(ctx, fmt.Sprintf("check %q", keys), func(c net.Conn, r *wireReader) error {
		if _, err := c.Write(appendKeys([]byte{queryCheck}, s.prefixed(keys))); err != nil {
			return err
		}
		b, err := r.byte()
		switch {
		case err != nil:
			return err
		case b == checkReady:
			ready = true
		case b != checkNotReady:
			return fmt.Errorf("protocol error: CHECK reply %d", b)
		}
		return nil
	})
	return ready, err
}

// Wait blocks until every key exists, ctx is done, or — when ctx has no deadline —
// StoreOptions.Timeout has passed.
func (s *Store) Wait(ctx context.Context, keys ...string) error {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	return s.do(ctx, fmt.Sprintf("wait for %q", keys), func(c net.Conn, r *wireReader) error {
		return waitQuery(c, r, s.prefixed(keys))
	})
}

// Delete removes key and reports whether it existed.
func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	var n int64
	err := s.do(ctx, fmt.Sprintf("delete %q", key), func(c net.Conn, r *wireReader) error {
		if _, err := c.Write(appendString([]byte{queryDeleteKey}, s.key(key))); err != nil {
			return err
		}
		var err error
		n, err = r.int64()
		return err
	})
	return n == 1, err
}

// NumKeys is the number of keys on the server, whatever their prefix.
func (s *Store) NumKeys(ctx context.Context) (int64, error) {
	var n int64
	err := s.do(ctx, "count keys", func(c net.Conn, r *wireReader) error {
		if _, err := c.Write([]byte{queryNumKeys}); err != nil {
			return err
		}
		var err error
		n, err = r.int64()
		return err
	})
	return n, err
}

func (s *Store) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.conn.opts.timeout())
}

func (s *Store) prefixed(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = s.key(k)
	}
	return out
}

func appendKeys(b []byte, keys []string) []byte {
	b = appendUint64(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendString(b, k)
	}
	return b
}

func waitQuery(c net.Conn, r *wireReader, keys []string) error {
	if _, err := c.Write(appendKeys([]byte{queryWait}, keys)); err != nil {
		return err
	}
	b, err := r.byte()
	if err != nil {
		return err
	}
	if b != waitStopWaiting {
		return fmt.Errorf("protocol error: WAIT reply %d", b)
	}
	return nil
}
