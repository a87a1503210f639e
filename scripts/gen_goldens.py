#!/usr/bin/env python3
# Generates the PyTorch golden files that spargo's Go tests compare against.
#
# Regenerate with (from the repository root):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_goldens.py testdata/goldens
#
# Generated with PyTorch 1.13.0a0 (Debian python3-torch); the version is also stored
# in every file as "torch_version".
#
# Conventions (the Go package internal/golden depends on them):
#   * every case has its own fixed torch.manual_seed, so the output is deterministic;
#   * inputs and parameters are created in float32 (parameters by PyTorch's default
#     init under that seed, so they double as init-distribution samples) and are always
#     stored, so the Go side never needs PyTorch's RNG;
#   * references (outputs, grads, buffers_after, SGD trajectories) are computed in
#     float64 from those float32 values ("compute_dtype": "float64" at the top level);
#   * arrays are {"shape": [...], "data": [flat row-major floats]}; a scalar has shape [];
#   * for layers the loss is sum(output * upstream), so grads are d(loss)/d(input, params);
#   * integer data (labels, num_batches_tracked) is written as floats.
import copy
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


def arr(t):
    t = torch.as_tensor(t).detach().double()
    return {"shape": list(t.shape), "data": t.reshape(-1).tolist()}


def rows(ts):
    return [torch.as_tensor(t).detach().double().reshape(-1).tolist() for t in ts]


def layer_case(name, op, config, module, x, extra_inputs=None, buffer_names=()):
    """Runs module (already initialised in float32) on x in float64 with loss sum(y*R)."""
    m = copy.deepcopy(module).double()
    x64 = x.detach().double().requires_grad_(True)
    case = {"name": name, "op": op, "config": config, "inputs": {"x": arr(x)}}
    params = dict(module.named_parameters())
    if params:
        case["params"] = {k: arr(v) for k, v in params.items()}
    if buffer_names:
        bufs = dict(module.named_buffers())
        case["buffers"] = {k: arr(bufs[k]) for k in buffer_names}
    y = m(x64)
    R = torch.randn(y.shape)  # float32 sample, drawn after params and x
    (y * R.double()).sum().backward()
    case["upstream"] = arr(R)
    case["outputs"] = {"y": arr(y)}
    grads = {"x": arr(x64.grad)}
    for k, p in m.named_parameters():
        grads[k] = arr(p.grad)
    case["grads"] = grads
    if buffer_names:
        bufs = dict(m.named_buffers())
        case["buffers_after"] = {k: arr(bufs[k]) for k in buffer_names}
    return case


# ---------------------------------------------------------------- linear
def gen_linear():
    cases = []
    for seed, (name, fin, fout, bias, n) in enumerate([
            ("linear_4_3_bias_b5", 4, 3, True, 5),
            ("linear_7_5_nobias_b5", 7, 5, False, 5),
            ("linear_4_3_bias_b1", 4, 3, True, 1)]):
        torch.manual_seed(100 + seed)
        m = nn.Linear(fin, fout, bias=bias)
        x = torch.randn(n, fin)
        cases.append(layer_case(name, "linear",
                                {"in_features": fin, "out_features": fout, "bias": bias}, m, x))
    return cases


# ---------------------------------------------------------------- conv2d
def gen_conv2d():
    cases = []
    specs = [  # name, cin, cout, k, s, p, bias, N, H, W
        ("conv2d_k3_s1_p1_bias", 3, 4, 3, 1, 1, True, 2, 5, 5),
        ("conv2d_k3_s2_p0_nobias", 3, 5, 3, 2, 0, False, 3, 7, 7),
        ("conv2d_k1_s1_p0_bias", 2, 3, 1, 1, 0, True, 1, 4, 4),
        ("conv2d_k5_s2_p2_bias", 2, 3, 5, 2, 2, True, 2, 7, 7),
        ("conv2d_k3_s1_p1_bias_6x9", 4, 2, 3, 1, 1, True, 2, 6, 9),
        # >= 16 channels: the NHWC indirect-GEMM path (forward and input gradient)
        ("conv2d_k3_s1_p1_bias_16to24", 16, 24, 3, 1, 1, True, 2, 5, 6),
        # strided: NHWC forward and weight gradient, col2im input gradient
        ("conv2d_k3_s2_p1_nobias_20to17", 20, 17, 3, 2, 1, False, 2, 7, 7),
    ]
    for seed, (name, cin, cout, k, s, p, bias, n, h, w) in enumerate(specs):
        torch.manual_seed(200 + seed)
        m = nn.Conv2d(cin, cout, k, stride=s, padding=p, bias=bias)
        x = torch.randn(n, cin, h, w)
        cases.append(layer_case(name, "conv2d",
                                {"in_channels": cin, "out_channels": cout, "kernel": k,
                                 "stride": s, "padding": p, "bias": bias}, m, x))
    return cases


