package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func init() {
	// launch-blame: rank BLAMED stalls (as a stopped or partitioned rank does: it never exits
	// by itself); the others print what comm says of it; rank FIRST exits first, once the
	// others have printed (they mark it with a file in MARKS), the others stay blocked as
	// survivors of a failed collective do until they are stopped.
	helperRoles["launch-blame"] = func() int {
		rank, first, blamed := os.Getenv("RANK"), os.Getenv("FIRST"), os.Getenv("BLAMED")
		marks := os.Getenv("MARKS")
		ctx, stop := NotifyContext(context.Background(), "rank "+rank, func(string, ...any) {})
		defer stop()
		if rank != blamed {
			fmt.Fprintf(os.Stderr, "comm: rank %s: %s\n", rank, os.Getenv("SAYS"))
			os.WriteFile(filepath.Join(marks, rank), nil, 0o644)
		}
		if rank == first {
			for n := 0; n < 2000; n++ { // until the others have spoken (at most 20 s)
				ents, _ := os.ReadDir(marks)
				if len(ents) >= countRanks()-1 {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			return 1
		}
		<-ctx.Done()
		return 1
	}
}

func countRanks() int {
	var n int
	fmt.Sscan(os.Getenv("WORLD_SIZE"), &n)
	return n
}

// The launcher names the rank the survivors blame, not the first process to exit, and the
// ranks it had to stop.
func TestLaunchNamesTheBlamedRank(t *testing.T) {
	for _, tc := range []struct {
		name          string
		n, first, bad int
		says          string
		want          string
	}{
		{"partitioned rank 2", 4, 1, 2, "peer rank 2 failed: silent for 5s",
			"rank 2 failed: silent for 5s (reported by ranks 0, 1, 3); the first to exit was rank 1: exit status 1"},
		{"reported by a goodbye", 3, 0, 2, "recv from rank 1 tag 3: peer rank 2 failed: connection closed without goodbye (reported by rank 1)",
			"rank 2 failed: connection closed without goodbye (reported by ranks 0, 1)"},
		{"a full disk on rank 0", 2, 1, 0, "checkpoint: rank 0 failed to save its part",
			"rank 0 failed: failed to save its part (reported by rank 1); the first to exit was rank 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			cfg := launchHelper(t, "launch-blame", tc.n, fmt.Sprintf("FIRST=%d", tc.first), fmt.Sprintf("BLAMED=%d", tc.bad),
				"SAYS="+tc.says, "MARKS="+t.TempDir())
			cfg.Stdout, cfg.Stderr = &out, &out
			cfg.Grace = 5 * time.Second
			err := Launch(testCtx(t), cfg)
			var rankErr *RankError
			if !errors.As(err, &rankErr) || rankErr.Blamed != tc.bad || rankErr.Rank != tc.first || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Launch = %v, want %q\n%s", err, tc.want, out.String())
			}
			var stopped []int
			for r := range tc.n {
				if r != tc.first {
					stopped = append(stopped, r)
				}
			}
			if !slices.Equal(rankErr.Stopped, stopped) || !strings.HasSuffix(err.Error(), "; stopped "+rankList(stopped)) {
				t.Errorf("stopped %v (%v), want %v", rankErr.Stopped, err, stopped)
			}
			if rankErr.Ranks()[0] != tc.bad {
				t.Errorf("Ranks() = %v, want the blamed rank first", rankErr.Ranks())
			}
		})
	}
}

// Lines are matched whole, wherever the PeerError sits in them; a rank that blames itself
// (a peer reported it failed) counts too, and the majority wins.
func TestBlameVerdict(t *testing.T) {
	b := newBlame()
	if r, _, _ := b.verdict(); r != -1 {
		t.Fatalf("nothing said: blamed %d", r)
	}
	b.observe(0, []byte("rank 0: train: step 3: peer rank 1 failed: silent for 5s"))
	b.observe(3, []byte("comm: rank 3: peer rank 2 failed: alive, but sent nothing (reported by rank 0)"))
	b.observe(2, []byte("comm: rank 2: peer rank 0 reports that this rank (2) failed: alive, but sent nothing"))
	b.observe(1, []byte("comm: rank 1: peer rank 2 failed: alive, but sent nothing (reported by rank 0)"))
	b.observe(1, []byte("loss 2.3, nothing failed here"))
	r, by, cause := b.verdict()
	if r != 2 || !slices.Equal(by, []int{1, 2, 3}) || cause != "alive, but sent nothing" {
		t.Fatalf("verdict %d %v %q", r, by, cause)
	}
}
