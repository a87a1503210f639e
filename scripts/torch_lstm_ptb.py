#!/usr/bin/env python3
# PyTorch comparison for BENCHMARKS.md: the PTB word-level language model of examples/lstm
# with the same recipe, in plain PyTorch (the reference of issue 10's "within 3 %" check).
#
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_lstm_ptb.py \
#       --data $SPARGO_DATA/ptb --model small --workers 2 --epochs 2
#
# Throughput only (no evaluation, the first N steps of an epoch):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_lstm_ptb.py \
#       --data $SPARGO_DATA/ptb --model small --workers 2 --epochs 1 --steps 60 --no-eval
#
# The recipe, as spargo's (train/lm.go, datasets/ptb.go, models/lstm.go):
#   * data: every line's words + <eos>; vocabulary by decreasing count, ties by the word (the
#     TensorFlow's PTB reader); the training stream cut into --workers contiguous equal parts, each
#     laid out in --batch columns (word_language_model's batchify) and read in --bptt windows
#     with targets shifted by one; the hidden state carried across windows, detached; zeros at
#     the start of every epoch;
#   * model: word_language_model's RNNModel with an LSTM, untied decoder, dropout on the
#     embeddings, between layers and on the output; embedding and decoder weights
#     U(-0.1, 0.1), decoder bias 0, the LSTM with PyTorch's default init;
#   * training: --workers simulated data-parallel workers as PyTorch DDP runs them: each step,
#     every worker runs forward/backward on its own window (mean cross-entropy over its
#     batch x bptt words), the gradients are averaged, clipped to a total norm of --clip
#     (clip_grad_norm_), and plain SGD steps with --lr; Zaremba's decay (×decay per epoch
#     after --after epochs);
#   * evaluation: the validation (and after the last epoch the test) stream cut into
#     --workers contiguous parts, each in --eval-batch columns, bptt windows from the zero
#     state; perplexity = exp(total loss / total words).
# Initial weights differ from spargo's (different generators) unless --init loads the file
# spargo's -save-init wrote; then the two runs start from the same model. Prints one line
# per epoch.
import argparse
import collections
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"small": (200, 200, 2, 0.0), "medium": (650, 650, 2, 0.5), "ptb": (1500, 1500, 2, 0.65)}


def read_words(path):
    words = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            words += line.split() + ["<eos>"]
    return words


def load_ptb(data):
    train = read_words(os.path.join(data, "ptb.train.txt"))
    counts = collections.Counter(train)
    vocab = [w for w, _ in sorted(counts.items(), key=lambda x: (-x[1], x[0]))]
    ids = {w: i for i, w in enumerate(vocab)}
    enc = lambda ws: torch.tensor([ids[w] for w in ws], dtype=torch.long)
    return (vocab, enc(train), enc(read_words(os.path.join(data, "ptb.valid.txt"))),
            enc(read_words(os.path.join(data, "ptb.test.txt"))))


def shard(tokens, rank, world):
    per = len(tokens) // world
    return tokens[rank * per:(rank + 1) * per]


def batchify(tokens, cols):
    rows = len(tokens) // cols
    return tokens[:rows * cols].view(cols, rows).t().contiguous()  # [rows, cols]


def windows(data, bptt):
    for i in range(0, data.size(0) - 1, bptt):
        n = min(bptt, data.size(0) - 1 - i)
        yield data[i:i + n], data[i + 1:i + 1 + n]


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out).view(-1, self.nhid)), hidden

    def init_hidden(self, n):
        z = torch.zeros(self.nlayers, n, self.nhid)
        return (z, z.clone())


def evaluate(model, tokens, args):
    model.eval()
    total, words = 0.0, 0
    with torch.no_grad():
        for r in range(args.workers):
            data = batchify(shard(tokens, r, args.workers), args.eval_batch)
            hidden = model.init_hidden(args.eval_batch)
            for x, y in windows(data, args.bptt):
                logits, hidden = model(x, hidden)
                total += F.cross_entropy(logits, y.reshape(-1), reduction="sum").item()
                words += y.numel()
    model.train()
    return total / words


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(os.environ["SPARGO_DATA"], "ptb") if os.environ.get("SPARGO_DATA") else None,
                    required=not os.environ.get("SPARGO_DATA"), help="PTB directory (default: $SPARGO_DATA/ptb; docs/data.md)")
    ap.add_argument("--model", default="small", choices=sorted(PRESETS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--bptt", type=int, default=35)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after N steps (0: all)")
    ap.add_argument("--lr", type=float, default=20.0)
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--after", type=int, default=4)
    ap.add_argument("--decay", type=float, default=0.5)
    ap.add_argument("--eval-batch", type=int, default=10)
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--metrics", default="")
    ap.add_argument("--init", default="", help="start from these weights (a safetensors file, e.g. spargo's -save-init)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    vocab, train, valid, test = load_ptb(args.data)
    emb, hid, layers, dropout = PRESETS[args.model]
    model = RNNModel(len(vocab), emb, hid, layers, dropout)
    if args.init:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from read_safetensors import load
        model.load_state_dict(load(args.init)[0])
    params = list(model.parameters())
    print(f"data: vocabulary {len(vocab)}, tokens train {len(train)}, valid {len(valid)}, test {len(test)}; "
          f"model {args.model}: {sum(p.numel() for p in params)} parameters; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    data = [batchify(shard(train, r, args.workers), args.batch) for r in range(args.workers)]
    nsteps = (data[0].size(0) - 1 + args.bptt - 1) // args.bptt
    if args.steps:
        nsteps = min(nsteps, args.steps)
    out = open(args.metrics, "w") if args.metrics else None
    start = time.time()
    for epoch in range(args.epochs):
        lr = args.lr * args.decay ** max(epoch + 1 - args.after, 0)
        hidden = [model.init_hidden(args.batch) for _ in range(args.workers)]
        its = [windows(d, args.bptt) for d in data]
        loss_sum, words = 0.0, 0
        t0 = time.time()
        for step in range(nsteps):
            grads = [torch.zeros_like(p) for p in params]
            for r in range(args.workers):
                x, y = next(its[r])
                hidden[r] = tuple(h.detach() for h in hidden[r])
                model.zero_grad()
                logits, hidden[r] = model(x, hidden[r])
                loss = F.cross_entropy(logits, y.reshape(-1))
                loss.backward()
                for g, p in zip(grads, params):
                    g += p.grad
                loss_sum += loss.item() * y.numel()
                words += y.numel()
            for g, p in zip(grads, params):
                p.grad = g / args.workers
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(params, args.clip)
            with torch.no_grad():
                for p in params:
                    p.add_(p.grad, alpha=-lr)
        train_s = time.time() - t0
        rec = {"epoch": epoch + 1, "steps": nsteps, "train_loss": loss_sum / words,
               "train_ppl": math.exp(loss_sum / words), "words_s": words / train_s, "train_s": train_s, "lr": lr}
        if not args.no_eval:
            vl = evaluate(model, valid, args)
            rec.update(val_loss=vl, val_ppl=math.exp(vl))
            if epoch == args.epochs - 1:
                rec["test_ppl"] = math.exp(evaluate(model, test, args))
        rec["total_s"] = time.time() - start
        print(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in rec.items()), flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
