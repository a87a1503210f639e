package hooks

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/internal/kernels"
)

// PowerSGD is PyTorch's powerSGD_hook (torch/distributed/algorithms/ddp_comm_hooks/
// powerSGD_hook.py, v1.13; Vogels et al., "PowerSGD", NeurIPS 2019) with PowerSGDState's
// options. The first StartIter calls of each bucket divide it by P and all-reduce it (plain
// data parallelism). From then on, per bucket on every rank:
//
//  1. With error feedback, add the bucket's error e to the gradient: M = g + e (the input).
//  2. View each parameter's gradient as a matrix [shape[0], rest]; with r = min(rows, cols,
//     Rank) it is compressed when (rows+cols)·r·MinCompressionRate < rows·cols. The others
//     (all 1-D tensors, for any rate of at least 1) are packed, all-reduced uncompressed and
//     divided by P.
//  3. Q (cols×r per matrix) is the previous call's Q (WarmStart) or, on the first compressed
//     call (every call without WarmStart), standard normal numbers drawn from Seed, the bucket
//     index and the call number, so every rank draws the same Q; orthogonalise Q.
//  4. P = M·Q; all-reduce all the Ps as one vector; orthogonalise each P.
//  5. Q = Mᵀ·P; all-reduce all the Qs as one vector and divide by the world size; keep Q.
//  6. The output is P·Qᵀ, the rank-r approximation of the average (exactly the average when
//     r = min(rows, cols)); with error feedback e = input − output.
//
// Orthogonalisation is PyTorch's Gram-Schmidt loop (each column normalised, then removed from
// the later columns), accumulated in float64; PyTorch switches to Householder QR above rank 2,
// which gives the same column spans and therefore the same output up to rounding (the sign of
// a stored Q column may differ). With OrthogonalizationEpsilon = 0 a zero column stays zero,
// where PyTorch's division yields NaN (its ZeroDivisionError handler never runs for tensors).
//
// Conservation: Σ_r input_r = P·output + Σ_r e_r elementwise, to float rounding, for the
// compressed and the uncompressed tensors alike (PyTorch keeps e = input − average for the
// latter too, which sums to zero over the ranks).
//
// Messages per compressed call: three all-reduces (uncompressed elements, Σ rows·r, Σ cols·r
// floats) through an AllReduceFunc (AllReduce32 unless a 16-bit wrapper set one: then all
// three are 16-bit). State per bucket (ddp.Stateful): the error, the call counter and Q;
// P is recomputed from Q every call and is not state.
//
// Differences from PyTorch: PyTorch counts iterations globally (state.iter, advanced by the
// last bucket), spargo per bucket: the same thing, since every bucket runs once per iteration.
// PyTorch refuses start_powerSGD_iter <= 1 with error feedback or warm start because its DDP
// rebuilds buckets after iteration 1; spargo's plan is fixed, so any StartIter >= 0 works.
// BatchTensorsWithSameShape only batches PyTorch's kernels; the result is the same, and spargo
// multiplies each matrix on its own in both cases.
type PowerSGD struct {
	// Rank is matrix_approximation_rank (>= 1).
	Rank int
	// StartIter is start_powerSGD_iter: calls of a bucket before compression starts.
	StartIter int64
	// MinCompressionRate is min_compression_rate (>= 0).
	MinCompressionRate float64
	// UseErrorFeedback and WarmStart are PowerSGDState's use_error_feedback and warm_start.
	UseErrorFeedback bool
	WarmStart        bool
	// OrthogonalizationEpsilon is added to each column's norm before it is divided (>= 0).
	OrthogonalizationEpsilon float64
	// Seed draws the initial Qs (PowerSGDState's random_seed).
	Seed uint64
	// BatchTensorsWithSameShape is accepted for compatibility; it does not change the result.
	BatchTensorsWithSameShape bool

	mu        sync.Mutex
	mem       *Memory
	buckets   map[int]*powerBucket
	loadedQ   map[int][]float32 // restored Qs not yet claimed by their bucket
	allReduce AllReduceFunc
	// randomQ fills q with the initial Qs of a call (tests replace it with PyTorch's draws).
	randomQ func(seed uint64, bucket int, call int64, q []float32)
	// compression statistics (PyTorch's compression_stats): elements before and after.
	numelBefore, numelAfter int64
}

