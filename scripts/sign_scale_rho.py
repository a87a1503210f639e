# How far a scaled sign is from the vector it stands for, on VGG-11's gradients (issue 26, onebit).
# For a chunk x of c elements, ρ = ‖x‖₁/(√c‖x‖₂) ∈ [1/√c, 1]. The sign scaled by ‖x‖₂/√c (DeepSpeed's
# 1-bit scale, onebit:scale=rms) leaves an error of 2‖x‖²(1 − ρ), more than ‖x‖² once ρ < 1/2, so error
# feedback cannot contract; scaled by ‖x‖₁/c (onebit's default) it leaves ‖x‖²(1 − ρ²). Prints ρ of the
# whole gradient, of 12 equal chunks (3 buckets × 4 ranks, as onebit cuts them) and of each tensor,
# every 10 SGD steps from initialisation.
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/sign_scale_rho.py $SPARGO_DATA/cifar10/approx
import sys, numpy as np, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0); torch.set_num_threads(1)
raw = np.fromfile(sys.argv[1] + "/data_batch_1.bin", dtype=np.uint8).reshape(-1, 3073)[:2000]
x = torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0 - 0.47) / 0.25; y = torch.from_numpy(raw[:, 0].astype(np.int64))
layers = []; c = 3
for v in [64,'M',128,'M',256,256,'M',512,512,'M',512,512,'M']:
    if v == 'M': layers.append(nn.MaxPool2d(2))
    else: layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]; c = v
m = nn.Sequential(*layers, nn.Flatten(), nn.Linear(512, 10)); params = list(m.parameters())
opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
def ratio(v): return (v.abs().sum() / (v.numel() ** 0.5 * v.norm())).item()
for step in range(31):
    idx = torch.randint(0, 2000, (16,))
    m.zero_grad(); F.cross_entropy(m(x[idx]), y[idx]).backward()
    g = torch.cat([p.grad.reshape(-1) for p in params])
    if step % 10 == 0:
        chunks = g.chunk(12)  # ~ 3 buckets x 4 ranks
        print(step, "whole %.3f" % ratio(g), "chunks min %.3f median %.3f" % (min(ratio(c) for c in chunks), sorted(ratio(c) for c in chunks)[6]),
              "per-tensor min %.3f" % min(ratio(p.grad.reshape(-1)) for p in params if p.numel() > 100))
    opt.step()
