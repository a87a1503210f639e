//go:build linux

package comm

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Multi-process tests of the shared-memory transport: P copies of this test binary join one
// job through NewShm, in a temporary directory instead of /dev/shm so that tests never meet.
// The children are `<test binary> -test.run=^TestShmHelperProcess$` with the job in the
// environment; each prints lines the parent reads.

const shmRoleVar = "SPARGO_SHM_TEST_ROLE"

// shmChildTimeout is the children's peer failure timeout.
const shmChildTimeout = time.Second

func TestShmHelperProcess(t *testing.T) {
	role := os.Getenv(shmRoleVar)
	if role == "" {
		return
	}
	os.Exit(shmChild(role))
}

func shmChildEnv(name string) int {
	v, _ := strconv.Atoi(os.Getenv(name))
	return v
}

// shmChild is one rank: "allreduce" checks all-reduces and prints a hash of their results;
// "loop" all-reduces until it fails, alternating the shared all-reduce and the ring (point to
// point), and prints the error; "loop-shared" does so with its vector in a shared buffer.
func shmChild(role string) int {
	secret, _ := hex.DecodeString(os.Getenv("SPARGO_SHM_TEST_SECRET"))
	cfg := ShmConfig{
		Rank: shmChildEnv("SPARGO_SHM_TEST_RANK"), Size: shmChildEnv("SPARGO_SHM_TEST_SIZE"),
		Job: os.Getenv("SPARGO_SHM_TEST_JOB"), Secret: secret, Dir: os.Getenv("SPARGO_SHM_TEST_DIR"),
		Timeout: shmChildTimeout, JoinTimeout: 30 * time.Second, Logf: func(string, ...any) {},
	}
	if role == "allreduce" {
		cfg.ReduceBytes = 64 << 10 // many passes
	}
	ctx := context.Background()
	g, err := NewShm(ctx, cfg)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	defer g.Close()
	switch role {
	case "allreduce":
		h := fnv.New64a()
		for _, n := range shmMultiprocSizes {
			for _, alg := range []Algorithm{Auto, Ring} {
				v := rankData(uint64(n), g.Rank(), n)
				if err := AllReduce(ctx, g, 1, v, alg); err != nil {
					fmt.Println("ERR", err)
					return 1
				}
				if alg == Auto {
					h.Write(F32Bytes(v))
				}
			}
		}
		// The same vectors again, in a shared buffer: summed in place (every length), the same bits.
		zeroCopyMin = 0
		shared, err := AllocShared[float32](ctx, g, 2, slices.Max(shmMultiprocSizes))
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		for _, n := range shmMultiprocSizes {
			v := shared[:n]
			copy(v, rankData(uint64(n), g.Rank(), n))
			if err := AllReduce(ctx, g, 1, v, Auto); err != nil {
				fmt.Println("ERR", err)
				return 1
			}
			h.Write(F32Bytes(v))
		}
		if in := shmUnder(g).ar.inPlace.Load(); in != uint64(len(shmMultiprocSizes)) {
			fmt.Println("ERR", in, "all-reduces in place, want", len(shmMultiprocSizes))
			return 1
		}
		fmt.Printf("OK %x\n", h.Sum64())
	case "bench":
		// One line per size: this rank's median time of a barrier-separated all-reduce.
		for _, size := range []int{4 << 10, 1 << 20, 64 << 20} {
			v := make([]float32, size/4)
			iters := map[int]int{4 << 10: 200, 1 << 20: 50, 64 << 20: 10}[size]
			var times []time.Duration
			for i := range iters + 2 {
				if err := Barrier(ctx, g, 2); err != nil {
					fmt.Println("ERR", err)
					return 1
				}
				start := time.Now()
				if err := AllReduce(ctx, g, 1, v, Auto); err != nil {
					fmt.Println("ERR", err)
					return 1
				}
				if i >= 2 {
					times = append(times, time.Since(start))
				}
			}
			slices.Sort(times)
			fmt.Printf("%d %d\n", size, times[len(times)/2].Nanoseconds())
		}
	case "loop", "loop-shared":
		v := make([]float32, 1<<20)
		if role == "loop-shared" {
			if v, err = AllocShared[float32](ctx, g, 2, 1<<20); err != nil {
				fmt.Println("ERR", err)
				return 1
			}
		}
		for i := 0; ; i++ {
			alg := Auto
			if i%2 == 1 {
				alg = Ring
			}
			if err := AllReduce(ctx, g, 1, v, alg); err != nil {
				fmt.Println("ERR", err)
				return 1
			}
			if i == 1 {
				fmt.Println("READY")
			}
		}
	}
	return 0
}

var shmMultiprocSizes = []int{1, 7, 1000, 100_000, 300_001}

// shmJob is a job of P child processes.
type shmJob struct {
	dir   string
	cmds  []*exec.Cmd
	lines []chan string
	ended []chan time.Time
}

