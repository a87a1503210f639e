#!/usr/bin/env python3
# Generates the PyTorch goldens for optim's Adam/AdamW and learning-rate schedules.
#
# Regenerate with (from the repository root):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_optim_goldens.py testdata/goldens
#
# Writes adam.json and lr_schedule.json in internal/golden's format (see gen_goldens.py for
# the conventions; generated with PyTorch 1.13.0a0, Debian python3-torch):
#   * adam.json: op "adam" cases like gen_goldens.py's SGD cases (parameters "a" [6] and
#     "b" [2,3] in float32, trajectories of torch.optim.Adam / AdamW computed in float64).
#     Extra config keys: "optimizer" ("adam" or "adamw"), "betas" [b1, b2], "eps", "amsgrad",
#     "maximize", optional "lr_per_step" (the lr set before each step, as a schedule does) and
#     optional "group_weight_decay" {param: wd} (one torch param group per parameter).
#   * lr_schedule.json: op "lr_schedule" cases; config "lrs" holds the learning rate of
#     param_groups[0] before each optimizer step t = 0..n-1 (a torch scheduler stepped once per
#     unit: per epoch for "steplr", "multistep", "cosine_epoch"; per step for the LambdaLR cases,
#     whose lambdas are transformers' get_linear/cosine_schedule_with_warmup). Values are in
#     config (float64) rather than float32 arrays so the Go side compares them exactly.
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_goldens import arr, rows  # noqa: E402

torch.set_num_threads(1)

ADAM_STEPS = 10


def adam_case(name, seed, optimizer, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
              amsgrad=False, maximize=False, rule="given", lr_per_step=None,
              group_weight_decay=None):
    torch.manual_seed(seed)
    init = {"a": torch.randn(6), "b": torch.randn(2, 3)}
    noise = {k: [torch.randn(v.shape) for _ in range(ADAM_STEPS)] for k, v in init.items()}
    if rule == "shrinking":
        # Gradients that shrink, so AMSGrad's running maximum differs from exp_avg_sq.
        noise = {k: [n / (1 + 2 * t) for t, n in enumerate(v)] for k, v in noise.items()}
    ps = {k: v.double().clone().requires_grad_(True) for k, v in init.items()}
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[optimizer]
    if group_weight_decay is None:
        groups = [{"params": [ps["a"], ps["b"]]}]
    else:
        groups = [{"params": [ps[k]], "weight_decay": wd} for k, wd in group_weight_decay.items()]
    opt = cls(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
              maximize=maximize)
    grads = {k: [] for k in ps}
    after = {k: [] for k in ps}
    for t in range(ADAM_STEPS):
        if lr_per_step is not None:
            for g in opt.param_groups:
                g["lr"] = lr_per_step[t]
        for k, p in ps.items():
            g = noise[k][t].double()
            if rule == "0.5p+noise":
                g = 0.5 * p.detach() + g
            p.grad = g.clone()
            grads[k].append(g.clone())
        opt.step()
        for k, p in ps.items():
            after[k].append(p.detach().clone())
    config = {"optimizer": optimizer, "lr": lr, "betas": list(betas), "eps": eps,
              "weight_decay": weight_decay, "amsgrad": amsgrad, "maximize": maximize,
              "grad_rule": "0.5p+noise" if rule == "0.5p+noise" else "given", "steps": ADAM_STEPS}
    if lr_per_step is not None:
        config["lr_per_step"] = lr_per_step
    if group_weight_decay is not None:
        config["group_weight_decay"] = group_weight_decay
    case = {"name": name, "op": "adam", "config": config,
            "params": {k: arr(v) for k, v in init.items()},
            "grads_per_step": {k: rows(v) for k, v in grads.items()},
            "params_per_step": {k: rows(v) for k, v in after.items()}}
    if rule == "0.5p+noise":
        case["noise_per_step"] = {k: rows(v) for k, v in noise.items()}
    return case


