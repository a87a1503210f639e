package ddp

import (
	"fmt"

	"github.com/spargo-dl/spargo/nn"
)

// PyTorch's defaults (torch/csrc/distributed/c10d/reducer.hpp): a small first bucket
// so communication starts early in backward, larger ones after.
const (
	DefaultFirstBucketBytes = 1 << 20  // kDefaultFirstBucketBytes
	DefaultBucketBytesCap   = 25 << 20 // kDefaultBucketBytesCap
)

// SizeCappedPlan groups parameters into buckets the way PyTorch DDP does: in reverse
// declaration order (roughly the order gradients become ready), closing a bucket once
// it reaches its cap in bytes of float32 (firstCap for the first bucket, cap after).
// It returns groups of indices into params.
func SizeCappedPlan(params []*nn.Param, firstCap, cap int) [][]int {
	var plan [][]int
	var cur []int
	size := 0
	limit := firstCap
	for i := len(params) - 1; i >= 0; i-- {
		cur = append(cur, i)
		size += 4 * params[i].Len()
		if size >= limit {
			plan = append(plan, cur)
			cur, size, limit = nil, 0, cap
		}
	}
	if len(cur) > 0 {
		plan = append(plan, cur)
	}
	return plan
}

// validatePlan checks that every parameter is in exactly one non-empty bucket.
func validatePlan(plan [][]int, n int) error {
	seen := make([]bool, n)
	for b, group := range plan {
		if len(group) == 0 {
			return fmt.Errorf("ddp: bucket plan: bucket %d is empty", b)
		}
		for _, i := range group {
			if i < 0 || i >= n {
				return fmt.Errorf("ddp: bucket plan: bucket %d names parameter %d of %d", b, i, n)
			}
			if seen[i] {
				return fmt.Errorf("ddp: bucket plan: parameter %d is in two buckets", i)
			}
			seen[i] = true
		}
	}
	for i, ok := range seen {
		if !ok {
			return fmt.Errorf("ddp: bucket plan: parameter %d is in no bucket", i)
		}
	}
	return nil
}