func startShmJob(t *testing.T, p int, role string) *shmJob {
	t.Helper()
	j := &shmJob{dir: t.TempDir()}
	job := fmt.Sprintf("test-%d-%d", os.Getpid(), time.Now().UnixNano())
	for r := range p {
		cmd := exec.Command(os.Args[0], "-test.run=^TestShmHelperProcess$")
		cmd.Env = append(os.Environ(), shmRoleVar+"="+role,
			"SPARGO_SHM_TEST_RANK="+strconv.Itoa(r), "SPARGO_SHM_TEST_SIZE="+strconv.Itoa(p),
			"SPARGO_SHM_TEST_JOB="+job, "SPARGO_SHM_TEST_SECRET="+hex.EncodeToString([]byte("s3cret")),
			"SPARGO_SHM_TEST_DIR="+j.dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines, ended := make(chan string, 16), make(chan time.Time, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
			cmd.Wait()
			ended <- time.Now()
		}()
		j.cmds, j.lines, j.ended = append(j.cmds, cmd), append(j.lines, lines), append(j.ended, ended)
	}
	t.Cleanup(func() {
		for _, c := range j.cmds {
			c.Process.Kill()
		}
	})
	return j
}

// line is rank r's next line, or "" after d.
func (j *shmJob) line(r int, d time.Duration) string {
	select {
	case l := <-j.lines[r]:
		return l
	case <-time.After(d):
		return ""
	}
}

// checkEmptyDir fails the test if the job left a file behind.
func (j *shmJob) checkEmptyDir(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind in the shared-memory directory: %s", e.Name())
	}
}

// An all-reduce across 2 and 4 processes gives every rank the same bits: the pairwise sum of
// the ranks' vectors in rank order.
func TestShmMultiProcessAllReduce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, p := range []int{2, 4} {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			j := startShmJob(t, p, "allreduce")
			h := fnv.New64a()
			for range 2 { // in ordinary memory, then in a shared buffer
				for _, n := range shmMultiprocSizes {
					h.Write(F32Bytes(treeSum(p, func(r int) []float32 { return rankData(uint64(n), r, n) })))
				}
			}
			want := fmt.Sprintf("OK %x", h.Sum64())
			for r := range p {
				if got := j.line(r, time.Minute); got != want {
					t.Errorf("rank %d: %q, want %q", r, got, want)
				}
			}
			for r := range p {
				<-j.ended[r]
			}
			j.checkEmptyDir(t)
		})
	}
}

// A rank killed (SIGKILL) or stopped (SIGSTOP) in the middle of the all-reduces: the others
// fail within the timeout with an error naming it, and the job leaves nothing behind.
func TestShmMultiProcessFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	cases := []struct {
		name   string
		sig    syscall.Signal
		within time.Duration // after the signal
		want   string
	}{
		{"kill", syscall.SIGKILL, shmChildTimeout, "is gone"},
		{"stop", syscall.SIGSTOP, 2 * shmChildTimeout, "silent for 1s"},
	}
	for _, c := range cases {
		for _, run := range []struct {
			p    int
			role string
		}{{2, "loop"}, {4, "loop"}, {4, "loop-shared"}} {
			p := run.p
			t.Run(fmt.Sprintf("%s/P=%d/%s", c.name, p, run.role), func(t *testing.T) {
				j := startShmJob(t, p, run.role)
				for r := range p {
					if l := j.line(r, time.Minute); l != "READY" {
						t.Fatalf("rank %d: %q, want READY", r, l)
					}
				}
				victim := p - 1
				time.Sleep(20 * time.Millisecond)
				if err := j.cmds[victim].Process.Signal(c.sig); err != nil {
					t.Fatal(err)
				}
				signalled := time.Now()
				var wg sync.WaitGroup
				for r := range victim {
					wg.Go(func() {
						// A loaded machine gets slack: the bound checked below is the tight one.
						l := j.line(r, 10*c.within+10*time.Second)
						var ended time.Time
						select {
						case ended = <-j.ended[r]:
						case <-time.After(10 * time.Second):
							t.Errorf("rank %d did not exit", r)
							return
						}
						want := fmt.Sprintf("peer rank %d failed", victim)
						if !strings.HasPrefix(l, "ERR ") || !strings.Contains(l, want) || !strings.Contains(l, c.want) {
							t.Errorf("rank %d: %q, want an error with %q and %q", r, l, want, c.want)
						}
						if d := ended.Sub(signalled); d > c.within+500*time.Millisecond {
							t.Errorf("rank %d: failed %v after the signal, want within %v", r, d, c.within)
						} else {
							t.Logf("rank %d failed %v after the signal: %s", r, d.Round(time.Millisecond), l)
						}
					})
				}
				wg.Wait()
				j.cmds[victim].Process.Kill()
				<-j.ended[victim]
				j.checkEmptyDir(t)
			})
		}
	}
}

// TestShmMultiProcessBench measures the all-reduce between P processes on this host (median
// over iterations of the slowest rank's median), with SPARGO_SHM_BENCH=1:
//
//	SPARGO_SHM_BENCH=1 go test ./comm -run TestShmMultiProcessBench -v
func TestShmMultiProcessBench(t *testing.T) {
	if os.Getenv("SPARGO_SHM_BENCH") == "" {
		t.Skip("a measurement: set SPARGO_SHM_BENCH=1")
	}
	for _, p := range []int{2, 4} {
		j := startShmJob(t, p, "bench")
		worst := map[int]int64{}
		var sizes []int
		for r := range p {
			for range 3 {
				var size int
				var ns int64
				if _, err := fmt.Sscan(j.line(r, 5*time.Minute), &size, &ns); err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				if _, ok := worst[size]; !ok {
					sizes = append(sizes, size)
				}
				worst[size] = max(worst[size], ns)
			}
		}
		for _, size := range sizes {
			d := time.Duration(worst[size])
			t.Logf("shm P=%d %s: median %v, algbw %.1f MB/s", p, sizeName(size), d, float64(size)/d.Seconds()/1e6)
		}
	}
}

// treeSum is the shared all-reduce's sum of p vectors: pairwise, in rank order.
func treeSum(p int, vec func(r int) []float32) []float32 {
	ops := make([][]float32, p)
	for r := range p {
		ops[r] = vec(r)
	}
	if p == 1 {
		return ops[0]
	}
	treeReduce(ops, nil, addInto)
	return ops[0]
}
