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
// # A script of one's own
//
// Three rules make a training program safe by construction, and DDP enforces the first and
// the third:
//
//   - One hook per rank. A hook keeps the state of the rank it runs on (residuals,
//     thresholds, its rank), so New binds the hook instance to the new DDP and refuses, on
//     every rank alike, an instance that another rank's open DDP holds: build the hook on
//     each rank (hooks.Parse(spec) or hooks.Config.New there). Close frees the instance; a
//     rank that builds its DDP again on the same group takes its hook over. Stateless hook
//     values (AllReduceHook) are copied into each DDP and may be shared.
//   - Every rank closes its group when it returns, however it returns: defer g.Close()
//     (and defer dp.Close()) right after creating them. A rank that returns early or
//     fails then makes the other ranks' pending and later collectives fail with an error
//     naming it (comm.ErrClosed) instead of leaving them blocked in Backward; a rank that
//     fails that way closes its group in turn, so the failure reaches every rank. Close on
//     the DDP does not close the group: the caller owns it.
//   - A hook that needs the optimizer's cooperation (OSP with lgp=true, a CorrectorNeeder)
//     refuses to run before SetCorrector: Backward fails with an error naming the hook
//     and the call to make, or the hook option that turns the need off (osp:lgp=false).
//
// On the goroutine (or process) of each rank:
//
//	defer g.Close()
//	hook, err := hooks.Parse(spec) // built on this rank
//	dp, err := ddp.New(ctx, model, g, ddp.WithCommHook(hook))
//	defer dp.Close()
//	opt, err := optim.NewSGD(dp.Parameters(), cfg)
//	dp.SetCorrector(opt) // a no-op for hooks that defer nothing
//	… // the loop; return its errors
//
// Example_closeOnReturn runs this with a rank that fails before its first Backward.
//
// # Futures
//
// CommHook.Run returns a Future, and every hook in this module finishes its bucket inside
// Run (Ready); the Reducer waits on the next line. The Future stays, for three reasons, and
// the Reducer keeps one bucket in flight on purpose:
//
//   - It is PyTorch's comm-hook contract (register_comm_hook: a hook returns a
//     torch.futures.Future), so a hook ported from PyTorch keeps its shape, and wrappers
//     compose as PyTorch's do with Future.then: Then applies a function to a hook's result
//     when it is waited for (the 16-bit wrappers round their inner hook's result with it).
//   - Some results really are pending: a two-stage hook's Deferred.Result (OSP's
//     In-Computation Synchronization) completes while the next iteration computes, and it
//     travels as a LateFuture, which is a Future.
//   - spargo's collectives run on the goroutine that calls them, not on a device stream:
//     overlap with computation comes from running the hooks on DDP's communication
//     goroutine while backward goes on. A second bucket in flight would need a goroutine per
//     bucket and would compete with the first for the same links and cores, and the hooks'
//     per-bucket state (residuals, thresholds) assumes the buckets of one rank run in order.
//     A hook that wants more overlap defers work (LateFuture) rather than returning early.
//
// A hook that plans from measured costs (OMGS-SGD: when each parameter's gradient becomes
// ready, what top-k and the all-gather cost) holds its profile itself: package hooks/profile
// measures one before New and the hook takes it (hooks.ProfiledPlanner); DDP keeps only the
// Planner hook point.
//
// # Late results (two-stage hooks such as OSP)
//
// A hook may deliver some parameters' averaged gradients after the step: its Future
// implements LateFuture (build it with Defer) and names the deferred parameters and a second
// Future for them, which may complete while the next iteration runs its forward and
// backward. DDP then tells two values of a deferred parameter apart. The true value is the
// same on every rank and only the optimizer changes it, with global gradients only: a
// deferred global gradient is added to the parameter's gradient at the next step, one step
// late, and at its own step the parameter's gradient holds just what arrived late for it (or
// zero). So every global gradient is applied exactly once, and every parameter still gets one
// optimizer step per iteration (momentum and weight decay act on the true values, as in a
// dense run with those gradients shifted by a step). The working value is what the rank
// trains with (LGP): the true value plus the Corrector's offset, which makes it the dense
// run's value except that the newest deferred gradients are the rank's own local ones. The
// optimizer (SetCorrector; optim.SGD is exact) follows that offset through momentum: with
// momentum the lag of the true values is more than the pending gradient's step, and training
// on lagging values can diverge. DDP keeps a copy of the true value while the offset is
// applied and puts it back bit for bit at the end of the next Backward. From then until the
// next training Forward p.Value holds the true values: the optimizer steps on them, and
// evaluation and checkpoints read them there. A training loop that may run such a hook
// (examples/vgg does) adds three calls:
//
//	dp.SetCorrector(opt) // LGP: the optimizer predicts its own step
//	for epoch := range epochs {
//		for step, b := range batches {
//			tape.Reset()
//			opt.ZeroGrad()
//			loss := nn.CrossEntropy(dp.Forward(tape.Const(b.X)), b.Y) // true values + LGP offsets
//			if err := dp.Backward(ctx, loss); err != nil { … } // last step's late results arrive; true values back
//			if step == lastStep {
//				err = dp.Flush(ctx) // this step also applies this step's late results: nothing stays pending
//			}
//			opt.Step()
//		}
//		_, err = dp.EndEpoch(ctx) // collective: the epoch's mean loss to epoch-adaptive hooks (OSP's budget)
//		evaluate(dp)              // dp.Forward with the tape's recording off runs on the true values
//	}
//
// With hooks that defer nothing SetCorrector and Flush do nothing and EndEpoch only averages
// the loss. Flush before the last step of a run, and of any step after which a checkpoint is
// taken (the pending results are not part of DDP's state). A hook's late work runs under
// the context of the Backward that started it: keep that context alive until the next
// Backward returns. Hooks whose decisions span buckets read the whole model and the true
// values through ModelView (TrueValue(b, p) for short).
package ddp
