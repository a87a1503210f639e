package train

import (
	"context"
	"fmt"
	"io"

	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/comm"
)

// Startup is how a program starts a run, the same in every program: InProcess checks the
// settings, loads the data and trains with Workers ranks in this process; Process checks the
// settings, joins a launched job as one of its ranks (JoinJob: rank 0 alone prints), loads
// the data, resumes by itself when the launcher restarted the job (AutoResume) and trains
// that rank. C is the program's settings (its config), D its data, S the result of its run
// (its summary). Config is the run's own copy of the settings, which Check completes and
// the start-up updates (Progress, Resume) before Train gets it; the other pointers point
// into it:
//
//	func (c *Config) startup() train.Startup[Config, *Data, *Summary] {
//		return train.Startup[Config, *Data, *Summary]{Config: c, Workers: &c.Workers, Progress: &c.Progress,
//			Resume: &c.Resume, Checkpoint: &c.Checkpoint, Check: c.check, Load: c.load, Train: trainRanks}
//	}
//	func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Summary, error) {
//		return c.startup().InProcess(ctx, stdout, stderr)
//	}
type Startup[C, D, S any] struct {
	// Config is the run's settings: Train gets them as they are when it starts.
	Config *C
	// Workers is the run's world size (-workers): the ranks in this process, or the
	// launched job's ranks, one per process.
	Workers *int
	// Progress is -progress; Process sets it to what JoinJob returns.
	Progress *bool
	// Resume and Checkpoint are -resume and -checkpoint; Process sets Resume to AutoResume's
	// decision.
	Resume     *bool
	Checkpoint *string
	// Check refuses bad settings before any data is looked for (and before Process joins the
	// job).
	Check func() error
	// Load finds and reads the data and describes it on stdout (io.Discard on a launched
	// job's ranks other than 0). Process prefixes its error with "rank N: ".
	Load func(ctx context.Context, stdout, stderr io.Writer) (D, error)
	// LoadLaunched, when set, is Process's load in Load's place: a launched rank's, on its
	// group g (e.g. the first rank of each host first, so that one process per host
	// downloads); Process returns its error as it is.
	LoadLaunched func(ctx context.Context, g comm.Group, env cluster.Env, stdout, stderr io.Writer) (D, error)
	// Train trains this process's ranks of the job with the settings c (a copy of *Config)
	// on data: groups are all of them in-process, or the launched rank's one; launcher is who
	// started the processes (empty in-process).
	Train func(ctx context.Context, c C, groups []comm.Group, data D, stdout, stderr io.Writer, launcher cluster.Source) (S, error)
}

// InProcess trains with *Workers in-process ranks, each on its own goroutine: Check, Load,
// then Train on *Workers local groups (comm.NewLocal).
func (s Startup[C, D, S]) InProcess(ctx context.Context, stdout, stderr io.Writer) (S, error) {
	var none S
	if err := s.Check(); err != nil {
		return none, err
	}
	data, err := s.Load(ctx, stdout, stderr)
	if err != nil {
		return none, err
	}
	groups, err := comm.NewLocal(*s.Workers)
	if err != nil {
		return none, err
	}
	return s.Train(ctx, *s.Config, groups, data, stdout, stderr, "")
}

// Process trains this process's rank of a launched job (env from cluster.DetectEnv,
// *Workers its world size): Check, JoinJob (closed at the end, CloseGroup), Load (or
// LoadLaunched), AutoResume, then Train on the rank's group. Rank 0 prints; the other ranks'
// stdout is io.Discard.
func (s Startup[C, D, S]) Process(ctx context.Context, env cluster.Env, stdout, stderr io.Writer) (sum S, err error) {
	if err := s.Check(); err != nil {
		return sum, err
	}
	g, stdout, progress, err := JoinJob(ctx, *s.Workers, stdout, stderr, *s.Progress)
	if err != nil {
		return sum, err
	}
	defer CloseGroup(g, &err)
	*s.Progress = progress
	var data D
	if s.LoadLaunched != nil {
		data, err = s.LoadLaunched(ctx, g, env, stdout, stderr)
	} else if data, err = s.Load(ctx, stdout, stderr); err != nil {
		err = fmt.Errorf("rank %d: %w", g.Rank(), err)
	}
	if err != nil {
		return sum, err
	}
	// Restarted by the launcher: continue from the last checkpoint, if the failed attempt left one.
	if *s.Resume, err = AutoResume(*s.Resume, *s.Checkpoint, env.RestartCount, stdout); err != nil {
		return sum, err
	}
	return s.Train(ctx, *s.Config, []comm.Group{g}, data, stdout, stderr, env.Source)
}
