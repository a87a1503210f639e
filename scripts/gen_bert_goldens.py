#!/usr/bin/env python3
# Generates the PyTorch goldens of spargo's transformer layers:
#   testdata/goldens/transformer.json  LayerNorm, GELU, softmax, cross-entropy with
#                                      ignore_index, multi-head self-attention with a
#                                      padding mask, one whole BERT layer
# and holds the plain-torch HF-layout BertForPreTraining that scripts/torch_parity_bert.py
# (testdata/goldens/bert.json, from weights spargo exports), torch_bert_step.py and
# torch_bert_mlm.py use.
#
# Regenerate with (from the repository root):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/gen_bert_goldens.py testdata/goldens
#
# The format is scripts/gen_goldens.py's (internal/golden reads it): float32 inputs and
# parameters, generated here under fixed seeds and stored, references computed in
# float64; for layers the loss is sum(y * upstream). Weights are generated here and
# loaded by the Go tests by name, so the names below are also the check that a Hugging
# Face BertForPreTraining state dict maps 1:1 onto spargo's parameters.
#
# The reference BERT is written in plain torch.nn with the module names of Hugging
# Face's modeling_bert.py (transformers is not installed here): post-LN layers, exact
# GELU, the additive mask (1 - mask) * -10000 of Google's BERT and HF up to 4.21, the
# MLM decoder tied to the word embeddings with its own bias, padding_idx 0 on the word
# embeddings, and the loss of BertForPreTraining (MLM CE with ignore_index -100 + NSP CE).
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
MASK_VALUE = -10000.0


def arr(t):
    t = torch.as_tensor(t).detach().double()
    return {"shape": list(t.shape), "data": t.reshape(-1).tolist()}


# ------------------------------------------------------------------ reference modules
class SelfAttention(nn.Module):  # HF BertSelfAttention (+ optional output projection)
    def __init__(self, hidden, heads, out_proj=False):
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        if out_proj:
            self.out = nn.Linear(hidden, hidden)
        else:
            self.out = None

    def split(self, x):
        n, t, _ = x.shape
        return x.view(n, t, self.heads, self.d).permute(0, 2, 1, 3)

    def forward(self, x, mask=None):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if mask is not None:
            s = s + (1.0 - mask[:, None, None, :].to(s.dtype)) * MASK_VALUE
        p = torch.softmax(s, dim=-1)
        ctx = (p @ v).permute(0, 2, 1, 3).reshape(x.shape)
        return self.out(ctx) if self.out is not None else ctx


class AddNorm(nn.Module):  # HF BertSelfOutput / BertOutput
    def __init__(self, inp, hidden, eps):
        super().__init__()
        self.dense = nn.Linear(inp, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x, res):
        return self.LayerNorm(self.dense(x) + res)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = SelfAttention(c["hidden"], c["heads"])
        self.output = AddNorm(c["hidden"], c["hidden"], c["eps"])


class Intermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden"], c["intermediate"])


class Layer(nn.Module):  # HF BertLayer
    def __init__(self, c):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = AddNorm(c["intermediate"], c["hidden"], c["eps"])

    def forward(self, x, mask=None):
        h = self.attention.output(self.attention.self(x, mask), x)
        return self.output(F.gelu(self.intermediate.dense(h)), h)


class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab"], c["hidden"], padding_idx=0)
        self.position_embeddings = nn.Embedding(c["positions"], c["hidden"])
        self.token_type_embeddings = nn.Embedding(c["types"], c["hidden"])
        self.LayerNorm = nn.LayerNorm(c["hidden"], eps=c["eps"])

    def forward(self, ids, types):
        pos = torch.arange(ids.shape[1])[None, :].expand_as(ids)
        return self.LayerNorm(self.word_embeddings(ids) + self.position_embeddings(pos)
                              + self.token_type_embeddings(types))


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([Layer(c) for _ in range(c["layers"])])


class Pooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden"], c["hidden"])


