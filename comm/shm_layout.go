package comm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// The shared segment of a shared-memory group is one file, mapped by every rank:
//
//	header   4 KiB: magic, version, size, the layout, the join state, the creator's nonce and
//	         proof of the secret, the shared all-reduce's control words
//	slots    512 bytes per rank: attached, state (live, closed, failed), pid and start time,
//	         heartbeat, the rank's proof of the secret, the failure it reports, the shared
//	         all-reduce barriers it has reached and where its vector of the current call lies
//	         (in a shared buffer of AllocShared or not)
//	rings    one per ordered pair (i, j), i ≠ j: a control block (the writer's head and
//	         doorbell, the reader's tail and doorbell, on separate cache lines) and RingBytes
//	         of data: a byte stream of messages, each a 16-byte header (tag, kind, length)
//	         and the payload
//	reduce   ReduceBytes per rank, each in two halves used alternately by the shared all-reduce
//
// Every field that more than one process writes is accessed atomically; words that waiters
// sleep on (futex) are 32-bit.
const (
	shmMagic   = 0x3147455350524153 // "SARPSEG1" read as little-endian bytes
	shmVersion = 1

	shmPage        = 4096
	shmSlotBytes   = 512
	shmRingCtl     = 256
	shmMsgHeader   = 16
	shmMaxRanks    = 1024
	shmMinRing     = 64 << 10
	shmMaxRing     = 64 << 20
	shmMinReduce   = 2 * shmPage
	shmMaxReduce   = 1 << 30
	shmKindMessage = 1

	// header fields
	hMagic        = 0    // u64, written last by the creator
	hVersion      = 8    // u32
	hSize         = 12   // u32
	hRing         = 16   // u64
	hReduce       = 24   // u64
	hTotal        = 32   // u64
	hState        = 40   // u32: 0 joining, 1 ready (rank 0 removed the file)
	hJoinBell     = 44   // u32
	hCreatorPid   = 48   // u64
	hCreatorStart = 56   // u64
	hNonce        = 64   // [32]byte
	hMAC          = 96   // [32]byte
	hROwner       = 1024 // u64: the shared all-reduce's owner: gen<<33 | busy<<32 | tag
	hRBell        = 1088 // u32: bumped on every change of the all-reduce's control words
	hRSleepers    = 1092 // u32
	hRArrive      = 1152 // u64: barrier arrivals, never reset
	hRBroken      = 1216 // u32: rank+1 of a rank that abandoned a shared all-reduce midway
	hRBrokenWhy   = 1280 // u32 length, then up to 256 bytes

	// slot fields
	sAttached   = 0   // u32
	sState      = 4   // u32: shmLive, shmClosed, shmFailed
	sPid        = 8   // u64
	sStart      = 16  // u64
	sBeat       = 24  // u64
	sMAC        = 32  // [32]byte
	sFailed     = 64  // u32: the failed rank this rank reports
	sCause      = 68  // u32 length, then up to shmCauseMax bytes
	sRBarriers  = 336 // u64: the shared all-reduce barriers the rank has reached, ever
	sInbox      = 384 // u32: the rank's doorbell, rung by peers that wrote to it
	sInboxSleep = 388 // u32: the rank's reader sleeps on sInbox
	sZCGen      = 400 // u64: the shared all-reduce call whose vector the next three describe
	sZCArena    = 408 // u64: 1 + the shared buffer (AllocShared) holding the vector, 0 for none
	sZCOff      = 416 // u64: the vector's byte offset in that buffer
	sZCLen      = 424 // u64: the vector's length in bytes

	shmCauseMax = 256

	// ring control fields
	cHead    = 0   // u64: bytes written, ever (the writer's); the writer then rings the reader's inbox
	cTail    = 128 // u64: bytes consumed, ever (the reader's)
	cSpace   = 136 // u32: bumped by the reader after it frees space
	cTxSleep = 140 // u32: the writer sleeps on cSpace
)

// slot states
const (
	shmLive   = 0
	shmClosed = 1
	shmFailed = 2
)

