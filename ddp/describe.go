package ddp

import "fmt"

// A hook describes what DDP must know about it through small optional interfaces, as a
// hook that chooses its buckets implements Planner: DDP (and the programs that set up a run)
// ask the hook instead of switching on its concrete type.

// WorldSizeChecker is implemented by hooks that run only at some world sizes: gTopk's tree
// needs a power of two, SparDL's teams=T needs T to divide P. CheckWorldSize says why the
// hook cannot run on p ranks, or nil when it can. New refuses such a hook before any message
// is sent, on every rank alike.
type WorldSizeChecker interface {
	CheckWorldSize(p int) error
}

// CheckWorldSize returns h's refusal to run on p ranks (naming the hook and P), or nil when
// h can run there or does not say: what New checks, for programs that run hooks without a
// DDP (benchmarks, simulators) or want to ask before building one.
func CheckWorldSize(h CommHook, p int) error {
	c, ok := h.(WorldSizeChecker)
	if !ok {
		return nil
	}
	if err := c.CheckWorldSize(p); err != nil {
		return fmt.Errorf("ddp: hook %s cannot run at world size P=%d: %w", h.Name(), p, err)
	}
	return nil
}

// CorrectorNeeder is implemented by hooks that deliver part of their result late and, to
// train on the dense run's values (LGP), need the optimizer installed with SetCorrector:
// NeedsCorrector reports whether this configuration of the hook does (OSP with lgp=true). A
// program whose optimizer is not a Corrector refuses such a hook, and Backward refuses to run
// it before SetCorrector (an error naming the hook and the call to make).
type CorrectorNeeder interface {
	NeedsCorrector() bool
}

// NeedsCorrector reports whether h asks for a Corrector (CorrectorNeeder).
func NeedsCorrector(h CommHook) bool {
	c, ok := h.(CorrectorNeeder)
	return ok && c.NeedsCorrector()
}

// checkCorrector refuses to run a hook that needs the optimizer's cooperation (LGP) before
// SetCorrector: without it the hook's deferred parameters would train on lagging values.
func (d *DDP) checkCorrector() error {
	if d.late.corrector != nil || !NeedsCorrector(d.cfg.hook) {
		return nil
	}
	return fmt.Errorf("ddp: rank %d: hook %s needs the optimizer's cooperation (local-gradient prediction): "+
		"call dp.SetCorrector(opt) before the first Backward (optim.SGD is a Corrector), or turn the prediction off in the hook's spec (osp:lgp=false)",
		d.group.Rank(), d.cfg.hook.Name())
}