# ---------------------------------------------------------------- batchnorm2d
BN_BUFS = ("running_mean", "running_var", "num_batches_tracked")


def gen_batchnorm2d():
    cases = []
    specs = [  # name, C, N, H, W, training
        ("batchnorm2d_train", 3, 4, 3, 3, True),
        ("batchnorm2d_eval", 3, 2, 3, 4, False),
        ("batchnorm2d_train_b1_1x2", 2, 1, 1, 2, True),
    ]
    for seed, (name, c, n, h, w, training) in enumerate(specs):
        torch.manual_seed(300 + seed)
        m = nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)
        with torch.no_grad():
            m.weight.copy_(torch.randn(c))
            m.bias.copy_(torch.randn(c))
            m.running_mean.copy_(torch.randn(c))
            m.running_var.copy_(torch.rand(c) + 0.5)
        m.train(training)
        x = torch.randn(n, c, h, w) * 1.5 + 0.3
        cases.append(layer_case(name, "batchnorm2d",
                                {"num_features": c, "eps": 1e-5, "momentum": 0.1,
                                 "training": training}, m, x, buffer_names=BN_BUFS))
    return cases


# ---------------------------------------------------------------- pool
def gen_pool():
    cases = []
    specs = [  # name, op, k, s, p, N, C, H, W
        ("maxpool2d_k2", "maxpool2d", 2, 2, 0, 2, 3, 6, 6),
        ("maxpool2d_k3_s2_p1", "maxpool2d", 3, 2, 1, 2, 2, 7, 6),
        ("avgpool2d_k2", "avgpool2d", 2, 2, 0, 2, 3, 4, 6),
        ("avgpool2d_k3_s1_p1", "avgpool2d", 3, 1, 1, 2, 2, 5, 5),
    ]
    for seed, (name, op, k, s, p, n, c, h, w) in enumerate(specs):
        torch.manual_seed(400 + seed)
        if op == "maxpool2d":
            m = nn.MaxPool2d(k, stride=s, padding=p)
            cfg = {"kernel": k, "stride": s, "padding": p}
        else:
            m = nn.AvgPool2d(k, stride=s, padding=p, count_include_pad=True)
            cfg = {"kernel": k, "stride": s, "padding": p, "count_include_pad": True}
        x = torch.randn(n, c, h, w)
        cases.append(layer_case(name, op, cfg, m, x))
    return cases


# ---------------------------------------------------------------- resnet ops
class SubsamplePad(nn.Module):
    """The option-A shortcut of the CIFAR ResNets: x[:, :, ::s, ::s], zero channels around."""

    def __init__(self, stride, before, after):
        super().__init__()
        self.stride, self.before, self.after = stride, before, after

    def forward(self, x):
        s = self.stride
        return F.pad(x[:, :, ::s, ::s], (0, 0, 0, 0, self.before, self.after))


