#!/usr/bin/env python3
"""PyTorch reference of examples/bert: BERT masked-LM + NSP pre-training on the same text,
with the same vocabulary (the vocab.txt the Go program writes with -save-vocab), the same
recipe and the same model, for the curves and the throughput in BENCHMARKS.md.

    go run ./examples/bert -data $SPARGO_DATA/ptb -steps 2000 -save-vocab vocab.txt ...
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_bert_mlm.py --data $SPARGO_DATA/ptb \\
        --vocab vocab.txt --steps 2000 --eval-every 500 --log-every 100 --metrics torch.jsonl

    # throughput: one worker, N steps, training sequences per second
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_bert_mlm.py --data $SPARGO_DATA/ptb \\
        --vocab vocab.txt --workers 1 --steps 30 --eval-every 0 --no-eval

What is the same as spargo's examples/bert (train/mlm.go, datasets/mlm.go):
  - text: ptb.train.txt for training, ptb.valid.txt held out (a directory's *valid*.txt; a
    single file holds out its last --hold-out of the sentences); one sentence per line,
    blank lines between documents;
  - tokenizer: BERT's BasicTokenizer (lowercase, strip accents, split punctuation) and
    greedy longest-match WordPiece over the given vocab.txt;
  - sequence pairs: BERT's create_instances_from_document (dupe factor 1, short-sequence
    probability 0.1, random next segment with probability 1/2, truncate_seq_pair);
  - masking, anew every data epoch: round(0.15 x candidates) positions (randomised rounding,
    at least 1, at most --max-predictions), 80 % [MASK], 10 % a random non-special token,
    10 % unchanged;
  - model: the plain-torch HF-layout BertForPreTraining of scripts/gen_bert_goldens.py at a
    BERT preset size, HF initialisation (N(0, 0.02), zero biases, padding row 0), dropout
    0.1, the MLM head only at the masked positions, loss = MLM CE + NSP CE;
  - optimizer: torch.optim.AdamW(lr, betas (0.9, 0.999), eps 1e-8, weight decay 0.01) with
    BERT's no-decay groups (biases and LayerNorm weights), and transformers'
    get_linear_schedule_with_warmup (10 % warm-up, linear decay to 0);
  - data parallelism simulated: each step's global batch (workers x batch) is split into
    --workers shards, each shard's loss is computed as a worker would, and the gradient is
    their mean (what DDP all-reduce computes); the training loss reported is the mean of the
    shards' MLM losses, averaged over the steps since the last record.
What differs: the random streams (Python's random and torch's generator vs spargo's PCG), so
pairs, masks, shuffles, dropout and the initial weights are different draws of the same
distributions.
"""
import argparse
import glob
import json
import math
import os
import random
import statistics
import sys
import time
import unicodedata

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_bert_goldens import BertForPreTraining  # noqa: E402  plain-torch HF layout
from torch_bert_step import bert_layer_forward  # noqa: E402  layer forward with dropout

PRESETS = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "medium": (8, 512), "base": (12, 768)}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
IGNORE = -100


# ------------------------------------------------------------------ tokenizer (BERT's)
def is_whitespace(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def is_control(c):
    if c in "\t\n\r":
        return False
    return unicodedata.category(c).startswith("C")


def is_punct(c):
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text, never_split):
    out = []
    for c in text:
        cp = ord(c)
        if cp == 0 or cp == 0xFFFD or is_control(c):
            continue
        if is_whitespace(c):
            out.append(" ")
        elif is_cjk(cp):
            out.append(" " + c + " ")
        else:
            out.append(c)
    tokens = []
    for tok in "".join(out).split():
        if tok in never_split:
            tokens.append(tok)
            continue
        tok = tok.lower()
        tok = "".join(ch for ch in unicodedata.normalize("NFD", tok) if unicodedata.category(ch) != "Mn")
        cur = ""
        for ch in tok:
            if is_punct(ch):
                if cur:
                    tokens.append(cur)
                tokens.append(ch)
                cur = ""
            else:
                cur += ch
        if cur:
            tokens.append(cur)
    return tokens


