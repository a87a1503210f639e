# PyTorch yardsticks for spargo's compressed hooks (issue 26): dgc, qsgd, efsignsgd, signsgd, signum, onebit, randomk and threshold written from the
# papers, on the recipe of anchors/torch_cifar_vgg_topk.py (P simulated workers in one process, VGG-11 on
# CIFAR-10, SGD lr 0.01, momentum 0.9, wd 5e-4, 3 epochs), and the same compressors as real DDP comm hooks
# (ddp_hook below) for torchrun.
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_compressors.py DATA_DIR MODEL EPOCHS WORKERS BATCH_PER_WORKER HOOK [LR=0.01] [SEED=0] [BN=shared]
# BN=shared keeps the BatchNorm running statistics updated by every worker's batch in turn (the anchor's
# simulation); BN=rank0 keeps worker 0's only, as DDP evaluates (worth about 3 points on the dense recipe).
# HOOK: dgc[:density=0.001,momentum=0.9,warmup=0] | qsgd[:levels=127,chunk=512] | efsignsgd | signsgd |
# signum[:beta=0.9] | onebit[:scale=mean] | randomk[:density=0.01,seed=0] |
# threshold[:v=0.01] | allreduce.
# dgc applies the momentum itself (momentum correction): the optimizer then runs without momentum, as
# spargo's recipe for -hook dgc (scripts/convergence.sh passes -momentum 0 for it).
# Prints test accuracy per epoch, as the anchor does. Not run in CI: the convergence check runs it.
import sys, time, numpy as np, torch, torch.nn as nn, torch.nn.functional as F

def parse(spec):
    name, _, opts = spec.partition(':')
    kv = dict(o.split('=') for o in opts.split(',') if o)
    return name, kv

class DGC:
    """Lin et al. 2018: u = m·u + g, v = v + u, top-k of |v| sent, v and u zeroed where sent, warm-up."""
    warm = [0.25, 0.0625, 0.015625, 0.004]
    def __init__(self, n, density=0.001, momentum=0.9, warmup=0, clip=0.0, P=1):
        self.n, self.d, self.m, self.w, self.clip, self.P = n, float(density), float(momentum), int(warmup), float(clip), P
        self.u, self.v, self.calls = torch.zeros(n), torch.zeros(n), 0
    def __call__(self, g):
        if self.clip > 0:
            bound = self.clip / self.P ** 0.5; norm = g.norm()
            if norm > bound: g = g * (bound / norm)
        d = self.d
        if self.w > 0 and self.calls // self.w < len(self.warm): d = max(d, self.warm[self.calls // self.w])
        self.calls += 1
        k = min(self.n, max(1, int(self.n * d)))
        self.u = self.m * self.u + g; self.v += self.u
        top = self.v.abs().topk(k, sorted=False).indices
        sent = torch.zeros(self.n); sent[top] = self.v[top]
        self.v[top] = 0; self.u[top] = 0
        return sent

class QSGD:
    """Alistarh et al. 2017: per chunk of d elements, ‖v‖·sign(x)·ℓ/s, ℓ stochastic rounding of s|x|/‖v‖."""
    def __init__(self, n, levels=127, chunk=512, seed=0):
        self.s, self.d, self.gen = int(levels), int(chunk), torch.Generator().manual_seed(int(seed))
    def __call__(self, g):
        d = self.d if self.d > 0 else g.numel()
        pad = (-g.numel()) % d
        x = torch.cat([g, torch.zeros(pad)]).view(-1, d)
        norm = x.norm(dim=1, keepdim=True)
        a = torch.where(norm > 0, self.s * x.abs() / norm.clamp_min(1e-38), torch.zeros_like(x)).clamp(max=self.s)
        l = a.floor() + (torch.rand(a.shape, generator=self.gen) < a - a.floor()).float()
        return (norm * x.sign() * l / self.s).view(-1)[:g.numel()]

class EFSign:
    """Karimireddy et al. 2019: p = g + e, Δ = (‖p‖₁/n)·sign(p), e = p − Δ."""
    def __init__(self, n):
        self.e = torch.zeros(n)
    def __call__(self, g):
        p = g + self.e
        delta = p.abs().mean() * torch.where(p < 0, -1.0, 1.0)
        self.e = p - delta
        return delta

class Sign:
    """Bernstein et al. 2018: each worker sends sign(g) (signsgd) or sign(m), m = β·m + (1-β)·g (signum),
    with 0 sent as +1 as 1-bit packings do; the result is the majority vote sign(Σ signs) (majority below)."""
    majority = True
    def __init__(self, n, beta=None):
        self.beta = None if beta is None else float(beta)
        self.m = torch.zeros(n)
    def __call__(self, g):
        if self.beta is not None:
            self.m = self.beta * self.m + (1 - self.beta) * g; g = self.m
        return torch.where(g < 0, -1.0, 1.0)

