package hooks

import "github.com/spargo-dl/spargo/ddp"

// ControlTagOffsets returns the tag offsets, within a bucket's tag range (ddp.Bucket's Tag()
// plus the offset), on which hook h sends only messages whose size does not grow with the
// bucket: counts, region boundaries, threshold histograms. A simulator that runs a schedule on
// shrunken vectors (spargo simulate -scale) scales the bytes of every other message and leaves
// these as they are. Nil for hooks whose every message grows with the bucket.
func ControlTagOffsets(h ddp.CommHook) []uint32 {
	switch h.(type) {
	case *OkTopk:
		return []uint32{okTagBounds, okTagSizes, okTagThreshold, okTagCounts}
	case *TopkDSA:
		return []uint32{1} // the all-gather of the reduced regions' counts
	}
	return nil
}
