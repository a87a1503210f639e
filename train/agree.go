package train

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strconv"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/spec"
)

// tagConfigAgree is the tag of the set-up's configuration agreement (the programs' other
// collectives use 99-105; ddp's start-up 1-4, checkpoints 120-150).
const tagConfigAgree = 106

// Fields turns a program's settings (name → value, e.g. its checkpoint.Meta.Config with
// "model", "epochs" and "data" added) into Setup.Agree's fields, sorted by name so that every
// rank lists them in the same order.
func Fields(settings map[string]string) []comm.Field {
	names := make([]string, 0, len(settings))
	for k := range settings {
		names = append(names, k)
	}
	slices.Sort(names)
	fields := make([]comm.Field, len(names))
	for i, k := range names {
		fields[i] = comm.Field{Name: k, Value: settings[k]}
	}
	return fields
}

// MetaFields are a program's fields for Setup.Agree: what resuming its checkpoints requires
// (meta's Model and Config) and more, the settings checkpoints leave out that every rank
// must share all the same (-epochs, evaluation and checkpoint periods, whether the run
// resumes, the data set's identity).
func MetaFields(meta checkpoint.Meta, more map[string]string) []comm.Field {
	m := map[string]string{"model": meta.Model}
	for k, v := range meta.Config {
		m[k] = v
	}
	for k, v := range more {
		m[k] = v
	}
	return Fields(m)
}

// CheckpointFields are the checkpoint settings every rank must share, for MetaFields' more:
// whether there are checkpoints, their period and whether the run resumes (saving and
// resuming are collective).
func CheckpointFields(dir string, every int, resume bool, more map[string]string) map[string]string {
	m := map[string]string{"checkpoint": strconv.FormatBool(dir != ""), "checkpoint_every": strconv.Itoa(every), "resume": strconv.FormatBool(resume)}
	for k, v := range more {
		m[k] = v
	}
	return m
}

// ParamsDigest describes model's parameters and buffers for the agreement: their count, how
// many values they hold and a SHA-256 of every "name shape" line, so that replicas of another
// model, or of the same model built with other sizes, differ here before DDP compares them.
func ParamsDigest(model nn.Module) string {
	h := sha256.New()
	values := 0
	ps := nn.Parameters(model)
	for _, p := range ps {
		fmt.Fprintf(h, "param %s %v\n", p.Name, p.Value.Shape)
		values += p.Len()
	}
	bs := nn.Buffers(model)
	for _, b := range bs {
		fmt.Fprintf(h, "buffer %s %v\n", b.Name, b.Value.Shape)
	}
	return fmt.Sprintf("%d tensors, %d values, %d buffers, sha256 %x", len(ps), values, len(bs), h.Sum(nil)[:8])
}

// agreementFields are the fields every rank must share in the set-up of model on g with the
// hook cfg: the set-up's own (world size, hook, optimizer, schedule, rates, bucket cap, step
// records), then the program's (Setup.Agree, without names already listed), then the
// parameters' digest.
func (s Setup) agreementFields(g comm.Group, model nn.Module, cfg hooks.Config) ([]comm.Field, error) {
	opt, err := s.Flags.OptimizerConfig()
	if err != nil {
		return nil, err
	}
	sched, err := s.Flags.ScheduleConfig()
	if err != nil {
		return nil, err
	}
	fields := []comm.Field{
		{Name: "world", Value: strconv.Itoa(g.Size())},
		{Name: "hook", Value: cfg.String()},
		{Name: "optim", Value: opt.String()},
		{Name: "schedule", Value: sched.String()},
		{Name: "lr", Value: spec.FormatFloat(s.Flags.LR)},
		{Name: "momentum", Value: spec.FormatFloat(s.Flags.Momentum)},
		{Name: "wd", Value: spec.FormatFloat(s.Flags.WD)},
		{Name: "warmup", Value: strconv.Itoa(s.Flags.Warmup)},
		{Name: "bucket_mb", Value: spec.FormatFloat(s.BucketMB)},
		{Name: "log_every", Value: strconv.Itoa(s.Flags.LogEvery)}, // step records are collective
	}
	for _, f := range s.Agree {
		if !slices.ContainsFunc(fields, func(x comm.Field) bool { return x.Name == f.Name }) {
			fields = append(fields, f)
		}
	}
	return append(fields, comm.Field{Name: "params", Value: ParamsDigest(model)}), nil
}

// agree is the set-up's configuration agreement (see Setup.Agree); a mismatch is the
// *comm.ConfigError every rank gets, naming the field, its values and the ranks.
func (s Setup) agree(ctx context.Context, g comm.Group, model nn.Module, cfg hooks.Config) error {
	fields, err := s.agreementFields(g, model, cfg)
	if err != nil {
		return err
	}
	if err := comm.AgreeConfig(ctx, g, tagConfigAgree, fields); err != nil {
		var ce *comm.ConfigError
		if errors.As(err, &ce) {
			return fmt.Errorf("the ranks were started with different settings (every rank must have the same flags): %w", err)
		}
		return err
	}
	return nil
}

// AutoResume says whether a run resumes from its -checkpoint dir: as resume (-resume) says on
// a job's first attempt; on a restart (restartCount > 0: cluster.Env.RestartCount, which
// `spargo launch -restarts` sets as SPARGO_RESTART_COUNT and torchrun's --max_restarts as
// TORCHELASTIC_RESTART_COUNT) with a dir, whenever dir names a complete checkpoint
// (checkpoint.Latest), and not when it names none yet (the failed attempt saved nothing:
// start fresh). Every rank of a restarted job decides alike, since the previous attempt's
// processes are all gone; Setup's agreement compares the decisions all the same ("resume").
// It says which on w.
func AutoResume(resume bool, dir string, restartCount int, w io.Writer) (bool, error) {
	if restartCount <= 0 || dir == "" {
		return resume, nil
	}
	path, err := checkpoint.Latest(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		fmt.Fprintf(w, "restart %d: no checkpoint in %s yet: starting afresh\n", restartCount, dir)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("restart %d: -checkpoint %s: %w", restartCount, dir, err)
	}
	fmt.Fprintf(w, "restart %d: resuming from %s\n", restartCount, path)
	return true, nil
}
