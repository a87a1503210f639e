package gradrec

import (
	"fmt"
	"os"
	"slices"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// Schedule selects the recorded iterations: windows of Steps consecutive iterations that
// start at iterations 0, Every, 2·Every, … (Every 0: only the first window). Consecutive
// iterations keep what happens from one call to the next (residuals, thresholds, top-k
// sets that persist) in the recording.
type Schedule struct {
	Every int // the -record-every flag
	Steps int // the -record-steps flag
}

// Check reports a schedule that records nothing or whose windows overlap.
func (s Schedule) Check() error {
	if s.Steps < 1 {
		return fmt.Errorf("-record-steps %d: want at least 1", s.Steps)
	}
	if s.Every < 0 || (s.Every > 0 && s.Every < s.Steps) {
		return fmt.Errorf("-record-every %d: want 0 (only the first %d iterations) or at least -record-steps %d", s.Every, s.Steps, s.Steps)
	}
	return nil
}

// Records reports whether iteration iter is recorded.
func (s Schedule) Records(iter int64) bool {
	if s.Every == 0 {
		return iter < int64(s.Steps)
	}
	return iter%int64(s.Every) < int64(s.Steps)
}

// Config configures a Recorder.
type Config struct {
	// Dir receives the files; it is created if needed.
	Dir      string
	Schedule Schedule
	// Model and Hook describe the run in the metadata.
	Model, Hook string
	// Params are the model's parameters in declaration order (nn.Parameters(model), what
	// DDP.Parameters returns).
	Params []*nn.Param
}

// Recorder writes one rank's bucket inputs at the scheduled iterations. It implements
// ddp.BucketObserver; use one per rank (DDP calls it from that rank's communication
// goroutine, one bucket at a time).
type Recorder struct {
	cfg    Config
	index  map[*nn.Param]int
	layout *Layout // set at the first recorded iteration (the world size and the plan are known then)

	iter    int64       // iteration being collected
	grads   [][]float32 // its gradients per parameter
	buckets [][]int     // and its plan
	// Written counts the files written so far.
	Written int
}

var _ ddp.BucketObserver = (*Recorder)(nil)

// NewRecorder checks cfg and creates cfg.Dir.
func NewRecorder(cfg Config) (*Recorder, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("-record-grads: no directory given")
	}
	if err := cfg.Schedule.Check(); err != nil {
		return nil, err
	}
	if len(cfg.Params) == 0 {
		return nil, fmt.Errorf("gradrec: no parameters to record")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("-record-grads: %w", err)
	}
	r := &Recorder{cfg: cfg, index: make(map[*nn.Param]int, len(cfg.Params)), iter: -1}
	for i, p := range cfg.Params {
		r.index[p] = i
	}
	return r, nil
}

// ObserveBucket copies b's local gradients when b's iteration is scheduled and, at the
// iteration's last bucket, writes the rank's file.
func (r *Recorder) ObserveBucket(g comm.Group, b ddp.Bucket) error {
	it := b.Iteration()
	if !r.cfg.Schedule.Records(it) {
		return nil
	}
	if it != r.iter {
		r.iter, r.buckets = it, r.buckets[:0]
		r.grads = make([][]float32, len(r.cfg.Params))
	}
	flat, offs := b.Flat(), b.Offsets()
	var idx []int
	for i, p := range b.Params() {
		pi, ok := r.index[p]
		if !ok {
			return fmt.Errorf("gradrec: bucket %d holds parameter %s, which is not in the recorder's parameters", b.Index(), p.Name)
		}
		r.grads[pi] = slices.Clone(flat[offs[i] : offs[i]+p.Len()])
		idx = append(idx, pi)
	}
	r.buckets = append(r.buckets, idx)
	if !b.IsLast() {
		return nil
	}
	if r.layout == nil {
		l := &Layout{Model: r.cfg.Model, Hook: r.cfg.Hook, World: g.Size()}
		for _, p := range r.cfg.Params {
			l.Names = append(l.Names, p.Name)
			l.Shapes = append(l.Shapes, slices.Clone(p.Value.Shape))
		}
		r.layout = l
	}
	r.layout.Buckets = r.buckets // the plan is fixed for a DDP's life; kept per file all the same
	for i, gr := range r.grads {
		if gr == nil {
			return fmt.Errorf("gradrec: iteration %d: parameter %s was in no bucket", it, r.cfg.Params[i].Name)
		}
	}
	if err := WriteIteration(r.cfg.Dir, r.layout, g.Rank(), it, r.grads); err != nil {
		return err
	}
	r.Written++
	r.grads = nil
	return nil
}
