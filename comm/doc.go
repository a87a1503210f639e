// Package comm moves data between the ranks of a data-parallel job: the Group interface (rank,
// size, tagged blocking and non-blocking point-to-point messages), the collectives built on it
// (AllReduce, AllReduceOf, Broadcast, AllGather, AllGatherV, AllGatherBytes, AllGatherBytesSized,
// Barrier), SendRecv (one exchange whose message may be shorter than the buffer), Sub (a sub-group
// view over some ranks, whose traffic counts on the parent rank), Topology (which ranks share a
// host; WithTopology simulates hosts in one process and counts the traffic that crosses them;
// Route joins a group of one node's ranks, such as shared memory, and the job's TCP group into
// one view in which a node's traffic stays on the node),
// per-rank Counters, and
// the transports: NewLocal runs P ranks as goroutines of one process, NewTCP connects
// processes over TCP, NewShm processes of one host through shared memory. comm knows nothing of
// tensors, models, DDP or hooks; it moves []float32 and []byte, and AllReduceOf reduces slices
// of any fixed-size number type with the caller's reduction.
//
// # The Group contract
//
// A Group is one rank's view of the communicator. Messages are matched by (source, tag), and
// messages between one (sender, receiver, tag) triple arrive in the order sent. Every blocking
// call takes a context and returns, wrapped with the awaited rank and tag, ctx.Err() when it is
// cancelled or its deadline passes: a rank that never shows up costs a deadline error, never a
// hang. A receive whose message does not fit its buffer fails with an error naming ranks, tag
// and sizes. Close makes the rank's pending and later operations fail with ErrClosed.
//
// # Tags
//
// Each collective call takes one tag and sends all its messages under it, relying on the FIFO
// order per (sender, receiver, tag) to keep its rounds apart; calls that run concurrently on the
// same ranks must use different tags. Calls on one tag one after another are fine. All ranks
// must make the same collective calls on a tag, in the same order, with the same sizes and
// algorithm.
//
// # Counters
//
// Every Group has Counters: payload bytes and messages sent and received (counted by the
// transport) and rounds (counted by the collectives). A round is one communication step on a
// rank: the messages it posts together and then waits for together (a send and a receive
// exchanged with neighbours are one round). A word is 4 bytes; the cost formulas in each
// collective's doc and in docs/ALGORITHMS.md count words received per rank. Measure an operation
// with Snapshot before and after and Stats.Sub. Counters of one rank are shared by all
// collectives running on it.
//
// # Algorithms
//
// AllReduce sums in place and leaves every rank with bit-identical results: each element is
// reduced in exactly one place (Ring, Rabenseifner) or by the same operations in the same operand
// order everywhere (RecursiveDoubling), then copied. Auto picks RecursiveDoubling for vectors
// up to SmallAllReduceBytes (2 KiB; latency dominates: log2 P rounds), otherwise Rabenseifner
// when P is a power of two (2·log2 P rounds, 2n(P-1)/P words) and Ring when it is not (2(P-1)
// rounds, 2n(P-1)/P words, where Rabenseifner's fold would add n words on the folded ranks).
// AllReduceOf runs the same algorithms, with the same Auto choice by size in bytes, on any
// Element type (int64, uint16 words of a 16-bit float format, ...) with the reduction the
// caller passes.
// On a shared-memory group (NewShm) Auto picks SharedMemory instead (see "Shared-memory
// transport").
// AllGather's Auto picks RecursiveDoubling for power-of-two P and Bruck otherwise, both
// ceil(log2 P) rounds. Broadcast is a binomial tree, Barrier a dissemination barrier.
//
// F32Bytes and BytesF32 view float32 data as host-order (little-endian) bytes without copying.
//
// # TCP transport
//
// NewTCP connects the processes of a job: a full mesh of persistent TCP connections, one per
// pair of ranks (the lower rank dials), each authenticated both ways by an HMAC-SHA256
// challenge-response over TCPConfig.Secret before any data moves; connections that fail it are
// closed and logged and the rank keeps waiting for its real peers. Messages travel as frames
// behind a validated 32-byte header (magic, version, kind, tag, chunk and message lengths);
// a large message goes out in 1 MiB chunks interleaved with other tags' frames, so a gradient
// bucket does not hold up a small message, and FIFO order per tag holds. Results and Counters
// are those of the in-process transport (Counters count payload bytes, never framing). Idle
// connections carry a heartbeat every Timeout/4; a peer that disconnects, breaks the protocol
// or is silent for Timeout fails every pending and later operation of the rank with an error
// naming that peer ("peer rank 2 failed: silent for 30s"). The rank then says goodbye to the
// others with the failure as the reason, so they fail at once naming the same rank ("peer rank
// 2 failed: silent for 30s (reported by rank 0)") rather than the survivor that left. A peer
// that closes its group says goodbye without a reason: operations that need it then fail with
// ErrClosed. NewTCPLoopback runs P ranks of one
// process over 127.0.0.1, for tests and benchmarks. A multi-process rank does:
//
//	ln, err := net.Listen("tcp", ":29600") // Addrs[rank] must reach it
//	g, err := comm.NewTCP(ctx, comm.TCPConfig{Rank: rank, Size: size, Listener: ln, Addrs: addrs, Secret: secret})
//	defer g.Close()
//	err = comm.AllReduce(ctx, g, 0, grads, comm.Auto)
//
// Without a Secret anyone who reaches the ports can join the mesh or inject data: leave it
// empty on loopback or a trusted network only. Authentication does not encrypt; across
// untrusted networks run the job inside a VPN or WireGuard tunnel.
//
// # Shared-memory transport
//
// NewShm joins the processes of a job that run on one host (Linux only; elsewhere it fails
// saying so) through one shared segment: a file in ShmConfig.Dir (/dev/shm by default) that
// every rank maps with mmap. It holds a header, a slot per rank (pid and start time, heartbeat,
// state, proof of the secret), a byte ring per ordered pair of ranks (RingBytes, 1 MiB by
// default, less beyond 5 ranks so that the rings fit in 32 MiB) and a reduce slot per rank
// (ReduceBytes, 1 MiB): 20 MiB at 4 ranks, 40 MiB at 8. Rank 0 allocates all of it when it
// creates the segment, so a /dev/shm too small for it (a container's is 64 MiB unless given
// more) is an error that says so, not a bus error later. A message is
// a validated 16-byte header (tag, kind, length) and its payload streamed through the ring of
// its pair: the sender copies in, the receiver's reader goroutine copies out into the posted
// receive (or a queue for messages nobody waits for yet), so sends never wait for a receive to
// be posted and FIFO order per (sender, receiver, tag) holds; one message is written whole
// before the next on the same pair. Waiters yield for about 200µs (not at all when the group has
// more ranks than the host has cores), then sleep on a futex (a raw FUTEX_WAIT with a timeout,
// shared between processes) that the other side rings only when someone sleeps; no cgo. Results,
// the Group contract and Counters are those of the other transports (payload bytes, never
// headers). NewShmLocal runs P ranks of one process over a real segment, for tests and
// benchmarks. A rank does:
//
//	g, err := comm.NewShm(ctx, comm.ShmConfig{Rank: rank, Size: size, Job: jobID, Secret: secret})
//	defer g.Close()
//	err = comm.AllReduce(ctx, g, 0, grads, comm.Auto)
//
// Security: the file is created with mode 0600 (other users cannot open it, and a rank refuses
// a file that is not its user's or that others may open); its name is "spargo-" and a SHA-256
// of the secret and the job name (ShmSegmentName), so a stranger cannot guess it; rank 0 writes
// an HMAC of the job, a fresh nonce and the layout under the secret, which the others check
// before they use the segment, and each rank writes an HMAC of the nonce, its rank and its pid,
// which rank 0 checks before it lets the job start. As with TCP, an empty Secret leaves only
// the job name and the file permissions.
//
// Cleanup: rank 0 builds the segment under a temporary name and links it into place, and
// removes the file as soon as every rank has mapped it: the memory lives on in the mappings and
// goes away with the last process, whatever happens to the job, so a crashed job leaves nothing
// in /dev/shm. A job that dies during set-up can leave its file; rank 0 of the next start of
// the same job removes it once its creator's process is gone (and refuses to touch the segment
// of a live one).
//
// Failures are those of the TCP transport: a monitor goroutine beats the rank's heartbeat and
// every Timeout/4 (at most 250ms) checks each peer's process (pid and start time, so a reused
// pid does not count; a zombie is dead) and heartbeat. A peer whose process is gone (kill -9)
// fails every pending and later operation with a PeerError naming it ("peer rank 2 failed: its
// process 4711 is gone") within a tick; one whose heartbeat has not moved for Timeout (a
// stopped process: SIGSTOP) "silent for 30s". The rank writes the failure into its slot, and
// the other ranks fail naming the same rank ("… (reported by rank 0)"). A rank that closes
// marks its slot: operations that need it fail with ErrClosed, messages it sent before stay
// readable. A blocking call's context is honoured as on TCP, except that a message already
// being written is finished (it is bounded by the failure timeout).
//
// ShmConfig.OpTimeout is TCPConfig.OpTimeout's operation timeout (0, the default: none): a rank
// that is alive but out of step keeps its heartbeat going, so every blocking operation with a
// peer that has waited this long fails the group with a PeerError naming that peer, in TCP's
// words: a receive ("peer rank 2 failed: alive, but sent nothing for this rank's receive under
// tag 5 within the operation timeout 3s (are the ranks out of step?)"), a send waiting for room
// in the peer's ring, and a wait in the shared all-reduce, which names the ranks that have not
// reached the barrier (each rank's slot counts the barriers it reached). A receive whose peer
// sent messages under other tags, or whose rank the others wait for in a shared all-reduce,
// names this rank instead ("this rank (2) failed: out of step: …"). The failure goes into the
// rank's slot, so the others name the same rank ("(reported by rank 0)"). Waits are checked
// every quarter of the timeout (at most a second).
//
// On a shared-memory group Auto runs AllReduce and AllReduceOf as SharedMemory, through the
// reduce slots instead of messages: in each pass every rank copies its chunk (half a slot) into
// its slot, a barrier, rank r sums block r (of P nearly equal blocks) of every rank's chunk into
// its slot, a barrier, and every rank copies every block's sum out. The sum is a tree in rank
// order (at distance 1, 2, 4, … the lower rank's partial first: recursive doubling's additions
// for power-of-two P, error growing with log2 P). Each element is summed in one place and one
// order, so every rank gets the same bits on every run. Barriers are an arrival counter and a
// futex in the header; passes alternate between the two halves of the slots, so two barriers per
// pass suffice; a vector of any size goes through the fixed slots in passes. Calls under
// different tags take turns (the header names the tag that owns the slots). Counters count what
// a rank reads from its peers' memory: block r of each peer and every other block's sum,
// (P-1)·|block r| + n - |block r| elements received, the same sent (what the peers read from its
// slot), 2(P-1) messages and 2 rounds per pass; for P | n, 2n(P-1)/P words, the ring's and
// Rabenseifner's figure (docs/ALGORITHMS.md). The explicit algorithms (Ring, Rabenseifner,
// RecursiveDoubling) still run over messages. A rank whose context ends inside a shared
// all-reduce leaves the others stuck at a barrier: it marks the slots unusable, and that call
// and every later shared all-reduce of the group fail on every rank naming it. A job's group
// that spans hosts (Route) runs the shared all-reduce on Sub of one host's ranks in their order,
// as hier:SPEC's node groups are.
//
// Vectors in shared buffers: AllocShared (collective: every rank, same tag and length, same
// order) gives each rank memory that its peers map too; each rank makes a file of its own next to
// the segment's name ("….b<k>.r<rank>.<pid>-<start>", mode 0600), maps every rank's, and removes
// its own once all have mapped it, so, as for the segment, nothing stays in /dev/shm. When every
// rank's vector of at least 64 KiB (shorter ones cost less to copy than the extra barrier) lies in
// such a buffer at the same offset (each rank writes where its vector lies
// into its slot before the first barrier, so all ranks choose alike), the shared all-reduce
// reads the peers' vectors where they are: in steps of 1 MiB of the vector, rank r sums block r of
// every rank's vector (the same tree, so the same bits) into its own vector; after a barrier it
// copies the other blocks' sums from their owners' vectors, while summing the next step's block.
// No copy through the reduce slots: per rank about 2.75 n elements of memory traffic instead of
// about 4.75 n. The counters count the words as the copying way does (what a rank reads from its
// peers and they from it), and 2 rounds per step. Anything else (one rank's vector in ordinary
// memory, different offsets) takes the copying way, with the same result. DDP allocates its
// buckets with AllocShared, so its dense all-reduce runs this way on one host. The buffers stay
// valid after Close (they become private memory) and live as long as the process.
package comm
