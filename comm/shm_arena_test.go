//go:build linux

package comm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// onRanks runs f on every rank concurrently and fails the test with the first error.
func onRanks(t *testing.T, groups []Group, f func(r int, g Group) error) {
	t.Helper()
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() { errs[r] = f(r, g) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// inPlaceCalls is how many shared all-reduces of rank g read the peers' vectors in place.
func inPlaceCalls(g Group) uint64 { return shmUnder(g).ar.inPlace.Load() }

// Vectors in shared buffers are summed in place, with the bits and counters of the copying way,
// for float32 (whose addition may write a third slice) and for AllReduceOf's other element types.
func TestAllocSharedAllReduce(t *testing.T) {
	ctx := context.Background()
	defer func(m int) { zeroCopyMin = m }(zeroCopyMin)
	zeroCopyMin = 0 // every length in place
	for _, p := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			groups := newShm(t, p, func(c *ShmConfig) { c.ReduceBytes = 64 << 10 })
			const capacity = 300_001 + 64
			shared := make([][]float32, p)
			wide := make([][]int64, p)
			onRanks(t, groups, func(r int, g Group) (err error) {
				if shared[r], err = AllocShared[float32](ctx, g, 1, capacity); err != nil {
					return err
				}
				wide[r], err = AllocShared[int64](ctx, g, 2, 1000)
				return err
			})
			for r := range p {
				if _, _, ok := shmUnder(groups[r]).arenaOf(unsafe.Pointer(&shared[r][0]), 4*capacity); !ok {
					t.Fatalf("rank %d: AllocShared gave memory outside the shared buffers", r)
				}
			}
			for _, n := range []int{1, 7, 1000, 300_001} {
				for _, at := range []int{0, 64} { // the vector at the same offset on every rank
					want := treeSum(p, func(r int) []float32 { return rankData(uint64(n), r, n) })
					snap := func() []Stats {
						s := make([]Stats, p)
						for r, g := range groups {
							s[r] = g.Counters().Snapshot()
						}
						return s
					}
					s0 := snap()
					private := make([][]float32, p)
					onRanks(t, groups, func(r int, g Group) error {
						private[r] = rankData(uint64(n), r, n)
						return AllReduce(ctx, g, 3, private[r], SharedMemory)
					})
					s1 := snap()
					calls := inPlaceCalls(groups[0])
					onRanks(t, groups, func(r int, g Group) error {
						v := shared[r][at : at+n]
						copy(v, rankData(uint64(n), r, n))
						return AllReduce(ctx, g, 3, v, SharedMemory)
					})
					if got := inPlaceCalls(groups[0]) - calls; got != 1 {
						t.Fatalf("n=%d at %d: %d in-place calls, want 1", n, at, got)
					}
					s2 := snap()
					for r := range groups {
						v := shared[r][at : at+n]
						for i := range want {
							if v[i] != want[i] || private[r][i] != want[i] {
								t.Fatalf("n=%d at %d rank %d element %d: shared %v, private %v, want %v", n, at, r, i, v[i], private[r][i], want[i])
							}
						}
						if n <= 8000 { // one pass of the copying way: the same traffic
							if in, cp := s2[r].Sub(s1[r]), s1[r].Sub(s0[r]); in != cp {
								t.Errorf("n=%d rank %d: counters in place %+v, copying %+v", n, r, in, cp)
							}
						}
					}
				}
			}
			// AllReduceOf on int64 (an add that writes one of its operands only).
			onRanks(t, groups, func(r int, g Group) error {
				for i := range wide[r] {
					wide[r][i] = int64(i*(r+1) - 7*r)
				}
				return AllReduceOf(ctx, g, 4, wide[r], func(dst, a, b []int64) {
					for i := range dst {
						dst[i] = a[i] + b[i]
					}
				}, SharedMemory)
			})
			for r := range p {
				for i, v := range wide[r] {
					want := int64(0)
					for q := range p {
						want += int64(i*(q+1) - 7*q)
					}
					if v != want {
						t.Fatalf("int64 rank %d element %d = %d, want %d", r, i, v, want)
					}
				}
			}
		})
	}
}

// Vectors that are not in shared buffers on every rank at the same offset are copied, with the
// same result: one rank's vector in ordinary memory, the ranks' vectors at different offsets, a
// vector shorter than zeroCopyMin.
func TestAllocSharedMixed(t *testing.T) {
	ctx := context.Background()
	const p, n = 3, 20000
	groups := newShm(t, p)
	shared := make([][]float32, p)
	onRanks(t, groups, func(r int, g Group) (err error) {
		shared[r], err = AllocShared[float32](ctx, g, 1, 2*n)
		return err
	})
	cases := map[string]func(r int) []float32{
		"rank 1 private": func(r int) []float32 {
			return map[bool][]float32{true: make([]float32, n), false: shared[r][:n]}[r == 1]
		},
		"offsets differ":    func(r int) []float32 { return shared[r][r : r+n] },
		"every rank shared": func(r int) []float32 { return shared[r][n:] },
		"short":             func(r int) []float32 { return shared[r][n : n+zeroCopyMin/4-1] }, // below zeroCopyMin
	}
	for name, vec := range cases {
		calls := inPlaceCalls(groups[0])
		got := make([][]float32, p)
		m := len(vec(0))
		want := treeSum(p, func(r int) []float32 { return rankData(9, r, m) })
		onRanks(t, groups, func(r int, g Group) error {
			got[r] = vec(r)
			copy(got[r], rankData(9, r, m))
			return AllReduce(ctx, g, 2, got[r], Auto)
		})
		for r := range p {
			for i := range want {
				if got[r][i] != want[i] {
					t.Fatalf("%s: rank %d element %d = %v, want %v", name, r, i, got[r][i], want[i])
				}
			}
		}
		if in, wantIn := inPlaceCalls(groups[0])-calls, map[bool]uint64{true: 1}[name == "every rank shared"]; in != wantIn {
			t.Errorf("%s: %d calls in place, want %d", name, in, wantIn)
		}
	}
}

