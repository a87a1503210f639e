#!/usr/bin/env python3
# Cross-replay of the dense CIFAR-10 convergence checks between PyTorch and spargo
# (BENCHMARKS.md, "Dense all-reduce against PyTorch" for VGG-11, "ResNets (issue 10)" for
# ResNet-20): each framework trains on the other's exact data stream (shuffle, crops, flips)
# from the other's initial weights, which separates what that draw does to a run from what the
# framework does. The Go side is scripts/replay; the stream file format is described there
# (int32: epochs, steps, workers, batch; then index, top, left, flip per image). Any model of
# scripts/torch_models.py's catalogue (its parameter names are spargo's).
#
#   # PyTorch's own stream and weights for a seed (scripts/torch_vgg_cifar.py's dense run):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_replay.py --write torch_s0 --seed 0
#   go run ./scripts/replay -stream torch_s0.bin -init torch_s0.safetensors
#   # spargo's (examples/vgg -seed 0), trained by PyTorch:
#   go run ./scripts/replay -write-stream s0.bin -write-init s0.safetensors -seed 0
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_replay.py --stream s0.bin --init s0.safetensors
#   # ResNet-20 with examples/resnet's recipe: add to both sides
#   #   --model resnet20 --workers 2 --batch 128 --lr 0.1 --wd 1e-4 --schedule cosine
#   # (Go: -model resnet20 -workers 2 -batch 128 -lr 0.1 -wd 1e-4 -schedule cosine)
#
# Training is torch_vgg_cifar.py's dense W-worker simulation (per-worker BatchNorm batch
# statistics, gradients averaged, rank 0's running statistics, SGD with --lr, --momentum,
# --wd, constant or --schedule cosine per step to 0). Prints "epoch E train_loss L test_acc A"
# per epoch, and with --log-steps N the first N steps' mean losses ("step T loss L").
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_vgg_cifar as T  # noqa: E402
from read_safetensors import load  # noqa: E402
from torch_models import CIFAR_DEPTHS, VGG_CFG, build  # noqa: E402