var (
	_ ddp.CommHook    = (*PowerSGD)(nil)
	_ ddp.Stateful    = (*PowerSGD)(nil)
	_ DenseAllReducer = (*PowerSGD)(nil)
)

// PowerSGDStartIter is PyTorch's default start_powerSGD_iter.
const PowerSGDStartIter = 1000

// NewPowerSGD returns a PowerSGD hook with PyTorch's defaults (rank 1, start at call 1000,
// minimum compression rate 2, error feedback, warm start, epsilon 0, seed 0).
func NewPowerSGD() *PowerSGD {
	return &PowerSGD{Rank: 1, StartIter: PowerSGDStartIter, MinCompressionRate: 2, UseErrorFeedback: true, WarmStart: true}
}

// powerBucket is one bucket's PowerSGD data besides its Memory.
type powerBucket struct {
	haveQ bool      // q holds the previous call's Q (warm start)
	q     []float32 // the Qs of the compressed matrices, concatenated
	p     []float32 // the Ps (scratch: recomputed every call)
	input []float32 // the input, kept for the error
	pack  []float32 // the uncompressed tensors, packed
}

// powerMatrix is one compressed tensor of a bucket: rows×cols at off in the bucket, rank r,
// its P at pOff and its Q at qOff in the bucket's P and Q vectors.
type powerMatrix struct{ off, rows, cols, r, pOff, qOff int }

// powerPlan is how a bucket splits into compressed matrices and uncompressed spans.
type powerPlan struct {
	matrices      []powerMatrix
	spans         [][2]int // offset, length of each uncompressed tensor
	packLen       int
	pLen, qLen    int
	before, after int64
}

// Tag offsets inside a bucket's tag range.
const (
	psgdTagDense = iota
	psgdTagUncompressed
	psgdTagP
	psgdTagQ
)

// Name returns "powersgd".
func (h *PowerSGD) Name() string { return "powersgd" }

func (h *PowerSGD) memory() *Memory { return lazyMemory(&h.mu, &h.mem, "powersgd") }

// SetAllReduce replaces the all-reduce of the uncompressed tensors, P and Q and of the calls
// before StartIter (DenseAllReducer); nil restores AllReduce32.
func (h *PowerSGD) SetAllReduce(fn AllReduceFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.allReduce = fn
}

// CompressionStats returns PyTorch's compression_stats over the compressed calls so far: the
// rate (elements before / after compression; 0 before the first compressed call) and the two
// element counts.
func (h *PowerSGD) CompressionStats() (rate float64, before, after int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.numelAfter > 0 {
		rate = float64(h.numelBefore) / float64(h.numelAfter)
	}
	return rate, h.numelBefore, h.numelAfter
}

func (h *PowerSGD) check() error {
	switch {
	case h.Rank < 1:
		return fmt.Errorf("hooks: powersgd: option rank=%d, want >= 1", h.Rank)
	case h.StartIter < 0:
		return fmt.Errorf("hooks: powersgd: option start_iter=%d, want >= 0", h.StartIter)
	case !(h.MinCompressionRate >= 0) || math.IsInf(h.MinCompressionRate, 0):
		return fmt.Errorf("hooks: powersgd: option min_compression_rate=%v, want a finite number >= 0", h.MinCompressionRate)
	case !(h.OrthogonalizationEpsilon >= 0) || math.IsInf(h.OrthogonalizationEpsilon, 0):
		return fmt.Errorf("hooks: powersgd: option orthogonalization_epsilon=%v, want a finite number >= 0", h.OrthogonalizationEpsilon)
	}
	return nil
}

// Run communicates one bucket.
func (h *PowerSGD) Run(ctx context.Context, g comm.Group, b ddp.Bucket) ddp.Future {
	out, err := h.run(ctx, g, b)
	return result("powersgd", b, out, err)
}

