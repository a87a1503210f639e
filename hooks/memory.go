package hooks

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// Memory is a sparse hook's state, kept per bucket index (GRACE's Memory): the residual
// (error feedback, in sum units, the length of the bucket), a call counter, and named scalars
// (B-SAG's h and step, the team count teams=auto chose). Every sparse hook owns one.
//
// One Memory, like the hook that owns it, serves one rank: build one hook per rank
// (hooks.Parse per worker, as the examples do). A call from another rank is an error, not
// silent sharing of residuals.
//
// State and LoadState save and restore it with the checkpoint (the hooks implement
// ddp.Stateful with them). A restored bucket is checked when it first runs: a bucket of
// another size, another rank or world size, or a plan with fewer buckets than the saved one is
// refused with an error naming both.
type Memory struct {
	hook string

	mu      sync.Mutex
	bound   bool
	rank    int
	size    int
	buckets map[int]*BucketState
	loaded  map[int]*BucketState // restored and not yet claimed by a bucket
}

// BucketState is one bucket's part of a Memory.
type BucketState struct {
	Index int
	// Residual is ξ, what the hook kept back for later iterations, in sum units.
	Residual Residual
	// Calls counts the hook's calls on this bucket (dense warm-up included).
	Calls int64
	vars  map[string]float64
	rank  int // for restored state: the rank and world size that saved it
	size  int
}

// Residual is a bucket's error-feedback memory ξ (or a range of it: slice it as a
// []float32), with GRACE's two verbs. Compensate adds it to the local gradient before the
// hook compresses, giving the compensated gradient G = g + ξ; Update stores what G did not
// send. Most hooks update in two steps, because their accumulator becomes scratch before
// they know what was sent: Keep stores G, then MarkSent or MarkApplied zero the positions
// that left the rank. The hooks keep their algorithms (which positions count as sent, and
// what SparDL's global residual collection adds back); the arithmetic is here.
type Residual []float32

// Compensate adds ξ to g in place: g becomes G = g + ξ (GRACE's Memory.compensate).
func (xi Residual) Compensate(g []float32) { kernels.Add(g, g, xi) }

// Update stores what G did not send (GRACE's Memory.update for a sparse selection): ξ = G,
// zero at the positions sent. It is Keep then MarkSent.
func (xi Residual) Update(acc []float32, sent []int32) {
	xi.Keep(acc)
	xi.MarkSent(sent)
}

// UpdateDense stores what a lossy approximation of G missed (GRACE's Memory.update for a
// dense compressor such as PowerSGD): ξ = G - approx, element by element.
func (xi Residual) UpdateDense(acc, approx []float32) {
	for i, x := range acc {
		xi[i] = x - approx[i]
	}
}

// Keep sets ξ = G: everything is kept back until the hook knows what it sent.
func (xi Residual) Keep(acc []float32) { copy(xi, acc) }

// MarkSent zeroes ξ at the positions sent (indices into xi).
func (xi Residual) MarkSent(sent []int32) {
	for _, j := range sent {
		xi[j] = 0
	}
}

// MarkApplied zeroes ξ at the positions this rank contributed that the result applied (both
// increasing): a contribution dropped on the way (gTopk's tree, Ok-Topk's global selection)
// stays in ξ.
func (xi Residual) MarkApplied(contributed, applied []int32) {
	eachIn(applied, contributed, func(e int, found bool) {
		if found {
			xi[contributed[e]] = 0
		}
	})
}

// MarkAllSent empties ξ: the whole of G was sent (a dense all-reduce).
func (xi Residual) MarkAllSent() { clear(xi) }

// Var returns the named scalar, or def when it was never set.
func (s *BucketState) Var(name string, def float64) float64 {
	if v, ok := s.vars[name]; ok {
		return v
	}
	return def
}

// SetVar sets a named scalar (saved with the state).
func (s *BucketState) SetVar(name string, v float64) {
	if s.vars == nil {
		s.vars = map[string]float64{}
	}
	s.vars[name] = v
}

// HasVar reports whether the named scalar was set.
func (s *BucketState) HasVar(name string) bool {
	_, ok := s.vars[name]
	return ok
}

// NewMemory returns an empty Memory for the named hook (the name prefixes the state keys).
func NewMemory(hook string) *Memory {
	return &Memory{hook: hook, buckets: map[int]*BucketState{}}
}

// lazyMemory returns *mem, first creating it for the named hook under mu: a hook built as a
// struct literal gets its Memory on its first call, which DDP makes before any other.
func lazyMemory(mu *sync.Mutex, mem **Memory, hook string) *Memory {
	mu.Lock()
	defer mu.Unlock()
	if *mem == nil {
		*mem = NewMemory(hook)
	}
	return *mem
}

