package comm

import (
	"context"
	"fmt"
)

// SendRecv is one round of a variable-size exchange: it posts a send of `send` to rank `to`
// (skipped when to < 0) and a receive from rank `from` (skipped when from < 0) into recv,
// waits for both, counts one round and returns the number of bytes received. Unlike the
// fixed-size collectives, the message may be shorter than recv: len(recv) is only an upper
// bound, and the sender's message length carries its size (sparse hooks send COO blocks whose
// number of entries the receiver learns this way). A longer message is an error naming the
// ranks, the tag and both sizes.
func SendRecv(ctx context.Context, g Group, tag uint32, to int, send []byte, from int, recv []byte) (int, error) {
	if err := checkGroup("SendRecv", g); err != nil {
		return 0, err
	}
	var sreq *Request
	if to >= 0 {
		sreq = g.Isend(ctx, to, tag, send)
	}
	var n int
	var rerr error
	if from >= 0 {
		n, rerr = g.Recv(ctx, from, tag, recv)
	}
	var serr error
	if sreq != nil {
		_, serr = sreq.Wait()
	}
	if rerr != nil {
		return 0, fmt.Errorf("comm: SendRecv: %w", rerr)
	}
	if serr != nil {
		return 0, fmt.Errorf("comm: SendRecv: %w", serr)
	}
	g.Counters().AddRound(1)
	return n, nil
}

// AllGatherBytesSized is AllGatherBytes for ranks that already know every rank's size:
// sizes[i] is the number of bytes rank i contributes (len(send) must equal sizes[Rank()]),
// and every rank passes the same sizes. It skips AllGatherBytes' size exchange: one Bruck
// all-gather, ceil(log2 P) rounds, each other rank's bytes received once. out[i] is rank i's
// bytes; the slices share one backing array.
func AllGatherBytesSized(ctx context.Context, g Group, tag uint32, send []byte, sizes []int) ([][]byte, error) {
	if err := checkGroup("AllGatherBytesSized", g); err != nil {
		return nil, err
	}
	p, r := g.Size(), g.Rank()
	if len(sizes) != p {
		return nil, fmt.Errorf("comm: AllGatherBytesSized: rank %d: %d sizes for %d ranks", r, len(sizes), p)
	}
	total := 0
	for i, s := range sizes {
		if s < 0 {
			return nil, fmt.Errorf("comm: AllGatherBytesSized: rank %d: size of rank %d is %d", r, i, s)
		}
		total += s
	}
	if len(send) != sizes[r] {
		return nil, fmt.Errorf("comm: AllGatherBytesSized: rank %d: len(send) = %d, sizes[%d] = %d", r, len(send), r, sizes[r])
	}
	tmp := make([]byte, total)
	copy(tmp, send)
	if p > 1 && total > 0 {
		if err := bruck(ctx, g, tag, tmp, sizes); err != nil {
			return nil, fmt.Errorf("comm: AllGatherBytesSized of %d bytes, rank %d of %d, tag %d: %w", len(send), r, p, tag, err)
		}
	}
	out := make([][]byte, p)
	off := 0
	for i := range p {
		src := (r + i) % p
		out[src] = tmp[off : off+sizes[src] : off+sizes[src]]
		off += sizes[src]
	}
	return out, nil
}
