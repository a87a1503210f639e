package hooks

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm/commtest"
)

func TestCOOWireRoundTrip(t *testing.T) {
	v := COO{Idx: []int32{0, 3, 7, math.MaxInt32 - 1}, Val: []float32{1.5, -2, float32(math.Inf(1)), -0.25}}
	b := v.AppendWire(nil)
	if len(b) != 8*v.Len() {
		t.Fatalf("wire form of %d entries is %d bytes, want 8 each", v.Len(), len(b))
	}
	var got COO
	if err := got.SetWire(b, math.MaxInt32); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Idx, v.Idx) || !slices.Equal(got.Val, v.Val) {
		t.Fatalf("round trip: %v, want %v", got, v)
	}
	if err := got.SetWire(nil, 10); err != nil || got.Len() != 0 {
		t.Fatalf("empty message: %v %v", got, err)
	}
	for _, c := range []struct {
		msg  []byte
		want string
	}{
		{b[:7], "not a whole number"},
		{COO{Idx: []int32{3, 3}, Val: []float32{1, 2}}.AppendWire(nil), "index 3 is not in (3, 10)"},
		{COO{Idx: []int32{10}, Val: []float32{1}}.AppendWire(nil), "index 10 is not in (-1, 10)"},
		{COO{Idx: []int32{-1}, Val: []float32{1}}.AppendWire(nil), "index -1"},
	} {
		if err := got.SetWire(c.msg, 10); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SetWire(%v) = %v, want error containing %q", c.msg, err, c.want)
		}
	}
}

func TestSelections(t *testing.T) {
	x := []float32{0, 3, -5, 0, 3, 1, -3, 0}
	top := TopK(COO{}, x, 3)
	if !slices.Equal(top.Idx, []int32{1, 2, 4}) || !slices.Equal(top.Val, []float32{3, -5, 3}) {
		t.Errorf("TopK(3) = %v: want indices 1 2 4 (ties to the lower index)", top)
	}
	all := TopK(COO{}, x, 100)
	if all.Len() != len(x) {
		t.Errorf("TopK(100) has %d entries, want all %d, zeros included", all.Len(), len(x))
	}
	nz := TopKNonZero(COO{}, x, 7)
	if !slices.Equal(nz.Idx, []int32{1, 2, 4, 5, 6}) {
		t.Errorf("TopKNonZero(7) = %v, want the 5 non-zeros", nz)
	}
	th := Threshold(COO{}, x, 3)
	if !slices.Equal(th.Idx, []int32{1, 2, 4, 6}) || !slices.Equal(th.Val, []float32{3, -5, 3, -3}) {
		t.Errorf("Threshold(3) = %v", th)
	}
	if z := Threshold(COO{}, x, 0); !slices.Equal(z.Idx, NonZeros(COO{}, x).Idx) || z.Len() != 5 {
		t.Errorf("Threshold(0) = %v, want the non-zeros only", z)
	}

	a := COO{Idx: []int32{1, 4, 6}, Val: []float32{1, 2, 3}}
	b := COO{Idx: []int32{0, 4, 9}, Val: []float32{10, 20, 30}}
	m := Merge(COO{}, a, b)
	if !slices.Equal(m.Idx, []int32{0, 1, 4, 6, 9}) || !slices.Equal(m.Val, []float32{10, 1, 22, 3, 30}) {
		t.Errorf("Merge = %v", m)
	}
	kept, dropped := TopKOf(COO{}, COO{}, m, 2)
	if !slices.Equal(kept.Idx, []int32{4, 9}) || !slices.Equal(dropped.Idx, []int32{0, 1, 6}) {
		t.Errorf("TopKOf(2) = %v / %v", kept, dropped)
	}
	dense := make([]float32, 10)
	ScatterAdd(dense, a)
	ScatterAdd(dense, b)
	ScatterSet(dense, COO{Idx: []int32{9}, Val: []float32{-1}})
	if !slices.Equal(dense, []float32{10, 1, 0, 0, 22, 0, 3, 0, 0, -1}) {
		t.Errorf("ScatterAdd/ScatterSet: %v", dense)
	}
	var in []bool
	eachIn([]int32{1, 4, 6}, []int32{0, 4, 5, 6, 7}, func(e int, found bool) { in = append(in, found) })
	if !slices.Equal(in, []bool{false, true, false, true, false}) {
		t.Errorf("eachIn: %v", in)
	}
}

