package comm

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// fakeConn is a connection that yields a fixed byte stream and swallows writes.
type fakeConn struct{ r *bytes.Reader }

func (c fakeConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c fakeConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c fakeConn) Close() error                     { return nil }
func (c fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c fakeConn) SetDeadline(time.Time) error      { return nil }
func (c fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c fakeConn) SetWriteDeadline(time.Time) error { return nil }

type fakeListener struct{}

func (fakeListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (fakeListener) Close() error              { return nil }
func (fakeListener) Addr() net.Addr            { return &net.TCPAddr{} }

// fuzzMaxMessage keeps what a fuzzed header may make the reader allocate small.
const fuzzMaxMessage = 256 << 10

// fuzzFrame encodes one frame for the seed corpus.
func fuzzFrame(h frameHeader, payload []byte) []byte {
	var b [frameHeaderLen]byte
	h.encode(&b)
	return append(b[:], payload...)
}

func fuzzBye(reason []byte) []byte {
	return fuzzFrame(frameHeader{kind: frameBye, chunk: uint32(len(reason))}, reason)
}

func fuzzData(tag uint32, total, offset int, payload []byte) []byte {
	return fuzzFrame(frameHeader{kind: frameData, tag: tag, chunk: uint32(len(payload)), total: uint64(total), offset: uint64(offset)}, payload)
}

// FuzzTCPFrame drives the reader of a receiving rank with an arbitrary byte stream from its
// peer, with receives posted on a few tags. Whatever the bytes, the reader must not panic or
// allocate more than the message limit, must stop at the end of the stream, and must leave no
// receive pending; a header it accepts must encode back to the same bytes.
//
//	go test -run '^$' -fuzz FuzzTCPFrame ./comm/
func FuzzTCPFrame(f *testing.F) {
	small := bytes.Repeat([]byte{7}, 100)
	seeds := [][]byte{
		{},
		fuzzData(0, 100, 0, small),
		append(fuzzData(1, 200, 0, small), fuzzData(1, 200, 100, small)...),       // two chunks
		append(fuzzData(1, 200, 0, small), fuzzData(2, 3, 0, []byte{1, 2, 3})...), // interleaved tags
		fuzzData(3, 0, 0, nil), // empty message
		fuzzFrame(frameHeader{kind: frameHeartbeat}, nil),
		append(fuzzData(0, 100, 0, small), fuzzFrame(frameHeader{kind: frameBye}, nil)...),
		append(fuzzData(2, 200, 0, small), fuzzFrame(frameHeader{kind: frameAbort, tag: 2}, nil)...),
		fuzzData(1, 5000, 0, small),                                                          // too long for the posted buffer, truncated
		fuzzData(9, 100, 0, small),                                                           // no receive posted: queued
		fuzzData(0, fuzzMaxMessage+1, 0, small),                                              // over the limit
		fuzzData(0, 200, 100, small),                                                         // chunk of a message never started
		fuzzFrame(frameHeader{kind: frameAbort, tag: 5}, nil),                                // abort with nothing in flight
		append(fuzzData(0, 300, 0, small), fuzzData(0, 300, 0, small)...),                    // restart mid-message
		func() []byte { b := fuzzData(0, 4, 0, []byte{1, 2, 3, 4}); b[2] = 1; return b }(),   // version 1
		func() []byte { b := fuzzData(0, 4, 0, []byte{1, 2, 3, 4}); b[0] = 'X'; return b }(), // magic
		func() []byte { b := fuzzData(0, 4, 0, []byte{1, 2, 3, 4}); b[12] = 1; return b }(),  // reserved
		[]byte("SP\x01\x01garbage"),                                                          // version 1
		[]byte("SP\x02\x01garbage"),
		// Goodbyes with a reason: the failure of rank 0 (the sender), of rank 1 (this rank), then
		// a bad code, a rank outside the group, bad UTF-8, a control character, a short reason,
		// one over the limit.
		fuzzBye(byeReason{failedRank: 0, cause: "silent for 30s"}.encode()),
		append(fuzzData(1, 200, 0, small), fuzzBye(byeReason{failedRank: 1, cause: "connection closed without goodbye"}.encode())...),
		fuzzBye([]byte{2, 0, 0, 0, 0, 'x'}),
		fuzzBye([]byte{1, 2, 0, 0, 0, 'x'}),
		fuzzBye([]byte{1, 0, 0, 0, 0, 0xff, 0xfe}),
		fuzzBye([]byte{1, 0, 0, 0, 0, 'a', '\n', 'b'}),
		fuzzBye([]byte{1, 0, 0}),
		fuzzBye(append([]byte{1, 0, 0, 0, 0}, bytes.Repeat([]byte{'a'}, tcpMaxByeReason)...)),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		if len(stream) >= frameHeaderLen {
			h, err := decodeFrameHeader(stream[:frameHeaderLen], fuzzMaxMessage)
			if err == nil {
				var b [frameHeaderLen]byte
				h.encode(&b)
				if !bytes.Equal(b[:], stream[:frameHeaderLen]) {
					t.Fatalf("accepted header %x encodes back as %x", stream[:frameHeaderLen], b)
				}
				if h.kind == frameData && (h.total > fuzzMaxMessage || h.chunk > tcpMaxChunk || h.offset+uint64(h.chunk) > h.total) {
					t.Fatalf("accepted an out-of-bounds header %+v", h)
				}
				if h.kind == frameBye && h.chunk > tcpMaxByeReason || (h.kind == frameHeartbeat || h.kind == frameAbort) && h.chunk != 0 {
					t.Fatalf("accepted a %v frame with a %d-byte payload", h.kind, h.chunk)
				}
			}
		}
		g, err := newTCPGroup(TCPConfig{Rank: 1, Size: 2, Listener: fakeListener{}, Addrs: []string{"", ""},
			MaxMessage: fuzzMaxMessage, Logf: func(string, ...any) {}})
		if err != nil {
			t.Fatal(err)
		}
		p := newTCPPeer(g, 0, fakeConn{bytes.NewReader(stream)})
		g.peers[0] = p
		ctx := context.Background()
		var reqs []*Request
		for tag, size := range []int{1000, 150, 300, 0} {
			reqs = append(reqs, g.Irecv(ctx, 0, uint32(tag), make([]byte, size)))
		}
		p.readLoop()
		for i, r := range reqs {
			select {
			case <-r.Done():
			default:
				t.Fatalf("receive %d still pending after the stream ended", i)
			}
		}
		if g.failure.Load() == nil && !p.gone.Load() {
			t.Fatal("the stream ended without a failure or a goodbye")
		}
		if f := g.failure.Load(); f != nil {
			// Whoever the failure names is a rank of the group, and a reported cause is clean.
			pf, ok := (*f).(*PeerError)
			if !ok || pf.Rank < 0 || pf.Rank > 1 {
				t.Fatalf("failure %v does not name a rank of the group", *f)
			}
			if msg := pf.Cause.Error(); pf.ReportedBy >= 0 && (!utf8.ValidString(msg) || strings.ContainsFunc(msg, unicode.IsControl)) {
				t.Fatalf("reported cause %q", msg)
			}
		}
		if s := g.counters.Snapshot(); s.BytesRecv > int64(len(stream)) {
			t.Fatalf("%d bytes received from a %d-byte stream", s.BytesRecv, len(stream))
		}
		// Later receives fail at once instead of waiting for a dead peer.
		if _, err := g.Recv(ctx, 0, 77, nil); err == nil {
			t.Fatal("receive after the end of the stream succeeded")
		}
	})
}