// Shared buffers keep their contents and stay usable after Close, and the job leaves no file.
func TestAllocSharedAfterClose(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	groups, err := newShmLocal(ctx, 2, func(c *ShmConfig) { c.Dir = dir })
	if err != nil {
		t.Fatal(err)
	}
	bufs := make([][]float64, 2)
	onRanks(t, groups, func(r int, g Group) (err error) {
		if bufs[r], err = AllocShared[float64](ctx, g, 1, zeroCopyMin/8+10); err != nil {
			return err
		}
		for i := range bufs[r] {
			bufs[r][i] = float64(i + r)
		}
		return AllReduceOf(ctx, g, 2, bufs[r], func(dst, a, b []float64) {
			for i := range dst {
				dst[i] = a[i] + b[i]
			}
		}, Auto)
	})
	if in := inPlaceCalls(groups[0]); in != 1 {
		t.Fatalf("%d calls in place, want 1", in)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files while the job runs: %v", ents)
	}
	closeAll(groups)
	for r, b := range bufs {
		for i, v := range b {
			if v != float64(2*i+1) {
				t.Fatalf("rank %d element %d = %v after Close, want %v", r, i, v, 2*i+1)
			}
		}
	}
	bufs[0][0] = -1 // still writable, and private now
	if bufs[1][0] != 1 {
		t.Errorf("rank 1's buffer changed with rank 0's after Close")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// A rank that cannot make its file (here a directory is in the way): every rank gets ordinary
// memory, the reason is logged, and the all-reduce works.
func TestAllocSharedFallsBack(t *testing.T) {
	ctx := context.Background()
	var logged sync.Map
	groups := newShm(t, 2, func(c *ShmConfig) {
		c.Logf = func(format string, args ...any) { logged.Store(fmt.Sprintf(format, args...), true) }
	})
	blocker := shmUnder(groups[1]).arenaFile(0, 1)
	if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	bufs := make([][]float32, 2)
	onRanks(t, groups, func(r int, g Group) (err error) {
		if bufs[r], err = AllocShared[float32](ctx, g, 1, 100); err != nil {
			return err
		}
		copy(bufs[r], rankData(3, r, 100))
		return AllReduce(ctx, g, 2, bufs[r], Auto)
	})
	for r, g := range groups {
		if _, _, ok := shmUnder(g).arenaOf(unsafe.Pointer(&bufs[r][0]), 400); ok || inPlaceCalls(g) != 0 {
			t.Errorf("rank %d: a shared buffer although rank 1 could not make its file", r)
		}
	}
	want := treeSum(2, func(r int) []float32 { return rankData(3, r, 100) })
	for i := range want {
		if bufs[0][i] != want[i] || bufs[1][i] != want[i] {
			t.Fatalf("element %d: %v, %v, want %v", i, bufs[0][i], bufs[1][i], want[i])
		}
	}
	found := false
	logged.Range(func(k, _ any) bool {
		found = found || strings.Contains(k.(string), "rank 1") && strings.Contains(k.(string), "private memory")
		return true
	})
	if !found {
		t.Error("rank 1's reason was not logged")
	}
	if _, err := os.Stat(shmUnder(groups[0]).arenaFile(0, 0)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("rank 0's file is still there: %v", err)
	}
	os.RemoveAll(blocker)
}

// On groups without shared memory AllocShared is make.
func TestAllocSharedElsewhere(t *testing.T) {
	groups, err := NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	v, err := AllocShared[float32](context.Background(), groups[0], 1, 10)
	if err != nil || len(v) != 10 {
		t.Fatalf("%v, %d elements", err, len(v))
	}
	if _, err := AllocShared[float32](context.Background(), groups[0], 1, -1); err == nil {
		t.Error("a negative length was accepted")
	}
}

// A job that died while it made its shared buffers left their files; the next job of the same
// name and secret removes those of dead processes when it creates its segment, not others.
func TestAllocSharedStaleFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := ShmConfig{Job: "stale-arena", Secret: []byte("k"), Dir: dir}
	base := shmPath(cfg)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	me, _ := myStart()
	stale := fmt.Sprintf("%s.b0.r1.%d-%d", base, dead.Process.Pid, uint64(1))
	live := fmt.Sprintf("%s.b0.r0.%d-%d", base, os.Getpid(), me)
	for _, f := range []string{stale, live} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	groups, err := newShmLocal(context.Background(), 2, func(c *ShmConfig) { c.Job, c.Secret, c.Dir = cfg.Job, cfg.Secret, dir })
	if err != nil {
		t.Fatal(err)
	}
	closeAll(groups)
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dead job's file is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live process's file was removed: %v", err)
	}
}
