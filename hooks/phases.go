package hooks

import (
	"sort"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/ddp"
)

// GroupPhases is one group's last call, its phases measured from the moment DDP called the
// hook: selection done (Selected), all-gather done (Gathered), result ready (Done).
type GroupPhases struct {
	Bucket   int
	Elements int
	// DenseElements are the bucket's elements in small tensors (all-reduced densely), K the
	// entries each rank selects from the others.
	DenseElements            int
	K                        int
	Dense                    bool // a dense call (dense_warmup, or only small tensors): no phases
	Selected, Gathered, Done time.Duration
}

// GroupTrace is one group of the last iteration on DDP's timeline, from the start of
// backward: its gradients ready, DDP calling the hook, selection done, all-gather done,
// result ready. A dense call (Dense) has no selection: Sparsified and Sent are Start.
type GroupTrace struct {
	Bucket                               int
	Elements                             int
	Dense                                bool
	Ready, Start, Sparsified, Sent, Done time.Duration
}

// GroupTracer is a hook that records the phases of its calls (topka, lags, mgs, omgs): Trace
// puts the last iteration's groups on DDP's timeline.
type GroupTracer interface {
	Trace(st ddp.IterationStats) []GroupTrace
}

var (
	_ GroupTracer = (*TopkA)(nil)
	_ GroupTracer = (*MergedTopK)(nil)
)

// phaseLog keeps the phases of each bucket's last call, for the hooks that run TopkA's step
// (topkaStep marks its selection and all-gather).
type phaseLog struct {
	mu     sync.Mutex
	phases map[int]GroupPhases
}

// record notes one call on bucket of n elements (nd of them all-reduced densely, k selected
// per rank) that DDP made at start; marks are the step's (zero: a dense call).
func (l *phaseLog) record(bucket, n, nd, k int, start time.Time, marks stepMarks) {
	tr := GroupPhases{Bucket: bucket, Elements: n, DenseElements: nd, K: k, Done: time.Since(start), Dense: marks.selected.IsZero()}
	if !tr.Dense {
		tr.Selected, tr.Gathered = marks.selected.Sub(start), marks.gathered.Sub(start)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.phases == nil {
		l.phases = map[int]GroupPhases{}
	}
	l.phases[bucket] = tr
}

// Phases returns the last call of every bucket, in bucket order.
func (l *phaseLog) Phases() []GroupPhases {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]GroupPhases, 0, len(l.phases))
	for _, t := range l.phases {
		out = append(out, t)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Bucket < out[b].Bucket })
	return out
}

// Trace combines DDP's statistics of the last iteration (DDP.Stats) with the hook's phases:
// one entry per bucket, on one timeline.
func (l *phaseLog) Trace(st ddp.IterationStats) []GroupTrace {
	phases := map[int]GroupPhases{}
	for _, t := range l.Phases() {
		phases[t.Bucket] = t
	}
	var out []GroupTrace
	for _, b := range st.Buckets {
		t, ok := phases[b.Index]
		out = append(out, GroupTrace{Bucket: b.Index, Elements: b.Elements, Dense: !ok || t.Dense, Ready: b.Ready, Start: b.CommStart,
			Sparsified: b.CommStart + t.Selected, Sent: b.CommStart + t.Gathered, Done: b.CommEnd})
	}
	return out
}
