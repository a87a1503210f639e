package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/gradrec"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// gradSource supplies the gradients of bench comm's calls: per call and worker, one slice per
// parameter in declaration order. One call is one iteration: every bucket of the hook's plan,
// in order. A source holds the workers it was made for (all P in-process, its own in a rank
// of a launched job), numbered 0, 1, … in the order they were given.
type gradSource struct {
	// params are the parameters in declaration order: the hooks plan their buckets from them
	// (ddp's size-capped plan unless the hook is a Planner), as DDP would.
	params []*nn.Param
	// calls is how many calls the source has (0: any number, every call the same gradients).
	calls int
	// iteration is the Bucket.Iteration of call c.
	iteration func(c int) int64
	// load returns held worker w's gradients of call c; the bench copies them into its buckets.
	load func(c, w int) ([][]float32, error)
}

// singleBucketSource is the synthetic source of -n: one parameter of n elements, so one bucket.
func singleBucketSource(n int, grads [][]float32) *gradSource {
	p := nn.NewParam("grad", n)
	return &gradSource{params: []*nn.Param{p}, iteration: func(c int) int64 { return int64(c) },
		load: func(_, w int) ([][]float32, error) { return [][]float32{grads[w]}, nil }}
}

// modelSource is the synthetic source of -model for the given workers: the model's
// parameters, each worker's synthetic gradient cut into them in declaration order.
func modelSource(name string, seed uint64, workers []int) (*gradSource, error) {
	m, err := models.New(name, nn.NewRand(0))
	if err != nil {
		return nil, fmt.Errorf("-model: %w", err)
	}
	params := nn.Parameters(m) // only their names and shapes are used
	grads := syntheticGradients(seed, nn.NumParams(params), workers)
	views := make([][][]float32, len(grads))
	for w, g := range grads {
		for _, p := range params {
			views[w] = append(views[w], g[:p.Len():p.Len()])
			g = g[p.Len():]
		}
	}
	return &gradSource{params: params, iteration: func(c int) int64 { return int64(c) },
		load: func(_, w int) ([][]float32, error) { return views[w], nil }}, nil
}

// recordedSource replays rec for the given workers of p: worker r gets recorded rank r mod
// rec.World. Fewer workers than rec.World take the first ranks; more must be a multiple of
// it, so that every recorded rank is replayed equally often (reused ranks' gradients are
// identical, which raises the overlap: say so when reporting).
func recordedSource(rec *gradrec.Recording, p int, workers []int) (*gradSource, error) {
	if p > rec.World && p%rec.World != 0 {
		return nil, fmt.Errorf("-workers %d: the recording in %s has P=%d ranks; replay the first W ≤ %d of them, or reuse each rank with a multiple of %d workers",
			p, rec.Dir, rec.World, rec.World, rec.World)
	}
	return &gradSource{params: rec.Params(), calls: len(rec.Iterations),
		iteration: func(c int) int64 { return rec.Iterations[c] },
		load:      func(c, w int) ([][]float32, error) { return rec.Load(rec.Iterations[c], workers[w]%rec.World) }}, nil
}

// hookPlan is the bucket plan DDP would use for h: the hook's own when it is a Planner that
// returns one, else PyTorch's size-capped default.
func hookPlan(h ddp.CommHook, params []*nn.Param) ([][]int, error) {
	if p, ok := h.(ddp.Planner); ok {
		plan, err := p.Plan(params)
		if err != nil {
			return nil, fmt.Errorf("planning buckets: %w", err)
		}
		if plan != nil {
			return plan, nil
		}
	}
	return ddp.SizeCappedPlan(params, ddp.DefaultFirstBucketBytes, ddp.DefaultBucketBytesCap), nil
}

// benchBucket is one bucket of one worker, as DDP's Reducer would hand it to the hook.
type benchBucket struct {
	index   int
	iter    int64
	last    bool
	flat    []float32
	params  []*nn.Param
	offsets []int
	members []int // declaration indices of params
}

func (b *benchBucket) Index() int          { return b.index }
func (b *benchBucket) Iteration() int64    { return b.iter }
func (b *benchBucket) IsLast() bool        { return b.last }
func (b *benchBucket) Flat() []float32     { return b.flat }
func (b *benchBucket) Params() []*nn.Param { return b.params }
func (b *benchBucket) Offsets() []int      { return b.offsets }
func (b *benchBucket) Tag() uint32         { return 1<<16 + uint32(b.index)*ddp.TagsPerBucket }