class OneBit:
    """Seide et al. 2014 as DeepSpeed's compressed all-reduce (1-bit Adam's backend): the vector is cut in P
    chunks (n//P elements, the first n%P one longer); each worker sends s·sign(p) per chunk of p = g + e and
    keeps e = p − what it sent; the server of each chunk takes the mean of the P messages, adds its own
    residual and sends that back the same way (server below). s = ‖x‖₁/c (scale=mean) or ‖x‖₂/√c (scale=rms,
    DeepSpeed's). 0 is sent as +1."""
    def __init__(self, n, P, scale='mean'):
        if scale not in ('mean', 'rms'): raise SystemExit(f"onebit: scale={scale!r}: want mean or rms")
        base, extra = divmod(n, P)
        self.bounds = np.cumsum([0] + [base + (1 if j < extra else 0) for j in range(P)]).tolist()
        self.scale, self.e = scale, torch.zeros(n)
        self.server = OneBitServer(self, n)
    def compress(self, x):
        out = torch.empty_like(x)
        for a, b in zip(self.bounds, self.bounds[1:]):
            c = x[a:b]
            s = c.abs().mean() if self.scale == 'mean' else c.norm() / (b - a) ** 0.5
            out[a:b] = s * torch.where(c < 0, -1.0, 1.0)
        return out
    def __call__(self, g):
        p = g + self.e
        sent = self.compress(p); self.e = p - sent
        return sent

class OneBitServer:
    """The servers' stage of OneBit on the mean of the workers' messages, with the server residual."""
    def __init__(self, worker, n):
        self.worker, self.e = worker, torch.zeros(n)
    def __call__(self, mean):
        q = mean + self.e
        sent = self.worker.compress(q); self.e = q - sent
        return sent

class RandomK:
    """Stich et al. 2018 (GRACE's RandomK) with a shared seed: every worker keeps the same k = ⌊n·density⌋
    positions of p = g + e, drawn anew each call from the seed and the call number (so the messages sum),
    and keeps e = p − what it sent."""
    _shared = {}
    def __init__(self, n, density=0.01, seed=0):
        self.n, self.k, self.seed, self.calls, self.e = n, max(1, int(n * float(density))), int(seed), 0, torch.zeros(n)
    def positions(self):
        key = (self.seed, self.calls, self.n, self.k)
        if key not in RandomK._shared:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
            RandomK._shared.clear(); RandomK._shared[key] = torch.randperm(self.n, generator=gen)[:self.k]
        return RandomK._shared[key]
    def __call__(self, g):
        p = g + self.e; pos = self.positions(); self.calls += 1
        sent = torch.zeros(self.n); sent[pos] = p[pos]
        self.e = p - sent
        return sent

class Threshold:
    """Hard threshold with error feedback: the entries of p = g + e with |p| ≥ v are sent, e keeps the rest."""
    def __init__(self, n, v=0.01):
        self.v, self.e = float(v), torch.zeros(n)
    def __call__(self, g):
        p = g + self.e
        sent = torch.where(p.abs() >= self.v, p, torch.zeros_like(p)); self.e = p - sent
        return sent

def compressor(spec, n, P, rank):
    name, kv = parse(spec)
    if name == 'dgc': return DGC(n, P=P, **kv)
    if name == 'qsgd': return QSGD(n, seed=int(kv.pop('seed', 0)) * 1000 + rank, **kv)
    if name == 'efsignsgd': return EFSign(n)
    if name == 'signsgd': return Sign(n)
    if name == 'signum': return Sign(n, beta=kv.get('beta', 0.9))
    if name == 'onebit': return OneBit(n, P, **kv)
    if name == 'randomk': return RandomK(n, **kv)
    if name == 'threshold': return Threshold(n, **kv)
    if name == 'allreduce': return lambda g: g
    raise SystemExit(f"unknown hook {spec!r}: dgc, qsgd, efsignsgd, signsgd, signum, onebit, randomk, threshold or allreduce")

