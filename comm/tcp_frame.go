package comm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Wire format of the TCP transport (version 2). All integers are little-endian.
//
// Handshake, once per connection; the lower rank dials the higher one:
//
//	dialer   → acceptor  hello(dialer)
//	acceptor → dialer    hello(acceptor), HMAC-SHA256(secret, "spargo tcp v1 acceptor" | hello(dialer) | hello(acceptor))
//	dialer   → acceptor  HMAC-SHA256(secret, "spargo tcp v1 dialer" | hello(dialer) | hello(acceptor))
//	acceptor → dialer    one byte, tcpHelloAck
//
// A hello is 52 bytes: "SPGH", version, flags (bit 0: the sender has a secret), two zero bytes,
// the group size, the sender's rank, the rank it believes it talks to (uint32 each) and 32 random
// bytes. Each side proves it knows the secret by MACing both hellos, so both fresh nonces, both
// ranks and the size; the role label keeps one side's proof from being replayed as the other's.
// Nothing else is sent before the exchange succeeds.
//
// Frames follow, each a 32-byte header and a payload:
//
//	0  "SP"       magic
//	2  version    1
//	3  kind       data, heartbeat, bye or abort
//	4  tag        uint32
//	8  chunk      uint32, payload bytes after this header (at most tcpMaxChunk; tcpMaxByeReason
//	              for a bye; none for heartbeats and aborts)
//	12 reserved   uint32, zero
//	16 total      uint64, length of the whole message (data frames)
//	24 offset     uint64, where this chunk starts in the message (data frames)
//
// A message is sent as consecutive chunks of at most tcpMaxChunk bytes (one frame of zero bytes
// for an empty message). Chunks of messages under different tags interleave, so a large message
// does not hold up small ones; chunks under one tag never do, which keeps FIFO order per tag.
// An abort frame drops the partly sent message under its tag (its send was cancelled); a bye
// frame says the sender will send nothing more, and its payload says why:
//
//	empty                      the sender closed its group (an orderly Close)
//	0  code     1              the sender's group failed because a rank failed:
//	1  rank     uint32         that rank (the first failure the sender knows of, seen by it or
//	                           reported to it; possibly the sender or the receiver itself)
//	5  cause    UTF-8 text     what was observed ("silent for 30s"), no control characters
//
// so that every rank of a job names the rank that failed first, not a survivor that left
// because of it. Version 2 added the reason; version 1 goodbyes had no payload.
const (
	frameHeaderLen = 32
	frameVersion   = 2

	// tcpMaxByeReason bounds a goodbye's payload; longer causes are cut when sent.
	tcpMaxByeReason = 256
	byeReasonHeader = 5 // code and rank
	byeCodeFailure  = 1

	// tcpMaxChunk is the largest frame payload: a large message goes out in pieces of this size
	// so that frames of other tags get their turn between them.
	tcpMaxChunk = 1 << 20

	helloLen    = 52
	helloNonce  = 32
	helloMACLen = sha256.Size
	tcpHelloAck = 0x4b // 'K'

	helloFlagSecret = 1
)

var (
	frameMagic = [2]byte{'S', 'P'}
	helloMagic = [4]byte{'S', 'P', 'G', 'H'}
)

type frameKind uint8

const (
	frameData      frameKind = 1
	frameHeartbeat frameKind = 2
	frameBye       frameKind = 3
	frameAbort     frameKind = 4
)

func (k frameKind) String() string {
	switch k {
	case frameData:
		return "data"
	case frameHeartbeat:
		return "heartbeat"
	case frameBye:
		return "bye"
	case frameAbort:
		return "abort"
	}
	return fmt.Sprintf("kind %d", uint8(k))
}

// frameHeader is a decoded, validated frame header.
type frameHeader struct {
	kind   frameKind
	tag    uint32
	chunk  uint32
	total  uint64
	offset uint64
}

// errProtocol marks a peer that broke the wire format; the connection cannot be trusted further.
var errProtocol = errors.New("protocol error")