func (h *PowerSGD) run(ctx context.Context, g comm.Group, b ddp.Bucket) ([]float32, error) {
	var pl powerPlan
	st, call, err := beginCall(h.memory(), g, b, h.check, func() (err error) {
		pl, err = h.plan(b)
		return err
	})
	if err != nil {
		return nil, err
	}
	flat := b.Flat()
	h.mu.Lock()
	allReduce := h.allReduce
	h.mu.Unlock()
	if allReduce == nil {
		allReduce = AllReduce32
	}
	world := g.Size()
	tag := b.Tag()
	if call < h.StartIter {
		// PyTorch's _allreduce_fut: divide first, then sum.
		divide(flat, world)
		if err := allReduce(ctx, g, tag+psgdTagDense, flat); err != nil {
			return nil, fmt.Errorf("all-reduce before start_iter: %w", err)
		}
		return flat, nil
	}
	pb, err := h.bucket(b.Index(), pl)
	if err != nil {
		return nil, err
	}
	if h.UseErrorFeedback {
		st.Residual.Compensate(flat)
		pb.input = append(pb.input[:0], flat...)
	}

	// Q: last call's (warm start) or drawn from the shared seed; orthogonalised either way.
	if !h.WarmStart || !pb.haveQ {
		pb.q = resize(pb.q, pl.qLen)
		random := h.randomQ
		if random == nil {
			random = normalQ
		}
		random(h.Seed, b.Index(), call, pb.q)
	}
	for _, m := range pl.matrices {
		orthogonalize(pb.q[m.qOff:m.qOff+m.cols*m.r], m.cols, m.r, h.OrthogonalizationEpsilon)
	}
	// P = M·Q.
	pb.p = resize(pb.p, pl.pLen)
	for _, m := range pl.matrices {
		kernels.Sgemm(false, false, m.rows, m.r, m.cols, 1, flat[m.off:m.off+m.rows*m.cols], m.cols,
			pb.q[m.qOff:m.qOff+m.cols*m.r], m.r, 0, pb.p[m.pOff:m.pOff+m.rows*m.r], m.r)
	}
	// The uncompressed tensors: packed, summed, averaged, unpacked.
	if pl.packLen > 0 {
		pb.pack = resize(pb.pack, pl.packLen)
		at := 0
		for _, s := range pl.spans {
			at += copy(pb.pack[at:], flat[s[0]:s[0]+s[1]])
		}
		if err := allReduce(ctx, g, tag+psgdTagUncompressed, pb.pack); err != nil {
			return nil, fmt.Errorf("all-reduce of %d uncompressed elements: %w", pl.packLen, err)
		}
		divide(pb.pack, world)
		at = 0
		for _, s := range pl.spans {
			at += copy(flat[s[0]:s[0]+s[1]], pb.pack[at:at+s[1]])
		}
	}
	if len(pl.matrices) > 0 {
		if err := allReduce(ctx, g, tag+psgdTagP, pb.p); err != nil {
			return nil, fmt.Errorf("all-reduce of P (%d elements): %w", pl.pLen, err)
		}
		// Q = Mᵀ·P with P orthogonalised.
		for _, m := range pl.matrices {
			pm := pb.p[m.pOff : m.pOff+m.rows*m.r]
			orthogonalize(pm, m.rows, m.r, h.OrthogonalizationEpsilon)
			kernels.Sgemm(true, false, m.cols, m.r, m.rows, 1, flat[m.off:m.off+m.rows*m.cols], m.cols,
				pm, m.r, 0, pb.q[m.qOff:m.qOff+m.cols*m.r], m.r)
		}
		if err := allReduce(ctx, g, tag+psgdTagQ, pb.q); err != nil {
			return nil, fmt.Errorf("all-reduce of Q (%d elements): %w", pl.qLen, err)
		}
		divide(pb.q, world)
		// The approximation P·Qᵀ replaces M.
		for _, m := range pl.matrices {
			kernels.Sgemm(false, true, m.rows, m.cols, m.r, 1, pb.p[m.pOff:m.pOff+m.rows*m.r], m.r,
				pb.q[m.qOff:m.qOff+m.cols*m.r], m.r, 0, flat[m.off:m.off+m.rows*m.cols], m.cols)
		}
	}
	if h.UseErrorFeedback {
		st.Residual.UpdateDense(pb.input, flat)
	}
	h.mu.Lock()
	pb.haveQ = h.WarmStart
	h.numelBefore += pl.before
	h.numelAfter += pl.after
	h.mu.Unlock()
	return flat, nil
}