class WordPiece:
    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.tokens = [line.rstrip("\n") for line in f if line.rstrip("\n") != ""]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.never_split = {t for t in SPECIALS if t in self.ids}
        self.cache = {}

    def encode(self, text):
        ids = []
        for w in basic_tokenize(text, self.never_split):
            if w not in self.cache:
                self.cache[w] = self.pieces(w)
            ids.extend(self.cache[w])
        return ids

    def pieces(self, word):
        if len(word) > 100:
            return [self.ids["[UNK]"]]
        out, start = [], 0
        while start < len(word):
            end, found = len(word), None
            while end > start:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in self.ids:
                    found = sub
                    break
                end -= 1
            if found is None:
                return [self.ids["[UNK]"]]
            out.append(self.ids[found])
            start = end
        return out


# ------------------------------------------------------------------ corpus and samples
def read_documents(path):
    docs, cur = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if s:
                cur.append(s)
            elif cur:
                docs.append(cur)
                cur = []
    if cur:
        docs.append(cur)
    return docs


def corpus_files(data):
    if os.path.isfile(data):
        return [data], []
    train, valid = [], []
    for n in sorted(glob.glob(os.path.join(data, "*.txt"))):
        base = os.path.basename(n).lower()
        if "valid" in base:
            valid.append(n)
        elif "test" not in base:
            train.append(n)
    return train, valid


def hold_out(docs, frac):
    total = sum(len(d) for d in docs)
    n = max(1, round(frac * total))
    train, held = [list(d) for d in docs], []
    while n > 0 and train:
        last = train[-1]
        if len(last) <= n:
            held.insert(0, last)
            train.pop()
            n -= len(last)
        else:
            held.insert(0, last[len(last) - n:])
            train[-1] = last[:len(last) - n]
            n = 0
    return train, held


def truncate_pair(a, b, max_tokens, rng):
    while len(a) + len(b) > max_tokens:
        t = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del t[0]
        else:
            t.pop()


def build_instances(docs, wp, max_seq, short_prob, rng):
    """BERT's create_instances_from_document over every document (dupe factor 1)."""
    cls, sep = wp.ids["[CLS]"], wp.ids["[SEP]"]
    alldocs = []
    for d in docs:
        sents = [ids for ids in (wp.encode(s) for s in d) if ids]
        if sents:
            alldocs.append(sents)
    out = []
    max_tokens = max_seq - 3
    for di, doc in enumerate(alldocs):
        target = max_tokens
        if rng.random() < short_prob:
            target = rng.randint(2, max_tokens)
        chunk, length, i = [], 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s]
                b = []
                random_next = len(chunk) == 1 or rng.random() < 0.5
                if random_next:
                    target_b = target - len(a)
                    ri = 0
                    for _ in range(10):
                        ri = rng.randrange(len(alldocs))
                        if ri != di:
                            break
                    rdoc = alldocs[ri]
                    for j in range(rng.randrange(len(rdoc)), len(rdoc)):
                        b.extend(rdoc[j])
                        if len(b) >= target_b:
                            break
                    i -= len(chunk) - a_end
                else:
                    b = [t for s in chunk[a_end:] for t in s]
                truncate_pair(a, b, max_tokens, rng)
                out.append(([cls] + a + [sep] + b + [sep], len(a), random_next))
                chunk, length = [], 0
            i += 1
    return out


class Masker:
    def __init__(self, wp, max_seq, max_pred, seed):
        self.max_seq, self.max_pred, self.seed = max_seq, max_pred, seed
        self.pad, self.mask = wp.ids["[PAD]"], wp.ids["[MASK]"]
        special = {wp.ids[s] for s in SPECIALS if s in wp.ids}
        self.random_ids = [i for i in range(len(wp.tokens)) if i not in special]

    def batch(self, instances, idx, epoch):
        L = self.max_seq
        n = len(idx)
        ids = torch.full((n, L), self.pad, dtype=torch.long)
        types = torch.zeros((n, L), dtype=torch.long)
        att = torch.zeros((n, L))
        labels = torch.full((n, L), IGNORE, dtype=torch.long)
        nsp = torch.zeros(n, dtype=torch.long)
        for k, i in enumerate(idx):
            toks, len_a, random_next = instances[i]
            t = list(toks)
            rng = random.Random((self.seed * 1_000_003 + epoch) * 10_000_019 + i)
            cand = [p for p in range(1, len(t) - 1) if p != len_a + 1]
            want = len(cand) * 0.15
            num = math.floor(want) + (1 if rng.random() < want - math.floor(want) else 0)
            num = min(max(num, 1), self.max_pred, len(cand))
            for j in range(num):
                r = j + rng.randrange(len(cand) - j)
                cand[j], cand[r] = cand[r], cand[j]
                p = cand[j]
                labels[k, p] = t[p]
                u = rng.random()
                if u < 0.8:
                    t[p] = self.mask
                elif u >= 0.9:
                    t[p] = self.random_ids[rng.randrange(len(self.random_ids))]
            ids[k, :len(t)] = torch.tensor(t)
            types[k, len_a + 2:len(t)] = 1
            att[k, :len(t)] = 1
            nsp[k] = 1 if random_next else 0
        return ids, types, att, labels, nsp


