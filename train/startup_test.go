package train

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
)

// startupRun is a program's settings and what its start-up did, for the Startup tests.
type startupRun struct {
	workers                        int
	progress, resume               bool
	checkpoint                     string
	checkErr, loadErr              error
	calls                          []string
	groups                         []int // the ranks Train got
	launcher                       cluster.Source
	resumeAtTrain, progressAtTrain bool
}

func (r *startupRun) startup() Startup[startupRun, string, *startupRun] {
	return Startup[startupRun, string, *startupRun]{Config: r, Workers: &r.workers, Progress: &r.progress, Resume: &r.resume, Checkpoint: &r.checkpoint,
		Check: func() error {
			r.calls = append(r.calls, "check")
			return r.checkErr
		},
		Load: func(ctx context.Context, stdout, stderr io.Writer) (string, error) {
			r.calls = append(r.calls, "load")
			return "data", r.loadErr
		},
		Train: func(ctx context.Context, c startupRun, groups []comm.Group, data string, stdout, stderr io.Writer, launcher cluster.Source) (*startupRun, error) {
			r.calls = append(r.calls, "train "+data)
			for _, g := range groups {
				r.groups = append(r.groups, g.Rank())
			}
			r.launcher, r.resumeAtTrain, r.progressAtTrain = launcher, c.resume, c.progress
			return r, nil
		}}
}

func TestStartupInProcess(t *testing.T) {
	ctx := context.Background()
	r := &startupRun{workers: 3}
	sum, err := r.startup().InProcess(ctx, io.Discard, io.Discard)
	if err != nil || sum != r {
		t.Fatalf("InProcess: %v, %v", sum, err)
	}
	if want := []string{"check", "load", "train data"}; !slices.Equal(r.calls, want) || !slices.Equal(r.groups, []int{0, 1, 2}) || r.launcher != "" {
		t.Errorf("calls %q, ranks %v, launcher %q; want %q on ranks 0 1 2 without a launcher", r.calls, r.groups, r.launcher, want)
	}
	for _, r := range []*startupRun{{workers: 2, checkErr: errors.New("bad flag")}, {workers: 2, loadErr: errors.New("no data")}} {
		sum, err := r.startup().InProcess(ctx, io.Discard, io.Discard)
		if want := errors.Join(r.checkErr, r.loadErr).Error(); err == nil || err.Error() != want || sum != nil || slices.Contains(r.calls, "train data") {
			t.Errorf("InProcess: %v, %v after %q; want the error %q as it is, before training", sum, err, r.calls, want)
		}
	}
}

// TestStartupProcess runs Process as the only rank of a job that torchrun started.
func TestStartupProcess(t *testing.T) {
	for k, v := range map[string]string{"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"} {
		t.Setenv(k, v)
	}
	ctx := context.Background()
	env := cluster.Env{Source: cluster.SourceTorchrun, WorldSize: 1, RestartCount: 1}
	// A restart without a checkpoint yet starts afresh: Train sees -resume off.
	dir := t.TempDir()
	r := &startupRun{workers: 1, progress: true, resume: true, checkpoint: dir}
	var out strings.Builder
	sum, err := r.startup().Process(ctx, env, &out, io.Discard)
	if err != nil || sum != r {
		t.Fatalf("Process: %v, %v", sum, err)
	}
	if want := []string{"check", "load", "train data"}; !slices.Equal(r.calls, want) || !slices.Equal(r.groups, []int{0}) || r.launcher != cluster.SourceTorchrun ||
		r.resumeAtTrain || !r.progressAtTrain {
		t.Errorf("calls %q, ranks %v, launcher %q, resume %v, progress %v; want %q on rank 0 from torchrun, not resuming, with progress",
			r.calls, r.groups, r.launcher, r.resumeAtTrain, r.progressAtTrain, want)
	}
	if want := "restart 1: no checkpoint in " + dir + " yet: starting afresh\n"; out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
	// The load's error names the rank; the check's and the join's do not.
	for _, tc := range []struct {
		run  *startupRun
		want string
	}{
		{&startupRun{workers: 1, checkErr: errors.New("bad flag")}, "bad flag"},
		{&startupRun{workers: 2}, "joined a group of 1 ranks, expected 2"},
		{&startupRun{workers: 1, loadErr: errors.New("no data")}, "rank 0: no data"},
	} {
		sum, err := tc.run.startup().Process(ctx, env, io.Discard, io.Discard)
		if err == nil || err.Error() != tc.want || sum != nil || slices.Contains(tc.run.calls, "train data") {
			t.Errorf("Process: %v, %v after %q; want the error %q, before training", sum, err, tc.run.calls, tc.want)
		}
	}
	// LoadLaunched replaces Load, and its error stays as it is.
	r = &startupRun{workers: 1}
	s := r.startup()
	s.LoadLaunched = func(ctx context.Context, g comm.Group, env cluster.Env, stdout, stderr io.Writer) (string, error) {
		r.calls = append(r.calls, "load launched")
		return "", errors.New("wait for the data")
	}
	if _, err := s.Process(ctx, env, io.Discard, io.Discard); err == nil || err.Error() != "wait for the data" || !slices.Equal(r.calls, []string{"check", "load launched"}) {
		t.Errorf("Process with LoadLaunched: %v after %q", err, r.calls)
	}
}
