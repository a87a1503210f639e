package cluster

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// The wire protocol of PyTorch 1.13's c10d TCPStore, as its C++ client and server speak it.
// Every number is little-endian (the host order of the machines PyTorch runs on). A request is
// one query-type byte followed by its arguments; a "string" or "bytes" argument is a uint64
// length and that many bytes; a key count is a uint64.
//
//	SET          0  key, value                      → (no reply)
//	COMPARE_SET  1  key, expected, desired          → bytes: the value now stored (see below)
//	GET          2  key                             → bytes (a missing key is a protocol error:
//	                                                   the server closes the connection)
//	ADD          3  key, int64 delta                → int64: the new value (stored as decimal text)
//	CHECK        4  count, keys…                    → 1 byte: 0 all exist, 1 not all
//	WAIT         5  count, keys…                    → 1 byte 0 (STOP_WAITING) once all keys exist
//	GETNUMKEYS   6  (none)                          → int64
//	WATCH_KEY    7  key                             → 1 byte 3 (callback registered), then one
//	                                                   update per change of key: 1 byte kind
//	                                                   (0 updated, 1 created, 2 deleted),
//	                                                   key, old bytes, new bytes
//	DELETE_KEY   8  key                             → int64: number of keys deleted (0 or 1)
//
// PyTorch 1.13's server closes the connection on any other type byte. This server also accepts
// the four types that PyTorch 2.0 and 2.1 clients add, so those clients work too:
//
//	APPEND       9  key, bytes                      → (no reply)
//	MULTI_GET   10  count, keys…                    → one bytes reply per key
//	MULTI_SET   11  count, (key, value)…            → (no reply)
//	CANCEL_WAIT 12  (none)                          → 1 byte 1 (WAIT_CANCELED), after any
//	                                                   STOP_WAITING already owed
//
// 1.13 has no version handshake, no validation message and no ping: a client connects and sends
// queries. Its Python client adds "/" before every key (TCPStore's own key prefix) and
// PrefixStore(p, store) adds p + "/"; Store here does the same, so Go and Python clients of one
// server see the same keys. COMPARE_SET on a missing key with an empty expected value creates
// the key; with a non-empty expected value it stores nothing and replies with the expected
// value (PyTorch's documented quirk). Its client reads replies in order; a query that fails on
// the server (GET of a missing key, ADD to a non-integer value, an unknown type) closes the
// connection, as PyTorch does.
const (
	querySet        byte = 0
	queryCompareSet byte = 1
	queryGet        byte = 2
	queryAdd        byte = 3
	queryCheck      byte = 4
	queryWait       byte = 5
	queryNumKeys    byte = 6
	queryWatchKey   byte = 7
	queryDeleteKey  byte = 8
	queryAppend     byte = 9
	queryMultiGet   byte = 10
	queryMultiSet   byte = 11
	queryCancelWait byte = 12

	checkReady    byte = 0
	checkNotReady byte = 1

	waitStopWaiting byte = 0
	waitCanceled    byte = 1

	watchUpdated    byte = 0
	watchCreated    byte = 1
	watchDeleted    byte = 2
	watchRegistered byte = 3
)

// queryName names a query type in error messages.
func queryName(q byte) string {
	names := [...]string{"SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS",
		"WATCH_KEY", "DELETE_KEY", "APPEND", "MULTI_GET", "MULTI_SET", "CANCEL_WAIT"}
	if int(q) < len(names) {
		return names[q]
	}
	return fmt.Sprintf("unknown query type %d", q)
}

// Limits on what a peer may make the server or client read. They bound memory per request;
// lengths above them are protocol errors, never allocations.
const (
	// DefaultMaxValueBytes caps one key or value (PyTorch has no cap; rendezvous values are
	// a few bytes, and 64 MiB leaves room for users who store checkpoints' metadata).
	DefaultMaxValueBytes = 64 << 20
	// maxKeysPerQuery caps the key count of CHECK, WAIT, MULTI_GET and MULTI_SET.
	maxKeysPerQuery = 1 << 20
	// readChunk is how much a length-prefixed read allocates ahead of the bytes that actually
	// arrived, so a peer announcing a huge length costs only what it sends.
	readChunk = 1 << 20
)

// wireReader decodes protocol fields from a buffered connection.
type wireReader struct {
	r        *bufio.Reader
	maxValue int
}

func (w *wireReader) byte() (byte, error) { return w.r.ReadByte() }

func (w *wireReader) uint64() (uint64, error) {
	var b [8]byte
	if _, err := io.ReadFull(w.r, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (w *wireReader) int64() (int64, error) {
	v, err := w.uint64()
	return int64(v), err
}

// bytes reads a uint64 length and that many bytes, refusing lengths above maxValue and
// allocating at most readChunk ahead of the data received.
func (w *wireReader) bytes(what string) ([]byte, error) {
	n, err := w.uint64()
	if err != nil {
		return nil, err
	}
	if n > uint64(w.maxValue) {
		return nil, fmt.Errorf("%s of %d bytes exceeds the limit of %d bytes", what, n, w.maxValue)
	}
	buf := make([]byte, 0, min(int(n), readChunk))
	for len(buf) < int(n) {
		step := min(int(n)-len(buf), readChunk)
		buf = append(buf, make([]byte, step)...)
		if _, err := io.ReadFull(w.r, buf[len(buf)-step:]); err != nil {
			return nil, err
		}
	}
	return buf, nil
}

func (w *wireReader) string(what string) (string, error) {
	b, err := w.bytes(what)
	return string(b), err
}

// keys reads a uint64 count and that many strings.
func (w *wireReader) keys() ([]string, error) {
	n, err := w.uint64()
	if err != nil {
		return nil, err
	}
	if n > maxKeysPerQuery {
		return nil, fmt.Errorf("%d keys in one query exceeds the limit of %d", n, maxKeysPerQuery)
	}
	keys := make([]string, 0, min(int(n), 1024))
	for range n {
		k, err := w.string("key")
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// Encoders append one field to a message under construction.

func appendUint64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

func appendBytes(b, v []byte) []byte {
	b = appendUint64(b, uint64(len(v)))
	return append(b, v...)
}

func appendString(b []byte, s string) []byte {
	b = appendUint64(b, uint64(len(s)))
	return append(b, s...)
}
