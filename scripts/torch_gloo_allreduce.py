#!/usr/bin/env python3
# PyTorch comparison for BENCHMARKS.md: all-reduce throughput of the gloo backend on this
# machine, P processes over loopback, to set next to `spargo bench allreduce`.
#
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_gloo_allreduce.py --procs 2 4 --mib 64 --iters 10
#   go run ./cmd/spargo bench allreduce -n 64MiB -workers 4 -iters 10        # spargo, same quantities
#
# Each P spawns P fresh processes (multiprocessing "spawn"), which meet through a TCPStore on a
# free loopback port and run init_process_group("gloo"). Each iteration is
# refill → barrier → timed all_reduce(SUM) of a float32 tensor of --mib MiB on every rank;
# the time of an iteration is the slowest rank's. After --warmup untimed iterations, --iters
# timed ones give the median and minimum time, algbw = bytes / median (the tensor's size, not
# the bytes on the wire) and busbw = algbw · 2(P-1)/P, nccl-tests' bus bandwidth (what each
# rank sends and receives in a ring or Rabenseifner all-reduce, per unit of time). This is what
# `spargo bench allreduce` measures and reports.
#
# Output: one line per P, "gloo P=4 64MiB: median 512.3 ms (min 498.0, max 530.1) algbw 131.0
# MB/s busbw 196.5 MB/s", and with --json one JSON object per line instead, with the keys of
# `spargo bench allreduce -json` (workers, bytes, algorithm = "gloo", time_ms = the median,
# min_ms, algbw_mb_s, busbw_mb_s, iters) plus max_ms. MB is 10^6 bytes.
# Measured with Debian's python3-torch 1.13 (CPU build; gloo over TCP).
import argparse
import json
import os
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, nbytes, warmup, iters, queue):
    # Before torch is imported in this (spawned) process: one BLAS/OpenMP thread per rank, so
    # P ranks on a small machine do not oversubscribe its cores.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    x = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
    times = []
    for i in range(warmup + iters):
        x.fill_(float(rank + 1))
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    # Sanity: every element is the sum 1 + 2 + … + P.
    expected = float(world * (world + 1) // 2)
    ok = bool((x == expected).all())
    dist.barrier()
    dist.destroy_process_group()
    queue.put((rank, times, ok))


def measure(world, nbytes, warmup, iters):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, nbytes, warmup, iters, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"rank process exited with {p.exitcode}")
    if not all(ok for _, _, ok in results):
        sys.exit("all_reduce gave a wrong sum")
    # An iteration lasts as long as its slowest rank.
    per_iter = [max(r[1][i] for r in results) for i in range(iters)]
    med = statistics.median(per_iter)
    algbw = nbytes / med / 1e6
    return {
        "workers": world,
        "bytes": nbytes,
        "algorithm": "gloo",
        "time_ms": med * 1e3,
        "min_ms": min(per_iter) * 1e3,
        "max_ms": max(per_iter) * 1e3,
        "algbw_mb_s": algbw,
        "busbw_mb_s": algbw * 2 * (world - 1) / world,
        "iters": iters,
    }


def main():
    ap = argparse.ArgumentParser(description="all-reduce throughput of PyTorch gloo over loopback")
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4], help="process counts P to measure")
    ap.add_argument("--mib", type=int, default=64, help="tensor size in MiB (float32)")
    ap.add_argument("--bytes", type=int, default=0, help="tensor size in bytes, a multiple of 4 (overrides --mib; e.g. 4096)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations (median reported)")
    ap.add_argument("--json", action="store_true", help="one JSON object per P (the keys of spargo bench allreduce -json)")
    args = ap.parse_args()
    for world in args.procs:
        if world < 2:
            sys.exit("--procs: P must be at least 2")
        nbytes = args.bytes or args.mib << 20
        if nbytes % 4:
            sys.exit("--bytes: want a multiple of 4 (float32)")
        r = measure(world, nbytes, args.warmup, args.iters)
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print(
                f"gloo P={world} {nbytes} B: median {r['time_ms']:.3f} ms "
                f"(min {r['min_ms']:.3f}, max {r['max_ms']:.3f}) "
                f"algbw {r['algbw_mb_s']:.1f} MB/s busbw {r['busbw_mb_s']:.1f} MB/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