def save_safetensors(state, path):
    header, blobs, off = {}, [], 0
    for k, v in state.items():
        b = v.detach().float().contiguous().numpy().astype("<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.write(b"".join(blobs))


def write(a, n):
    """The stream and initial weights torch_vgg_cifar.py draws for a.seed (dense run)."""
    W, B = a.workers, a.batch
    gb = W * B
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    m = build(a.model)
    recs = []
    for _ in range(a.epochs):
        perm = rng.permutation(n)
        for i in range(0, n - gb + 1, gb):  # the draws of torch_vgg_cifar.augment, in its order
            idx = perm[i:i + gb]
            ox = rng.integers(0, 9, gb)
            oy = rng.integers(0, 9, gb)
            flip = rng.random(gb) < 0.5
            recs.append(np.stack([idx, oy, ox, flip.astype(np.int64)], 1))
    steps = len(recs) // a.epochs
    hdr = np.array([a.epochs, steps, W, B], np.int32)
    np.concatenate([hdr, np.array(recs, np.int32).ravel()]).astype("<i4").tofile(a.write + ".bin")
    save_safetensors(m.state_dict(), a.write + ".safetensors")
    print(f"wrote {a.write}.bin ({a.epochs} epochs of {steps} steps) and {a.write}.safetensors")


def replay(a, xtr, ytr, xte, yte):
    raw = np.fromfile(a.stream, dtype="<i4")
    epochs, steps, W, B = (int(v) for v in raw[:4])
    s = raw[4:].reshape(epochs, steps, W, B, 4)
    m = build(a.model)
    state, _ = load(a.init)
    own = m.state_dict()
    m.load_state_dict({k: state[k].to(own[k].dtype).reshape(own[k].shape) for k in own})
    dt = torch.float64 if a.double else torch.float32
    m.to(dt)
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.wd)
    bn = [b for b in m.modules() if isinstance(b, nn.BatchNorm2d)]

    def batch(ent):
        p = np.pad(xtr[ent[:, 0]], ((0, 0), (0, 0), (4, 4), (4, 4)))
        x = np.stack([p[i, :, t:t + 32, l:l + 32][:, :, ::-1] if f else p[i, :, t:t + 32, l:l + 32]
                      for i, (_, t, l, f) in enumerate(ent)])
        return torch.from_numpy(np.ascontiguousarray(x)).to(dt), torch.from_numpy(ytr[ent[:, 0]])

    if a.steps:
        steps = min(steps, a.steps)
    total = epochs * steps
    for ep in range(epochs):
        m.train()
        tl = 0.0
        for st in range(steps):
            if a.schedule == "cosine":  # optim.Cosine: t = steps taken so far
                for grp in opt.param_groups:
                    grp["lr"] = 0.5 * a.lr * (1 + math.cos(math.pi * (ep * steps + st) / total))
            opt.zero_grad(set_to_none=True)
            sl = 0.0
            rank0 = None
            for r in range(W):
                x, y = batch(s[ep, st, r])
                loss = F.cross_entropy(m(x), y)
                (loss / W).backward()
                sl += loss.item() / W
                if r == 0:
                    rank0 = [(b.running_mean.clone(), b.running_var.clone(), b.num_batches_tracked.clone()) for b in bn]
            with torch.no_grad():
                for b, (rm, rv, nt) in zip(bn, rank0):
                    b.running_mean.copy_(rm)
                    b.running_var.copy_(rv)
                    b.num_batches_tracked.copy_(nt)
            opt.step()
            tl += sl
            if ep * steps + st < a.log_steps:
                print(f"step {ep * steps + st + 1} loss {sl:.6f}", flush=True)
            if a.stop_after and ep * steps + st + 1 >= a.stop_after:
                return
        m.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(xte), 500):
                correct += int((m(torch.from_numpy(xte[i:i + 500]).to(dt)).argmax(1).numpy() == yte[i:i + 500]).sum())
        print(f"epoch {ep + 1} train_loss {tl / steps:.4f} test_acc {correct / len(xte):.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(os.environ["SPARGO_DATA"], "cifar10") if os.environ.get("SPARGO_DATA") else None,
                    required=not os.environ.get("SPARGO_DATA"), help="CIFAR-10 directory (default: $SPARGO_DATA/cifar10; docs/data.md)")
    ap.add_argument("--model", default="vgg11", choices=sorted(VGG_CFG) + [f"resnet{d}" for d in CIFAR_DEPTHS])
    ap.add_argument("--write", help="write torch_vgg_cifar.py's stream and weights for --seed to WRITE.bin, WRITE.safetensors")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--stream", help="train on this stream file")
    ap.add_argument("--init", help="from these initial weights (spargo's safetensors names)")
    ap.add_argument("--steps", type=int, default=0, help="train only the first N steps of each epoch (0: all)")
    ap.add_argument("--eval-limit", type=int, default=0, help="evaluate on the first N test images (0: all)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--wd", type=float, default=5e-4)
    ap.add_argument("--schedule", default="constant", choices=["constant", "cosine"],
                    help="cosine: per step from --lr to 0 over the replayed steps (spargo's -schedule cosine)")
    ap.add_argument("--log-steps", type=int, default=0, help="print the mean loss of each of the first N steps")
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop after N steps in all (the schedule stays the whole run's; with --log-steps)")
    ap.add_argument("--double", action="store_true",
                    help="train in float64 (from the same float32 weights): the float32 rounding floor of a trajectory")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    xtr, ytr, xte, yte = T.load_cifar(a.data)
    if a.eval_limit:
        xte, yte = xte[:a.eval_limit], yte[:a.eval_limit]
    if a.write:
        write(a, len(xtr))
    if a.stream:
        if not a.init:
            sys.exit("--stream needs --init")
        replay(a, xtr, ytr, xte, yte)
    if not (a.write or a.stream):
        sys.exit("give --write PREFIX, or --stream FILE --init FILE")


if __name__ == "__main__":
    main()
