# PyTorch anchor: VGG on CIFAR-10 in the binary format (DATA_DIR holds data_batch_1.bin and test_batch.bin), the recipe of examples/vgg.
# Run with Debian's python3-torch:
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 torch_cifar_vgg.py DATA_DIR MODEL EPOCHS [BATCH=64] [LR=0.01] [SEED=0]
# Recipe: SGD momentum 0.9, weight decay 5e-4, random crop (pad 4) + flip, per-channel normalisation.
import sys, time, numpy as np, torch, torch.nn as nn, torch.nn.functional as F
data, model_name, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
bs = int(sys.argv[4]) if len(sys.argv) > 4 else 64
lr = float(sys.argv[5]) if len(sys.argv) > 5 else 0.01
seed = int(sys.argv[6]) if len(sys.argv) > 6 else 0
torch.set_num_threads(2); torch.manual_seed(seed); np.random.seed(seed)
def load(path):
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, 3073)
    return raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, raw[:, 0].astype(np.int64)
xtr, ytr = load(f"{data}/data_batch_1.bin"); xte, yte = load(f"{data}/test_batch.bin")
mean = np.array([0.4914, 0.4822, 0.4465], np.float32).reshape(1, 3, 1, 1); std = np.array([0.2470, 0.2435, 0.2616], np.float32).reshape(1, 3, 1, 1)
xtr = (xtr - mean) / std; xte = (xte - mean) / std
cfg = {'vgg11': [64,'M',128,'M',256,256,'M',512,512,'M',512,512,'M'],
       'vgg16': [64,64,'M',128,128,'M',256,256,256,'M',512,512,512,'M',512,512,512,'M']}
layers = []; c = 3
for v in cfg[model_name]:
    if v == 'M': layers.append(nn.MaxPool2d(2))
    else: layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]; c = v
m = nn.Sequential(*layers, nn.Flatten(), nn.Linear(512, 10))
opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
def augment(x):
    n = x.shape[0]; p = np.pad(x, ((0,0),(0,0),(4,4),(4,4))); out = np.empty_like(x)
    ox = np.random.randint(0, 9, n); oy = np.random.randint(0, 9, n); fl = np.random.rand(n) < 0.5
    for i in range(n):
        t = p[i, :, oy[i]:oy[i]+32, ox[i]:ox[i]+32]
        out[i] = t[:, :, ::-1] if fl[i] else t
    return out
t0 = time.time()
for ep in range(epochs):
    m.train(); perm = np.random.permutation(len(xtr)); tl = 0; nb = 0; ts = time.time()
    for i in range(0, len(perm) - bs + 1, bs):
        idx = perm[i:i+bs]; x = torch.from_numpy(augment(xtr[idx])); y = torch.from_numpy(ytr[idx])
        opt.zero_grad(); loss = F.cross_entropy(m(x), y); loss.backward(); opt.step(); tl += loss.item(); nb += 1
    tt = time.time() - ts
    m.eval(); correct = 0
    with torch.no_grad():
        for i in range(0, len(xte), 500):
            correct += (m(torch.from_numpy(xte[i:i+500])).argmax(1).numpy() == yte[i:i+500]).sum()
    print(f"epoch {ep+1} train_loss {tl/nb:.4f} test_acc {correct/len(xte):.4f} train_s {tt:.1f} img_s {nb*bs/tt:.1f} total_s {time.time()-t0:.1f}", flush=True)