class Bert(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.pooler = Pooler(c)


class Transform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden"], c["hidden"])
        self.LayerNorm = nn.LayerNorm(c["hidden"], eps=c["eps"])


class LMHead(nn.Module):  # HF BertLMPredictionHead
    def __init__(self, c, word):
        super().__init__()
        self.transform = Transform(c)
        self.decoder = nn.Linear(c["hidden"], c["vocab"], bias=False)
        self.bias = nn.Parameter(torch.zeros(c["vocab"]))
        self.decoder.weight = word.weight
        self.decoder.bias = self.bias


class Heads(nn.Module):
    def __init__(self, c, word):
        super().__init__()
        self.predictions = LMHead(c, word)
        self.seq_relationship = nn.Linear(c["hidden"], 2)


class BertForPreTraining(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = Bert(c)
        self.cls = Heads(c, self.bert.embeddings.word_embeddings)

    def forward(self, ids, types, mask):
        h = self.bert.embeddings(ids, types)
        for layer in self.bert.encoder.layer:
            h = layer(h, mask)
        pooled = torch.tanh(self.bert.pooler.dense(h[:, 0]))
        tr = self.cls.predictions.transform
        z = tr.LayerNorm(F.gelu(tr.dense(h)))
        mlm = self.cls.predictions.decoder(z)
        nsp = self.cls.seq_relationship(pooled)
        return mlm, nsp


def randomise(module, std):
    """Float32 weights far from the identity-ish HF init, so every path matters."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape))
            else:
                p.copy_(std * torch.randn(p.shape))
        for m in module.modules():
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()


def layer_case(name, op, config, module, x, mask=None):
    """Runs module in float64 on x (and mask) with loss sum(y * R)."""
    params = {k: arr(v) for k, v in module.named_parameters()}
    m = module.double()
    x64 = x.detach().double().requires_grad_(True)
    y = m(x64) if mask is None else m(x64, mask)
    R = torch.randn(y.shape)
    (y * R.double()).sum().backward()
    case = {"name": name, "op": op, "config": config, "inputs": {"x": arr(x)},
            "upstream": arr(R), "outputs": {"y": arr(y)}, "grads": {"x": arr(x64.grad)}}
    if mask is not None:
        case["inputs"]["mask"] = arr(mask)
    if params:
        case["params"] = params
        for k, p in m.named_parameters():
            case["grads"][k] = arr(p.grad)
    return case


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def gen_transformer():
    cases = []
    for seed, (name, shape, eps) in enumerate([("layernorm_2x3x8_eps1e-5", (2, 3, 8), 1e-5),
                                               ("layernorm_4x16_eps1e-12", (4, 16), 1e-12)]):
        torch.manual_seed(1000 + seed)
        m = nn.LayerNorm(shape[-1], eps=eps)
        with torch.no_grad():
            m.weight.copy_(1 + 0.5 * torch.randn(shape[-1]))
            m.bias.copy_(0.5 * torch.randn(shape[-1]))
        x = 2 * torch.randn(*shape) + 1
        cases.append(layer_case(name, "layernorm", {"dim": shape[-1], "eps": eps}, m, x))
    torch.manual_seed(1010)
    x = torch.cat([torch.linspace(-9, 9, 37), 2 * torch.randn(23)]).reshape(4, 15)
    cases.append(layer_case("gelu_4x15", "gelu", {}, nn.GELU(), x))
    torch.manual_seed(1011)
    cases.append(layer_case("softmax_3x2x7", "softmax", {}, Fn(lambda v: torch.softmax(v, -1)),
                            3 * torch.randn(3, 2, 7)))
    for seed, (name, hidden, heads, out) in enumerate([("attention_h8_2heads_mask", 8, 2, False),
                                                       ("attention_h12_3heads_out_mask", 12, 3, True)]):
        torch.manual_seed(1020 + seed)
        m = SelfAttention(hidden, heads, out_proj=out)
        randomise(m, 0.5)
        x = torch.randn(3, 5, hidden)
        mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
        cases.append(layer_case(name, "attention", {"hidden": hidden, "heads": heads, "out_proj": out},
                                m, x, mask))
    torch.manual_seed(1030)
    c = {"hidden": 16, "heads": 2, "intermediate": 32, "eps": 1e-12}
    m = Layer(c)
    randomise(m, 0.3)
    x = torch.randn(2, 6, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.float32)
    cases.append(layer_case("bert_layer_h16_mask", "bert_layer", c, m, x, mask))
    # cross-entropy with ignore_index
    torch.manual_seed(1040)
    logits = torch.randn(6, 9)
    labels = torch.tensor([3, -100, 0, -100, 8, 3])
    z = logits.double().requires_grad_(True)
    loss = F.cross_entropy(z, labels, ignore_index=-100)
    loss.backward()
    cases.append({"name": "cross_entropy_ignore_6x9", "op": "cross_entropy_ignore",
                  "config": {"ignore_index": -100},
                  "inputs": {"logits": arr(logits), "labels": arr(labels)},
                  "outputs": {"loss": arr(loss)}, "grads": {"logits": arr(z.grad)}})
    return cases


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "testdata/goldens"
    os.makedirs(out, exist_ok=True)
    for fname, gen in [("transformer.json", gen_transformer)]:
        doc = {"torch_version": torch.__version__, "compute_dtype": "float64", "cases": gen()}
        with open(os.path.join(out, fname), "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        print("wrote", os.path.join(out, fname), len(doc["cases"]), "cases")


if __name__ == "__main__":
    main()