func TestMemorySaveRestore(t *testing.T) {
	groups := commtest.Groups(t, 2)
	g := groups[1]
	m := NewMemory("spardl")
	b0 := &testBucket{idx: 0, flat: make([]float32, 5)}
	b1 := &testBucket{idx: 1, last: true, flat: make([]float32, 3)}
	s0, err := m.Bucket(g, b0)
	if err != nil {
		t.Fatal(err)
	}
	copy(s0.Residual, []float32{1, 2, 3, 4, 5})
	s0.Calls = 1<<24 + 1 // not representable as a float32 number
	s0.SetVar("bsag.h", 12.375)
	if _, err := m.Bucket(g, b1); err != nil {
		t.Fatal(err)
	}
	st, err := m.State()
	if err != nil {
		t.Fatal(err)
	}

	r := NewMemory("spardl")
	if err := r.LoadState(st); err != nil {
		t.Fatal(err)
	}
	got, err := r.Bucket(g, b0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Residual, s0.Residual) || got.Calls != s0.Calls || got.Var("bsag.h", 0) != 12.375 {
		t.Fatalf("restored %+v (h %v), want %+v", got, got.Var("bsag.h", 0), s0)
	}

	// Refusals: another plan, another rank, another hook, another instance's rank.
	check := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want error containing %q", what, err, want)
		}
	}
	r2 := NewMemory("spardl")
	r2.LoadState(st)
	_, err = r2.Bucket(g, &testBucket{idx: 0, flat: make([]float32, 6)})
	check("bucket of another size", err, "state saved under a different bucket plan")
	r3 := NewMemory("spardl")
	r3.LoadState(st)
	_, err = r3.Bucket(groups[0], b0)
	check("another rank", err, "saved by rank 1 of 2, restoring on rank 0 of 2")
	r4 := NewMemory("spardl")
	r4.LoadState(st)
	_, err = r4.Bucket(g, &testBucket{idx: 0, last: true, flat: make([]float32, 5)})
	check("fewer buckets", err, "restored state has bucket 1, the plan ends at bucket 0")
	check("another hook", NewMemory("topka").LoadState(st), "is not topka state")
	_, err = m.Bucket(groups[0], b0)
	check("shared instance", err, "build one hook per rank")
}

// A dense warm-up call is an all-reduce of g + ξ and empties the residual.
func TestDenseWarmup(t *testing.T) {
	const p, n = 3, 50
	w := newWorld(t, p, "spardl:density=0.1,dense_warmup=1")
	gs := grads(1, p, n)
	outs, _ := w.call(t, 0, gs) // dense
	checkIdentical(t, "warm-up", outs)
	for i := range n {
		want := (float64(gs[0][i]) + float64(gs[1][i]) + float64(gs[2][i])) / p
		if math.Abs(float64(outs[0][i])-want) > 1e-5*math.Max(1, math.Abs(want)) {
			t.Fatalf("warm-up output[%d] = %v, want the dense average %v", i, outs[0][i], want)
		}
	}
	outs, _ = w.call(t, 0, gs) // sparse
	if kb := max(1, (n+p-1)/p/10); nnz(outs[0]) > p*kb {
		t.Fatalf("second call has %d non-zeros: not sparse", nnz(outs[0]))
	}
}

// Errors, not panics or hangs: a team count that does not divide P fails on every rank.
func TestSparDLBadTeams(t *testing.T) {
	w := newWorld(t, 4, "spardl:teams=3")
	_, _, err := w.try(0, grads(1, 4, 40))
	if err == nil || !strings.Contains(err.Error(), "teams=3 does not divide the world size P=4") {
		t.Fatalf("teams=3 on 4 ranks: %v", err)
	}
	for spec, want := range map[string]string{
		"spardl:density=0":         "density=0",
		"spardl:density=1.5":       "density=1.5",
		"spardl:density=NaN":       "density=NaN",
		"spardl:density=x":         `density="x" is not a number`,
		"spardl:teams=0":           `teams="0"`,
		"spardl:teams=two":         `teams="two"`,
		"spardl:residual=none":     `residual="none", want one of global|local|partial`,
		"spardl:dense_warmup=-1":   "dense_warmup=-1",
		"spardl:dense_warmup=1.5":  `dense_warmup="1.5" is not an integer`,
		"spardl:bogus=1":           `spardl has no option "bogus"`,
		"topka:density=2":          "option density=2",
		"gtopk:dense_warmup=x":     `dense_warmup="x"`,
		"topkdsa:dense_switch=0.5": `topkdsa has no option "dense_switch"`,
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want error containing %q", spec, err, want)
		}
	}
	_ = context.Background
}

// A rank that never calls costs the others a deadline error, never a hang.
func TestMissingRankDeadline(t *testing.T) {
	for _, spec := range []string{"spardl", "spardl:teams=2", "spardl:teams=3", "topka", "topkdsa", "gtopk"} {
		p := 6
		if spec == "gtopk" {
			p = 4 // power-of-two P only
		}
		w := newWorld(t, p, spec)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		errs := make([]error, p)
		var wg sync.WaitGroup
		for r := 1; r < p; r++ {
			wg.Go(func() {
				_, errs[r] = w.hooks[r].Run(ctx, w.groups[r], &testBucket{last: true, flat: heavyTailed(1, r, 600)}).Wait()
			})
		}
		wg.Wait()
		cancel()
		failed := 0
		for r, err := range errs[1:] {
			if err != nil {
				failed++
				if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "hooks: "+strings.Split(spec, ":")[0]) {
					t.Errorf("%s rank %d: %v, want a deadline error naming the hook", spec, r+1, err)
				}
			}
		}
		if failed == 0 {
			t.Errorf("%s: no rank noticed the missing one", spec)
		}
	}
}
