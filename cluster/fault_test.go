package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

func init() {
	// train-stall: DDP training; at step STALL_AT rank STALL_RANK stops taking part: HOW=sigstop
	// stops the process (no heartbeats), HOW=stuck leaves it alive and heartbeating but waiting
	// elsewhere (the ranks out of step, as with a different -steps).
	helperRoles["train-stall"] = func() int {
		return helperMain(func(ctx context.Context, g comm.Group, env Env) error {
			at, _ := strconv.Atoi(os.Getenv("STALL_AT"))
			_, err := trainDDP(ctx, g, -1, func(step int) {
				if step == at && os.Getenv("STALL_RANK") == strconv.Itoa(g.Rank()) {
					fmt.Fprintf(os.Stderr, "rank %d: stalling (%s) at step %d\n", g.Rank(), os.Getenv("HOW"), step)
					if os.Getenv("HOW") == "sigstop" {
						syscall.Kill(os.Getpid(), syscall.SIGSTOP)
					}
					// Stuck in another collective: a receive nobody will send.
					_, err := g.Recv(ctx, (g.Rank()+1)%g.Size(), 77, make([]byte, 1))
					fmt.Fprintf(os.Stderr, "rank %d: FAILED: %v\n", g.Rank(), err)
					os.Exit(1)
				}
				if step == at && os.Getenv("HOW") == "stuck" {
					// The others reach the next collective a second after the stuck rank began
					// its wait, more than the operation watcher's tick (a quarter of the timeout):
					// the stuck rank's timeout fires first, and it finds the others' messages
					// queued under a tag it never asked for. (Timeouts that fire within one tick of
					// each other may name a rank that waits behind the stuck one.)
					time.Sleep(time.Second)
				}
				time.Sleep(2 * time.Millisecond)
			})
			return err
		})
	}
}

// A rank that stalls (stopped by a signal, or alive but out of step) never exits by itself;
// the others fail naming it (the peer timeout, the operation timeout), and the launcher names
// it and says it had to stop it, although another rank exited first.
func TestLaunchBlamesStalledRank(t *testing.T) {
	for _, how := range []string{"sigstop", "stuck"} {
		t.Run(how, func(t *testing.T) {
			var out strings.Builder
			var mu sync.Mutex
			cfg := LaunchConfig{
				NProc:     4,
				Program:   os.Args[0],
				Args:      []string{"-test.run=^TestHelperProcess$"},
				Env:       append(helperEnv("train-stall"), "STALL_RANK=2", "STALL_AT=5", "HOW="+how),
				Timeout:   2 * time.Second,
				OpTimeout: 3 * time.Second,
				Grace:     time.Second,
				Stdout:    &syncWriter{mu: &mu, w: &out},
				Stderr:    &syncWriter{mu: &mu, w: &out},
			}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			start := time.Now()
			err := Launch(ctx, cfg)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			var rankErr *RankError
			// A stopped rank is stopped by the launcher; a stuck one fails by itself once told.
			if !errors.As(err, &rankErr) || rankErr.Blamed != 2 || !strings.HasPrefix(err.Error(), "rank 2 failed: ") || (how == "sigstop") != slices.Contains(rankErr.Stopped, 2) {
				t.Fatalf("Launch = %v\n%s", err, out.String())
			}
			t.Logf("%s: %v after %v", how, err, took.Round(time.Millisecond))
		})
	}
}
