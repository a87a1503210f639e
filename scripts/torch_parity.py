#!/usr/bin/env python3
"""PyTorch parity of a spargo model through exported weights (models/internal/parity).

spargo writes a case directory (weights, a batch, its loss, gradients and updated buffers):

    go run ./models/internal/parity/export -model resnet20 -batch 8 /tmp/parity/resnet20

This script builds the same model in PyTorch (scripts/torch_models.py), loads the weights
(strict: every name and shape must match), runs one training-mode forward and backward on
the same batch and reports the largest relative differences:

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_parity.py --family resnet \\
        --model resnet20 /tmp/parity/resnet20 [--golden testdata/parity/resnet20.json]

Loss: |spargo - torch| / |torch|, criterion 1e-4. Gradients and buffers: per tensor
max|spargo - torch| / max|torch|, criterion 1e-3 (for gradients the scale is at least 1e-3 of
the model's largest gradient element: see FLOOR). Also printed: the whole gradient's
|g_spargo - g_torch| / |g_torch|. PyTorch computes in float64 from the
float32 weights and batch (--dtype float32 for torch's own float32 result). The exit status is
1 when a criterion fails. --golden writes a compact golden that the Go test
internal/parity/parity_test.go checks a fresh spargo run against (no Python in CI). A case
exported with -steps K also compares the parameters and buffers after K SGD steps on the
batch (relative to how far the parameters moved).

Families: FAMILIES maps a family to (build the torch model, compute the loss from the batch).
Add one per model family (the LSTM and BERT families join the same way).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_safetensors import load  # noqa: E402
from torch_models import build  # noqa: E402

LOSS_RTOL, GRAD_RTOL = 1e-4, 1e-3
# A tensor whose gradient is below FLOOR times the model's largest gradient element is
# compared on that scale instead of its own: VGG's convolution biases feed a training-mode
# BatchNorm, so their gradient is zero in exact arithmetic (torch's float64 gives 1e-17,
# spargo's float32 1e-7), and a ratio of two rounding errors says nothing.
FLOOR = 1e-3
SAMPLES = 32  # evenly spaced elements per tensor in a golden, plus the largest


def image_model(case):
    return build(case["model"], classes=case["dataset"]["Classes"])


def image_loss(model, batch):
    return F.cross_entropy(model(batch["x"]), batch["labels"].long())


FAMILIES = {
    "vgg": (image_model, image_loss),
    "resnet": (image_model, image_loss),
}


def rel(a, b, floor=0.0):
    """max|a - b| / max(max|b|, floor) (scale 1 when both are 0)."""
    scale = max(b.abs().max().item(), floor) or 1.0
    return (a - b).abs().max().item() / scale


def summary(t, with_samples=True):
    t = t.detach().double().reshape(-1)
    s = {"shape": None, "sum": t.sum().item(), "abs_sum": t.abs().sum().item(),
         "max_abs": t.abs().max().item() if t.numel() else 0.0, "norm": t.norm().item()}
    if with_samples and t.numel():
        step = max(1, t.numel() // SAMPLES)
        idx = sorted(set(list(range(0, t.numel(), step))[:SAMPLES] + [int(t.abs().argmax())]))
        s["index"], s["values"] = idx, [t[i].item() for i in idx]
    else:
        s["index"], s["values"] = [], []
    return s


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="case directory written by go run ./models/internal/parity/export")
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--model", required=True, help="catalogue name; must be the exported case's")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--golden", help="also write the compact golden for the Go test here")
    ap.add_argument("--top", type=int, default=5, help="list the N worst tensors")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    with open(os.path.join(a.dir, "case.json")) as f:
        case = json.load(f)
    if case["model"] != a.model or case["family"] != a.family:
        sys.exit(f"{a.dir}: holds {case['family']}/{case['model']}, not {a.family}/{a.model}")
    weights, _ = load(os.path.join(a.dir, "weights.safetensors"))
    batch, _ = load(os.path.join(a.dir, "batch.safetensors"))
    spargo, _ = load(os.path.join(a.dir, "spargo.safetensors"))
    make_model, loss_fn = FAMILIES[a.family]
    dtype = torch.float64 if a.dtype == "float64" else torch.float32

    model = make_model(case)
    model.load_state_dict(weights, strict=True)
    model = model.to(dtype).train()
    inputs = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in batch.items()}
    loss = loss_fn(model, inputs)
    model.zero_grad(set_to_none=True)
    loss.backward()

    report = {"loss_spargo": spargo["loss"].item(), "loss_torch": loss.item()}
    report["loss_rel"] = abs(report["loss_spargo"] - report["loss_torch"]) / abs(report["loss_torch"])
    rows = []
    gmax = max(p.grad.abs().max().item() for p in model.parameters())
    for name, p in model.named_parameters():
        rows.append(("grad/" + name, rel(spargo["grad/" + name].double(), p.grad.double(), FLOOR * gmax)))
    for name, b in model.named_buffers():
        rows.append(("buffer/" + name, rel(spargo["buffer/" + name].double(), b.double())))
    grads = [r for n, r in rows if n.startswith("grad/")]
    bufs = [r for n, r in rows if n.startswith("buffer/")]
    report["grad_max_rel"] = max(grads)
    if a.dtype == "float64":
        # The float32 noise floor of this case: torch's own float32 gradients against float64.
        m32 = make_model(case)
        m32.load_state_dict(weights, strict=True)
        m32.train()
        loss_fn(m32, {k: v for k, v in batch.items()}).backward()
        report["torch_float32_grad_max_rel"] = max(
            rel(p32.grad.double(), p.grad.double(), FLOOR * gmax)
            for p32, p in zip(m32.parameters(), model.parameters()))
    report["buffer_max_rel"] = max(bufs) if bufs else 0.0
    report["params"] = sum(p.numel() for p in model.parameters())
    flat_s = torch.cat([spargo["grad/" + n].double().reshape(-1) for n, _ in model.named_parameters()])
    flat_t = torch.cat([p.grad.double().reshape(-1) for p in model.parameters()])
    report["grad_norm_rel"] = ((flat_s - flat_t).norm() / flat_t.norm()).item()
    ok = report["loss_rel"] <= LOSS_RTOL and report["grad_max_rel"] <= GRAD_RTOL and report["buffer_max_rel"] <= GRAD_RTOL

    if case.get("steps"):
        # The trajectory: the same SGD steps on the same batch from the same weights.
        # Parameters compare relative to their change over the steps
        # (max|p_spargo - p_torch| / max|p_torch - p_0| per tensor), buffers as above.
        def trajectory(dt):
            t = make_model(case)
            t.load_state_dict(weights, strict=True)
            t = t.to(dt).train()
            opt = torch.optim.SGD(t.parameters(), lr=case["lr"], momentum=case.get("momentum", 0),
                                  weight_decay=case.get("wd", 0))
            for _ in range(case["steps"]):
                opt.zero_grad(set_to_none=True)
                loss_fn(t, {k: (v.to(dt) if v.is_floating_point() else v) for k, v in batch.items()}).backward()
                opt.step()
            return t

        traj = trajectory(dtype)
        steps_rows = []
        for name, p in traj.named_parameters():
            p0 = weights[name].double()
            moved = p.detach().double() - p0
            steps_rows.append(("param/" + name, rel(spargo["param/" + name].double() - p0, moved)))
        for name, b in traj.named_buffers():
            steps_rows.append(("buffer_steps/" + name, rel(spargo["buffer_steps/" + name].double(), b.double())))
        report["steps_param_max_rel"] = max(r for n, r in steps_rows if n.startswith("param/"))
        report["steps_buffer_max_rel"] = max((r for n, r in steps_rows if n.startswith("buffer_steps/")), default=0.0)
        if a.dtype == "float64":
            t32 = dict(trajectory(torch.float32).named_parameters())
            report["torch_float32_steps_param_max_rel"] = max(
                rel(t32[n].detach().double() - weights[n].double(), p.detach().double() - weights[n].double())
                for n, p in traj.named_parameters())
        ok = ok and report["steps_param_max_rel"] <= GRAD_RTOL and report["steps_buffer_max_rel"] <= GRAD_RTOL

    x = case.get("size") or case["dataset"]["Size"]
    print(f"{a.family}/{a.model}: {report['params']} parameters, batch {case['batch']}"
          f" at {x}x{x}, seed {case['seed']}, torch {torch.__version__} in {a.dtype}")
    print(f"loss spargo {report['loss_spargo']:.8f} torch {report['loss_torch']:.8f} "
          f"relative {report['loss_rel']:.2e} (criterion {LOSS_RTOL:g})")
    print(f"gradients: max relative {report['grad_max_rel']:.2e} over {len(grads)} tensors; "
          f"buffers: {report['buffer_max_rel']:.2e} over {len(bufs)} (criterion {GRAD_RTOL:g}); "
          f"whole gradient |g_s - g_t| / |g_t| {report['grad_norm_rel']:.2e}")
    def floor_and_worst(key, what, table):
        if key in report:
            print(f"noise floor: torch's own float32 {what} against float64, max relative {report[key]:.2e}")
        for name, r in sorted(table, key=lambda r: -r[1])[:a.top]:
            print(f"  {r:.2e}  {name}")

    floor_and_worst("torch_float32_grad_max_rel", "gradients", rows)
    if case.get("steps"):
        print(f"after {case['steps']} SGD steps (lr {case['lr']}, momentum {case.get('momentum', 0)}, "
              f"wd {case.get('wd', 0)}): parameters' change max relative {report['steps_param_max_rel']:.2e}, "
              f"buffers {report['steps_buffer_max_rel']:.2e} (criterion {GRAD_RTOL:g})")
        floor_and_worst("torch_float32_steps_param_max_rel", "trajectory", steps_rows)
    print("PASS" if ok else "FAIL")

    if a.golden:
        tensors = {}
        for name, v in weights.items():
            tensors["weight/" + name] = summary(v, with_samples=False)
            tensors["weight/" + name]["shape"] = list(v.shape)
        for name, v in batch.items():
            if v.is_floating_point():
                tensors["input/" + name] = summary(v, with_samples=False)
                tensors["input/" + name]["shape"] = list(v.shape)
        for name, p in model.named_parameters():
            tensors["grad/" + name] = summary(p.grad)
            tensors["grad/" + name]["shape"] = list(p.shape)
        for name, b in model.named_buffers():
            tensors["buffer/" + name] = summary(b)
            tensors["buffer/" + name]["shape"] = list(b.shape)
        doc = {"generator": "scripts/torch_parity.py", "torch_version": torch.__version__,
               "compute_dtype": a.dtype, "family": a.family,
               "case": {k: case[k] for k in ("model", "batch", "size", "seed") if k in case},  # gradient only
               "loss": loss.item(), "tensors": tensors, "report": report}
        os.makedirs(os.path.dirname(os.path.abspath(a.golden)), exist_ok=True)
        with open(a.golden, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
        print(f"golden: {a.golden}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
