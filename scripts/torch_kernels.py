#!/usr/bin/env python3
# PyTorch side of the kernel rows in BENCHMARKS.md: SGEMM at 1024^3 (OpenBLAS through
# torch.mm) and the VGG CIFAR 3x3 convolutions at batch 32 (oneDNN), forward and both
# backward passes, in GFLOP/s (direct-convolution flops, 2*O*C*9*N*H*W per pass).
#
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_kernels.py --threads 1
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_kernels.py --threads 2
#
# The Go counterparts:
#   go test -run '^$' -bench 'Sgemm/avx512/NN_sq1024' -cpu 1 ./internal/kernels/
#   go test -run '^$' -bench 'ConvLayer' ./nn/
# Each line: "name GFLOP/s" (median of --reps timings of --iters calls).
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def timeit(fn, iters, reps):
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t0) / iters)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    n = 1024
    A, B = torch.randn(n, n), torch.randn(n, n)
    t = timeit(lambda: torch.mm(A, B), a.iters, a.reps)
    print(f"sgemm_1024 {2 * n**3 / t / 1e9:.1f}")

    for c, o, hw in [(64, 64, 32), (128, 128, 16), (256, 256, 8), (512, 512, 4), (512, 512, 2)]:
        x = torch.randn(a.batch, c, hw, hw, requires_grad=True)
        w = torch.randn(o, c, 3, 3, requires_grad=True)
        flops = 2 * o * c * 9 * a.batch * hw * hw
        y = F.conv2d(x, w, padding=1)
        dy = torch.randn_like(y)
        fwd = timeit(lambda: F.conv2d(x, w, padding=1), a.iters, a.reps)

        def fwd_bwd():
            yy = F.conv2d(x, w, padding=1)
            torch.autograd.grad(yy, (x, w), dy)
        both = timeit(fwd_bwd, a.iters, a.reps)
        name = f"conv_c{c}_o{o}_hw{hw}"
        print(f"{name}/fwd {flops / fwd / 1e9:.1f}")
        print(f"{name}/fwd+bwd {3 * flops / both / 1e9:.1f}")


if __name__ == "__main__":
    main()