// plan splits b into compressed matrices and uncompressed spans by PyTorch's _should_compress.
// A bucket without parameters (only Flat) is one 1-D tensor.
func (h *PowerSGD) plan(b ddp.Bucket) (powerPlan, error) {
	var pl powerPlan
	n := len(b.Flat())
	params, offs := b.Params(), b.Offsets()
	if len(params) == 0 {
		if n > 0 {
			pl.spans, pl.packLen = [][2]int{{0, n}}, n
		}
		pl.before, pl.after = int64(n), int64(n)
		return pl, nil
	}
	if len(offs) != len(params) {
		return pl, fmt.Errorf("%d parameters but %d offsets", len(params), len(offs))
	}
	for i, p := range params {
		off, l := offs[i], p.Len()
		if off < 0 || off+l > n {
			return pl, fmt.Errorf("parameter %s (%d elements at offset %d) lies outside the bucket of %d elements", p.Name, l, off, n)
		}
		rows, cols := l, 1 // 0-D and 1-D tensors
		if shape := p.Value.Shape; len(shape) >= 2 && shape[0] > 0 {
			rows, cols = shape[0], l/shape[0]
		}
		r := min(rows, cols, h.Rank)
		full, compressed := int64(rows)*int64(cols), int64(rows+cols)*int64(r)
		pl.before += full
		if l > 0 && float64(compressed)*h.MinCompressionRate < float64(full) {
			pl.matrices = append(pl.matrices, powerMatrix{off: off, rows: rows, cols: cols, r: r, pOff: pl.pLen, qOff: pl.qLen})
			pl.pLen += rows * r
			pl.qLen += cols * r
			pl.after += compressed
		} else {
			pl.spans = append(pl.spans, [2]int{off, l})
			pl.packLen += l
			pl.after += full
		}
	}
	return pl, nil
}

// bucket returns the PowerSGD data of bucket idx, claiming a restored Q and checking that Q
// fits the plan.
func (h *PowerSGD) bucket(idx int, pl powerPlan) (*powerBucket, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.buckets == nil {
		h.buckets = map[int]*powerBucket{}
	}
	pb := h.buckets[idx]
	if pb == nil {
		pb = &powerBucket{}
		h.buckets[idx] = pb
		if q, ok := h.loadedQ[idx]; ok {
			delete(h.loadedQ, idx)
			if len(q) != pl.qLen {
				return nil, fmt.Errorf("restored Q has %d values, the bucket's matrices need %d: state saved with another rank or bucket plan", len(q), pl.qLen)
			}
			pb.q, pb.haveQ = q, true
		}
	}
	if pb.haveQ && len(pb.q) != pl.qLen {
		return nil, fmt.Errorf("Q has %d values, the bucket's matrices need %d: the bucket plan changed", len(pb.q), pl.qLen)
	}
	return pb, nil
}

// normalQ fills q with standard normal numbers from a generator seeded by (seed, bucket,
// call): every rank draws the same numbers.
func normalQ(seed uint64, bucket int, call int64, q []float32) {
	rng := rand.New(rand.NewPCG(seed, uint64(bucket)*0x9e3779b97f4a7c15^uint64(call)))
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
}

// orthogonalize makes the columns of the rows×cols row-major matrix a orthonormal by
// PyTorch's _orthogonalize_gram_schmidt: column i is divided by its norm (plus eps), then its
// projection is removed from columns i+1..; sums in float64. With eps = 0 a zero column stays
// zero.
func orthogonalize(a []float32, rows, cols int, eps float64) {
	w := make([]float64, rows*cols)
	for i, x := range a[:rows*cols] {
		w[i] = float64(x)
	}
	for i := range cols {
		var ss float64
		for k := range rows {
			ss += w[k*cols+i] * w[k*cols+i]
		}
		d := math.Sqrt(ss) + eps
		for k := range rows {
			if d == 0 {
				w[k*cols+i] = 0
			} else {
				w[k*cols+i] /= d
			}
		}
		for j := i + 1; j < cols; j++ {
			var dot float64
			for k := range rows {
				dot += w[k*cols+i] * w[k*cols+j]
			}
			for k := range rows {
				w[k*cols+j] -= dot * w[k*cols+i]
			}
		}
	}
	for i, x := range w {
		a[i] = float32(x)
	}
}

// divide sets x[i] /= p (a true division, as torch's div_).
func divide(x []float32, p int) {
	if p == 1 {
		return
	}
	d := float32(p)
	for i := range x {
		x[i] /= d
	}
}

// resize returns s with length n, reusing its storage when it is large enough.
func resize(s []float32, n int) []float32 {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]float32, n)
}

// State keys of Q: "powersgd.bucket<i>.q"; the rest is the Memory's (error, meta with the call
// counter).
const psgdQKey = "q"