// shmLayout is where each part of a segment lies.
type shmLayout struct {
	size          int
	ringBytes     int
	reduceBytes   int
	slots, rings  int // offsets
	reduce, total int
}

func alignUp(n, a int) int { return (n + a - 1) / a * a }

// newShmLayout computes the layout of a segment; it checks the parameters.
func newShmLayout(size, ringBytes, reduceBytes int) (shmLayout, error) {
	switch {
	case size < 1 || size > shmMaxRanks:
		return shmLayout{}, fmt.Errorf("size %d outside [1, %d]", size, shmMaxRanks)
	case ringBytes < shmMinRing || ringBytes > shmMaxRing || ringBytes%shmPage != 0:
		return shmLayout{}, fmt.Errorf("ring of %d bytes: want a multiple of %d in [%d, %d]", ringBytes, shmPage, shmMinRing, shmMaxRing)
	case reduceBytes < shmMinReduce || reduceBytes > shmMaxReduce || reduceBytes%(2*shmPage) != 0:
		return shmLayout{}, fmt.Errorf("reduce slot of %d bytes: want a multiple of %d in [%d, %d]", reduceBytes, 2*shmPage, shmMinReduce, shmMaxReduce)
	}
	l := shmLayout{size: size, ringBytes: ringBytes, reduceBytes: reduceBytes}
	l.slots = shmPage
	l.rings = alignUp(l.slots+size*shmSlotBytes, shmPage)
	l.reduce = alignUp(l.rings+size*size*(shmRingCtl+ringBytes), shmPage)
	l.total = l.reduce + size*reduceBytes
	return l, nil
}

// shmRingBudget bounds the default rings of a segment together: size² rings of 1 MiB would
// need 64 MiB at 8 ranks, all of a container's default /dev/shm.
const shmRingBudget = 32 << 20

// defaultShmSizes fills in the ring and reduce-slot sizes for size ranks.
func defaultShmSizes(size, ringBytes, reduceBytes int) (int, int) {
	if ringBytes <= 0 {
		ringBytes = min(max(shmRingBudget/(size*size)/shmPage*shmPage, shmMinRing), 1<<20)
	}
	if reduceBytes <= 0 {
		// Passes of half a MiB per rank stay in the caches: at 64 MiB, P = 2 and 4, they beat
		// slots of 2 to 32 MiB by 30 % or more, and 256-512 KiB slots (more barriers) too
		// (BENCHMARKS.md, issue 25).
		reduceBytes = 1 << 20
	}
	return ringBytes, reduceBytes
}

// shmSpaceError says that the file system of a segment is too full for it.
type shmSpaceError struct {
	dir        string
	need, free int64
}

func (e *shmSpaceError) Error() string {
	free := "too little"
	if e.free >= 0 {
		free = fmt.Sprintf("%.1f MiB", float64(e.free)/(1<<20))
	}
	return fmt.Sprintf("the shared segment needs %.1f MiB in %s, which has %s free "+
		"(a container's /dev/shm is 64 MiB unless given more: docker run --shm-size=1g, or a "+
		"memory-backed emptyDir at /dev/shm under Kubernetes); or put the segment on another "+
		"memory file system (ShmConfig.Dir; SPARGO_SHM_DIR under cluster.Init), make the rings smaller "+
		"(ShmConfig.RingBytes), or let the node's ranks talk over TCP (SPARGO_SHM=0)",
		float64(e.need)/(1<<20), e.dir, free)
}

// shmMem is a mapped segment.
type shmMem []byte

func (m shmMem) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&m[off])) }
func (m shmMem) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&m[off])) }

func (m shmMem) load32(off int) uint32 { return atomic.LoadUint32(m.u32(off)) }
func (m shmMem) load64(off int) uint64 { return atomic.LoadUint64(m.u64(off)) }