# ------------------------------------------------------------------ model
def hf_init(model, std=0.02):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0, std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, torch.nn.Embedding):
                m.weight.normal_(0, std)
                if m.padding_idx is not None:
                    m.weight[m.padding_idx].zero_()
            elif isinstance(m, torch.nn.LayerNorm):
                m.weight.fill_(1)
                m.bias.zero_()
        model.cls.predictions.bias.zero_()


def forward(model, ids, types, att, labels, nsp_labels, p):
    """MLM loss, NSP loss, MLM logits and labels at the masked positions."""
    b = model.bert
    e = b.embeddings
    pos = torch.arange(ids.shape[1])[None, :].expand_as(ids)
    h = F.dropout(e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(pos) + e.token_type_embeddings(types)), p, p > 0)
    for layer in b.encoder.layer:
        h = bert_layer_forward(layer, h, att, p)
    pooled = torch.tanh(b.pooler.dense(h[:, 0]))
    flat = labels.view(-1)
    at = (flat != IGNORE).nonzero().view(-1)
    tr = model.cls.predictions.transform
    hm = h.reshape(-1, h.shape[-1])[at]
    mlm = model.cls.predictions.decoder(tr.LayerNorm(F.gelu(tr.dense(hm))))
    y = flat[at]
    nsp = model.cls.seq_relationship(pooled)
    return F.cross_entropy(mlm, y), F.cross_entropy(nsp, nsp_labels), mlm, y, nsp


