package cluster

import (
	"bytes"
	"net"
	"testing"
	"time"
)

// replayConn yields a fixed byte stream and swallows writes: a stranger's side of a handshake.
type replayConn struct {
	net.Conn // nil: only the methods below are used
	r        *bytes.Reader
}

func (c replayConn) Read(b []byte) (int, error)         { return c.r.Read(b) }
func (c replayConn) Write(b []byte) (int, error)        { return len(b), nil }
func (c replayConn) SetDeadline(t time.Time) error      { return nil }
func (c replayConn) SetReadDeadline(t time.Time) error  { return nil }
func (c replayConn) SetWriteDeadline(t time.Time) error { return nil }

// FuzzStoreHandshake plays a stranger on both sides of the store's challenge–response: the
// bytes are its answer to the server's challenge and its challenge to a client. Without the
// secret neither side may accept it, and no input may panic.
//
//	go test -run '^$' -fuzz FuzzStoreHandshake ./cluster/
func FuzzStoreHandshake(f *testing.F) {
	secret := []byte("fuzz secret")
	f.Add(make([]byte, authNonceLen+authMACLen))
	f.Add(append([]byte(authMagic), make([]byte, authNonceLen+authMACLen)...))
	f.Add(append([]byte(authMagic), make([]byte, authNonceLen)...))
	f.Add([]byte("\x00\x01\x02"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := serverAuth(replayConn{r: bytes.NewReader(data)}, secret); err == nil {
			t.Fatalf("the server accepted a stranger's answer %x", data)
		}
		if err := clientAuth(replayConn{r: bytes.NewReader(data)}, secret); err == nil {
			t.Fatalf("the client accepted a stranger's challenge %x", data)
		}
	})
}
