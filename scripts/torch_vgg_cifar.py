#!/usr/bin/env python3
# PyTorch comparison for BENCHMARKS.md: trains a CIFAR-variant VGG-BN (11/13/16/19) on
# CIFAR-10 in the official binary format (data_batch_*.bin, test_batch.bin: records of
# 1 label byte + 3072 pixel bytes) with the same recipe as spargo's Go example:
#   SGD momentum 0.9, weight decay 5e-4, constant lr; per-channel normalisation, then
#   random crop from the 4-pixel zero-padded image + horizontal flip; cross-entropy;
#   test accuracy after every epoch.
#
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_vgg_cifar.py \
#       --data /work/shared/data/cifar10/approx --model vgg11 --epochs 10 --batch 64 --lr 0.01
#
# Quick smoke test (256 train / 256 test images, 1 epoch):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_vgg_cifar.py \
#       --data /work/shared/data/cifar10/approx --model vgg11 --epochs 1 --batch 32 --limit 256
#
# --workers W simulates data-parallel training the way PyTorch DDP does it: each step takes
# a global batch of W*batch images, splits it into W shards of --batch, runs forward/backward
# per shard (so BatchNorm batch statistics are per shard), averages the gradients and takes
# one SGD step; BatchNorm running statistics are those of shard 0 (DDP broadcasts rank 0's
# buffers). The lr is used as given (not scaled by W). --bn shared keeps instead the running
# statistics updated by every shard in turn (what scripts/anchors/torch_cifar_vgg_topk.py does).
#
# --hook replaces the dense average by a simulated sparse scheme on the whole flattened
# gradient (one bucket), each worker with its own residual (error feedback):
#   topka   local top-k per worker, sum of the sparse vectors (the anchor's TopkA);
#   spardl  SparDL with d = 1 (docs/ALGORITHMS.md §2): Spar-Reduce-Scatter over N = W blocks with
#           per-block budget k_b, sparsify-before-send, global residual collection. It is
#           written plainly from the specification, as an independent check of the Go hook's
#           accuracy (not of its communication).
#   lags    layer-wise TopkA (LAGS): local top-k of every parameter tensor, error feedback per
#           tensor. --dense-below N sends the tensors of fewer than N elements densely (summed
#           exactly, no residual), as spargo's lags/mgs/omgs option dense_below does (its
#           default there is 8192; here 0, every tensor sparsified, the paper's algorithm).
#   covap   COVAP with the paper's scheduled error feedback (docs/ALGORITHMS.md §6, hooks/covap.go):
#           DDP's buckets (reverse parameter order, 1 MiB first bucket, then 25 MiB), split into
#           shards by the median rule, shard i sent at step s iff (i + s) mod I == 0 (--interval),
#           step 0 dense, acc = g + c(s)·r with c(s) = min(0.5 + floor(s/50)·0.1, 1). Written
#           plainly from the specification, as an independent check of the Go hook's training.
# Example (the hooks' convergence check, SparDL at density 0.01):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_vgg_cifar.py --data DATA \
#       --model vgg11 --epochs 3 --workers 4 --batch 16 --hook spardl --density 0.01
# --model resnet20 (32, 44, 56, 110) trains He et al.'s CIFAR ResNet (scripts/torch_models.py,
# akamaster/pytorch_resnet_cifar10's definition and init), spargo's examples/resnet recipe:
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_vgg_cifar.py --data DATA \
#       --model resnet20 --epochs 3 --workers 2 --batch 128 --lr 0.1 --wd 1e-4 --schedule cosine
# Prints one line per epoch: "epoch E train_loss L test_acc A img_s S" (+ timings).
import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import CIFAR_DEPTHS, VGG_CFG, build  # noqa: E402

MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.2470, 0.2435, 0.2616], np.float32).reshape(1, 3, 1, 1)


def load_bin(paths):
    raw = np.concatenate([np.fromfile(p, dtype=np.uint8).reshape(-1, 3073) for p in paths])
    x = raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    return (x - MEAN) / STD, raw[:, 0].astype(np.int64)


