// Package profile measures the costs that a cost-model planner needs before training: when
// each parameter's gradient becomes ready in backward, what the sparse hooks' exact top-k
// selection costs on this CPU, and what their all-gather (and the dense all-reduce of small
// tensors) costs on this group. It is the input of OMGS-SGD's merge planner (Shi et al.,
// "Communication-Efficient Distributed Deep Learning with Merged Gradient Sparsification on
// GPUs", IEEE INFOCOM 2020: its Algorithm 1 and Eqs. 10-11), which hooks.OMGS implements.
// The package knows nothing of DDP; the hook that plans from a profile holds it
// (hooks.ProfiledPlanner: SetProfile before ddp.New, which asks the hook for its plan).
//
// What Measure does:
//
//   - per-parameter backward time: the step runs Warmup times unmeasured, then Iterations
//     times with a grad-ready hook that stamps every parameter's gradient; the stamps are
//     averaged;
//   - the top-k cost γ·n·log2 n: the real selection kernel (kernels.TopKAbs, then the gather
//     of the values, as the sparse hooks do) is timed on heavy-tailed data at several sizes,
//     at the planner's density, on every rank at once (as in training, where all ranks select
//     at the same time); γ is fitted by least squares;
//   - the all-gather cost α + β·bytes: the all-gather the sparse hooks use
//     (comm.AllGatherBytesSized) is timed on the real group at several sizes per rank, each
//     the median of Repeats runs that start together after a barrier; α and β are fitted by
//     least squares on the relative error;
//   - the all-reduce cost α + β·bytes of the dense all-reduce (comm.AllReduce, comm.Auto)
//     that the layer-wise hooks use for small tensors, timed and fitted the same way at
//     small sizes (64 bytes to 64 KiB by default).
//
// Every rank measures, and every rank returns rank 0's profile (broadcast as JSON), so all
// ranks plan identically. Before the collectives the ranks exchange their status, so a rank
// whose step failed makes every rank return an error naming it instead of hanging.
//
//	pp := hook.(hooks.ProfiledPlanner)
//	prof, err := profile.Measure(ctx, model, group, step, pp.ProfileOptions())
//	pp.SetProfile(prof)
//	dp, err := ddp.New(ctx, model, group, ddp.WithCommHook(hook))
//
// A Profile prints (%v, %+v) and saves as JSON (Save, Load) for reuse.
package profile