// newBenchBuckets builds plan's buckets over consecutive slices of flat (nil: ordinary
// memory), which holds at least the plan's elements.
func newBenchBuckets(params []*nn.Param, plan [][]int, flat []float32) []*benchBucket {
	if flat == nil {
		flat = make([]float32, planElements(params, plan))
	}
	bs := make([]*benchBucket, len(plan))
	for i, group := range plan {
		b := &benchBucket{index: i, last: i == len(plan)-1, members: group}
		n := 0
		for _, pi := range group {
			b.params = append(b.params, params[pi])
			b.offsets = append(b.offsets, n)
			n += params[pi].Len()
		}
		b.flat, flat = flat[:n:n], flat[n:]
		bs[i] = b
	}
	return bs
}

// planElements is the number of gradient elements plan's buckets hold.
func planElements(params []*nn.Param, plan [][]int) int {
	n := 0
	for _, group := range plan {
		for _, pi := range group {
			n += params[pi].Len()
		}
	}
	return n
}

// benchOptions are what benchHook needs besides the hook and the gradients.
type benchOptions struct {
	workers, warmup, iters int
	// overlapDensity > 0 also measures the top-k overlap at that density (overlapTracker).
	overlapDensity float64
	// transport is "local" (default) or "tcp" (loopback); groups, when set, are used instead
	// and left open (spargo simulate -validate reuses its calibrated TCP groups).
	transport string
	groups    []comm.Group
}

// benchGroups returns o's groups: the given ones, or new ones of o.transport with their
// closing function.
func benchGroups(o benchOptions) ([]comm.Group, func(), error) {
	if o.groups != nil {
		return o.groups, func() {}, nil
	}
	var groups []comm.Group
	var err error
	if o.transport == "tcp" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		groups, err = comm.NewTCPLoopback(ctx, o.workers, nil)
		cancel()
	} else {
		groups, err = comm.NewLocal(o.workers)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("-transport %s: %w", o.transport, err)
	}
	return groups, func() {
		for _, g := range groups {
			g.Close()
		}
	}, nil
}