def load_cifar(data):
    train = sorted(glob.glob(os.path.join(data, "data_batch_*.bin")))
    test = os.path.join(data, "test_batch.bin")
    if not train or not os.path.exists(test):
        sys.exit(f"{data}: need data_batch_*.bin and test_batch.bin (CIFAR-10 binary format)")
    xtr, ytr = load_bin(train)
    xte, yte = load_bin([test])
    return xtr, ytr, xte, yte


def augment(x, rng):
    """Random 32x32 crop of the zero-padded (4 px) normalised image, then random h-flip."""
    n = x.shape[0]
    p = np.pad(x, ((0, 0), (0, 0), (4, 4), (4, 4)))
    ox = rng.integers(0, 9, n)
    oy = rng.integers(0, 9, n)
    flip = rng.random(n) < 0.5
    out = np.empty_like(x)
    for i in range(n):
        t = p[i, :, oy[i]:oy[i] + 32, ox[i]:ox[i] + 32]
        out[i] = t[:, :, ::-1] if flip[i] else t
    return out


def topk_abs(v, k):
    """Indices of the k largest |v| (k clipped to len(v))."""
    k = min(k, v.numel())
    return v.abs().topk(k, sorted=False).indices


def topka(grads, resid, density):
    """Local top-k with local error feedback; returns the summed sparse gradient."""
    n = grads[0].numel()
    k = max(1, int(n * density))
    total = torch.zeros(n)
    for r, g in enumerate(grads):
        acc = g + resid[r]
        idx = topk_abs(acc, k)
        total[idx] += acc[idx]
        acc[idx] = 0
        resid[r] = acc
    return total


def lags(grads, resid, density, sizes, dense_below=0):
    """Layer-wise TopkA: local top-k of every tensor (k = max(1, int(size*density))) with
    local error feedback per tensor; tensors of fewer than dense_below elements are summed
    densely and keep no residual. Returns the summed gradient."""
    n = grads[0].numel()
    total = torch.zeros(n)
    for r, g in enumerate(grads):
        acc = g + resid[r]
        off = 0
        for size in sizes:
            if size < dense_below:
                total[off:off + size] += acc[off:off + size]
                acc[off:off + size] = 0
            else:
                seg = acc[off:off + size]
                idx = topk_abs(seg, max(1, int(size * density))) + off
                total[idx] += acc[idx]
                acc[idx] = 0
            off += size
        resid[r] = acc
    return total


