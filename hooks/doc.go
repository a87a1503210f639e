// Package hooks holds spargo's gradient-communication algorithms (comm hooks) and
// hooks.Parse, which turns a one-line spec into a hook so that any program swaps the
// algorithm with one option:
//
//	h, err := hooks.Parse("spardl:density=0.01,teams=2")
//	dp, err := ddp.New(ctx, model, group, ddp.WithCommHook(h))
//
// A spec is a registered name, optionally followed by a colon and comma-separated
// key=value options. `spargo hooks` lists every registered hook with its options and
// defaults. Build one hook per rank (Parse once per worker): sparse hooks keep per-rank
// state.
//
// # The hooks
//
// Every hook returns the averaged gradient (the sum over ranks divided by P once, at the
// end). Costs are per rank, in rounds (communication steps) and words received (4 bytes; a
// sparse entry is two words), for a bucket of n elements and k = max(1, int(n·density)):
//
//   - allreduce: dense all-reduce (ring, Rabenseifner or recursive doubling).
//   - spardl: SparDL (ALGORITHMS.md §2). Spar-Reduce-Scatter inside teams of N = P/d ranks (any
//     N; bags of blocks sent as one message per round, each block cut to its top-k_b right
//     before it is sent), global residual collection, Spar-All-Gather across the d teams (R-SAG
//     for d a power of two, B-SAG with the adaptive h of the paper's Algorithm 2 otherwise), a
//     sparse Bruck all-gather inside each team. At teams=1: 2·ceil(log2 P) rounds and 4(P-1)·k_b
//     words (k_b = int(density·ceil(n/P)) per block). Options density, teams (a divisor of P or
//     auto), residual (global, or local / partial for the paper's ablation), dense_warmup.
//   - topka: SparCML's TopkA — local top-k, all-gather of P·k pairs: ceil(log2 P) rounds,
//     2k(P-1) words.
//   - topkdsa: SparCML's TopkDSA — rotated sparse reduce-scatter over P regions, then a sparse
//     all-gather-v, dense once the reduced non-zeros reach n/3: P-1+2·ceil(log2 P) rounds,
//     [4k(P-1)/P, (2k+n)(P-1)/P] words plus P-1 words of counts.
//   - gtopk: gTopk — tree reduction keeping the top-k of each 2k merge, then a broadcast;
//     power-of-two P only; 2·log2 P rounds, at most 4k·log2 P words.
//   - oktopk: Ok-Topk (ALGORITHMS.md §3) — local and global selection by thresholds reused
//     between exact re-evaluations every τ' calls (a distributed radix select finds the exact
//     global one), with the reference's multiplicative feedback (preset=vgg|lstm|bert) and, by
//     default, an exact re-evaluation within the call when a reused threshold's count leaves
//     its band (guard); region boundaries agreed every τ = 64 calls from the ranks' selected
//     positions; a split and reduce with destination rotation and 4 peers in flight; data
//     balancing before the all-gather-v when the largest count exceeds 4× the average
//     (balance=auto|always|never). At most 6k(P-1)/P words plus 2(P-1) words of counts per
//     call with k-entry selections, plus k-independent boundary and histogram all-reduces on
//     repartition and re-evaluation calls. Options density, tau, tau_prime, preset, balance,
//     guard, dense_warmup. Debug log: one line per call (thresholds, counts, guards).
//   - gaussiank: Gaussiank — the magnitude threshold of a normal fit of g + ξ, corrected toward k
//     (the reference's up to 20 steps of 1.02 into [3k/4, 5k/4]); all-gather-v of the
//     selections: 2·ceil(log2 P) rounds, P-1 words of sizes plus 2 words per received entry.
//
// # Shared sparse parts
//
// The sparse hooks are built from the same pieces, in GRACE's decomposition: COO vectors with
// int32 indices and a headerless wire form (COO, AppendWire, SetWire), exact top-k and
// threshold selection on the internal/kernels selection kernels (TopK, TopKNonZero, Threshold,
// TopKOf), scatter-add and merge (ScatterAdd, Merge), and Memory, the error-feedback state per
// bucket index (residual, call counter, scalars such as B-SAG's h) that the hooks save and
// restore through ddp.Stateful. Every sparse hook takes dense_warmup=N.
//
// # Guarantees the tests check
//
// Replicas stay bit-identical (every rank gets the same output bits). For spardl (global
// residuals), topka, topkdsa, oktopk and gaussiank the conservation test holds: the summed output plus the new
// residuals of all ranks equals the summed gradients plus the old residuals, so every
// contribution is applied exactly once or kept exactly once. gtopk and spardl's local and
// partial residual modes drop some contributions by design.
package hooks