def ddp_hook(spec):
    """The same compressors as a torch DDP comm hook (model.register_comm_hook(None, ddp_hook(spec))):
    each rank compresses its bucket (state per bucket index), all-gathers the decoded messages and averages."""
    import torch.distributed as dist
    states = {}
    def hook(_, bucket):
        g = bucket.buffer()
        key = bucket.index()
        if key not in states:
            states[key] = compressor(spec, g.numel(), dist.get_world_size(), dist.get_rank())
        sent = states[key](g.detach().float().cpu()).to(g.device, g.dtype)
        out = [torch.zeros_like(sent) for _ in range(dist.get_world_size())]
        fut = dist.all_gather(out, sent, async_op=True).get_future()
        vote = getattr(states[key], 'majority', False)
        # onebit: every rank runs the servers' stage on the whole mean (the same on each rank, as the
        # all-gather of the servers' messages would give it).
        server = getattr(states[key], 'server', lambda x: x)
        return fut.then(lambda _: torch.stack(out).sum(0).sign() if vote else server(torch.stack(out).mean(0)))
    return hook

def main():
    data, model_name, epochs, P, bs, spec = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    lr = float(sys.argv[7]) if len(sys.argv) > 7 else 0.01
    seed = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    bn_mode = sys.argv[9] if len(sys.argv) > 9 else 'shared'
    if bn_mode not in ('shared', 'rank0'): raise SystemExit(f"BN={bn_mode!r}: want shared or rank0")
    torch.set_num_threads(2); torch.manual_seed(seed); np.random.seed(seed)
    def load(path):
        raw = np.fromfile(path, dtype=np.uint8).reshape(-1, 3073)
        return raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, raw[:, 0].astype(np.int64)
    xtr, ytr = load(f"{data}/data_batch_1.bin"); xte, yte = load(f"{data}/test_batch.bin")
    mean = np.array([0.4914, 0.4822, 0.4465], np.float32).reshape(1, 3, 1, 1); std = np.array([0.2470, 0.2435, 0.2616], np.float32).reshape(1, 3, 1, 1)
    xtr = (xtr - mean) / std; xte = (xte - mean) / std
    cfg = {'vgg11': [64,'M',128,'M',256,256,'M',512,512,'M',512,512,'M']}
    layers = []; c = 3
    for v in cfg[model_name]:
        if v == 'M': layers.append(nn.MaxPool2d(2))
        else: layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]; c = v
    m = nn.Sequential(*layers, nn.Flatten(), nn.Linear(512, 10))
    params = list(m.parameters()); n = sum(p.numel() for p in params)
    bns = [l for l in m.modules() if isinstance(l, nn.BatchNorm2d)]
    momentum = 0.0 if parse(spec)[0] == 'dgc' else 0.9
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=5e-4)
    comps = [compressor(spec, n, P, r) for r in range(P)]
    def augment(x):
        nb = x.shape[0]; p = np.pad(x, ((0,0),(0,0),(4,4),(4,4))); out = np.empty_like(x)
        ox = np.random.randint(0, 9, nb); oy = np.random.randint(0, 9, nb); fl = np.random.rand(nb) < 0.5
        for i in range(nb):
            t = p[i, :, oy[i]:oy[i]+32, ox[i]:ox[i]+32]; out[i] = t[:, :, ::-1] if fl[i] else t
        return out
    t0 = time.time(); G = P * bs
    for ep in range(epochs):
        m.train(); perm = np.random.permutation(len(xtr)); tl = 0; nb = 0
        for i in range(0, len(perm) - G + 1, G):
            total = torch.zeros(n)
            for r in range(P):
                # BN=rank0: momentum 0 leaves the running statistics as worker 0 left them.
                for b in bns: b.momentum = 0.0 if bn_mode == 'rank0' and r > 0 else 0.1
                idx = perm[i + r*bs:i + (r+1)*bs]
                m.zero_grad(); loss = F.cross_entropy(m(torch.from_numpy(augment(xtr[idx]))), torch.from_numpy(ytr[idx])); loss.backward(); tl += loss.item() / P
                total += comps[r](torch.cat([p.grad.reshape(-1) for p in params]))
            total = torch.sign(total) if getattr(comps[0], 'majority', False) else getattr(comps[0], 'server', lambda x: x)(total / P); off = 0
            for p in params: p.grad = total[off:off+p.numel()].view_as(p).clone(); off += p.numel()
            opt.step(); nb += 1
        m.eval(); correct = 0
        with torch.no_grad():
            for j in range(0, len(xte), 500): correct += (m(torch.from_numpy(xte[j:j+500])).argmax(1).numpy() == yte[j:j+500]).sum()
        print(f"epoch {ep+1} P {P} hook {spec} bn {bn_mode} train_loss {tl/nb:.4f} test_acc {correct/len(xte):.4f} total_s {time.time()-t0:.1f}", flush=True)

if __name__ == '__main__':
    main()
