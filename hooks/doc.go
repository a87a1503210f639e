// Package hooks holds spargo's gradient-communication algorithms (comm hooks) and
// hooks.ParseConfig, which turns a one-line spec into a validated configuration so that any
// program swaps the algorithm with one option:
//
//	cfg, err := hooks.ParseConfig("spardl:density=0.01,teams=2") // once
//	h, err := cfg.New()                                           // on every rank
//	dp, err := ddp.New(ctx, model, group, ddp.WithCommHook(h))
//
// A spec is a registered name, optionally followed by a colon and comma-separated
// key=value options, or a wrapper's name, a plus sign and a spec ("fp16+powersgd:rank=4":
// the options belong to the wrapped hook), or hier, a colon and any spec with its own colon
// and options ("hier:spardl:density=0.01,teams=2"); package spec holds the grammar. `spargo hooks`
// lists every registered hook with its options and defaults. Config.String is the canonical
// spec (defaults filled in, keys in order, numbers in one form), which checkpoints compare.
// Build one hook per rank (Config.New once per worker): sparse hooks keep per-rank state.
// Parse is ParseConfig and New in one call.
//
// A hook says what else a program must know about it through optional interfaces: the world
// sizes it runs at (ddp.WorldSizeChecker: ddp.New refuses gtopk at P=6), whether it needs the
// optimizer as a corrector (ddp.CorrectorNeeder: osp), its cost formula, its selection and its
// control tags (CostDescriber, SelectionDescriber, ControlTagger: spargo simulate).
//
// # The hooks
//
// Every hook returns the averaged gradient (the sum over ranks divided by P once, at the
// end). Costs are per rank, in rounds (communication steps) and words received (4 bytes; a
// sparse entry is two words), for a bucket of n elements and k = max(1, int(n·density)):
//
//   - allreduce: dense all-reduce (ring, Rabenseifner or recursive doubling).
//   - spardl: SparDL (docs/ALGORITHMS.md §2). Spar-Reduce-Scatter inside teams of N = P/d ranks (any
//     N; bags of blocks sent as one message per round, each block cut to its top-k_b right
//     before it is sent), global residual collection, Spar-All-Gather across the d teams (R-SAG
//     for d a power of two, B-SAG with the adaptive h of the paper's Algorithm 2 otherwise), a
//     sparse Bruck all-gather inside each team. At teams=1: 2·ceil(log2 P) rounds and 4(P-1)·k_b
//     words (k_b = int(density·ceil(n/P)) per block). Options density, teams (a divisor of P or
//     auto), residual (global, or local / partial for the paper's ablation), dense_warmup, and
//     buckets: model (the default, a ddp.Planner giving one bucket with the whole model,
//     sparsified after backward as in the paper) or ddp (DDP's size-capped buckets, overlapped
//     with backward, each with its own budget; on VGG-11 this trains measurably worse).
//   - topka: SparCML's TopkA — local top-k, all-gather of P·k pairs: ceil(log2 P) rounds,
//     2k(P-1) words.
//   - lags, mgs, omgs: OMGS-SGD's family (docs/ALGORITHMS.md §5) — TopkA on every bucket of a plan
//     the hook makes itself (ddp.Planner), in backward order, so groups are communicated while
//     backward runs: lags one bucket per tensor (LAGS-SGD), mgs consecutive tensors merged
//     until threshold elements (default 8192), omgs the merge plan of least predicted
//     iteration time on a measured profile (package hooks/profile: profile.Measure, then SetProfile): the
//     exact optimum over all 2^(L-1) plans by default, or the paper's Algorithm 1
//     (planner=paper), which misses it on some models; timeline=ddp|paper chooses whether the
//     cost model puts the selection on DDP's communication goroutine or, as the paper does, on
//     the backward stream. Tensors under dense_below elements (default 8192: biases,
//     BatchNorm, small layers) are all-reduced densely inside their group, not sparsified,
//     as Deep Gradient Compression does; dense_below=0 sparsifies every tensor (the paper's
//     algorithm). Costs per group as topka's on its sparse part, plus a dense all-reduce of
//     its small tensors. Rank 0 logs the plan and its predicted
//     iteration time next to TopK-SGD's and LAGS's; Trace places each group's phases (ready,
//     selected, all-gathered, done) on DDP's timeline. PlanProfile gives the same plan and
//     predictions from a profile alone, without a model or training: `spargo plan -profile
//     FILE` (or -measure) prints them for lags, mgs, omgs's planners and timelines and
//     TopK-SGD, with the compute or network costs overridden (-compute-scale, -network).
//   - topkdsa: SparCML's TopkDSA — rotated sparse reduce-scatter over P regions, then a sparse
//     all-gather-v, dense once the reduced non-zeros reach n/3: P-1+2·ceil(log2 P) rounds,
//     [4k(P-1)/P, (2k+n)(P-1)/P] words plus P-1 words of counts.
//   - gtopk: gTopk — tree reduction keeping the top-k of each 2k merge, then a broadcast;
//     power-of-two P only; 2·log2 P rounds, at most 4k·log2 P words.
//   - oktopk: Ok-Topk (docs/ALGORITHMS.md §3) — local and global selection by thresholds reused
//     between exact re-evaluations every τ' calls (a distributed radix select finds the exact
//     global one), with the reference's multiplicative feedback (preset=vgg|lstm|bert) and, by
//     default, an exact re-evaluation within the call when a reused threshold's count leaves
//     its band or ±25 % of k, whichever is narrower (guard, guard_band); region boundaries cut
//     where the union of all ranks' selections (estimated from all-gathered sketches of
//     4P+2 words a rank, fewer at large P) reaches j/P of its total, every τ = 64 calls and on the 16 calls
//     after one whose split gave a rank more than 1.5× its share (partition=union;
//     partition=reference: the average of the ranks' own quantiles every τ calls); a split
//     and reduce with destination rotation and 4 peers in flight; data balancing before the
//     all-gather-v when the largest count exceeds 4× the average (balance=auto|always|never).
//     At most 6k(P-1)/P words plus 2(P-1) words of counts per call with k-entry selections
//     whenever no rank receives more than k(2P-3)/P entries in the split: every call below
//     the trigger, for P >= 3 (a call on boundaries the selections have moved away from can
//     exceed it, and makes the next calls repartition; see OkTopk for the exact conditions);
//     plus k-independent sketch or boundary and histogram messages on repartition and
//     re-evaluation calls. Options density, tau, tau_prime, preset, partition, balance, guard,
//     guard_band, dense_warmup. Debug log: one line per call (thresholds, counts, guards).
//     It reports each piece of its local work, with its size, to a WorkMeter in the context
//     (WithWorkMeter); WorkProbes runs each piece on a sample so that a simulator can time it.
//   - gaussiank: Gaussiank — the magnitude threshold of a normal fit of g + ξ, corrected toward k
//     (the reference's up to 20 steps of 1.02 into [3k/4, 5k/4]); all-gather-v of the
//     selections: 2·ceil(log2 P) rounds, P-1 words of sizes plus 2 words per received entry.
//   - covap: COVAP (docs/ALGORITHMS.md §6) — no selection at all: DDP's buckets, oversized ones cut
//     into min(I, max(1, floor(x/median))) contiguous shards, numbered globally in bucket order;
//     shard i is all-reduced at iteration s iff (i + s) mod I == 0, the others return zeros and
//     stay in the residual. Iteration 0 is dense. interval=auto measures I = ceil(CCR) on a few
//     dense iterations with a distributed profiler that aligns the ranks' timelines at the end of
//     each all-reduce (waiting for a late rank is not communication) and reads the backward time
//     from DDP's bucket timestamps (ddp.Timed). Error feedback per element with the paper's
//     scheduler c(s) = min(init + floor(s/ascend_steps)·ascend_range, 1) multiplying the residual
//     each time it is added to the gradient (feedback=reference: the authors' rule; the
//     defaults 0.5/50/0.1 are the authors' code's). The paper's near-lossless accuracy is at
//     I = 3–4 and SGD lr 1e-3 only: one-step-late gradients under momentum 0.9 shrink the
//     stable step roughly 17–19× at I = 2 (see COVAP). Words per
//     iteration average 2(P-1)/P·n/I; each iteration's volume is within the plan's logged
//     imbalance. Options interval, max_interval, profile_iters, init, ascend_steps,
//     ascend_range, feedback, dense_warmup, algorithm.
//
// # Two-stage synchronization
//
//   - osp: OSP (docs/ALGORITHMS.md §7) on all-reduce. Every iteration the parameter tensors are
//     ranked by Σ|Ĝ·W| (the last global gradient applied to the tensor times its true value:
//     the same on every rank, so no bitmap is sent); the least important, up to S(G^u)
//     elements, are all-reduced on a goroutine of the hook while the next iteration computes
//     (ICS) and reach DDP as a late result (ddp.Deferred) that the optimizer applies one step
//     late; the rest are all-reduced now (RS). LGP: the rank trains on the dense run's values
//     with its own local gradient standing in for the pending one (through momentum). Options budget (auto: the paper's Algorithm 1
//     over epochs ended by dp.EndEpoch, 0 in epoch 1, U_max from the measured α-β and compute
//     time; or a fixed fraction), cap (0.8), umax, dense_warmup, lgp, algorithm. The same words
//     as allreduce, in one or two all-reduces per bucket. The training loop calls
//     dp.SetCorrector(opt), and dp.Flush before its last step (ddp's package doc). Trace
//     returns the ICS timeline; budget=0 is allreduce bit for bit.
//
// # PyTorch DDP's built-in hooks
//
// The hooks of torch.distributed.algorithms.ddp_comm_hooks (v1.13), for users who know them:
//
//   - fp16, bf16: fp16_compress_hook / bf16_compress_hook. Each rank divides its bucket by P,
//     rounds it to IEEE half or bfloat16 (Float32ToHalf, Float32ToBFloat16: round to nearest,
//     ties to even) and AllReduce16 sums the 16-bit words: every reduction step widens, adds in
//     float32 and rounds back, so 2 bytes per element travel (half of allreduce's volume, same
//     rounds) and every rank gets the same bits. Option algorithm as allreduce's.
//   - fp16+SPEC, bf16+SPEC: fp16_compress_wrapper / bf16_compress_wrapper around the hook of any
//     spec, whose options follow its colon ("fp16+powersgd:rank=4,start_iter=10"). The input is
//     rounded to 16 bits before the inner hook and its output after. Only a DenseAllReducer
//     (powersgd) also sends 16-bit messages; a sparse inner hook's messages stay float32 (the
//     wrapper saves nothing on its wire). "fp16+allreduce" is the fp16 hook itself.
//   - powersgd: powerSGD_hook with PowerSGDState's options (rank, start_iter = PyTorch's 1000 by
//     default, min_compression_rate, use_error_feedback, warm_start, orthogonalization_epsilon,
//     seed, batch_tensors_with_same_shape). Per bucket: tensors worth it ((rows+cols)·r·rate <
//     rows·cols, viewing a tensor as [shape[0], rest]) get P = M·Q, an all-reduce of the Ps,
//     Gram-Schmidt, Q = Mᵀ·P, an all-reduce of the Qs divided by the world size, output P·Qᵀ;
//     the rest are all-reduced together. Three all-reduces of (uncompressed, Σ rows·r, Σ cols·r) elements. Error
//     feedback e = input − output, warm-started Q; both are saved with the checkpoint.
//   - noop: noop_hook. No communication: each rank keeps its own undivided gradient. It does not
//     train a data-parallel model (the replicas drift apart); it measures how much time
//     communication costs.
//
// # Hierarchical: hier:SPEC
//
//   - hier:SPEC (Hier): any hook, run across nodes (hosts) on node sums, for groups that know
//     which ranks share a node (comm.TopologyOf: the launcher's topology, or comm.WithTopology
//     for simulated hosts in tests). With H nodes of L ranks each: a dense ring reduce-scatter
//     inside each node leaves local rank i with the node's sum of shard i (the bucket cut into
//     L shards, the first n mod L one element longer); SPEC runs on that shard among the H
//     ranks of local index i, one per node, so every local rank works at once, each with its
//     own SPEC instance and state (residuals, thresholds) in SPEC's sum units; SPEC's mean over
//     H is divided by L, giving the mean over P; a ring all-gather inside each node gives every
//     rank every shard. The result is SPEC's on the node-summed gradients, divided by L. Words
//     per call and rank: 2n − |shard i−1| − |shard i| inside a node (2n(L−1)/L when L divides
//     n), L−1 rounds each way; across nodes SPEC's own volume with P = H on its shard of
//     about n/L (Hier.CostSplit; CostFormula is the sum, for the topology the hook ran on).
//     L = 1 is SPEC itself, bit for bit; H = 1 a dense all-reduce inside the node. Every node
//     must hold the same number of ranks (a first call on another topology fails, naming two
//     nodes that differ), and SPEC must run at P = H (hier:gtopk needs a power-of-two number
//     of nodes). hier refuses to wrap osp, lags, mgs, omgs (they need whole tensors; hier's
//     inner hook sees shards) and itself. Its state is SPEC's plus the topology; a checkpoint
//     resumes on the same nodes × ranks per node only, and a resize is refused.
//
// # Shared sparse parts
//
// The sparse hooks are built from the same pieces, in GRACE's decomposition: COO vectors with
// int32 indices and a headerless wire form (COO, AppendWire, SetWire), exact top-k and
// threshold selection on the internal/kernels selection kernels (TopK, TopKNonZero, Threshold,
// TopKOf), scatter-add and merge (ScatterAdd, Merge), and Memory, the error-feedback state per
// bucket index (residual, call counter, scalars such as B-SAG's h) that the hooks save and
// restore through ddp.Stateful. Its Residual owns GRACE's two error-feedback verbs
// (Compensate; Update, or Keep then MarkSent or MarkApplied), which every sparse hook calls.
// Every sparse hook takes dense_warmup=N.
//
// # Guarantees the tests check
//
// Replicas stay bit-identical (every rank gets the same output bits). For spardl (global
// residuals), topka, lags, mgs, omgs, topkdsa, oktopk and gaussiank the conservation test holds: the summed output plus the new
// residuals of all ranks equals the summed gradients plus the old residuals, so every
// contribution is applied exactly once or kept exactly once; so does covap with init=1 (with
// c < 1 it drops (1 - c) of each residual it carries over, by design). gtopk and spardl's local and
// partial residual modes drop some contributions by design. fp16, bf16 and powersgd (wrapped or
// not) keep the replicas bit-identical too; powersgd's output is exactly the average when its
// rank reaches min(rows, cols), and its errors satisfy the same conservation test (for the
// tensors it does not compress, PyTorch's e = input − average sums to zero over the ranks).
// hier:SPEC keeps the replicas bit-identical and passes the conservation test whenever SPEC
// does (its output is SPEC's on the node sums, divided by L, and its residuals are SPEC's).
// noop does not keep the replicas identical. osp keeps the true parameters bit-identical while
// each rank trains on its own LGP-corrected values, applies every global gradient exactly once
// (one step late for the deferred tensors), and equals allreduce bit for bit when S(G^u) = 0.
package hooks
