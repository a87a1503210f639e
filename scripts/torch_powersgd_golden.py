#!/usr/bin/env python3
# Golden values for spargo's powersgd hook from PyTorch's own powerSGD_hook
# (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py), run unmodified on two
# simulated ranks in one process.
#
# Regenerate with (from the repository root):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_powersgd_golden.py hooks/testdata/powersgd_golden.json
#
# The Go test hooks/powersgd_golden_test.go reads the file.
#
# How the two ranks are simulated: each rank runs the real hook in its own thread with its
# own PowerSGDState and a fake GradBucket whose gradients() are views into buffer();
# torch.distributed.all_reduce is replaced by a barrier that sums the two ranks' tensors
# (rank 0's + rank 1's, in float32) and writes the sum into both. The hook's random initial
# Qs are drawn from a per-thread generator (torch.manual_seed / torch.randn are redirected
# for the hook module only, so the two threads do not race on the global RNG) and recorded,
# so the Go side can start from exactly the same Qs.
#
# Inputs need no RNG: gradient element i of rank r at iteration it is splitmix64 of
# i + 1000*r + 100000*it, mapped to [-1, 1) and rounded to float32 (the Go test computes the
# same numbers).
import json
import sys
import threading

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

torch.set_num_threads(1)

WORLD = 2
START_ITER = 2
ITERATIONS = 5
SHAPES = [[8, 3, 3, 3], [8], [6, 20], [3, 4]]
CONFIGS = [
    # rank 2: PyTorch orthogonalises with Gram-Schmidt, like spargo.
    dict(name="rank2", rank=2, min_compression_rate=2.0, use_error_feedback=True, warm_start=True),
    # rank 4: PyTorch uses Householder QR; the output must still agree (same column spans).
    dict(name="rank4_qr", rank=4, min_compression_rate=1.0, use_error_feedback=True, warm_start=True),
    # no error feedback, no warm start: a fresh Q every call.
    dict(name="rank1_cold", rank=1, min_compression_rate=2.0, use_error_feedback=False, warm_start=False),
]

M64 = (1 << 64) - 1


def splitmix(x):
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def gradient(rank, it, n):
    return np.array([(splitmix(i + 1000 * rank + 100000 * it) >> 11) / 2.0**53 * 2 - 1 for i in range(n)], dtype=np.float32)


class FakeGroup:
    def size(self):
        return WORLD


class Collective:
    """all_reduce across the rank threads: rank 0's tensor + rank 1's, written into both."""

    def __init__(self):
        self.barrier = threading.Barrier(WORLD)
        self.slots = [None] * WORLD
        self.local = threading.local()

    def all_reduce(self, tensor, group=None, async_op=False):
        r = self.local.rank
        self.slots[r] = tensor.clone()
        self.barrier.wait()
        total = self.slots[0].clone()
        for t in self.slots[1:]:
            total += t
        self.barrier.wait()
        tensor.copy_(total)
        fut = torch.futures.Future()
        fut.set_result([tensor])

        class Work:
            def get_future(self):
                return fut

            def wait(self):
                return True

        return Work()


class TorchForHook:
    """The hook module's `torch`: everything is torch, but manual_seed/randn use a per-thread
    generator, and randn's draws are recorded."""

    def __init__(self, local):
        self._local = local

    def __getattr__(self, name):
        return getattr(torch, name)

    def manual_seed(self, seed):
        self._local.gen = torch.Generator().manual_seed(int(seed))

    def randn(self, *shape, device=None, dtype=None):
        t = torch.randn(*shape, generator=self._local.gen, dtype=dtype)
        self._local.draws.append(t.clone())
        return t


class Bucket:
    def __init__(self, buf, shapes):
        self.buf = buf
        self.views = []
        off = 0
        for s in shapes:
            n = int(np.prod(s))
            self.views.append(buf[off:off + n].view(*s))
            off += n

    def buffer(self):
        return self.buf

    def index(self):
        return 0

    def is_last(self):
        return True

    def gradients(self):
        return self.views


def f32(a):
    """float32 values as the shortest decimals that read back as the same float32."""
    return [float(repr(np.float32(x))) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def run_config(cfg, coll):
    n = sum(int(np.prod(s)) for s in SHAPES)
    outs = [[None] * ITERATIONS for _ in range(WORLD)]
    draws = [{} for _ in range(WORLD)]
    states = [None] * WORLD
    errors = [None] * WORLD

    def worker(r):
        coll.local.rank = r
        coll.local.draws = []
        st = ps.PowerSGDState(process_group=FakeGroup(), matrix_approximation_rank=cfg["rank"],
                              start_powerSGD_iter=START_ITER, min_compression_rate=cfg["min_compression_rate"],
                              use_error_feedback=cfg["use_error_feedback"], warm_start=cfg["warm_start"],
                              orthogonalization_epsilon=0, random_seed=0)
        states[r] = st
        for it in range(ITERATIONS):
            before = len(coll.local.draws)
            buf = torch.from_numpy(gradient(r, it, n).copy())
            out = ps.powerSGD_hook(st, Bucket(buf, SHAPES)).wait()
            outs[r][it] = out.clone().numpy()
            new = coll.local.draws[before:]
            if new:
                draws[r][it] = np.concatenate([d.reshape(-1).numpy() for d in new])
        if cfg["use_error_feedback"]:
            errors[r] = st.error_dict[0].clone().numpy()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for it in range(ITERATIONS):
        assert np.array_equal(outs[0][it], outs[1][it]), "ranks disagree"
    assert draws[0].keys() == draws[1].keys()
    for k in draws[0]:
        assert np.array_equal(draws[0][k], draws[1][k])
    res = dict(cfg)
    res["outputs"] = [f32(o) for o in outs[0]]
    res["q_draws"] = {str(k): f32(v) for k, v in sorted(draws[0].items())}
    res["errors"] = [f32(e) for e in errors] if cfg["use_error_feedback"] else []
    res["q_final"] = f32(states[0].q_memory_dict[0].clone().numpy()) if cfg["warm_start"] else []
    _, before, after = states[0].compression_stats()
    res["numel_before"], res["numel_after"] = before, after
    return res


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "hooks/testdata/powersgd_golden.json"
    coll = Collective()
    dist.all_reduce = coll.all_reduce
    ps.torch = TorchForHook(coll.local)
    golden = dict(torch_version=torch.__version__, world=WORLD, start_iter=START_ITER,
                  iterations=ITERATIONS, shapes=SHAPES, configs=[run_config(c, coll) for c in CONFIGS])
    with open(out, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
