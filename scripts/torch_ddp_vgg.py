#!/usr/bin/env python3
# PyTorch DDP (gloo, dense all-reduce) training throughput on this machine, for the spargo vs
# PyTorch DDP row of BENCHMARKS.md: the same CIFAR-variant VGG-BN as examples/vgg, the same
# per-worker batch, the same data pipeline (CIFAR-10 binary files, per-channel normalisation,
# random crop from the 4-pixel zero-padded image + horizontal flip, each rank its shard of a
# global batch), SGD lr 0.01, momentum 0.9, weight decay 5e-4; one thread per process.
#
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_ddp_vgg.py --procs 2 \
#       --data $SPARGO_DATA/cifar10 --model vgg11 --batch 32 --steps 40
#
# or under torchrun (torch 1.13 under Python 3.11 needs --redirects=1 --tee=1, see README.md):
#
#   OPENBLAS_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 --redirects=1 --tee=1 \
#       scripts/torch_ddp_vgg.py --data $SPARGO_DATA/cifar10 --model vgg11 --batch 32
#
# --data synthetic trains on random images instead. Every step is timed on every rank; the
# step time is rank 0's (DDP's all-reduce makes the ranks' steps equal up to jitter). After
# --warmup untimed steps it prints "img_s X" with X = procs * batch * timed steps / their
# total time (data loading and augmentation included, as in spargo's train img/s), and the
# median step's rate; --json writes both.
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.dont_write_bytecode = True  # no scripts/__pycache__ from the import below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_vgg_cifar import augment, load_cifar, vgg  # noqa: E402  the same model and data


def worker(rank, world, a, port):
    torch.set_num_threads(a.threads)
    if "MASTER_ADDR" not in os.environ or a.procs:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(a.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    rng = np.random.default_rng(a.seed)  # same permutation on every rank; each takes its shard
    aug_rng = np.random.default_rng(a.seed * 1000 + rank)
    B, gb = a.batch, a.batch * world
    if a.data == "synthetic":
        n = gb * (a.steps + a.warmup)
        xtr = np.random.default_rng(a.seed).standard_normal((n, 3, 32, 32), dtype=np.float32)
        ytr = np.random.default_rng(a.seed + 1).integers(0, 10, n)
    else:
        xtr, ytr, _, _ = load_cifar(a.data)
    model = DDP(vgg(a.model))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    perm = rng.permutation(len(xtr))
    total = a.warmup + a.steps
    if total * gb > len(perm):
        sys.exit(f"{total} steps of {gb} images need more than the {len(perm)} training images")
    times = []
    dist.barrier()
    for s in range(total):
        t = time.perf_counter()
        idx = perm[s * gb + rank * B: s * gb + (rank + 1) * B]
        x = xtr[idx] if a.data == "synthetic" else augment(xtr[idx], aug_rng)
        x, y = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(ytr[idx])
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()  # DDP all-reduces the buckets during backward
        opt.step()
        if s >= a.warmup:
            times.append(time.perf_counter() - t)
    dist.barrier()
    if rank == 0:
        tot, med = sum(times), sorted(times)[len(times) // 2]
        res = {"model": a.model, "procs": world, "batch": B, "steps": a.steps, "threads": a.threads,
               "data": "synthetic" if a.data == "synthetic" else "cifar10",
               "img_s": world * B * len(times) / tot, "img_s_median_step": world * B / med,
               "median_step_s": med, "torch": torch.__version__}
        print(f"# {json.dumps(res)}", flush=True)
        print(f"img_s {res['img_s']:.1f}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description="PyTorch DDP (gloo) training images/s")
    ap.add_argument("--procs", type=int, default=0,
                    help="start this many processes (torch.multiprocessing); 0: run under torchrun")
    ap.add_argument("--data", default="synthetic", help="CIFAR-10 binary directory, or synthetic")
    ap.add_argument("--model", default="vgg11")
    ap.add_argument("--batch", type=int, default=32, help="per-process batch")
    ap.add_argument("--steps", type=int, default=40, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=29511)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.procs:
        mp.spawn(worker, args=(a.procs, a, a.port), nprocs=a.procs, join=True)
    else:
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
