#!/usr/bin/env python3
"""Train PyTorch's BERT on exactly the batches examples/bert trained on, from its initial
weights: examples/bert -dump-batches DIR writes DIR/init.safetensors (the parameters before
the first step) and DIR/rank<r>.bin (each rank's first -dump-steps batches); this script
replays them with scripts/torch_bert_mlm.py's model, forward, AdamW (BERT's no-decay groups)
and schedule, the ranks' shards as its simulated workers, and prints the training MLM loss
(mean of the shards') per step or per --log-every steps, to compare with the Go run's
-metrics step records (-log-every 1).

    go run ./examples/bert -data $SPARGO_DATA/ptb -vocab vocab.txt -dropout 0 -steps 2000 \\
        -log-every 1 -metrics go.jsonl -dump-batches dump -dump-steps 100 -progress=false
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_bert_lockstep.py dump --steps 2000 --dropout 0

With --dropout 0 on both sides the two trajectories agree step for step (to float32
rounding), which checks the whole pipeline (batches, model, DDP averaging, optimizer,
schedule) at once; with --dropout 0.1 only the dropout masks differ (PyTorch draws a
different mask for every shard, spargo's ranks draw the same ones).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_bert_goldens import BertForPreTraining  # noqa: E402
from read_safetensors import load  # noqa: E402
from torch_bert_mlm import PRESETS, forward  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the -dump-batches directory")
    ap.add_argument("--steps", type=int, default=0, help="the Go run's -steps (the schedule's length; default: its metadata)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--warmup-frac", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0, help="torch seed (dropout masks)")
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    state, meta = load(os.path.join(args.dir, "init.safetensors"))
    workers, batch, seq = int(meta["workers"]), int(meta["batch"]), int(meta["seq"])
    total = args.steps or int(meta["steps"])
    layers, hidden = PRESETS[meta["model"]]
    vocab = state["bert.embeddings.word_embeddings.weight"].shape[0]
    cfg = {"vocab": vocab, "hidden": hidden, "layers": layers, "heads": hidden // 64, "intermediate": 4 * hidden,
           "positions": state["bert.embeddings.position_embeddings.weight"].shape[0], "types": 2, "eps": 1e-12}
    model = BertForPreTraining(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    if unexpected or set(missing) - tied:
        sys.exit(f"init.safetensors does not fit the model: missing {missing}, unexpected {unexpected}")
    model.train()
    names = [(n, p) for n, p in model.named_parameters()]
    no_decay = lambda n: n.split(".")[-1].lower().endswith("bias") or "norm" in n.lower()  # noqa: E731
    opt = torch.optim.AdamW([{"params": [p for n, p in names if not no_decay(n)], "weight_decay": args.wd},
                             {"params": [p for n, p in names if no_decay(n)], "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    warmup = int(total * args.warmup_frac)

    def lr_at(t):
        if t < warmup:
            return args.lr * t / warmup
        return args.lr * max(0.0, (total - t) / (total - warmup))

    rows = batch * seq
    per = 4 * rows + batch
    raw = [np.fromfile(os.path.join(args.dir, f"rank{r}.bin"), dtype="<i4") for r in range(workers)]
    steps = min(len(x) // per for x in raw)
    rec, n = 0.0, 0
    for t in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(t)
        opt.zero_grad(set_to_none=False)
        step_loss = 0.0
        for r in range(workers):
            a = raw[r][t * per:(t + 1) * per]
            ids, types, att, labels = (torch.from_numpy(a[i * rows:(i + 1) * rows].astype(np.int64)).view(batch, seq) for i in range(4))
            nsp = torch.from_numpy(a[4 * rows:].astype(np.int64))
            mlm_loss, nsp_loss, _, _, _ = forward(model, ids, types, att.float(), labels, nsp, args.dropout)
            ((mlm_loss + nsp_loss) / workers).backward()
            step_loss += mlm_loss.item() / workers
        opt.step()
        rec, n = rec + step_loss, n + 1
        if (t + 1) % args.log_every == 0:
            print(json.dumps({"step": t + 1, "loss": rec / n, "lr": lr_at(t)}), flush=True)
            rec, n = 0.0, 0


if __name__ == "__main__":
    main()