// readShmHeader validates a segment header (at least shmPage bytes) of a file of fileSize
// bytes and returns its layout. Nothing in it is trusted: a corrupt header is an error.
func readShmHeader(m shmMem, fileSize int64) (shmLayout, error) {
	if len(m) < shmPage {
		return shmLayout{}, fmt.Errorf("segment of %d bytes is shorter than its header", len(m))
	}
	if v := m.load64(hMagic); v != shmMagic {
		return shmLayout{}, fmt.Errorf("bad magic %#x", v)
	}
	if v := m.load32(hVersion); v != shmVersion {
		return shmLayout{}, fmt.Errorf("segment version %d, this program speaks %d", v, shmVersion)
	}
	size, ring, reduce := m.load32(hSize), m.load64(hRing), m.load64(hReduce)
	if size > shmMaxRanks || ring > shmMaxRing || reduce > shmMaxReduce {
		return shmLayout{}, fmt.Errorf("corrupt header: size %d, ring %d bytes, reduce slot %d bytes", size, ring, reduce)
	}
	l, err := newShmLayout(int(size), int(ring), int(reduce))
	if err != nil {
		return shmLayout{}, fmt.Errorf("corrupt header: %w", err)
	}
	if total := m.load64(hTotal); total != uint64(l.total) || fileSize != int64(l.total) {
		return shmLayout{}, fmt.Errorf("corrupt header: total %d bytes, the layout needs %d, the file has %d", total, l.total, fileSize)
	}
	return l, nil
}

// writeShmHeader writes the creator's fields, magic last.
func writeShmHeader(m shmMem, l shmLayout, pid int, start uint64, nonce []byte, mac []byte) {
	atomic.StoreUint32(m.u32(hVersion), shmVersion)
	atomic.StoreUint32(m.u32(hSize), uint32(l.size))
	atomic.StoreUint64(m.u64(hRing), uint64(l.ringBytes))
	atomic.StoreUint64(m.u64(hReduce), uint64(l.reduceBytes))
	atomic.StoreUint64(m.u64(hTotal), uint64(l.total))
	atomic.StoreUint64(m.u64(hCreatorPid), uint64(pid))
	atomic.StoreUint64(m.u64(hCreatorStart), start)
	copy(m[hNonce:hNonce+32], nonce)
	copy(m[hMAC:hMAC+32], mac)
	atomic.StoreUint64(m.u64(hMagic), shmMagic)
}

// shmCreatorMAC proves that the segment's creator knows the secret; it binds the job, the
// nonce and the layout.
func shmCreatorMAC(secret []byte, job string, nonce []byte, l shmLayout) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("spargo shm creator\x00"))
	mac.Write([]byte(job))
	mac.Write([]byte{0})
	mac.Write(nonce)
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(l.size))
	binary.LittleEndian.PutUint64(b[8:], uint64(l.ringBytes))
	binary.LittleEndian.PutUint64(b[16:], uint64(l.reduceBytes))
	mac.Write(b[:])
	return mac.Sum(nil)
}

// shmRankMAC proves that the process that took rank's slot knows the secret.
func shmRankMAC(secret []byte, nonce []byte, rank int, pid uint64) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("spargo shm rank\x00"))
	mac.Write(nonce)
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(rank))
	binary.LittleEndian.PutUint64(b[8:], pid)
	mac.Write(b[:])
	return mac.Sum(nil)
}

// shmMsgHeader encodes a message header: tag, kind, payload length.
func encodeShmMsg(b []byte, tag uint32, n int) {
	binary.LittleEndian.PutUint32(b[0:], tag)
	binary.LittleEndian.PutUint32(b[4:], shmKindMessage)
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
}

// decodeShmMsg validates a message header read from a ring.
func decodeShmMsg(b []byte, maxMessage int) (tag uint32, n int, err error) {
	tag = binary.LittleEndian.Uint32(b[0:])
	kind := binary.LittleEndian.Uint32(b[4:])
	size := binary.LittleEndian.Uint64(b[8:])
	if kind != shmKindMessage {
		return 0, 0, fmt.Errorf("corrupt message header in the shared segment: kind %d", kind)
	}
	if size > uint64(maxMessage) {
		return 0, 0, fmt.Errorf("corrupt message header in the shared segment: message of %d bytes under tag %d exceeds the limit of %d bytes", size, tag, maxMessage)
	}
	return tag, int(size), nil
}
