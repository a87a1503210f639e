// Package ddp is spargo's DistributedDataParallel: it wraps one model replica per rank,
// turns the autograd tape's grad-ready hooks into gradient buckets, and hands each
// complete bucket to a pluggable CommHook while the rest of backward runs.
//
//	dp, err := ddp.New(ctx, model, group, ddp.WithCommHook(hooks.MustParse("allreduce")))
//	opt, _ := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.01, Momentum: 0.9})
//	for b, err := range loader.Epoch(ctx, epoch) {
//		tape.Reset()
//		opt.ZeroGrad()
//		loss := nn.CrossEntropy(dp.Forward(tape.Const(x)), b.Y)
//		if err := dp.Backward(ctx, loss); err != nil { … } // returns with averaged gradients
//		opt.Step()
//	}
//
// What New does: checks that every rank has the same parameter names and shapes (the
// error names the first difference and the ranks), broadcasts rank 0's parameters and
// buffers, and builds the bucket plan — PyTorch's size-capped plan by default (reverse
// declaration order, a 1 MiB first bucket, 25 MiB after), a fixed plan with WithPlan,
// or the hook's own when it implements Planner.
//
// What Backward does: the Reducer copies each parameter's gradient into its bucket the
// moment the tape reports it final; a bucket whose gradients are all in, and whose
// predecessors have been launched, goes to the comm hook on DDP's communication
// goroutine (one bucket in flight at a time, in plan order, on every rank). Parameters
// the forward did not use are reduced with their unchanged gradients after backward.
// Backward returns when every bucket's averaged result is in the parameters' Grad, and
// after broadcasting rank 0's BatchNorm statistics (WithBroadcastBuffers), so replicas
// stay bit-identical in parameters and buffers. Stats reports per-bucket sizes and
// ready / communication times for the last iteration.
//
// NoSync runs backward passes without communication for gradient accumulation.
//
// MeasureProfile measures, before New, what cost-model planners need (OMGS-SGD): when each
// parameter's gradient becomes ready in backward, the top-k selection's cost on this CPU
// (γ·n·log2 n) and the all-gather's on this group (α + β·bytes), every rank getting rank 0's
// numbers. A hook that plans from it implements ProfiledPlanner; pass the profile with
// WithProfile. A Profile prints (%v, %+v) and saves as JSON (Save, LoadProfile) for reuse.
package ddp
