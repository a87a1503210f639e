package comm

import (
	"context"
	"fmt"
)

// Broadcast copies root's buf into every other rank's buf along a binomial tree. Every rank
// passes the same len(buf), tag and root. The root spends ceil(log2 P) rounds (one per child);
// a rank at relative position v = (rank-root) mod P spends one round receiving plus one per
// child. P-1 messages of len(buf) words in all; each non-root rank receives len(buf) words once.
func Broadcast(ctx context.Context, g Group, tag uint32, root int, buf []float32) error {
	if err := broadcast(ctx, g, tag, root, F32Bytes(buf)); err != nil {
		return fmt.Errorf("comm: Broadcast of %d floats: %w", len(buf), err)
	}
	return nil
}

// BroadcastBytes is Broadcast for bytes; every rank passes the same len(buf).
func BroadcastBytes(ctx context.Context, g Group, tag uint32, root int, buf []byte) error {
	if err := broadcast(ctx, g, tag, root, buf); err != nil {
		return fmt.Errorf("comm: BroadcastBytes of %d bytes: %w", len(buf), err)
	}
	return nil
}

func broadcast(ctx context.Context, g Group, tag uint32, root int, buf []byte) error {
	if err := checkGroup("Broadcast", g); err != nil {
		return err
	}
	p, r := g.Size(), g.Rank()
	if root < 0 || root >= p {
		return fmt.Errorf("rank %d: root %d out of range [0, %d)", r, root, p)
	}
	vr := (r - root + p) % p
	real := func(v int) int { return (v + root) % p }
	// A non-root rank receives from the rank that differs in its lowest set bit.
	mask := 1
	for mask < p {
		if vr&mask != 0 {
			if err := exchange(ctx, g, tag, -1, nil, real(vr-mask), buf); err != nil {
				return fmt.Errorf("rank %d of %d, root %d, tag %d: receive: %w", r, p, root, tag, err)
			}
			break
		}
		mask <<= 1
	}
	// Then it forwards to the ranks below that bit, farthest first (largest subtree first).
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < p {
			if err := exchange(ctx, g, tag, real(vr+mask), buf, -1, nil); err != nil {
				return fmt.Errorf("rank %d of %d, root %d, tag %d: forward: %w", r, p, root, tag, err)
			}
		}
	}
	return nil
}