// State returns every bucket's error, call counter and Q (ddp.Stateful).
func (h *PowerSGD) State() (map[string][]float32, error) {
	st, err := h.memory().State()
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for idx, pb := range h.buckets {
		if pb.haveQ {
			st[fmt.Sprintf("powersgd.bucket%d.%s", idx, psgdQKey)] = slices.Clone(pb.q)
		}
	}
	for idx, q := range h.loadedQ {
		st[fmt.Sprintf("powersgd.bucket%d.%s", idx, psgdQKey)] = slices.Clone(q)
	}
	return st, nil
}

// LoadState restores State's output (ddp.Stateful). Each bucket is checked against the plan
// when it first runs.
func (h *PowerSGD) LoadState(st map[string][]float32) error {
	rest := map[string][]float32{}
	qs := map[int][]float32{}
	for k, v := range st {
		num, okPrefix := strings.CutPrefix(k, "powersgd.bucket")
		num, okSuffix := strings.CutSuffix(num, "."+psgdQKey)
		if !okPrefix || !okSuffix {
			rest[k] = v
			continue
		}
		i, err := strconv.Atoi(num)
		if err != nil || i < 0 {
			return fmt.Errorf("hooks: powersgd: LoadState: malformed key %q", k)
		}
		if _, ok := st[fmt.Sprintf("powersgd.bucket%d.%s", i, keyMeta)]; !ok {
			return fmt.Errorf("hooks: powersgd: LoadState: bucket %d has a Q but no %s entry", i, keyMeta)
		}
		qs[i] = slices.Clone(v)
	}
	if err := h.memory().LoadState(rest); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buckets = map[int]*powerBucket{}
	h.loadedQ = qs
	return nil
}

// boolOption parses a true/false option.
func boolOption(o Values, name string) (bool, error) {
	v, err := strconv.ParseBool(o.String(name))
	if err != nil {
		return false, fmt.Errorf("hooks: %s: option %s=%q is not true or false", o.hook, name, o.String(name))
	}
	return v, nil
}

func init() {
	Register(Spec{
		Name: "powersgd",
		Summary: "PyTorch's powerSGD_hook: rank-r approximation P·Qᵀ of each ≥2-D gradient by one power iteration " +
			"(all-reduce P, orthogonalise, all-reduce Q), warm start, error feedback; other tensors all-reduced; " +
			"plain all-reduce for the first start_iter iterations",
		Options: []Option{
			{Name: "rank", Default: "1", Help: "matrix_approximation_rank r"},
			{Name: "start_iter", Default: strconv.Itoa(PowerSGDStartIter), Help: "start_powerSGD_iter: iterations of plain all-reduce first (PyTorch's default; short runs need fewer)"},
			{Name: "min_compression_rate", Default: "2", Help: "compress a rows×cols tensor only if (rows+cols)·r·rate < rows·cols"},
			{Name: "use_error_feedback", Default: "true", Help: "keep input − output per bucket and add it next time"},
			{Name: "warm_start", Default: "true", Help: "start each power iteration from the last Q"},
			{Name: "orthogonalization_epsilon", Default: "0", Help: "added to column norms in Gram-Schmidt"},
			{Name: "seed", Default: "0", Help: "random_seed of the initial Qs (the same on every rank)"},
			{Name: "batch_tensors_with_same_shape", Default: "false", Help: "accepted; PyTorch's kernel batching, no effect on the result"},
		},
		New: func(o Values) (ddp.CommHook, error) {
			h := NewPowerSGD()
			var err error
			if h.Rank, err = o.Int("rank"); err != nil {
				return nil, err
			}
			start, err := o.Int("start_iter")
			if err != nil {
				return nil, err
			}
			h.StartIter = int64(start)
			if h.MinCompressionRate, err = o.Float("min_compression_rate"); err != nil {
				return nil, err
			}
			if h.UseErrorFeedback, err = boolOption(o, "use_error_feedback"); err != nil {
				return nil, err
			}
			if h.WarmStart, err = boolOption(o, "warm_start"); err != nil {
				return nil, err
			}
			if h.OrthogonalizationEpsilon, err = o.Float("orthogonalization_epsilon"); err != nil {
				return nil, err
			}
			if h.Seed, err = strconv.ParseUint(o.String("seed"), 10, 64); err != nil {
				return nil, fmt.Errorf("hooks: powersgd: option seed=%q is not a non-negative integer", o.String("seed"))
			}
			if h.BatchTensorsWithSameShape, err = boolOption(o, "batch_tensors_with_same_shape"); err != nil {
				return nil, err
			}
			return h, h.check()
		},
	})
}