def gen_resnet_ops():
    cases = []
    specs = [  # name, op, config, N, C, H, W
        ("adaptiveavgpool2d_1x1", "adaptiveavgpool2d", {"out_h": 1, "out_w": 1}, 2, 3, 5, 7),
        ("adaptiveavgpool2d_2x3_overlap", "adaptiveavgpool2d", {"out_h": 2, "out_w": 3}, 2, 2, 5, 7),
        ("adaptiveavgpool2d_4x4_from_3x3", "adaptiveavgpool2d", {"out_h": 4, "out_w": 4}, 1, 2, 3, 3),
        ("subsample_pad_s2_4_4", "subsample_pad", {"stride": 2, "before": 4, "after": 4}, 2, 8, 6, 6),
        ("subsample_pad_s2_odd", "subsample_pad", {"stride": 2, "before": 1, "after": 2}, 2, 3, 5, 7),
        ("subsample_pad_s1", "subsample_pad", {"stride": 1, "before": 0, "after": 3}, 1, 2, 3, 4),
    ]
    for seed, (name, op, cfg, n, c, h, w) in enumerate(specs):
        torch.manual_seed(450 + seed)
        if op == "adaptiveavgpool2d":
            m = nn.AdaptiveAvgPool2d((cfg["out_h"], cfg["out_w"]))
        else:
            m = SubsamplePad(cfg["stride"], cfg["before"], cfg["after"])
        x = torch.randn(n, c, h, w)
        cases.append(layer_case(name, op, cfg, m, x))
    return cases


# ---------------------------------------------------------------- activation
def gen_activation():
    cases = []
    torch.manual_seed(500)
    x = torch.randn(3, 2, 3, 4)
    x = torch.where(x >= 0, x + 2e-3, x - 2e-3)  # nothing within 1e-3 of 0
    assert x.abs().min().item() > 1e-3
    cases.append(layer_case("relu", "relu", {}, nn.ReLU(), x))
    torch.manual_seed(501)
    x = torch.randn(2, 3, 2, 2)
    cases.append(layer_case("flatten", "flatten", {"start_dim": 1, "end_dim": -1},
                            nn.Flatten(1), x))
    return cases


# ---------------------------------------------------------------- loss
def ce_case(name, logits, labels):
    z = logits.detach().double().requires_grad_(True)
    loss = F.cross_entropy(z, labels, reduction="mean")
    loss.backward()
    return {"name": name, "op": "cross_entropy",
            "config": {"reduction": "mean", "num_classes": logits.shape[1]},
            "inputs": {"logits": arr(logits), "labels": arr(labels)},
            "outputs": {"loss": arr(loss)},
            "grads": {"logits": arr(z.grad)}}


def gen_loss():
    cases = []
    torch.manual_seed(600)
    cases.append(ce_case("cross_entropy_5x7", torch.randn(5, 7), torch.randint(0, 7, (5,))))
    torch.manual_seed(601)
    big = torch.randn(5, 7) * 5
    big[torch.arange(5), torch.randint(0, 7, (5,))] = 50.0
    big[torch.arange(5), torch.randint(0, 7, (5,))] = -50.0
    big[0, :] = torch.tensor([50.0, -50.0, 49.0, -50.0, 0.0, 50.0, -49.5])
    labels = torch.randint(0, 7, (5,))
    labels[0] = 1  # true class at -50 while others at +50: loss ~100
    cases.append(ce_case("cross_entropy_large_logits", big, labels))
    torch.manual_seed(602)
    cases.append(ce_case("cross_entropy_batch1", torch.randn(1, 7), torch.randint(0, 7, (1,))))
    return cases


# ---------------------------------------------------------------- model
def gen_model():
    torch.manual_seed(700)
    m = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(6 * 2 * 2, 5))
    x = torch.randn(3, 3, 8, 8)
    labels = torch.randint(0, 5, (3,))
    m.train()
    bufs0 = {k: arr(v) for k, v in m.named_buffers()}
    params0 = {k: arr(v) for k, v in m.named_parameters()}
    m64 = copy.deepcopy(m).double()
    x64 = x.double().requires_grad_(True)
    logits = m64(x64)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    grads = {"x": arr(x64.grad)}
    grads.update({k: arr(p.grad) for k, p in m64.named_parameters()})
    return [{
        "name": "vgg_tiny_train", "op": "vgg_tiny",
        "config": {"arch": "Conv(3,4,k3,p1) BN(4) ReLU MaxPool(2) Conv(4,6,k3,p1) BN(6) ReLU "
                           "MaxPool(2) Flatten Linear(24,5)",
                   "training": True, "bn_eps": 1e-5, "bn_momentum": 0.1, "num_classes": 5,
                   "loss": "cross_entropy_mean"},
        "inputs": {"x": arr(x), "labels": arr(labels)},
        "params": params0,
        "buffers": bufs0,
        "outputs": {"loss": arr(loss), "logits": arr(logits)},
        "grads": grads,
        "buffers_after": {k: arr(v) for k, v in m64.named_buffers()},
    }]


