package hooks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// testBucket is a ddp.Bucket without parameters, for driving hooks directly.
type testBucket struct {
	idx  int
	iter int64
	last bool
	flat []float32
}

func (b *testBucket) Index() int          { return b.idx }
func (b *testBucket) Iteration() int64    { return b.iter }
func (b *testBucket) IsLast() bool        { return b.last }
func (b *testBucket) Flat() []float32     { return b.flat }
func (b *testBucket) Params() []*nn.Param { return nil }
func (b *testBucket) Offsets() []int      { return nil }
func (b *testBucket) Tag() uint32         { return 1<<16 + uint32(b.idx)*ddp.TagsPerBucket }

// world is P in-process ranks, each with its own hook instance.
type world struct {
	groups []comm.Group
	hooks  []ddp.CommHook
}

func newWorld(t testing.TB, p int, spec string) *world {
	t.Helper()
	groups, err := comm.NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{groups: groups}
	for range p {
		h, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		w.hooks = append(w.hooks, h)
	}
	return w
}

// call runs one call of every rank's hook on bucket idx with grads[r] (copied) and returns
// the outputs and each rank's traffic during the call.
func (w *world) call(t testing.TB, idx int, grads [][]float32) ([][]float32, []comm.Stats) {
	t.Helper()
	outs, stats, err := w.try(idx, grads)
	if err != nil {
		t.Fatal(err)
	}
	return outs, stats
}

func (w *world) try(idx int, grads [][]float32) ([][]float32, []comm.Stats, error) {
	p := len(w.groups)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	outs := make([][]float32, p)
	stats := make([]comm.Stats, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() {
			before := w.groups[r].Counters().Snapshot()
			b := &testBucket{idx: idx, last: true, flat: slices.Clone(grads[r])}
			res, err := w.hooks[r].Run(ctx, w.groups[r], b).Wait()
			stats[r] = w.groups[r].Counters().Snapshot().Sub(before)
			if err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				return
			}
			if len(res) != len(grads[r]) {
				errs[r] = fmt.Errorf("rank %d: %d values for a bucket of %d", r, len(res), len(grads[r]))
			}
			outs[r] = slices.Clone(res)
		})
	}
	wg.Wait()
	return outs, stats, errors.Join(errs...)
}

// residual returns rank r's residual of bucket idx (a copy), or zeros before the first call.
func (w *world) residual(r, idx, n int) []float32 {
	m := hookMemory(w.hooks[r])
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.buckets[idx]; ok {
		return slices.Clone(s.Residual)
	}
	return make([]float32, n)
}

func hookMemory(h ddp.CommHook) *Memory {
	m, ok := h.(interface{ memory() *Memory })
	if !ok {
		panic(fmt.Sprintf("no memory in %T", h))
	}
	return m.memory()
}

// heavyTailed returns rank r's gradient: Student-t-like values (a normal over the square root
// of a uniform), so a few entries dominate as in real gradients; every entry is non-zero.
func heavyTailed(seed uint64, r, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	v := make([]float32, n)
	for i := range v {
		x := float32(rng.NormFloat64() / math.Sqrt(rng.Float64()+1e-3))
		if x == 0 {
			x = 1e-3
		}
		v[i] = x
	}
	return v
}

func grads(seed uint64, p, n int) [][]float32 {
	gs := make([][]float32, p)
	for r := range gs {
		gs[r] = heavyTailed(seed, r, n)
	}
	return gs
}

// checkConservation is the test of ALGORITHMS.md §0: with T = Σ_r (g_r + ξ_r) before the call,
// S = P·output and ξ'_r after, S + Σ ξ'_r = T elementwise up to float rounding.
func checkConservation(t testing.TB, what string, gs, before, after [][]float32, out []float32) {
	t.Helper()
	p := len(gs)
	for i := range out {
		var tsum, abs float64
		for r := range p {
			x := float64(gs[r][i]) + float64(before[r][i])
			tsum += x
			abs += math.Abs(float64(gs[r][i])) + math.Abs(float64(before[r][i]))
		}
		s := float64(out[i]) * float64(p)
		got := s
		for r := range p {
			got += float64(after[r][i])
			abs += math.Abs(float64(after[r][i]))
		}
		abs += math.Abs(s)
		if tol := 4 * float64(p) * 6e-8 * abs; math.Abs(got-tsum) > tol {
			t.Fatalf("%s: element %d: S + Σξ' = %v, T = %v (S = %v; tolerance %g): a contribution was lost or counted twice", what, i, got, tsum, s, tol)
		}
	}
}

// checkIdentical requires bit-identical outputs on every rank.
func checkIdentical(t testing.TB, what string, outs [][]float32) {
	t.Helper()
	for r := 1; r < len(outs); r++ {
		for i := range outs[0] {
			if math.Float32bits(outs[r][i]) != math.Float32bits(outs[0][i]) {
				t.Fatalf("%s: rank %d element %d = %v, rank 0 has %v: replicas differ", what, r, i, outs[r][i], outs[0][i])
			}
		}
	}
}

func maxStats(stats []comm.Stats) (rounds, wordsRecv int64) {
	for _, s := range stats {
		rounds = max(rounds, s.Rounds)
		wordsRecv = max(wordsRecv, s.BytesRecv/4)
	}
	return rounds, wordsRecv
}

func ceilLog2(p int) int {
	l := 0
	for 1<<l < p {
		l++
	}
	return l
}

func nnz(v []float32) int {
	c := 0
	for _, x := range v {
		if x != 0 {
			c++
		}
	}
	return c
}
