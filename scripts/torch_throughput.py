#!/usr/bin/env python3
# PyTorch comparison for BENCHMARKS.md: training images/s (forward + backward + SGD step)
# of the catalogue's models (scripts/torch_models.py: VGG-BN, ResNets) on random 3x32x32 inputs at a fixed batch size.
#
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_throughput.py --model vgg11 --batch 32 --steps 20
#
# Reports the median step time over --steps timed steps after --warmup untimed ones.
# Output: a comment line with the parameter count, then the last line "MODEL BATCH IMG_S".
# Measured with Debian's python3-torch 1.13 (CPU); --threads sets torch.set_num_threads.
import argparse
import json
import sys
import time

import os

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import build  # noqa: E402

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="vgg11", help="a name of spargo's catalogue (scripts/torch_models.py)")
    ap.add_argument("--size", type=int, default=32, help="input height = width")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="timed steps (median is reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the result to this file")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    m = build(a.model).train()
    nparams = sum(p.numel() for p in m.parameters())
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    lossf = nn.CrossEntropyLoss()
    x = torch.randn(a.batch, 3, a.size, a.size)
    y = torch.randint(0, 10, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        lossf(m(x), y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    ts = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    ts.sort()
    med = ts[len(ts) // 2]
    img_s = a.batch / med
    print(f"# {a.model} params {nparams} threads {a.threads} steps {a.steps} "
          f"median_step_s {med:.4f} torch {torch.__version__}", flush=True)
    print(f"{a.model} {a.batch} {img_s:.1f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "batch": a.batch, "img_s": img_s, "params": nparams,
                       "threads": a.threads, "steps": a.steps, "warmup": a.warmup,
                       "median_step_s": med, "step_s": ts, "torch_version": torch.__version__},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
