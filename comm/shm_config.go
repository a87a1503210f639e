package comm

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"time"
)

// ShmConfig configures one rank of a shared-memory group (see NewShm).
type ShmConfig struct {
	// Rank is this process's rank in [0, Size); Size the number of ranks. All of them run on
	// this host.
	Rank, Size int
	// Job names the job; every rank passes the same. With Secret it names the shared segment,
	// so two jobs with different names or secrets never meet.
	Job string
	// Secret is the job's shared secret. The segment's file name is derived from a hash of it
	// (a stranger cannot guess it), and every rank proves it knows it in the segment's
	// handshake before any data moves. Empty means the job name alone protects the segment
	// (beyond the file permissions): use it only when every process of the user is trusted.
	Secret []byte
	// Dir is where the segment's file is created; "" means /dev/shm (memory-backed). Tests use
	// a temporary directory.
	Dir string
	// Timeout is the peer failure timeout: a peer whose heartbeat (written every Timeout/4 by a
	// goroutine of its own) does not move for this long is declared failed, and so is one whose
	// process is gone (checked every Timeout/4, at most every 250ms). 0 means 30s. Every rank
	// should use the same value.
	Timeout time.Duration
	// OpTimeout bounds every operation with a peer (0: none), as TCPConfig.OpTimeout does: a
	// receive waiting for a message from a rank, a send waiting for room in the ring to it, or
	// a wait in the shared all-reduce for the ranks that have not arrived, not over this long
	// after it started, fails the group naming that peer (a PeerError whose cause says it is
	// alive but did not take part; the other ranks then name the same rank). It catches a live
	// rank that is out of step, which heartbeats cannot. It must exceed the longest time one
	// rank may wait for another between matching operations.
	OpTimeout time.Duration
	// JoinTimeout bounds the set-up: rank 0 waits this long for the others to map the segment,
	// the others this long for rank 0 to create it. 0 means 60s.
	JoinTimeout time.Duration
	// RingBytes is the size of the byte ring of each ordered pair of ranks (messages larger
	// than it stream through it); 0 means 1 MiB, or less so that the size² rings fit in 32 MiB
	// (512 KiB at 8 ranks, at least 64 KiB). Rank 0's value is the job's.
	RingBytes int
	// ReduceBytes is the size of each rank's slot for the shared all-reduce (vectors larger
	// than half of it are reduced half a slot at a time); 0 means 1 MiB, whose passes stay in
	// the caches. Rank 0's value is the job's.
	ReduceBytes int
	// MaxMessage is the largest message, in bytes, this rank sends or accepts; 0 means 1 GiB.
	MaxMessage int
	// Logf reports peer failures; nil means log.Printf.
	Logf func(format string, args ...any)
}

const (
	shmDefaultTimeout     = 30 * time.Second
	shmDefaultJoinTimeout = 60 * time.Second
	shmDefaultMaxMessage  = 1 << 30
	shmDefaultDir         = "/dev/shm"
)

// ShmSegmentName is the file name (in ShmConfig.Dir) of the shared segment of the job with
// this name and secret: "spargo-" and 32 hex digits of a SHA-256 of both. The file exists
// only while the ranks join; rank 0 removes it once every rank has mapped it.
func ShmSegmentName(job string, secret []byte) string {
	h := sha256.New()
	h.Write([]byte("spargo shared-memory segment v1\x00"))
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(secret)))
	h.Write(n[:])
	h.Write(secret)
	h.Write([]byte(job))
	return "spargo-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// NewShmLocal starts size ranks in this process, each with its own mapping of one real
// shared segment (in /dev/shm when it exists, else the temporary directory), and returns their
// Groups. It is meant for tests and for measuring the transport on one machine; NewShm is the
// constructor for processes. Each configure function, if any, adjusts every rank's ShmConfig
// (say, smaller rings) after Rank, Size, Job, Secret and Dir are filled in.
func NewShmLocal(ctx context.Context, size int, configure ...func(*ShmConfig)) ([]Group, error) {
	return newShmLocal(ctx, size, func(c *ShmConfig) {
		for _, f := range configure {
			f(c)
		}
	})
}
