package comm

import (
	"bytes"
	"context"
	"testing"
)

// FuzzTCPHandshake plays a stranger on both sides of the mesh handshake: the bytes are what
// it sends to an accepting rank (1 of 3) and to a dialing one (0, dialing rank 1). Without
// the secret it can never be accepted, and no input may panic either side.
//
//	go test -run '^$' -fuzz FuzzTCPHandshake ./comm/
func FuzzTCPHandshake(f *testing.F) {
	nop := func(string, ...any) {}
	group := func(rank int) *tcpGroup {
		g, err := newTCPGroup(TCPConfig{Rank: rank, Size: 3, Listener: fakeListener{}, Addrs: make([]string, 3), Secret: testSecret, Logf: nop})
		if err != nil {
			f.Fatal(err)
		}
		return g
	}
	acceptor, dialer := group(1), group(0)
	h := hello{version: frameVersion, hasSecret: true, size: 3, from: 0, to: 1}
	f.Add(h.encode())
	f.Add(append(h.encode(), make([]byte, helloMACLen)...))
	h.to, h.from = 0, 1
	f.Add(append(h.encode(), make([]byte, helloMACLen+1)...))
	h.hasSecret = false
	f.Add(h.encode())
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := acceptor.acceptHandshake(fakeConn{bytes.NewReader(data)}); err == nil {
			t.Fatalf("accepted a stranger's bytes %x", data)
		}
		if err := dialer.dialHandshake(context.Background(), fakeConn{bytes.NewReader(data)}, 1); err == nil {
			t.Fatalf("the dialer accepted a stranger's answer %x", data)
		}
	})
}
