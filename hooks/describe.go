package hooks

import "github.com/spargo-dl/spargo/ddp"

// What a hook is, beyond what it does in Run, it says itself through small optional
// interfaces: ddp.WorldSizeChecker and ddp.CorrectorNeeder (what DDP and a training program
// must know), and the ones below (what a cost model or a simulator must know). Programs ask
// the hook; none switches on its concrete type. A wrapper (fp16+X) answers for its inner hook.

// CostDescriber is implemented by hooks with a closed-form communication volume (SparDL's
// Table I, Ok-Topk's and the SparCML baselines' bounds): CostFormula returns the expression
// and its value in words received per worker, for a bucket of n elements on p workers at the
// hook's own density. ok is false when this configuration has no closed form.
type CostDescriber interface {
	CostFormula(n, p int) (expr string, words float64, ok bool)
}

// SelectionKind is what local selection a sparse hook computes per call.
type SelectionKind int

const (
	// SelectUndescribed: the hook does not say (a cost model charges its dense passes only).
	SelectUndescribed SelectionKind = iota
	// SelectTopK: an exact top-K of the whole bucket.
	SelectTopK
	// SelectBlockTopK: a top-K of each block of Block elements (SparDL's per-team blocks).
	SelectBlockTopK
	// SelectMetered: the hook reports every piece of its local work, with its size, to the
	// WorkMeter of its context (WithWorkMeter).
	SelectMetered
)

// Selection describes a sparse hook's local selection on a bucket.
type Selection struct {
	Kind SelectionKind
	// K is how many entries one selection keeps (per block for SelectBlockTopK).
	K int
	// Block is the block size of SelectBlockTopK.
	Block int
}

// SelectionDescriber is implemented by sparse hooks that say what they select per call on a
// bucket of n elements among p workers, for cost models (spargo simulate).
type SelectionDescriber interface {
	Selection(n, p int) Selection
}

// ControlTagger is implemented by hooks that send, on some of a bucket's tags, only messages
// whose size does not grow with the bucket (counts, region boundaries, threshold
// histograms); ControlTagOffsets lists those tags' offsets within the bucket's range.
type ControlTagger interface {
	ControlTagOffsets() []uint32
}

// ControlTagOffsets returns the tag offsets, within a bucket's tag range (ddp.Bucket's Tag()
// plus the offset), on which hook h sends only messages whose size does not grow with the
// bucket (ControlTagger). A simulator that runs a schedule on shrunken vectors (spargo
// simulate -scale) scales the bytes of every other message and leaves these as they are. Nil
// for hooks whose every message grows with the bucket.
func ControlTagOffsets(h ddp.CommHook) []uint32 {
	if t, ok := h.(ControlTagger); ok {
		return t.ControlTagOffsets()
	}
	return nil
}

// CostFormula returns h's closed-form volume (CostDescriber); ok is false when h has none.
func CostFormula(h ddp.CommHook, n, p int) (expr string, words float64, ok bool) {
	if c, is := h.(CostDescriber); is {
		return c.CostFormula(n, p)
	}
	return "", 0, false
}

// SelectionOf returns what h selects per call on a bucket of n elements among p workers
// (SelectionDescriber); SelectUndescribed when h does not say.
func SelectionOf(h ddp.CommHook, n, p int) Selection {
	if s, ok := h.(SelectionDescriber); ok {
		return s.Selection(n, p)
	}
	return Selection{}
}

// Merger is implemented by the merging family (lags, mgs, omgs): Merged returns the hook's
// MergedTopK, whose plans spargo plan reports.
type Merger interface {
	Merged() *MergedTopK
}

// Merged returns h's MergedTopK when h is one of the merging family, or nil.
func Merged(h ddp.CommHook) *MergedTopK {
	if m, ok := h.(Merger); ok {
		return m.Merged()
	}
	return nil
}
