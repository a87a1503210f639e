package overlap

import (
	"fmt"
	"io"
)

// WriteText prints the report as a table, one hook per row, then each hook's trace when there
// is one.
func (r *Report) WriteText(w io.Writer) error {
	lines := []string{
		fmt.Sprintf("model %s (%d parameters in %d tensors), P=%d workers (%s), batch %d per worker; %s",
			r.Model, r.Params, r.Tensors, r.Workers, r.Transport, r.Batch, r.Input),
		fmt.Sprintf("rank 0's DDP timeline, medians of %d iterations after %d warm-up; non-overlapped = all groups reduced − backward ended", r.Iters, r.Warmup),
		fmt.Sprintf("%-32s %-11s %7s %16s %12s %13s %18s", "hook", "plan", "groups", "done_in_backward", "backward_ms", "iteration_ms", "non_overlapped_ms"),
	}
	for _, l := range lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	for _, h := range r.Hooks {
		plan := h.Plan
		if h.Profiled {
			plan += "+profile"
		}
		if _, err := fmt.Fprintf(w, "%-32s %-11s %7d %16.1f %12.1f %13.1f %18.2f\n",
			h.Hook, plan, h.Groups, h.DoneInBackward, h.BackwardMS, h.IterationMS, h.NonOverlappedMS); err != nil {
			return err
		}
	}
	for _, h := range r.Hooks {
		if h.Trace == nil {
			continue
		}
		if err := h.Trace.write(w, h.Hook); err != nil {
			return err
		}
	}
	return nil
}

// write prints one hook's trace: a line per group, ms from the start of backward.
func (t *Trace) write(w io.Writer, hook string) error {
	if _, err := fmt.Fprintf(w, "\n%s: last iteration on rank 0, ms from the start of backward (sent includes waiting for the other ranks; - : dense or not recorded)\n", hook); err != nil {
		return err
	}
	opt := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f", *v)
	}
	for _, g := range t.Groups {
		if _, err := fmt.Fprintf(w, "  group %3d %10d elements: ready %9.2f  hook %9.2f  selected %9s  sent %9s  done %9.2f\n",
			g.Bucket, g.Elements, g.ReadyMS, g.HookMS, opt(g.SelectedMS), opt(g.SentMS), g.DoneMS); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "  backward ended at %.2f, all %d groups done at %.2f\n", t.BackwardEndMS, len(t.Groups), t.EndMS)
	return err
}
