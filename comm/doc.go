// Package comm moves data between the ranks of a data-parallel job: the Group interface (rank,
// size, tagged blocking and non-blocking point-to-point messages), the collectives built on it
// (AllReduce, AllReduceOf, Broadcast, AllGather, AllGatherV, AllGatherBytes, AllGatherBytesSized,
// Barrier), SendRecv (one exchange whose message may be shorter than the buffer), Sub (a sub-group
// view over some ranks, whose traffic counts on the parent rank), Topology (which ranks share a
// host; WithTopology simulates hosts in one process and counts the traffic that crosses them;
// Route joins a group of one node's ranks, such as shared memory, and the job's TCP group into
// one view in which a node's traffic stays on the node),
// per-rank Counters, and
// the transports. NewLocal runs P ranks as goroutines of one process. comm knows nothing of
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
package comm