class Covap:
    """COVAP's schedule and scheduled error feedback on the flattened gradient (see header)."""

    def __init__(self, params, interval, first=262144, cap=6553600):
        sizes = [p.numel() for p in params]
        offs = np.cumsum([0] + sizes)
        rev = [np.arange(offs[i], offs[i] + sizes[i]) for i in reversed(range(len(sizes)))]
        self.rev = torch.from_numpy(np.concatenate(rev))
        buckets, cur, lim = [], 0, first
        for sz in reversed(sizes):
            cur += sz
            if cur >= lim:
                buckets.append(cur)
                cur, lim = 0, cap
        if cur:
            buckets.append(cur)
        srt = sorted(buckets)
        two_m = 2 * srt[len(srt) // 2] if len(srt) % 2 else srt[len(srt) // 2 - 1] + srt[len(srt) // 2]
        self.shards = []  # (global shard index, lo, hi) in reverse-order positions
        g, base = 0, 0
        for b in buckets:
            k = max(1, min(max(1, 2 * b // two_m), interval, b))
            for j in range(k):
                self.shards.append((g + j, base + j * b // k, base + (j + 1) * b // k))
            g, base = g + k, base + b
        self.interval, self.n, self.s = interval, offs[-1], 0
        print(f"# covap buckets {buckets} shards {[(i, hi - lo) for i, lo, hi in self.shards]}", flush=True)

    def __call__(self, grads, resid):
        c = min(0.5 + (self.s // 50) * 0.1, 1.0)
        sent = torch.zeros(self.n, dtype=torch.bool)
        if self.s == 0:
            sent[:] = True
        else:
            for i, lo, hi in self.shards:
                if (i + self.s) % self.interval == 0:
                    sent[self.rev[lo:hi]] = True
        total = torch.zeros(self.n)
        for r, g in enumerate(grads):
            acc = g + c * resid[r]
            total[sent] += acc[sent]
            acc[sent] = 0
            resid[r] = acc
        self.s += 1
        return total


def spardl_schedule(N):
    """Bag sizes and gaps of Spar-Reduce-Scatter (docs/ALGORITHMS.md §2)."""
    L = (N - 1).bit_length()
    if L == 0:
        return [], []
    E = N - 2 ** (L - 1)
    sizes = [E] + [2 ** (L - 2 - t) for t in range(L - 1)]
    gaps, gap = [], N - sizes[0]
    for _ in range(L):
        gaps.append(gap)
        gap //= 2
    return sizes, gaps


def spardl(grads, resid, density):
    """SparDL, d = 1: returns the summed sparse gradient and updates resid (global residuals)."""
    P = len(grads)
    n = grads[0].numel()
    N = P
    c = -(-n // N)
    kb = max(1, int(c * density))
    acc = [torch.cat([g + resid[r], torch.zeros(c * N - n)]) for r, g in enumerate(grads)]
    hold = [{b: acc[r][b * c:(b + 1) * c].clone() for b in range(N)} for r in range(P)]
    local_res = [dict() for _ in range(P)]  # rank -> block -> dense residual when forwarding
    sizes, gaps = spardl_schedule(N)
    for size, gap in zip(sizes, gaps):
        msgs = []
        for r in range(P):
            dst = (r + gap) % N
            bag = []
            for j in range(size):
                b = (r + gap + j) % N
                v = hold[r].pop(b)
                idx = topk_abs(v, kb)
                sel = v[idx]
                v[idx] = 0
                local_res[r][b] = v
                bag.append((b, idx, sel))
            msgs.append((dst, bag))
        for dst, bag in msgs:
            for b, idx, sel in bag:
                hold[dst][b][idx] += sel
    out = torch.zeros(c * N)
    final = {}
    for r in range(P):
        (b, v), = hold[r].items()
        idx = topk_abs(v, kb)
        out[b * c + idx] = v[idx]
        v[idx] = 0
        local_res[r][b] = v
        final[b] = idx
    for r in range(P):
        new = acc[r].clone()
        for b in range(N):
            idx = final[b]
            blk = new[b * c:(b + 1) * c]
            blk[idx] = local_res[r][b][idx]
        resid[r] = new[:n]
    return out[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="directory with the CIFAR-10 .bin files")
    ap.add_argument("--model", default="vgg11",
                    choices=sorted(VGG_CFG) + [f"resnet{d}" for d in CIFAR_DEPTHS])
    ap.add_argument("--schedule", default="constant", choices=["constant", "cosine"],
                    help="cosine: per step from --lr to 0 over the run (spargo's -schedule cosine)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64, help="per-worker batch size")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--wd", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1,
                    help="simulated data-parallel workers; global batch = workers*batch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0,
                    help="use only the first N train and N test images (smoke tests)")
    ap.add_argument("--limit-test", type=int, default=0, help="override --limit for the test set")
    ap.add_argument("--json", help="also write per-epoch results to this file")
    ap.add_argument("--bn", default="rank0", choices=["rank0", "shared"],
                    help="BatchNorm running statistics: rank 0's (DDP) or updated by every shard")
    ap.add_argument("--hook", default="dense", choices=["dense", "topka", "spardl", "lags", "covap"])
    ap.add_argument("--interval", type=int, default=2, help="COVAP's interval I (--hook covap)")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--dense-below", type=int, default=0,
                    help="--hook lags: tensors of fewer elements are summed densely (spargo's dense_below)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    xtr, ytr, xte, yte = load_cifar(a.data)
    if a.limit:
        xtr, ytr = xtr[:a.limit], ytr[:a.limit]
    lt = a.limit_test or a.limit
    if lt:
        xte, yte = xte[:lt], yte[:lt]

    m = build(a.model)
    nparams = sum(p.numel() for p in m.parameters())
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.wd)
    W, B = a.workers, a.batch
    gb = W * B
    if len(xtr) < gb:
        sys.exit(f"{len(xtr)} training images is less than one global batch of {gb}")
    print(f"# {a.model} params {nparams} train {len(xtr)} test {len(xte)} workers {W} "
          f"batch {B} global_batch {gb} lr {a.lr} threads {a.threads} torch {torch.__version__}",
          flush=True)

    bn = [mod for mod in m.modules() if isinstance(mod, nn.BatchNorm2d)]
    params = list(m.parameters())
    resid = [torch.zeros(nparams) for _ in range(W)]
    covap = Covap(params, a.interval) if a.hook == "covap" else None
    history = []
    steps_per_epoch = len(xtr) // gb
    total_steps = a.epochs * steps_per_epoch
    t0 = time.time()
    for ep in range(1, a.epochs + 1):
        m.train()
        perm = rng.permutation(len(xtr))
        tl, nb, ts = 0.0, 0, time.time()
        for i in range(0, len(perm) - gb + 1, gb):
            if a.schedule == "cosine":  # optim.Cosine: t = steps taken so far
                t = (ep - 1) * steps_per_epoch + i // gb
                for grp in opt.param_groups:
                    grp["lr"] = 0.5 * a.lr * (1 + math.cos(math.pi * t / total_steps))
            idx = perm[i:i + gb]
            x = torch.from_numpy(augment(xtr[idx], rng))
            y = torch.from_numpy(ytr[idx])
            opt.zero_grad(set_to_none=True)
            step_loss, rank0, grads = 0.0, None, []
            for w in range(W):
                xs, ys = x[w * B:(w + 1) * B], y[w * B:(w + 1) * B]
                loss = F.cross_entropy(m(xs), ys)
                if a.hook == "dense":
                    (loss / W).backward()  # gradient = mean over workers, as DDP all-reduce
                else:
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    grads.append(torch.cat([p.grad.reshape(-1) for p in params]))
                step_loss += loss.item() / W
                if w == 0 and W > 1 and a.bn == "rank0":
                    rank0 = [(b.running_mean.clone(), b.running_var.clone(),
                              b.num_batches_tracked.clone()) for b in bn]
            if rank0 is not None:
                with torch.no_grad():
                    for b, (rm, rv, nt) in zip(bn, rank0):
                        b.running_mean.copy_(rm)
                        b.running_var.copy_(rv)
                        b.num_batches_tracked.copy_(nt)
            if a.hook != "dense":
                if a.hook == "lags":
                    total = lags(grads, resid, a.density, [p.numel() for p in params], a.dense_below) / W
                elif a.hook == "covap":
                    total = covap(grads, resid) / W
                else:
                    total = (topka if a.hook == "topka" else spardl)(grads, resid, a.density) / W
                off = 0
                for p in params:
                    p.grad = total[off:off + p.numel()].view_as(p).clone()
                    off += p.numel()
            opt.step()
            tl += step_loss
            nb += 1
        train_s = time.time() - ts
        m.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(xte), 500):
                pred = m(torch.from_numpy(xte[i:i + 500])).argmax(1).numpy()
                correct += int((pred == yte[i:i + 500]).sum())
        acc = correct / len(xte)
        img_s = nb * gb / train_s
        rec = {"epoch": ep, "train_loss": tl / nb, "test_acc": acc, "img_s": img_s,
               "train_s": train_s, "total_s": time.time() - t0}
        history.append(rec)
        print(f"epoch {ep} train_loss {tl / nb:.4f} test_acc {acc:.4f} img_s {img_s:.1f} "
              f"train_s {train_s:.1f} total_s {rec['total_s']:.1f}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "params": nparams, "torch_version": torch.__version__,
                           "train_images": len(xtr), "test_images": len(xte),
                           "epochs": history}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