def gen_adam():
    sched = [0.02 * (t + 1) / ADAM_STEPS for t in range(ADAM_STEPS)]
    return [
        adam_case("adam_default", 900, "adam", 0.01),
        adam_case("adam_l2", 901, "adam", 0.05, weight_decay=0.1),
        adam_case("adam_betas_eps", 902, "adam", 0.05, betas=(0.8, 0.99), eps=1e-3),
        adam_case("adam_amsgrad_shrinking", 903, "adam", 0.05, amsgrad=True, rule="shrinking"),
        adam_case("adam_amsgrad_l2_pdep", 904, "adam", 0.05, weight_decay=0.05, amsgrad=True,
                  rule="0.5p+noise"),
        adam_case("adam_maximize", 905, "adam", 0.03, weight_decay=0.02, maximize=True),
        adam_case("adamw_default", 906, "adamw", 0.01, weight_decay=1e-2),
        adam_case("adamw_large_wd_pdep", 907, "adamw", 0.05, weight_decay=0.5, rule="0.5p+noise"),
        adam_case("adamw_amsgrad_shrinking", 908, "adamw", 0.05, weight_decay=0.1, amsgrad=True,
                  rule="shrinking"),
        adam_case("adamw_lr_per_step", 909, "adamw", 0.02, weight_decay=0.3, lr_per_step=sched),
        adam_case("adamw_groups", 910, "adamw", 0.05, weight_decay=0.2,
                  group_weight_decay={"a": 0.0, "b": 0.2}),
        adam_case("adam_l2_groups", 911, "adam", 0.05, group_weight_decay={"a": 0.3, "b": 0.0}),
    ]


def run_scheduler(make, n, base=0.1):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base)
    sched = make(opt)
    lrs = []
    for _ in range(n):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def hf_linear(warmup, total):
    # transformers.get_linear_schedule_with_warmup
    def f(t):
        if t < warmup:
            return t / max(1, warmup)
        return max(0.0, (total - t) / max(1, total - warmup))
    return f


def hf_cosine_min(warmup, total, min_factor):
    # transformers.get_cosine_schedule_with_warmup (num_cycles 0.5), floored at min_factor·base
    # (min_factor 0 is transformers' own schedule).
    def f(t):
        if t < warmup:
            return t / max(1, warmup)
        progress = min(1.0, (t - warmup) / max(1, total - warmup))
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def sched_case(name, kind, n, make, base=0.1, steps_per_epoch=1, **cfg):
    config = {"kind": kind, "base": base, "n": n, "steps_per_epoch": steps_per_epoch, **cfg}
    config["lrs"] = run_scheduler(make, n, base)
    return {"name": name, "op": "lr_schedule", "config": config}


def gen_lr_schedule():
    LS = torch.optim.lr_scheduler
    return [
        sched_case("steplr", "steplr", 12, lambda o: LS.StepLR(o, step_size=3, gamma=0.5),
                   step_size=3, gamma=0.5),
        sched_case("multistep", "multistep", 12,
                   lambda o: LS.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.1),
                   milestones=[2, 5, 5, 9], gamma=0.1),
        sched_case("cosine_epoch", "cosine_epoch", 11,
                   lambda o: LS.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
                   epochs=10, min=0.001),
        sched_case("cosine_warmup_steps", "cosine", 43,
                   lambda o: LS.LambdaLR(o, hf_cosine_min(7, 42, 0.0)),
                   steps_per_epoch=7, warmup_steps=7, total_steps=42, min=0.0),
        sched_case("cosine_warmup_min", "cosine", 30,
                   lambda o: LS.LambdaLR(o, hf_cosine_min(5, 25, 0.05)), base=0.2,
                   steps_per_epoch=5, warmup_steps=5, total_steps=25, min=0.01),
        sched_case("linear_warmup_decay", "linear", 35,
                   lambda o: LS.LambdaLR(o, hf_linear(4, 30)), base=1e-4,
                   steps_per_epoch=6, warmup_steps=4, total_steps=30),
    ]


FILES = {"adam": gen_adam, "lr_schedule": gen_lr_schedule}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "testdata/goldens"
    os.makedirs(out, exist_ok=True)
    for fname, gen in FILES.items():
        doc = {"torch_version": torch.__version__, "compute_dtype": "float64",
               "generator": "scripts/gen_optim_goldens.py", "cases": gen()}
        path = os.path.join(out, fname + ".json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=None, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {', '.join(c['name'] for c in doc['cases'])}")


if __name__ == "__main__":
    main()