func (h frameHeader) encode(b *[frameHeaderLen]byte) {
	b[0], b[1], b[2], b[3] = frameMagic[0], frameMagic[1], frameVersion, byte(h.kind)
	binary.LittleEndian.PutUint32(b[4:], h.tag)
	binary.LittleEndian.PutUint32(b[8:], h.chunk)
	binary.LittleEndian.PutUint32(b[12:], 0)
	binary.LittleEndian.PutUint64(b[16:], h.total)
	binary.LittleEndian.PutUint64(b[24:], h.offset)
}

// decodeFrameHeader parses and checks one header on its own: magic, version, kind, reserved
// bits, and lengths (chunk at most tcpMaxChunk, total at most maxMessage, the chunk inside the
// message). It allocates nothing; the reader sizes buffers only from a header it accepted.
func decodeFrameHeader(b []byte, maxMessage uint64) (frameHeader, error) {
	if len(b) < frameHeaderLen {
		return frameHeader{}, fmt.Errorf("%w: short frame header (%d bytes)", errProtocol, len(b))
	}
	if b[0] != frameMagic[0] || b[1] != frameMagic[1] {
		return frameHeader{}, fmt.Errorf("%w: bad frame magic %#x %#x", errProtocol, b[0], b[1])
	}
	if b[2] != frameVersion {
		return frameHeader{}, fmt.Errorf("%w: frame version %d, this build speaks %d", errProtocol, b[2], frameVersion)
	}
	h := frameHeader{
		kind:   frameKind(b[3]),
		tag:    binary.LittleEndian.Uint32(b[4:]),
		chunk:  binary.LittleEndian.Uint32(b[8:]),
		total:  binary.LittleEndian.Uint64(b[16:]),
		offset: binary.LittleEndian.Uint64(b[24:]),
	}
	if r := binary.LittleEndian.Uint32(b[12:]); r != 0 {
		return frameHeader{}, fmt.Errorf("%w: %v frame with reserved field %#x", errProtocol, h.kind, r)
	}
	switch h.kind {
	case frameData:
		switch {
		case h.total > maxMessage:
			return frameHeader{}, fmt.Errorf("%w: message of %d bytes under tag %d exceeds the limit of %d bytes", errProtocol, h.total, h.tag, maxMessage)
		case h.chunk > tcpMaxChunk:
			return frameHeader{}, fmt.Errorf("%w: frame of %d bytes under tag %d exceeds the chunk limit of %d bytes", errProtocol, h.chunk, h.tag, tcpMaxChunk)
		case h.offset > h.total || uint64(h.chunk) > h.total-h.offset:
			return frameHeader{}, fmt.Errorf("%w: chunk [%d, %d+%d) outside its message of %d bytes under tag %d", errProtocol, h.offset, h.offset, h.chunk, h.total, h.tag)
		case h.chunk == 0 && h.total != 0:
			return frameHeader{}, fmt.Errorf("%w: empty chunk of a %d-byte message under tag %d", errProtocol, h.total, h.tag)
		}
	case frameBye:
		if h.total != 0 || h.offset != 0 || h.tag != 0 {
			return frameHeader{}, fmt.Errorf("%w: %v frame with non-zero fields", errProtocol, h.kind)
		}
		if h.chunk > tcpMaxByeReason {
			return frameHeader{}, fmt.Errorf("%w: goodbye with a %d-byte reason, the limit is %d", errProtocol, h.chunk, tcpMaxByeReason)
		}
	case frameHeartbeat, frameAbort:
		if h.chunk != 0 || h.total != 0 || h.offset != 0 || (h.kind != frameAbort && h.tag != 0) {
			return frameHeader{}, fmt.Errorf("%w: %v frame with non-zero fields", errProtocol, h.kind)
		}
	default:
		return frameHeader{}, fmt.Errorf("%w: unknown frame kind %d", errProtocol, b[3])
	}
	return h, nil
}

// byeReason is what a goodbye says: failedRank < 0 for an orderly close, otherwise the rank
// whose failure made the sender leave and what was observed.
type byeReason struct {
	failedRank int
	cause      string
}

