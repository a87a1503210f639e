package hooks

import (
	"context"
	"math"
	"slices"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// Work is one kind of local computation a hook does, in units a WorkMeter counts: elements of
// a dense vector, entries of a sparse one, or values scanned. A hook that reports its work
// (Ok-Topk) lets a simulator charge each piece, with its real size, at the point of the
// schedule where it happens (`spargo simulate`), instead of guessing the whole call's work
// from n and k.
type Work int

// The pieces of work, each timed by MeasureWork on the functions the hooks call.
const (
	WorkAdd        Work = iota // kernels.Add, per element (acc = g + ξ)
	WorkCopy                   // copy, per 4-byte word (ξ = acc; appending decoded entries: 2 words an entry)
	WorkClear                  // clear, per element
	WorkScale                  // kernels.Scale, per element (the division by P)
	WorkKth                    // kernels.KthLargestAbs, per element scanned (an exact threshold)
	WorkScan                   // Threshold / NonZeros / kernels.FilterAbs, per element scanned
	WorkGather                 // Threshold's extra cost per entry it selects (emit + gather)
	WorkAppend                 // COO.Append, per entry (selected entries re-indexed one by one)
	WorkPack                   // COO to wire form, per entry
	WorkUnpack                 // wire form to COO (SetWire: decode, check, append), per entry
	WorkScatterAdd             // ScatterAdd, per entry
	WorkScatterSet             // ScatterSet, per entry
	WorkWalk                   // walking two sorted index lists (eachIn), per entry of both
	WorkHistogram              // one pass of the distributed radix select's histogram, per value
	NumWork                    // the number of kinds
)

var workNames = [NumWork]string{"add", "copy", "clear", "scale", "kth", "scan", "gather", "append", "pack",
	"unpack", "scatter_add", "scatter_set", "walk", "histogram"}

// String is the piece's name (add, copy, …, histogram).
func (w Work) String() string {
	if w < 0 || w >= NumWork {
		return "work(?)"
	}
	return workNames[w]
}

// WorkMeter receives a hook's local work as it is done: units of kind w (see Work). It is
// called from the goroutine that runs the hook, in program order.
type WorkMeter func(w Work, units int)

type workMeterKey struct{}

// WithWorkMeter returns a context under which the hooks that report their work (Ok-Topk) call
// m for every piece of local computation.
func WithWorkMeter(ctx context.Context, m WorkMeter) context.Context {
	return context.WithValue(ctx, workMeterKey{}, m)
}

// workMeter returns ctx's meter, or one that does nothing.
func workMeter(ctx context.Context) WorkMeter {
	if m, ok := ctx.Value(workMeterKey{}).(WorkMeter); ok && m != nil {
		return m
	}
	return func(Work, int) {}
}

// WorkProbe runs one piece of work on a sample, through the functions the hooks call, so
// that a simulator can time it on this machine (`spargo simulate` times every probe several
// times, interleaved, and keeps the fastest).
type WorkProbe struct {
	Work  Work
	Units int // units of Work one run does
	// New returns a run with its own scratch: runs from different New calls may run at once.
	New func() func()
	// Minus, when set, is a probe whose time per run is subtracted from this one's (WorkGather:
	// a threshold's selection minus its scan).
	Minus *WorkProbe
}

// WorkProbes returns a probe of every piece of work on x (a gradient-like vector: the
// sample), with selections of about density·len(x) entries.
func WorkProbes(x []float32, density float64) []WorkProbe {
	s := len(x)
	k := max(1, int(float64(s)*density))
	th := kernels.KthLargestAbs(x, k)
	sel := Threshold(COO{}, x, th) // about k entries, sorted
	m := max(1, sel.Len())
	wire := sel.AppendWire(nil)
	// A second sorted list of about k entries, half of them shared with sel, for the walk.
	other := COO{}
	for e := range sel.Idx {
		if i := sel.Idx[e] - 1; e%2 == 0 || i < 0 || e > 0 && i <= sel.Idx[e-1] {
			other.Append(sel.Idx[e], sel.Val[e])
		} else {
			other.Append(i, sel.Val[e])
		}
	}
	pos := make([]int32, sel.Len()) // every entry of sel, as the global selection's positions
	for e := range pos {
		pos[e] = int32(e)
	}
	dense := func(run func(dst []float32)) func() func() {
		return func() func() {
			dst := slices.Clone(x)
			return func() { run(dst) }
		}
	}
	// sparse probes get a COO, a byte buffer and (only those that write one) a dense vector.
	sparse := func(withDense bool, run func(c *COO, dst []float32, buf *[]byte)) func() func() {
		return func() func() {
			var c COO
			var dst []float32
			if withDense {
				dst = make([]float32, s)
			}
			buf := make([]byte, 0, len(wire))
			return func() { run(&c, dst, &buf) }
		}
	}
	inf := float32(math.Inf(1))
	scan := WorkProbe{WorkScan, s, sparse(false, func(c *COO, _ []float32, _ *[]byte) { *c = Threshold(*c, x, inf) }), nil}
	return []WorkProbe{
		{WorkAdd, s, dense(func(dst []float32) { kernels.Add(dst, x, x) }), nil},
		{WorkCopy, s, dense(func(dst []float32) { copy(dst, x) }), nil},
		{WorkClear, s, dense(func(dst []float32) { clear(dst) }), nil},
		{WorkScale, s, dense(func(dst []float32) { kernels.Scale(1, dst) }), nil},
		{WorkKth, s, dense(func([]float32) { kernels.KthLargestAbs(x, k) }), nil},
		scan,
		{WorkGather, m, sparse(false, func(c *COO, _ []float32, _ *[]byte) { *c = Threshold(*c, x, th) }), &scan},
		{WorkAppend, m, sparse(false, func(c *COO, _ []float32, _ *[]byte) { c.Reset(); appendShifted(c, sel, pos, 0) }), nil},
		{WorkPack, m, sparse(false, func(_ *COO, _ []float32, buf *[]byte) { *buf = sel.AppendWire((*buf)[:0]) }), nil},
		{WorkUnpack, m, sparse(false, func(c *COO, _ []float32, _ *[]byte) { _ = c.SetWire(wire, s) }), nil},
		{WorkScatterAdd, m, sparse(true, func(_ *COO, dst []float32, _ *[]byte) { ScatterAdd(dst, sel) }), nil},
		{WorkScatterSet, m, sparse(true, func(_ *COO, dst []float32, _ *[]byte) { ScatterSet(dst, sel) }), nil},
		{WorkWalk, sel.Len() + other.Len(), sparse(true, func(_ *COO, dst []float32, _ *[]byte) { Residual(dst).MarkApplied(sel.Idx, other.Idx) }), nil},
		{WorkHistogram, m, sparse(false, func(_ *COO, _ []float32, _ *[]byte) {
			var bins [256]int64
			radixCount(bins[:], sel.Val, 0, 31, 23, 8)
		}), nil},
	}
}
