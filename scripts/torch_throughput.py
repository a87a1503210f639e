#!/usr/bin/env python3
# PyTorch comparison for BENCHMARKS.md: training throughput (forward + backward + SGD step with
# momentum 0.9 and weight decay 5e-4) of the catalogue's models at a fixed batch size, the PyTorch
# side of `spargo bench train`:
#   * image classifiers (scripts/torch_models.py: VGG-BN, ResNets) on random 3 x size x size
#     inputs, images/s;
#   * the models that read tokens, on random token ids with the step of spargo's
#     models.NewTokenStep, sequences/s and tokens/s: lstm-ptb-small/-medium/lstm-ptb
#     (scripts/torch_lstm_ptb.py's RNNModel on a --seq x --batch bptt window, default 35 x 20,
#     vocabulary 10,000, the hidden state carried across steps, detached), lstm-imdb (embedding
#     50, LSTM 100, Linear 2 at the last word; 32 reviews of 500 words) and bert-tiny ... bert-base
#     (scripts/torch_bert_step.py's BenchmarkBertTinyMLMStep batch and step: --vocab 8000,
#     16 x 128, the MLM head at every 7th real position, NSP, dropout 0.1).
#
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_throughput.py --model vgg11 --batch 32 --steps 20
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_throughput.py --model bert-tiny --steps 20
#
# Reports the median step time over --steps timed steps after --warmup untimed ones.
# Output: a comment line with the parameter count, then the last line "MODEL BATCH IMG_S"
# (token models: "MODEL BATCH SEQ_S TOK_S"); --json also writes img_s (token models: seq_s,
# tok_s, seq, vocab instead).
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

# batch, sequence length and vocabulary of spargo's models.NewTokenStep defaults
TOKEN_DEFAULTS = {"lstm": (20, 35, 10000), "imdb": (32, 500, 50001), "bert": (16, 128, 8000)}
LSTM_PRESETS = {"lstm-ptb": "ptb", "lstm-ptb-small": "small", "lstm-ptb-medium": "medium"}  # torch_lstm_ptb.PRESETS
BERT_SIZES = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "medium": (8, 512), "base": (12, 768)}


def token_kind(name):
    if name == "lstm-imdb":
        return "imdb"
    if name in LSTM_PRESETS:
        return "lstm"
    if name.startswith("bert-") and name[5:] in BERT_SIZES:
        return "bert"
    return None


def token_step(kind, name, batch, seq, vocab):
    """The model and a step closure (loss and backward, no optimizer) on random tokens."""
    import torch.nn.functional as F
    if kind == "lstm":
        from torch_lstm_ptb import PRESETS, RNNModel
        emb, hid, layers, dropout = PRESETS[LSTM_PRESETS[name]]
        m = RNNModel(vocab, emb, hid, layers, dropout).train()
        x = torch.randint(0, vocab, (seq, batch))
        y = torch.randint(0, vocab, (seq * batch,))
        hidden = [m.init_hidden(batch)]

        def loss():
            hidden[0] = tuple(h.detach() for h in hidden[0])
            logits, hidden[0] = m(x, hidden[0])
            return F.cross_entropy(logits, y)
        return m, loss
    if kind == "imdb":
        class IMDB(nn.Module):
            def __init__(self):
                super().__init__()
                self.embedding = nn.Embedding(vocab, 50)
                self.rnn = nn.LSTM(50, 100, 1)
                self.fc = nn.Linear(100, 2)

            def forward(self, x):
                out, _ = self.rnn(self.embedding(x))
                return self.fc(out[-1])
        m = IMDB().train()
        x = torch.randint(1, vocab, (seq, batch))
        y = torch.randint(0, 2, (batch,))
        return m, lambda: F.cross_entropy(m(x), y)
    from torch_bert_step import BertForPreTraining, mlm_batch, mlm_step
    layers, hidden = BERT_SIZES[name[len("bert-"):]]
    if seq > 512:
        raise SystemExit(f"--seq {seq}: above {name}'s 512 positions")
    cfg = {"vocab": vocab, "hidden": hidden, "layers": layers, "heads": hidden // 64, "intermediate": 4 * hidden,
           "positions": 512, "types": 2, "eps": 1e-12}
    m = BertForPreTraining(cfg).train()
    b = mlm_batch(vocab, batch, seq)
    return m, lambda: mlm_step(m, *b)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="vgg11", help="a name of spargo's catalogue (scripts/torch_models.py, lstm-*, bert-*)")
    ap.add_argument("--size", type=int, default=32, help="image classifiers: input height = width")
    ap.add_argument("--batch", type=int, default=None, help="images or sequences per step (default 32; token models: 20 LSTM-PTB, 32 IMDB, 16 BERT)")
    ap.add_argument("--seq", type=int, default=None, help="token models: tokens per sequence (default 35 LSTM-PTB, 500 IMDB, 128 BERT)")
    ap.add_argument("--vocab", type=int, default=None, help="token models: vocabulary (default 10000 LSTM-PTB, 50001 IMDB, 8000 BERT)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (median is reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--channels-last", action="store_true",
                    help="image classifiers: model and input in torch.channels_last (spargo's -channels-last)")
    ap.add_argument("--json", help="also write the result to this file")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    kind = token_kind(a.model)
    if kind:
        db, ds, dv = TOKEN_DEFAULTS[kind]
        a.batch, a.seq, a.vocab = a.batch or db, a.seq or ds, a.vocab or dv
        m, loss = token_step(kind, a.model, a.batch, a.seq, a.vocab)
    else:
        a.batch = a.batch or 32
        m = build(a.model).train()
        lossf = nn.CrossEntropyLoss()
        x = torch.randn(a.batch, 3, a.size, a.size)
        if a.channels_last:
            m = m.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (a.batch,))
        loss = lambda: lossf(m(x), y)
    nparams = sum(p.numel() for p in m.parameters())
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
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
    rate = a.batch / med
    print(f"# {a.model} params {nparams} threads {a.threads} steps {a.steps} "
          f"median_step_s {med:.4f} torch {torch.__version__}", flush=True)
    res = {"model": a.model, "batch": a.batch}
    if kind:
        print(f"{a.model} {a.batch} {rate:.1f} {rate * a.seq:.0f}", flush=True)
        res.update(seq_s=rate, tok_s=rate * a.seq, seq=a.seq, vocab=a.vocab)
    else:
        print(f"{a.model} {a.batch} {rate:.1f}", flush=True)
        res["img_s"] = rate
    if a.json:
        res.update(params=nparams, threads=a.threads, steps=a.steps, warmup=a.warmup,
                   channels_last=bool(not kind and a.channels_last),
                   median_step_s=med, step_s=ts, torch_version=torch.__version__)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
