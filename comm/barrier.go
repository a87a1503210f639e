package comm

import (
	"context"
	"fmt"
)

// Barrier returns on a rank only after every rank has entered it. Dissemination algorithm: in
// round k each rank sends an empty message to rank+2^k and waits for one from rank-2^k (mod P);
// ceil(log2 P) rounds and as many messages per rank, zero bytes.
func Barrier(ctx context.Context, g Group, tag uint32) error {
	if err := checkGroup("Barrier", g); err != nil {
		return err
	}
	p, r := g.Size(), g.Rank()
	for d := 1; d < p; d *= 2 {
		if err := exchange(ctx, g, tag, (r+d)%p, nil, (r-d+p)%p, nil); err != nil {
			return fmt.Errorf("comm: Barrier: rank %d of %d, tag %d, distance %d: %w", r, p, tag, d, err)
		}
	}
	return nil
}
