#!/usr/bin/env python3
# PyTorch side of spargo's BERT step benchmarks (models/bert_bench_test.go): one training
# step (forward + backward, gradients zeroed, no optimizer) at batch 8, sequence 128, in
# training mode (dropout 0.1), of BERT-tiny with its MLM + NSP loss and of one BERT-base
# layer with a padding mask; and (--only mlm) examples/bert's step, BenchmarkBertTinyMLMStep:
# BERT-tiny with an 8,000-token vocabulary, batch 16 x 128, every 7th real position masked,
# the MLM head only there. Same batch layouts as the Go benchmarks.
#
#   /usr/bin/python3 scripts/torch_bert_step.py --runs 5 --steps 10 [--threads 2] [--only tiny|layer|mlm]
#
# Prints the median ms/step over runs (each run: mean of --steps steps after a warm-up) and
# the median CPU ms/step (process time, which a loaded machine does not distort).
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_bert_goldens import BertForPreTraining, Layer  # noqa: E402  plain-torch HF layout



def bert_layer_forward(layer, x, mask, p=0.1):
    a = layer.attention.self
    n, t, h = x.shape
    split = lambda v: v.view(n, t, a.heads, a.d).permute(0, 2, 1, 3)
    q, k, v = split(a.query(x)), split(a.key(x)), split(a.value(x))
    s = q @ k.transpose(-1, -2) / (a.d ** 0.5) + (1.0 - mask[:, None, None, :]) * -10000.0
    probs = F.dropout(torch.softmax(s, -1), p, True)
    ctx = (probs @ v).permute(0, 2, 1, 3).reshape(n, t, h)
    o = layer.attention.output
    h1 = o.LayerNorm(F.dropout(o.dense(ctx), p, True) + x)
    inter = F.gelu(layer.intermediate.dense(h1))
    return layer.output.LayerNorm(F.dropout(layer.output.dense(inter), p, True) + h1)


def tiny_step(model, ids, types, mask, mlm_labels, nsp_labels, p=0.1):
    b = model.bert
    pos = torch.arange(ids.shape[1])[None, :].expand_as(ids)
    e = b.embeddings
    h = F.dropout(e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(pos) + e.token_type_embeddings(types)), p, True)
    for layer in b.encoder.layer:
        h = bert_layer_forward(layer, h, mask, p)
    pooled = torch.tanh(b.pooler.dense(h[:, 0]))
    tr = model.cls.predictions.transform
    mlm = model.cls.predictions.decoder(tr.LayerNorm(F.gelu(tr.dense(h))))
    nsp = model.cls.seq_relationship(pooled)
    return F.cross_entropy(mlm.view(-1, mlm.shape[-1]), mlm_labels.view(-1)) + F.cross_entropy(nsp, nsp_labels)


def batch(vocab, n=8, t=128):
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(1, vocab, (n, t), generator=g)
    mask = torch.ones(n, t)
    mask[1::2, t - 16:] = 0
    types = torch.zeros(n, t, dtype=torch.long)
    types[:, t // 2:] = 1
    types[mask == 0] = 0
    ids[mask == 0] = 0
    mlm = torch.full((n, t), -100)
    pick = (torch.rand(n, t, generator=g) < 0.15) & (mask == 1)
    mlm[pick] = torch.randint(0, vocab, (int(pick.sum()),), generator=g)
    return ids, types, mask, mlm, torch.arange(n) % 2


def timed(step, steps):
    step()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1000, (time.process_time() - c0) / steps * 1000


def mlm_batch(vocab, n=16, t=128):
    """BenchmarkBertTinyMLMStep's layout (models.NewTokenStep's): ids, types, mask, masked
    positions and labels, NSP; the last t/8 positions of odd sequences padded (16 of 128)."""
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(5, vocab, (n, t), generator=g)
    mask = torch.ones(n, t)
    mask[1::2, t - t // 8:] = 0
    types = torch.zeros(n, t, dtype=torch.long)
    types[:, t // 2:] = 1
    types[mask == 0] = 0
    ids[mask == 0] = 0
    pos = torch.arange(t)
    pick = ((pos > 0) & (pos % 7 == 3))[None, :] & (mask == 1)
    at = pick.view(-1).nonzero().view(-1)
    labels = torch.randint(0, vocab, (len(at),), generator=g)
    return ids, types, mask, at, labels, torch.arange(n) % 2


def mlm_step(model, ids, types, mask, at, labels, nsp_labels, p=0.1):
    b = model.bert
    pos = torch.arange(ids.shape[1])[None, :].expand_as(ids)
    e = b.embeddings
    h = F.dropout(e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(pos) + e.token_type_embeddings(types)), p, True)
    for layer in b.encoder.layer:
        h = bert_layer_forward(layer, h, mask, p)
    pooled = torch.tanh(b.pooler.dense(h[:, 0]))
    tr = model.cls.predictions.transform
    hm = h.reshape(-1, h.shape[-1])[at]
    mlm = model.cls.predictions.decoder(tr.LayerNorm(F.gelu(tr.dense(hm))))
    nsp = model.cls.seq_relationship(pooled)
    return F.cross_entropy(mlm, labels) + F.cross_entropy(nsp, nsp_labels)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["tiny", "layer", "mlm"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tiny_cfg = {"vocab": 30522, "hidden": 128, "layers": 2, "heads": 2, "intermediate": 512,
                "positions": 512, "types": 2, "eps": 1e-12}
    model = BertForPreTraining(tiny_cfg).train()
    ids, types, mask, mlm_labels, nsp = batch(30522)

    def tiny():
        model.zero_grad(set_to_none=False)
        tiny_step(model, ids, types, mask, mlm_labels, nsp).backward()

    base_cfg = {"hidden": 768, "heads": 12, "intermediate": 3072, "eps": 1e-12}
    layer = Layer(base_cfg).train()
    x = torch.randn(8, 128, 768, requires_grad=True)
    up = torch.randn(8, 128, 768)

    def base_layer():
        layer.zero_grad(set_to_none=False)
        x.grad = None
        bert_layer_forward(layer, x, mask).backward(up)

    mlm_cfg = dict(tiny_cfg, vocab=8000)
    mlm_model = BertForPreTraining(mlm_cfg).train()
    mb = mlm_batch(8000)

    def mlm():
        mlm_model.zero_grad(set_to_none=False)
        mlm_step(mlm_model, *mb).backward()

    labels = {"tiny": "BertTinyStep", "layer": "BertBaseLayerStep", "mlm": "BertTinyMLMStep"}
    for name, fn in [("tiny", tiny), ("layer", base_layer), ("mlm", mlm)]:
        if args.only and args.only != name:
            continue
        res = [timed(fn, args.steps) for _ in range(args.runs)]
        ms, cpu = [r[0] for r in res], [r[1] for r in res]
        print(f"torch {torch.__version__} threads={args.threads} {labels[name]}: median {statistics.median(ms):.1f} ms/step "
              f"(runs {', '.join(f'{v:.1f}' for v in ms)}), median {statistics.median(cpu):.1f} cpu-ms/step")


if __name__ == "__main__":
    main()
