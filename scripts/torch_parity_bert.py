#!/usr/bin/env python3
"""PyTorch parity of spargo's BERT through exported weights.

spargo writes a BertForPreTraining's weights (Hugging Face names) and a fixed batch into a
safetensors file (models/bert_parity_test.go); this script loads the file with
scripts/read_safetensors.py into the plain-torch HF-layout BertForPreTraining of
scripts/gen_bert_goldens.py — strictly: every tensor must be a parameter of the model and
every parameter must be in the file (the MLM decoder's weight and bias are the tied word
embeddings and cls.predictions.bias) — and computes, in float64 with dropout off (the module
has none), the pre-training loss (MLM cross-entropy with ignore_index -100 + NSP
cross-entropy), the logits, every parameter's gradient and the losses of five AdamW steps
(lr 1e-2, weight decay 0.01 with BERT's no-decay groups) on the batch, written as a golden file in
scripts/gen_goldens.py's format (case bert_tiny_pretraining; the weights stay in the
safetensors file).

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_parity_bert.py \\
        testdata/parity/bert_tiny.safetensors testdata/goldens/bert.json
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_bert_goldens import BertForPreTraining, arr  # noqa: E402
from read_safetensors import load  # noqa: E402

torch.set_num_threads(1)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    tensors, metadata = load(src)
    c = json.loads(metadata["config"])
    batch = {k[len("batch."):]: v for k, v in tensors.items() if k.startswith("batch.")}
    state = {k: v for k, v in tensors.items() if not k.startswith("batch.")}
    model = BertForPreTraining(c)
    # HF's state dict lists the tied decoder under its own names too.
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"{src}: parameters missing from the file: {missing}; tensors that are no parameter: {unexpected}")
    model = model.double()
    ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    mlm_labels, nsp_labels = batch["mlm_labels"], batch["nsp_labels"]
    mlm, nsp = model(ids, types, mask)
    loss = (F.cross_entropy(mlm.view(-1, c["vocab"]), mlm_labels.view(-1), ignore_index=-100)
            + F.cross_entropy(nsp, nsp_labels))
    loss.backward()
    grads = {k: arr(p.grad) for k, p in model.named_parameters()}
    # Five AdamW steps on the same batch (lr 1e-2, weight decay 0.01 with BERT's no-decay
    # groups: biases and LayerNorm weights), the loss before each: the optimizer's parity too.
    named = list(model.named_parameters())
    exempt = lambda n: n.split(".")[-1].lower().endswith("bias") or "norm" in n.lower()
    opt = torch.optim.AdamW([{"params": [p for n, p in named if not exempt(n)], "weight_decay": 0.01},
                             {"params": [p for n, p in named if exempt(n)], "weight_decay": 0.0}], lr=1e-2)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        m, n = model(ids, types, mask)
        step_loss = (F.cross_entropy(m.view(-1, c["vocab"]), mlm_labels.view(-1), ignore_index=-100)
                     + F.cross_entropy(n, nsp_labels))
        step_loss.backward()
        opt.step()
        losses.append(step_loss.item())
    case = {"name": "bert_tiny_pretraining", "op": "bert_for_pretraining", "config": c,
            "inputs": {"input_ids": arr(ids), "token_type_ids": arr(types), "attention_mask": arr(mask),
                       "mlm_labels": arr(mlm_labels), "nsp_labels": arr(nsp_labels)},
            "outputs": {"loss": arr(loss), "mlm_logits": arr(mlm.view(-1, c["vocab"])), "nsp_logits": arr(nsp),
                        "adamw_losses": arr(torch.tensor(losses))},
            "grads": grads}
    doc = {"torch_version": torch.__version__, "compute_dtype": "float64", "weights": os.path.basename(src), "cases": [case]}
    with open(dst, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"{dst}: loss {loss.item():.6f}, {len(case['grads'])} gradients, from the weights in {src}")


if __name__ == "__main__":
    main()
