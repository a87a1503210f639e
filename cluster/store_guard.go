package cluster

import (
	"fmt"
	"net"
)

// Limits on what a stranger can make a StoreServer hold.
const (
	// DefaultMaxConnsPerSource caps the open connections from one IP address: a job needs one
	// or two per rank on that host.
	DefaultMaxConnsPerSource = 256
	// maxAuthenticatingPerSource caps the connections of one IP address in the handshake at
	// once (of maxAuthenticating in all), so that strangers on one host cannot take every
	// slot from the ranks of another; refused clients retry (see DialStore).
	maxAuthenticatingPerSource = 16
	// DefaultUnauthenticatedBytes is the budget of keys and values a server without a secret
	// stores: rendezvous needs a few kilobytes per rank.
	DefaultUnauthenticatedBytes = 64 << 20
)

func (o StoreOptions) maxConnsPerSource() int {
	return positiveOr(o.MaxConnsPerSource, DefaultMaxConnsPerSource)
}

func (o StoreOptions) unauthenticatedBytes() int {
	return positiveOr(o.UnauthenticatedBytes, DefaultUnauthenticatedBytes)
}

// positiveOr is v when it is positive, else def.
func positiveOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// sourceOf is the IP address a connection comes from.
func sourceOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

// admitLocked counts a new connection against its source's limit; false when over it.
func (s *StoreServer) admitLocked(sc *serverConn) bool {
	if s.perSource[sc.source] >= s.opts.maxConnsPerSource() {
		return false
	}
	s.perSource[sc.source]++
	return true
}

// releaseLocked uncounts a connection admitted by admitLocked.
func (s *StoreServer) releaseLocked(sc *serverConn) {
	if s.perSource[sc.source]--; s.perSource[sc.source] <= 0 {
		delete(s.perSource, sc.source)
	}
}

// startAuth takes a handshake slot for sc: false when the server or sc's source has too many
// connections authenticating.
func (s *StoreServer) startAuth(sc *serverConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.authenticating >= maxAuthenticating || s.authBySource[sc.source] >= maxAuthenticatingPerSource {
		return false
	}
	s.authenticating++
	s.authBySource[sc.source]++
	return true
}

func (s *StoreServer) endAuth(sc *serverConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authenticating--
	if s.authBySource[sc.source]--; s.authBySource[sc.source] <= 0 {
		delete(s.authBySource, sc.source)
	}
}

// budgetLocked refuses, on a server without a secret, a value that would take the keys and
// values stored beyond StoreOptions.UnauthenticatedBytes.
func (s *StoreServer) budgetLocked(key string, value []byte) error {
	if len(s.opts.Secret) > 0 {
		return nil
	}
	grow := len(value)
	if old, ok := s.data[key]; ok {
		grow -= len(old)
	} else {
		grow += len(key)
	}
	if s.dataBytes+grow > s.opts.unauthenticatedBytes() {
		return fmt.Errorf("storing %d bytes under %q would take the store (no secret) over its budget of %d bytes", len(value), truncate([]byte(key)), s.opts.unauthenticatedBytes())
	}
	return nil
}

// accountLocked keeps dataBytes current when key's value changes from old to value (nil:
// deleted).
func (s *StoreServer) accountLocked(key string, old []byte, existed bool, value []byte, exists bool) {
	if existed {
		s.dataBytes -= len(key) + len(old)
	}
	if exists {
		s.dataBytes += len(key) + len(value)
	}
}
