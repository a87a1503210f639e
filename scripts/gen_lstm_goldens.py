#!/usr/bin/env python3
# Generates the PyTorch goldens of spargo's LSTM and the LSTM language model:
#   testdata/goldens/lstm.json
#     lstm_*      torch.nn.LSTM (sequence first) from a given or zero (h0, c0): the output,
#                 (h_n, c_n) and the gradients of sum(y * upstream) for x and every weight
#     lm_*        word_language_model's RNNModel (Embedding, 2-layer LSTM, untied Linear
#                 decoder, no dropout) over two bptt windows: the hidden state of the
#                 first window is detached (repackage_hidden) and fed to the second; the
#                 gradients are those of the second window's mean cross-entropy alone ("loss";
#                 "loss_window1" is the first window's)
#
# Regenerate with (from the repository root):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_lstm_goldens.py testdata/goldens
#
# The format is scripts/gen_goldens.py's (internal/golden reads it): float32 inputs and
# parameters under fixed seeds, stored; references computed in float64. Integer ids are
# written as floats.
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


def lstm_case(name, seed, inp, hidden, layers, T, N, with_state):
    torch.manual_seed(seed)
    m = nn.LSTM(inp, hidden, layers)  # PyTorch's default init, float32
    x = torch.randn(T, N, inp)
    case = {"name": name, "op": "lstm",
            "config": {"input_size": inp, "hidden_size": hidden, "num_layers": layers, "with_state": with_state},
            "inputs": {"x": arr(x)},
            "params": {k: arr(v) for k, v in m.named_parameters()}}
    m64 = m.double()
    x64 = x.double().requires_grad_(True)
    if with_state:
        h0, c0 = torch.randn(layers, N, hidden), torch.randn(layers, N, hidden)
        case["inputs"]["h0"], case["inputs"]["c0"] = arr(h0), arr(c0)
        y, (hn, cn) = m64(x64, (h0.double(), c0.double()))
    else:
        y, (hn, cn) = m64(x64)
    R = torch.randn(y.shape)
    (y * R.double()).sum().backward()
    case["upstream"] = arr(R)
    case["outputs"] = {"y": arr(y), "h_n": arr(hn), "c_n": arr(cn)}
    grads = {"x": arr(x64.grad)}
    for k, p in m64.named_parameters():
        grads[k] = arr(p.grad)
    case["grads"] = grads
    return case


class RNNModel(nn.Module):  # word_language_model's, LSTM, untied, dropout 0
    def __init__(self, ntoken, ninp, nhid, nlayers):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)
        initrange = 0.1  # as its init_weights and Ok-Topk's (LSTM/models/lstm.py)
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, ids, hidden):
        out, hidden = self.rnn(self.encoder(ids), hidden)
        return self.decoder(out.reshape(-1, out.shape[-1])), hidden


def lm_case(name, seed, vocab, emb, hid, layers, T, N):
    torch.manual_seed(seed)
    m = RNNModel(vocab, emb, hid, layers)
    ids = torch.randint(0, vocab, (2 * T + 1, N))
    case = {"name": name, "op": "lstm_lm",
            "config": {"vocab": vocab, "embed": emb, "hidden": hid, "layers": layers, "bptt": T, "batch": N},
            "inputs": {"ids": arr(ids)},
            "params": {k: arr(v) for k, v in m.named_parameters()}}
    m64 = m.double()
    hidden = (torch.zeros(layers, N, hid, dtype=torch.float64), torch.zeros(layers, N, hid, dtype=torch.float64))
    losses = []
    for w in range(2):
        x, y = ids[w * T:(w + 1) * T], ids[w * T + 1:(w + 1) * T + 1]
        hidden = tuple(h.detach() for h in hidden)
        m64.zero_grad()
        logits, hidden = m64(x, hidden)
        loss = F.cross_entropy(logits, y.reshape(-1))
        loss.backward()
        losses.append(loss.item())
    case["outputs"] = {"loss_window1": arr(torch.tensor(losses[0])), "loss": arr(torch.tensor(losses[1])),
                       "h_n": arr(hidden[0]), "c_n": arr(hidden[1])}
    case["grads"] = {k: arr(p.grad) for k, p in m64.named_parameters()}
    return case


def gen_lstm():
    return [
        lstm_case("lstm_1layer_state", 1, 5, 4, 1, 3, 2, True),
        lstm_case("lstm_2layer_zero", 2, 3, 6, 2, 4, 3, False),
        lstm_case("lstm_3layer_state_t1", 3, 4, 3, 3, 1, 2, True),
        lm_case("lm_2layer_two_windows", 4, 11, 5, 6, 2, 4, 3),
    ]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "testdata/goldens"
    os.makedirs(out, exist_ok=True)
    doc = {"torch_version": torch.__version__, "compute_dtype": "float64",
           "generator": "scripts/gen_lstm_goldens.py", "cases": gen_lstm()}
    path = os.path.join(out, "lstm.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {', '.join(c['name'] for c in doc['cases'])}")


if __name__ == "__main__":
    main()