// Bucket returns the state of b's bucket, creating a zero residual of len(b.Flat()) on first
// use and checking restored state against the bucket.
func (m *Memory) Bucket(g comm.Group, b ddp.Bucket) (*BucketState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, p, n, idx := g.Rank(), g.Size(), len(b.Flat()), b.Index()
	if !m.bound {
		m.bound, m.rank, m.size = true, r, p
	} else if m.rank != r || m.size != p {
		return nil, fmt.Errorf("hooks: %s: this hook instance serves rank %d of %d and was called by rank %d of %d: build one hook per rank (hooks.Parse per worker)", m.hook, m.rank, m.size, r, p)
	}
	if s, ok := m.buckets[idx]; ok {
		if len(s.Residual) != n {
			return nil, fmt.Errorf("hooks: %s: bucket %d has %d elements, its residual %d: the bucket plan changed", m.hook, idx, n, len(s.Residual))
		}
		return s, nil
	}
	if s, ok := m.loaded[idx]; ok {
		switch {
		case len(s.Residual) != n:
			return nil, fmt.Errorf("hooks: %s: restored state of bucket %d has %d elements, the bucket has %d: state saved under a different bucket plan", m.hook, idx, len(s.Residual), n)
		case s.rank != r || s.size != p:
			return nil, fmt.Errorf("hooks: %s: restored state of bucket %d was saved by rank %d of %d, restoring on rank %d of %d", m.hook, idx, s.rank, s.size, r, p)
		}
		delete(m.loaded, idx)
		m.buckets[idx] = s
	} else {
		m.buckets[idx] = &BucketState{Index: idx, Residual: make([]float32, n)}
	}
	if b.IsLast() {
		for j := range m.loaded {
			if j > idx {
				return nil, fmt.Errorf("hooks: %s: restored state has bucket %d, the plan ends at bucket %d: state saved under a different bucket plan", m.hook, j, idx)
			}
		}
	}
	return m.buckets[idx], nil
}

// State keys: "<hook>.bucket<i>.residual", "<hook>.bucket<i>.meta" (elements, rank, world
// size, calls) and "<hook>.bucket<i>.var.<name>". Integers and float64 scalars are stored
// bit-exactly as pairs of float32 bit patterns (never as float32 numbers: a checkpoint must
// restore a counter of 2^24+1).
const (
	keyResidual = "residual"
	keyMeta     = "meta"
	keyVar      = "var."
)

func packU64(v uint64) []float32 {
	return []float32{math.Float32frombits(uint32(v)), math.Float32frombits(uint32(v >> 32))}
}

func unpackU64(f []float32) uint64 {
	return uint64(math.Float32bits(f[0])) | uint64(math.Float32bits(f[1]))<<32
}

// State returns every bucket's state (ddp.Stateful).
func (m *Memory) State() (map[string][]float32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := map[string][]float32{}
	save := func(s *BucketState, rank, size int) {
		pre := fmt.Sprintf("%s.bucket%d.", m.hook, s.Index)
		st[pre+keyResidual] = append([]float32(nil), s.Residual...)
		var meta []float32
		for _, v := range []int64{int64(len(s.Residual)), int64(rank), int64(size), s.Calls} {
			meta = append(meta, packU64(uint64(v))...)
		}
		st[pre+keyMeta] = meta
		for name, v := range s.vars {
			st[pre+keyVar+name] = packU64(math.Float64bits(v))
		}
	}
	for _, s := range m.buckets {
		save(s, m.rank, m.size)
	}
	for _, s := range m.loaded { // restored but not run yet: keep it for the next checkpoint
		save(s, s.rank, s.size)
	}
	return st, nil
}

// LoadState replaces the state with a saved one (ddp.Stateful). Keys of other hooks are an
// error; the buckets are checked against the plan when they first run.
func (m *Memory) LoadState(st map[string][]float32) error {
	loaded := map[int]*BucketState{}
	get := func(i int) *BucketState {
		if loaded[i] == nil {
			loaded[i] = &BucketState{Index: i, rank: -1}
		}
		return loaded[i]
	}
	keys := make([]string, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	metaSeen := map[int]bool{}
	for _, k := range keys {
		rest, ok := strings.CutPrefix(k, m.hook+".bucket")
		if !ok {
			return fmt.Errorf("hooks: %s: LoadState: key %q is not %s state", m.hook, k, m.hook)
		}
		num, field, ok := strings.Cut(rest, ".")
		i, err := strconv.Atoi(num)
		if !ok || err != nil || i < 0 {
			return fmt.Errorf("hooks: %s: LoadState: malformed key %q", m.hook, k)
		}
		v := st[k]
		s := get(i)
		switch {
		case field == keyResidual:
			s.Residual = append([]float32(nil), v...)
		case field == keyMeta:
			if len(v) != 8 {
				return fmt.Errorf("hooks: %s: LoadState: %q has %d values, want 8", m.hook, k, len(v))
			}
			s.rank, s.size, s.Calls = int(unpackU64(v[2:])), int(unpackU64(v[4:])), int64(unpackU64(v[6:]))
			if n := int(unpackU64(v)); n != len(st[m.hook+".bucket"+num+"."+keyResidual]) {
				return fmt.Errorf("hooks: %s: LoadState: bucket %d: meta says %d elements, residual has %d", m.hook, i, n, len(st[m.hook+".bucket"+num+"."+keyResidual]))
			}
			metaSeen[i] = true
		case strings.HasPrefix(field, keyVar) && len(v) == 2:
			s.SetVar(strings.TrimPrefix(field, keyVar), math.Float64frombits(unpackU64(v)))
		default:
			return fmt.Errorf("hooks: %s: LoadState: unknown key %q", m.hook, k)
		}
	}
	for i := range loaded {
		if !metaSeen[i] {
			return fmt.Errorf("hooks: %s: LoadState: bucket %d has no %s entry", m.hook, i, keyMeta)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.buckets = map[int]*BucketState{}
	m.loaded = loaded
	return nil
}