// encode returns the goodbye's payload. The cause is cleaned (control characters become
// spaces, invalid UTF-8 "?") and cut at a character boundary to fit tcpMaxByeReason.
func (r byeReason) encode() []byte {
	if r.failedRank < 0 {
		return nil
	}
	cause := strings.Map(func(c rune) rune {
		if unicode.IsControl(c) {
			return ' '
		}
		return c
	}, strings.ToValidUTF8(r.cause, "?"))
	if limit := tcpMaxByeReason - byeReasonHeader; len(cause) > limit {
		for limit > 0 && !utf8.RuneStart(cause[limit]) {
			limit--
		}
		cause = cause[:limit]
	}
	b := make([]byte, byeReasonHeader, byeReasonHeader+len(cause))
	b[0] = byeCodeFailure
	binary.LittleEndian.PutUint32(b[1:], uint32(r.failedRank))
	return append(b, cause...)
}

// decodeByeReason parses and checks a goodbye's payload from a peer of a group of size ranks.
func decodeByeReason(b []byte, size int) (byeReason, error) {
	if len(b) == 0 {
		return byeReason{failedRank: -1}, nil
	}
	if len(b) < byeReasonHeader || len(b) > tcpMaxByeReason {
		return byeReason{}, fmt.Errorf("%w: goodbye reason of %d bytes", errProtocol, len(b))
	}
	if b[0] != byeCodeFailure {
		return byeReason{}, fmt.Errorf("%w: goodbye with unknown reason code %d", errProtocol, b[0])
	}
	rank := binary.LittleEndian.Uint32(b[1:])
	if uint64(rank) >= uint64(size) {
		return byeReason{}, fmt.Errorf("%w: goodbye names rank %d, the group has %d", errProtocol, rank, size)
	}
	cause := b[byeReasonHeader:]
	if !utf8.Valid(cause) {
		return byeReason{}, fmt.Errorf("%w: goodbye cause is not UTF-8", errProtocol)
	}
	for _, c := range string(cause) {
		if unicode.IsControl(c) {
			return byeReason{}, fmt.Errorf("%w: goodbye cause has control character %U", errProtocol, c)
		}
	}
	return byeReason{failedRank: int(rank), cause: string(cause)}, nil
}

// hello is one side's opening message of the handshake.
type hello struct {
	version   uint8
	hasSecret bool
	size      uint32
	from, to  uint32
	nonce     [helloNonce]byte
}

func (h *hello) encode() []byte {
	b := make([]byte, helloLen)
	copy(b, helloMagic[:])
	b[4] = h.version
	if h.hasSecret {
		b[5] = helloFlagSecret
	}
	binary.LittleEndian.PutUint32(b[8:], h.size)
	binary.LittleEndian.PutUint32(b[12:], h.from)
	binary.LittleEndian.PutUint32(b[16:], h.to)
	copy(b[20:], h.nonce[:])
	return b
}

// decodeHello parses a hello; checking it against what is expected is the caller's job.
func decodeHello(b []byte) (hello, error) {
	if len(b) != helloLen {
		return hello{}, fmt.Errorf("hello of %d bytes, want %d", len(b), helloLen)
	}
	if [4]byte(b[:4]) != helloMagic {
		return hello{}, fmt.Errorf("not a spargo peer (hello starts %q)", b[:4])
	}
	if b[4] != frameVersion {
		return hello{}, fmt.Errorf("peer speaks protocol version %d, this build speaks %d", b[4], frameVersion)
	}
	if b[5]&^helloFlagSecret != 0 || b[6] != 0 || b[7] != 0 {
		return hello{}, fmt.Errorf("hello with unknown flags %#x %#x %#x", b[5], b[6], b[7])
	}
	h := hello{
		version:   b[4],
		hasSecret: b[5]&helloFlagSecret != 0,
		size:      binary.LittleEndian.Uint32(b[8:]),
		from:      binary.LittleEndian.Uint32(b[12:]),
		to:        binary.LittleEndian.Uint32(b[16:]),
	}
	copy(h.nonce[:], b[20:])
	return h, nil
}

// helloMAC is a side's proof that it knows the secret, bound to both hellos of the connection.
func helloMAC(secret []byte, role string, dialerHello, acceptorHello []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("spargo tcp v1 " + role))
	m.Write(dialerHello)
	m.Write(acceptorHello)
	return m.Sum(nil)
}
