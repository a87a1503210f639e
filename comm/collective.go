package comm

import (
	"context"
	"fmt"
	"math/bits"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// Algorithm selects how a collective moves data.
type Algorithm int

const (
	// Auto lets the collective choose (see the package doc).
	Auto Algorithm = iota
	// Ring: all-reduce as reduce-scatter + all-gather around the ring, 2(P-1) rounds; all-gather
	// in P-1 rounds.
	Ring
	// Rabenseifner: all-reduce as recursive-halving reduce-scatter + recursive-doubling
	// all-gather, 2·log2 P rounds for power-of-two P.
	Rabenseifner
	// RecursiveDoubling: all-reduce exchanging whole vectors, log2 P rounds (small messages);
	// all-gather doubling the gathered block each round, log2 P rounds (power-of-two P only).
	RecursiveDoubling
	// Bruck: all-gather for any P in ceil(log2 P) rounds.
	Bruck
	// SharedMemory: all-reduce through the shared segment of a group made by NewShm, what
	// Auto picks on such a group (see the package doc, "Shared-memory transport").
	SharedMemory
)

func (a Algorithm) String() string {
	switch a {
	case Auto:
		return "auto"
	case Ring:
		return "ring"
	case Rabenseifner:
		return "rabenseifner"
	case RecursiveDoubling:
		return "recursive-doubling"
	case Bruck:
		return "bruck"
	case SharedMemory:
		return "shared-memory"
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// exchange is one round: it posts a send of `send` to rank `to` (skipped when to < 0) and a
// receive from rank `from` into recv (skipped when from < 0), waits for both and counts the
// round. It returns the received length, which must equal len(recv): every collective here
// knows the exact size it expects, and a different size means the ranks disagree on the input.
func exchange(ctx context.Context, g Group, tag uint32, to int, send []byte, from int, recv []byte) error {
	var sreq *Request
	if to >= 0 {
		sreq = g.Isend(ctx, to, tag, send)
	}
	var rerr error
	if from >= 0 {
		var n int
		n, rerr = g.Recv(ctx, from, tag, recv)
		if rerr == nil && n != len(recv) {
			rerr = fmt.Errorf("comm: rank %d: recv from rank %d tag %d: got %d bytes, want %d (do the ranks pass the same sizes?)",
				g.Rank(), from, tag, n, len(recv))
		}
	}
	var serr error
	if sreq != nil {
		_, serr = sreq.Wait()
	}
	if rerr != nil {
		return rerr
	}
	if serr != nil {
		return serr
	}
	g.Counters().AddRound(1)
	return nil
}

// checkGroup refuses a nil Group.
func checkGroup(op string, g Group) error {
	if g == nil {
		return fmt.Errorf("comm: %s: nil Group", op)
	}
	return nil
}

func isPow2(p int) bool { return p > 0 && p&(p-1) == 0 }

// floorPow2 is the largest power of two <= p (p >= 1).
func floorPow2(p int) int { return 1 << (bits.Len(uint(p)) - 1) }

// ceilLog2 is the smallest k with 2^k >= p (p >= 1).
func ceilLog2(p int) int { return bits.Len(uint(p - 1)) }

// log2 of a power of two.
func log2(p int) int { return bits.Len(uint(p)) - 1 }

// blockCounts splits n elements into p blocks as evenly as possible (the first n%p blocks get one
// more) and returns counts and offsets (len p+1).
func blockCounts(n, p int) (counts, offs []int) {
	counts = make([]int, p)
	offs = make([]int, p+1)
	base, rem := n/p, n%p
	for i := range p {
		counts[i] = base
		if i < rem {
			counts[i]++
		}
		offs[i+1] = offs[i] + counts[i]
	}
	return counts, offs
}

// addInto sets dst[i] = a[i] + b[i] for i < len(a). Callers pass the lower rank's partial as a
// so that every rank computes a sum the same way, operand order included. Each element is one
// IEEE addition, in the kernels' vector loop (the same bits as a scalar loop).
func addInto(dst, a, b []float32) {
	n := len(a)
	kernels.Add(dst[:n], a, b[:n])
}
