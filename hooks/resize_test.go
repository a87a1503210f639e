package hooks

import (
	"strings"
	"testing"
)

// oldState is the Memory state of one bucket of n values saved by rank of world, with a
// call counter and a named scalar.
func oldState(t *testing.T, rank, world int, residual []float32) map[string][]float32 {
	t.Helper()
	m := NewMemory("oktopk")
	m.rank, m.size, m.bound = rank, world, true
	s := &BucketState{Index: 0, Residual: residual, Calls: 7}
	s.SetVar(varLocalTh, 0.5)
	m.buckets[0] = s
	st, err := m.State()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Redistribute sums the sources' residuals (float64, rounded once), resets the counters and
// scalars, and refuses a source that does not map to the rank or a bucket of another size.
func TestMemoryRedistribute(t *testing.T) {
	m := NewMemory("oktopk")
	reset, err := m.Redistribute([]map[string][]float32{
		oldState(t, 1, 4, []float32{1, 1e8, -2}),
		oldState(t, 3, 4, []float32{0.5, 1, 2}),
	}, 4, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reset, "call counters") || !strings.Contains(reset, varLocalTh) {
		t.Fatalf("reset %q, want the counters and %s named", reset, varLocalTh)
	}
	st, err := m.State()
	if err != nil {
		t.Fatal(err)
	}
	got := st["oktopk.bucket0.residual"]
	if want := []float32{1.5, float32(1e8 + 1.0), 0}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("residual %v, want %v", got, want)
	}
	for k := range st {
		if strings.Contains(k, ".var.") {
			t.Fatalf("scalar %s survived the redistribution", k)
		}
	}
	if meta := st["oktopk.bucket0.meta"]; unpackU64(meta[2:]) != 1 || unpackU64(meta[4:]) != 2 || unpackU64(meta[6:]) != 0 {
		t.Fatalf("meta: rank %d of %d, %d calls; want rank 1 of 2, 0 calls", unpackU64(meta[2:]), unpackU64(meta[4:]), unpackU64(meta[6:]))
	}

	_, err = NewMemory("oktopk").Redistribute([]map[string][]float32{oldState(t, 2, 4, []float32{1})}, 4, 1, 2)
	if err == nil || !strings.Contains(err.Error(), "rank 2 of 4, which does not map to rank 1 of 2") {
		t.Fatalf("a source of old rank 2 for new rank 1 of 2: %v", err)
	}
	_, err = NewMemory("oktopk").Redistribute([]map[string][]float32{
		oldState(t, 1, 4, []float32{1}), oldState(t, 3, 4, []float32{1, 2}),
	}, 4, 1, 2)
	if err == nil || !strings.Contains(err.Error(), "bucket 0 has 1 elements on one old rank, 2 on old rank 3") {
		t.Fatalf("buckets of 1 and 2 elements: %v", err)
	}
}