// benchHook runs warmup+iters calls of row's hook on o.workers in-process workers; each call
// refills every worker's buckets from src (untimed) and then runs the hook on every bucket in
// plan order, all workers at once, one bucket in flight as in DDP. The time of a call is the
// wall time of all its buckets; counts are the maxima over workers, averaged over the timed
// calls.
func benchHook(row hookRow, src *gradSource, o benchOptions) (commResult, error) {
	p := o.workers
	groups, closeGroups, err := benchGroups(o)
	if err != nil {
		return commResult{}, err
	}
	defer closeGroups()
	hs := make([]ddp.CommHook, p)
	for r := range p {
		if hs[r], err = row.config.New(); err != nil { // one hook per worker
			return commResult{}, err
		}
	}
	plan, err := hookPlan(hs[0], src.params)
	if err != nil {
		return commResult{}, err
	}
	buckets := make([][]*benchBucket, p)
	for r := range p {
		buckets[r] = newBenchBuckets(src.params, plan, nil)
	}
	var overlap *overlapTracker
	if o.overlapDensity > 0 {
		overlap = newOverlapTracker(o.overlapDensity, buckets)
	}
	var times []float64
	var rounds, bytes int64
	for call := range o.warmup + o.iters {
		if err := fill(src, call, buckets); err != nil {
			return commResult{}, err
		}
		timed := call >= o.warmup
		if overlap != nil {
			overlap.observe(timed) // before the hooks, which may use Flat as scratch
		}
		before := make([]comm.Stats, p)
		for r := range p {
			before[r] = groups[r].Counters().Snapshot()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		errs := make([]error, p)
		start := time.Now()
		for bi := range plan {
			var wg sync.WaitGroup
			for r := range p {
				wg.Go(func() {
					if _, err := hs[r].Run(ctx, groups[r], buckets[r][bi]).Wait(); err != nil {
						errs[r] = fmt.Errorf("call %d (iteration %d), bucket %d: %w", call, buckets[r][bi].iter, bi, err)
					}
				})
			}
			wg.Wait()
			if errors.Join(errs...) != nil {
				break
			}
		}
		took := time.Since(start)
		cancel()
		if err := errors.Join(errs...); err != nil {
			return commResult{}, err
		}
		if !timed {
			continue
		}
		times = append(times, float64(took.Nanoseconds())/1e6)
		var callRounds, callBytes int64
		for r := range p {
			s := groups[r].Counters().Snapshot().Sub(before[r])
			callRounds, callBytes = max(callRounds, s.Rounds), max(callBytes, s.BytesRecv)
		}
		rounds += callRounds
		bytes += callBytes
	}
	res := commSummary(row.label, p, nn.NumParams(src.params), len(plan), times, rounds, bytes)
	if overlap != nil {
		u, ov := overlap.result()
		res.UnionK, res.Overlap = &u, &ov
	}
	return res, nil
}

// commSummary is the result of len(times) timed calls of spec on p workers: the median time
// (ms) and the rounds and bytes received per call, whose sums over the calls are given.
func commSummary(spec string, p, n, buckets int, times []float64, rounds, bytes int64) commResult {
	mean := func(sum int64) int64 { return int64(math.Round(float64(sum) / float64(len(times)))) }
	res := commResult{Hook: spec, Workers: p, N: n, TimeMS: median(times), Buckets: buckets,
		Calls: len(times), Rounds: mean(rounds), BytesReceived: mean(bytes)}
	res.WordsReceived = res.BytesReceived / 4
	return res
}

// rankHook is benchHook in one rank of a launched job: this process is worker g.Rank() and
// src holds its gradients only. Each call refills the buckets (untimed), passes a barrier and
// runs the hook on every bucket in plan order, as DDP does; a call's time is the slowest
// rank's and its counts the maxima over ranks, so every rank returns what benchHook would.
// Overlap is not measured (no process sees the others' selections).
//
// The buckets lie in shared buffers, as DDP's (comm.AllocShared, made by the first call into
// *flat, which every rank's call reaches alike, and reused by the next hooks): on one host the
// dense all-reduce reads them in place.
func rankHook(ctx context.Context, g comm.Group, row hookRow, src *gradSource, flat *[]float32, warmup, iters int) (commResult, error) {
	h, err := row.config.New()
	if err != nil {
		return commResult{}, err
	}
	plan, err := hookPlan(h, src.params)
	if err != nil {
		return commResult{}, err
	}
	if *flat == nil {
		if *flat, err = comm.AllocShared[float32](ctx, g, tagBenchAlloc, planElements(src.params, plan)); err != nil {
			return commResult{}, fmt.Errorf("rank %d: %w", g.Rank(), err)
		}
	}
	buckets := [][]*benchBucket{newBenchBuckets(src.params, plan, *flat)}
	var mine []float64 // per timed call: ms, rounds, bytes received, bytes received from other nodes
	for call := range warmup + iters {
		if err := fill(src, call, buckets); err != nil {
			return commResult{}, err
		}
		if err := comm.Barrier(ctx, g, tagBenchBarrier); err != nil {
			return commResult{}, fmt.Errorf("rank %d: %w", g.Rank(), err)
		}
		before := g.Counters().Snapshot()
		start := time.Now()
		for _, b := range buckets[0] {
			if _, err := h.Run(ctx, g, b).Wait(); err != nil {
				return commResult{}, fmt.Errorf("rank %d: call %d (iteration %d), bucket %d: %w", g.Rank(), call, b.iter, b.index, err)
			}
		}
		took := time.Since(start)
		s := g.Counters().Snapshot().Sub(before)
		if call >= warmup {
			mine = append(mine, float64(took.Nanoseconds())/1e6, float64(s.Rounds), float64(s.BytesRecv), float64(s.InterBytesRecv))
		}
	}
	worst, err := allMax(ctx, g, tagBenchTimes, mine)
	if err != nil {
		return commResult{}, err
	}
	times := make([]float64, iters)
	var rounds, bytes, inter int64
	for i := range times {
		times[i] = worst[4*i]
		rounds += int64(worst[4*i+1])
		bytes += int64(worst[4*i+2])
		inter += int64(worst[4*i+3])
	}
	res := commSummary(row.label, g.Size(), nn.NumParams(src.params), len(plan), times, rounds, bytes)
	if top := comm.TopologyOf(g); top.Nodes() > 1 && top.Nodes() < g.Size() {
		// ranks share nodes: what crossed them, per call, the maximum over ranks
		res.Nodes = top.Nodes()
		res.InterWordsReceived = int64(math.Round(float64(inter)/float64(iters))) / 4
		if hh, ok := h.(*hooks.Hier); ok {
			if perNode, err := top.RanksPerNode(); err != nil {
				return commResult{}, err // hier refused to run on it already
			} else if c := hh.CostSplit(res.N, top.Nodes(), perNode); c.InterKnown {
				res.InterFormula = fmt.Sprintf("%s at P=H=%d on ⌈n/L⌉=%d", c.InterExpr, top.Nodes(), c.Shard)
				res.InterFormulaWords = c.Inter
			}
		}
	}
	// The hook has seen the job's topology: hier's formula is the one for its nodes.
	res.Formula, res.FormulaWords = costFormula(h, res.N, g.Size(), row.density)
	return res, nil
}

// fill copies every worker's gradients of call c into its buckets, workers in parallel.
func fill(src *gradSource, c int, buckets [][]*benchBucket) error {
	errs := make([]error, len(buckets))
	var wg sync.WaitGroup
	for w, bs := range buckets {
		wg.Go(func() {
			g, err := src.load(c, w)
			if err != nil {
				errs[w] = err
				return
			}
			for _, b := range bs {
				b.iter = src.iteration(c)
				for i, pi := range b.members {
					copy(b.flat[b.offsets[i]:], g[pi])
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// overlapTracker measures how much the workers' top-k selections agree, the quantity that
// decides the sparse hooks' volumes (a union of P·k positions costs TopkA and the gathers
// P times what one shared set would, and sets SparDL's and Ok-Topk's reduce-scatters how
// much they can merge). Each worker keeps a local error-feedback accumulator per bucket, as
// TopkA does: acc += gradient, select the top k = max(1, int(density·n)) of |acc|, zero
// them in acc. Per timed call and bucket it counts the union of the P selections and the
// positions each pair of workers shares.
type overlapTracker struct {
	density float64
	buckets [][]*benchBucket // worker, bucket
	acc     [][][]float32    // worker, bucket
	count   [][]int32        // bucket: workers that selected each position (zero between calls)
	sel     [][]hooks.COO    // worker, bucket: scratch

	union, pairs, k float64 // sums over timed calls and buckets
}

func newOverlapTracker(density float64, buckets [][]*benchBucket) *overlapTracker {
	t := &overlapTracker{density: density, buckets: buckets}
	for _, bs := range buckets {
		var acc [][]float32
		for _, b := range bs {
			acc = append(acc, make([]float32, len(b.flat)))
		}
		t.acc = append(t.acc, acc)
		t.sel = append(t.sel, make([]hooks.COO, len(bs)))
	}
	for _, b := range buckets[0] {
		t.count = append(t.count, make([]int32, len(b.flat)))
	}
	return t
}

// observe selects every worker's top-k of the current buckets and, when timed, adds the
// union and pair counts.
func (t *overlapTracker) observe(timed bool) {
	var wg sync.WaitGroup
	for w, bs := range t.buckets {
		wg.Go(func() {
			for bi, b := range bs {
				acc := t.acc[w][bi]
				for i, v := range b.flat {
					acc[i] += v
				}
				t.sel[w][bi] = hooks.TopK(t.sel[w][bi], acc, max(1, int(t.density*float64(len(acc)))))
				for _, i := range t.sel[w][bi].Idx {
					acc[i] = 0
				}
			}
		})
	}
	wg.Wait()
	for bi, count := range t.count {
		var union, pairs int
		for w := range t.buckets {
			for _, i := range t.sel[w][bi].Idx {
				pairs += int(count[i]) // this worker shares i with each earlier one
				if count[i] == 0 {
					union++
				}
				count[i]++
			}
		}
		for w := range t.buckets {
			for _, i := range t.sel[w][bi].Idx {
				count[i] = 0
			}
		}
		if timed {
			t.union += float64(union)
			t.pairs += float64(pairs)
			t.k += float64(t.sel[0][bi].Len())
		}
	}
}

// result returns the union of the workers' selections over k (1: all select the same
// positions, P: disjoint) and the mean fraction of k that two workers share (1 with one
// worker).
func (t *overlapTracker) result() (unionK, overlap float64) {
	p := float64(len(t.buckets))
	if t.k == 0 {
		return 0, 0
	}
	if p == 1 {
		return 1, 1
	}
	return t.union / t.k, t.pairs / (p * (p - 1) / 2) / t.k
}
