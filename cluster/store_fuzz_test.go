package cluster

import (
	"bufio"
	"bytes"
	"net"
	"testing"
)

// FuzzStoreQueries feeds arbitrary bytes to the server's query decoder, as a hostile or broken
// client would send them: it must neither panic nor allocate what a length field asks for
// beyond its limits, and must stop at the first malformed query.
//
//	go test -run '^$' -fuzz FuzzStoreQueries ./cluster/
func FuzzStoreQueries(f *testing.F) {
	f.Add(appendBytes(appendString([]byte{querySet}, "/k"), []byte("v")))
	f.Add(appendKeys([]byte{queryWait}, []string{"a", "b"}))
	f.Add(appendBytes(appendBytes(appendString([]byte{queryCompareSet}, "c"), nil), []byte("x")))
	f.Add(appendUint64(appendString([]byte{queryAdd}, "n"), 7))
	f.Add(append(appendUint64([]byte{queryMultiSet}, 1), appendBytes(appendString(nil, "m"), []byte("v"))...))
	f.Add([]byte{queryNumKeys, queryCancelWait, queryCheck, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(appendUint64([]byte{querySet}, 1<<63))
	f.Add([]byte{200})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &StoreServer{
			opts:     StoreOptions{MaxValueBytes: 1 << 16, Logf: func(string, ...any) {}},
			data:     map[string][]byte{"n": []byte("1")},
			waiting:  map[string][]*serverConn{},
			watchers: map[string][]*serverConn{},
			conns:    map[net.Conn]*serverConn{},
		}
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		sc := &serverConn{c: a, outSignal: make(chan struct{}, 1), done: make(chan struct{})}
		r := &wireReader{r: bufio.NewReader(bytes.NewReader(data)), maxValue: s.opts.maxValue()}
		for {
			q, err := r.byte()
			if err != nil {
				break
			}
			if err := s.query(sc, q, r); err != nil {
				break
			}
		}
		for k, v := range s.data {
			if len(k) > s.opts.maxValue() || len(v) > s.opts.maxValue() {
				t.Fatalf("stored %d-byte key / %d-byte value past the limit", len(k), len(v))
			}
		}
		s.clearWaitLocked(sc)
		if len(s.waiting) != 0 {
			t.Fatalf("wait state left after clearing: %v", s.waiting)
		}
	})
}