# ---------------------------------------------------------------- sgd
SGD_STEPS = 10


def sgd_case(name, seed, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0,
             rule="given"):
    torch.manual_seed(seed)
    init = {"a": torch.randn(6), "b": torch.randn(2, 3)}
    noise = {k: [torch.randn(v.shape) for _ in range(SGD_STEPS)] for k, v in init.items()}
    ps = {k: v.double().clone().requires_grad_(True) for k, v in init.items()}
    opt = torch.optim.SGD([ps["a"], ps["b"]], lr=lr, momentum=momentum, dampening=dampening,
                          nesterov=nesterov, weight_decay=weight_decay)
    grads = {k: [] for k in ps}
    after = {k: [] for k in ps}
    for t in range(SGD_STEPS):
        for k, p in ps.items():
            g = noise[k][t].double()
            if rule == "0.5p+noise":
                g = 0.5 * p.detach() + g
            p.grad = g.clone()
            grads[k].append(g.clone())
        opt.step()
        for k, p in ps.items():
            after[k].append(p.detach().clone())
    config = {"lr": lr, "momentum": momentum, "dampening": dampening, "nesterov": nesterov,
              "weight_decay": weight_decay, "grad_rule": rule, "steps": SGD_STEPS}
    case = {"name": name, "op": "sgd", "config": config,
            "params": {k: arr(v) for k, v in init.items()},
            "grads_per_step": {k: rows(v) for k, v in grads.items()},
            "params_per_step": {k: rows(v) for k, v in after.items()}}
    if rule == "0.5p+noise":
        config["grad_rule_desc"] = ("before step t (0-based) the gradient is 0.5*p_t + "
                                    "noise_per_step[t], p_t being the parameter before step t; "
                                    "grads_per_step holds the resulting gradient PyTorch used")
        case["noise_per_step"] = {k: rows(v) for k, v in noise.items()}
    return case


def gen_sgd():
    return [
        sgd_case("sgd_plain", 800, 0.1),
        sgd_case("sgd_momentum", 801, 0.1, momentum=0.9),
        sgd_case("sgd_momentum_dampening", 802, 0.1, momentum=0.9, dampening=0.1),
        sgd_case("sgd_nesterov", 803, 0.1, momentum=0.9, nesterov=True),
        sgd_case("sgd_momentum_wd", 804, 0.1, momentum=0.9, weight_decay=5e-4),
        sgd_case("sgd_wd_nomomentum", 805, 0.1, weight_decay=1e-2),
        sgd_case("sgd_nesterov_wd_lr001", 806, 0.01, momentum=0.9, nesterov=True,
                 weight_decay=5e-4),
        sgd_case("sgd_momentum_wd_pdep", 807, 0.1, momentum=0.9, weight_decay=5e-4,
                 rule="0.5p+noise"),
        sgd_case("sgd_nesterov_wd_lr001_pdep", 808, 0.01, momentum=0.9, nesterov=True,
                 weight_decay=5e-4, rule="0.5p+noise"),
    ]


FILES = {
    "linear": gen_linear,
    "conv2d": gen_conv2d,
    "batchnorm2d": gen_batchnorm2d,
    "pool": gen_pool,
    "resnet_ops": gen_resnet_ops,
    "activation": gen_activation,
    "loss": gen_loss,
    "model": gen_model,
    "sgd": gen_sgd,
}


def main():
    # gen_goldens.py [OUT_DIR [FILE ...]]: all files, or only the named ones.
    out = sys.argv[1] if len(sys.argv) > 1 else "testdata/goldens"
    only = set(sys.argv[2:])
    os.makedirs(out, exist_ok=True)
    for fname, gen in FILES.items():
        if only and fname not in only:
            continue
        doc = {"torch_version": torch.__version__, "compute_dtype": "float64",
               "generator": "scripts/gen_goldens.py", "cases": gen()}
        path = os.path.join(out, fname + ".json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=None, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {', '.join(c['name'] for c in doc['cases'])}")


if __name__ == "__main__":
    main()
