#!/usr/bin/env python3
# PyTorch parity of spargo's LSTM language model through exported weights (issue 10): the
# Go test models/lstm_parity_test.go writes a safetensors file with the model's weights
# (word_language_model names), the batch ("ids", [2·bptt+1, N] int32), and spargo's results:
# "spargo.loss" (the second window's mean cross-entropy, after a first window whose hidden
# state is carried over detached) and "spargo.grad.<name>" for every parameter. This script
# loads the weights into word_language_model's RNNModel (LSTM, untied, no dropout), runs the
# same two windows in float64 and checks the loss (1e-4 relative) and every gradient (1e-3
# relative to the tensor's largest PyTorch gradient). Exit status 0 and "parity ok" when
# all match.
#
#   /usr/bin/python3 scripts/torch_lstm_parity.py FILE.safetensors
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_safetensors import load  # noqa: E402
from gen_lstm_goldens import RNNModel  # noqa: E402


def main():
    state, meta = load(sys.argv[1])
    ids = state.pop("ids").long()
    want_loss = state.pop("spargo.loss").double().item()
    want_grads = {k[len("spargo.grad."):]: state.pop(k) for k in list(state) if k.startswith("spargo.grad.")}
    vocab, emb = state["encoder.weight"].shape
    hid = state["rnn.weight_hh_l0"].shape[1]
    layers = sum(1 for k in state if k.startswith("rnn.weight_ih_l"))
    bptt, n = int(meta["bptt"]), ids.shape[1]
    m = RNNModel(vocab, emb, hid, layers)
    m.load_state_dict(state)
    m = m.double()
    hidden = (torch.zeros(layers, n, hid, dtype=torch.float64), torch.zeros(layers, n, hid, dtype=torch.float64))
    for w in range(2):
        x, y = ids[w * bptt:(w + 1) * bptt], ids[w * bptt + 1:(w + 1) * bptt + 1]
        hidden = tuple(h.detach() for h in hidden)
        m.zero_grad()
        logits, hidden = m(x, hidden)
        loss = F.cross_entropy(logits, y.reshape(-1))
        loss.backward()
    bad = []
    if abs(loss.item() - want_loss) > 1e-4 * abs(loss.item()):
        bad.append(f"loss: spargo {want_loss}, PyTorch {loss.item()}")
    for name, p in m.named_parameters():
        g, ref = want_grads[name].double(), p.grad
        err = (g - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        if err > 1e-3:
            bad.append(f"grad {name}: relative error {err:.3g}")
    if bad:
        print("\n".join(bad))
        sys.exit(1)
    print(f"parity ok: loss {loss.item():.6f}, {len(want_grads)} gradients")


if __name__ == "__main__":
    main()