def evaluate(model, valid, masker, batch, limit):
    model.eval()
    sums = [0.0, 0, 0, 0, 0]
    with torch.no_grad():
        n = len(valid) if limit == 0 else min(limit, len(valid))
        for lo in range(0, n, batch):
            idx = list(range(lo, min(lo + batch, n)))
            ids, types, att, labels, nsp = masker.batch(valid, idx, 0)
            mlm_loss, _, mlm, y, nsp_logits = forward(model, ids, types, att, labels, nsp, 0.0)
            sums[0] += mlm_loss.item() * len(y)
            sums[1] += (mlm.argmax(-1) == y).sum().item()
            sums[2] += len(y)
            sums[3] += (nsp_logits.argmax(-1) == nsp).sum().item()
            sums[4] += len(idx)
    model.train()
    return sums[0] / sums[2], sums[1] / sums[2], sums[3] / sums[4]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--vocab", required=True, help="vocab.txt written by examples/bert -save-vocab")
    ap.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16, help="sequences per worker")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--max-predictions", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--warmup-frac", type=float, default=0.1)
    ap.add_argument("--hold-out", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-limit", type=int, default=0)
    ap.add_argument("--no-eval", action="store_true", help="skip the final evaluation (throughput runs)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--metrics", default="")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    t0 = time.time()
    wp = WordPiece(args.vocab)
    train_files, valid_files = corpus_files(args.data)
    train_docs = [d for f in train_files for d in read_documents(f)]
    valid_docs = [d for f in valid_files for d in read_documents(f)]
    if not valid_files:
        train_docs, valid_docs = hold_out(train_docs, args.hold_out)
    train = build_instances(train_docs, wp, args.seq, 0.1, rng)
    valid = build_instances(valid_docs, wp, args.seq, 0.1, rng)
    max_pred = args.max_predictions or max(1, round(0.15 * args.seq))
    masker = Masker(wp, args.seq, max_pred, args.seed)
    print(f"train {train_files}: {len(train)} pairs; held out {valid_files or 'tail'}: {len(valid)} pairs; "
          f"vocabulary {len(wp.tokens)} tokens ({time.time() - t0:.1f}s)", flush=True)

    layers, hidden = PRESETS[args.model]
    cfg = {"vocab": len(wp.tokens), "hidden": hidden, "layers": layers, "heads": hidden // 64, "intermediate": 4 * hidden,
           "positions": 512, "types": 2, "eps": 1e-12}
    model = BertForPreTraining(cfg)
    hf_init(model)
    model.train()
    decay = [p for n, p in model.named_parameters() if not (n.split(".")[-1].lower().endswith("bias") or "norm" in n.lower())]
    no_decay = [p for n, p in model.named_parameters() if n.split(".")[-1].lower().endswith("bias") or "norm" in n.lower()]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    warmup = int(args.steps * args.warmup_frac)
    total = args.steps

    def lr_at(t):
        if t < warmup:
            return args.lr * t / warmup
        return args.lr * max(0.0, (total - t) / (total - warmup))

    nparams = sum(p.numel() for p in model.parameters())
    print(f"model bert-{args.model} (torch {torch.__version__}, {args.threads} threads): {nparams} parameters; "
          f"{args.workers} simulated workers x batch {args.batch} x {args.seq} tokens; {args.steps} steps, warm-up {warmup}", flush=True)
    out = open(args.metrics, "w") if args.metrics else None
    if out:
        out.write(json.dumps({"hook": "pytorch", "config": vars(args)}) + "\n")
    gb = args.workers * args.batch
    per_epoch = len(train) // gb
    start = time.time()
    rec_loss, rec_n = 0.0, 0
    round_loss, round_acc, round_n, round_t0 = 0.0, 0.0, 0, time.time()
    order = None
    train_sec = 0.0
    for t in range(args.steps):
        epoch, b = divmod(t, per_epoch)
        if b == 0 or order is None:
            order = list(range(len(train)))
            random.Random(args.seed * 7919 + epoch).shuffle(order)
        ts = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(t)
        opt.zero_grad(set_to_none=False)
        idx = order[b * gb:(b + 1) * gb]
        ids, types, att, labels, nsp = masker.batch(train, idx, epoch)
        step_loss, step_acc = 0.0, 0.0
        for w in range(args.workers):
            sl = slice(w * args.batch, (w + 1) * args.batch)
            mlm_loss, nsp_loss, mlm, y, _ = forward(model, ids[sl], types[sl], att[sl], labels[sl], nsp[sl], 0.1)
            ((mlm_loss + nsp_loss) / args.workers).backward()
            step_loss += mlm_loss.item() / args.workers
            step_acc += (mlm.argmax(-1) == y).float().mean().item() / args.workers
        opt.step()
        train_sec += time.time() - ts
        rec_loss += step_loss
        rec_n += 1
        round_loss += step_loss
        round_acc += step_acc
        round_n += 1
        done = t + 1
        if args.log_every and done % args.log_every == 0:
            rec = {"step": done, "loss": rec_loss / rec_n, "lr": lr_at(t), "total_s": time.time() - start}
            print(json.dumps(rec), flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
            rec_loss, rec_n = 0.0, 0
        if (args.eval_every and done % args.eval_every == 0) or (done == args.steps and not args.no_eval):
            vl, va, vn = evaluate(model, valid, masker, args.batch, args.eval_limit)
            rnd = {"epoch": done // (args.eval_every or args.steps), "steps": round_n, "at_step": done,
                   "train_loss": round_loss / round_n, "train_acc": round_acc / round_n,
                   "val_loss": vl, "val_acc": va, "val_nsp_acc": vn,
                   "seq_s": round_n * gb / (time.time() - round_t0), "total_s": time.time() - start}
            print(json.dumps(rnd), flush=True)
            if out:
                out.write(json.dumps(rnd) + "\n")
                out.flush()
            round_loss, round_acc, round_n, round_t0 = 0.0, 0.0, 0, time.time()
    print(f"train_seq_s {args.steps * gb / train_sec:.2f} over {args.steps} steps ({train_sec:.1f}s of training)", flush=True)
    if out:
        out.close()


if __name__ == "__main__":
    main()
