#!/usr/bin/env python3
# PyTorch comparison for the sparse selection kernels (internal/kernels/select.go):
#
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_topk.py --threads 1
#   OPENBLAS_NUM_THREADS=2 /usr/bin/python3 scripts/torch_topk.py --threads 2
#
# Times, on CPU, for n = 1M (2^20) and 14.7M (VGG-16 size) heavy-tailed float32
# gradients (normal * exp(normal), as in select_bench_test.go) at densities 1% and 0.1%
# (k = density * n):
#
#   topk        torch.topk(x.abs(), k, sorted=False)          ~ kernels.TopKAbs
#   kthvalue    torch.kthvalue(x.abs(), n - k + 1)            ~ kernels.KthLargestAbs
#   filter      (x.abs() >= t).nonzero()  (t = k-th largest)  ~ kernels.FilterAbs
#   scatter_add dst.index_add_(0, idx, val)                   ~ kernels.ScatterAdd
#   gather      x.index_select(0, idx)                        ~ kernels.Gather
#   merge_coo   (a + b).coalesce() of two 1-D sparse tensors  ~ kernels.MergeCOO
#
# Prints one line per case, "op n k Melem/s", from the median of --runs timed runs after
# --warmup untimed ones. Melem/s counts dense elements (n) for topk, kthvalue and filter,
# and nonzeros for scatter_add, gather (k) and merge_coo (nnz of both inputs), like the
# Go benchmarks. Note torch's topk returns indices in value order (here unsorted), while
# TopKAbs returns them in increasing index order; torch.topk's tie order is unspecified.
# Measured with Debian's python3-torch 1.13 (CPU); --threads sets torch.set_num_threads.
import argparse
import statistics
import sys
import time

import torch

SIZES = [("1M", 1 << 20), ("14.7M", 14_700_000)]
DENSITIES = [0.01, 0.001]
OPS = ["topk", "kthvalue", "filter", "scatter_add", "gather", "merge_coo"]


def heavy(n, gen):
    return (torch.randn(n, generator=gen) * torch.randn(n, generator=gen).exp()).float()


def bernoulli_coo(n, k, gen):
    mask = torch.rand(n, generator=gen) < (k / n)
    idx = mask.nonzero().flatten()
    return idx, torch.randn(idx.numel(), generator=gen)


def median_seconds(fn, runs, warmup):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description="time torch selection ops (see header)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=7, help="timed runs (median is reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ops = [o for o in a.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            sys.exit(f"unknown op {o!r}")
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, runs {a.runs}", flush=True)
    gen = torch.Generator().manual_seed(a.seed)
    for name, n in SIZES:
        x = heavy(n, gen)
        for d in DENSITIES:
            k = int(n * d)
            t = torch.topk(x.abs(), k, sorted=False).values.min()
            idx = (x.abs() >= t).nonzero().flatten()
            val = x[idx]
            dst = torch.randn(n, generator=gen)
            ai, av = bernoulli_coo(n, k, gen)
            bi, bv = bernoulli_coo(n, k, gen)
            a_sp = torch.sparse_coo_tensor(ai.unsqueeze(0), av, (n,)).coalesce()
            b_sp = torch.sparse_coo_tensor(bi.unsqueeze(0), bv, (n,)).coalesce()
            cases = {
                "topk": (n, lambda: torch.topk(x.abs(), k, sorted=False)),
                "kthvalue": (n, lambda: torch.kthvalue(x.abs(), n - k + 1)),
                "filter": (n, lambda: (x.abs() >= t).nonzero()),
                "scatter_add": (idx.numel(), lambda: dst.index_add_(0, idx, val)),
                "gather": (idx.numel(), lambda: x.index_select(0, idx)),
                "merge_coo": (ai.numel() + bi.numel(), lambda: (a_sp + b_sp).coalesce()),
            }
            for op in ops:
                elems, fn = cases[op]
                s = median_seconds(fn, a.runs, a.warmup)
                print(f"{op} {name} {k} {elems / s / 1e6:.1f}", flush=True)


if __name__ == "__main__":
    main()
