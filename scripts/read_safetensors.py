#!/usr/bin/env python3
"""Load a safetensors file written by spargo into a PyTorch state dict, without the
safetensors package: only json and torch.frombuffer (PyTorch 1.13 has both).

    python3 scripts/read_safetensors.py model.safetensors          # list names, dtypes, shapes
    python3 scripts/read_safetensors.py --dump model.safetensors   # JSON: every tensor's values

As a module:

    from read_safetensors import load
    state, metadata = load("ckpt/step-000000100/model.safetensors")
    model.load_state_dict(state)   # spargo names parameters like PyTorch ("features.0.weight")

The Go test safetensors/torch_test.go runs --dump on a file spargo wrote and compares
names, shapes and values.
"""
import json
import struct
import sys

import torch

DTYPES = {
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "U8": torch.uint8,
}
SIZES = {"F32": 4, "F64": 8, "I64": 8, "I32": 4, "U8": 1}


def load(path):
    """Returns (state dict of tensors, metadata dict) of the safetensors file at path."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: truncated ({len(raw)} bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header of {n} bytes runs past the file's {len(raw)} bytes")
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = raw[8 + n :]
    metadata = header.pop("__metadata__", {}) or {}
    state = {}
    for name, e in header.items():
        dtype, shape, (begin, end) = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * SIZES[dtype] or end > len(data):
            raise ValueError(f"{path}: tensor {name}: data_offsets {begin}..{end} do not fit {dtype} {shape}")
        if count == 0:
            t = torch.empty(shape, dtype=DTYPES[dtype])
        else:
            # bytearray: frombuffer wants a writable buffer; the format is little-endian,
            # as is every machine PyTorch runs on here.
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=DTYPES[dtype]).reshape(shape)
        state[name] = t
    return state, metadata


def main(argv):
    dump = "--dump" in argv
    paths = [a for a in argv if a != "--dump"]
    if len(paths) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    state, metadata = load(paths[0])
    if dump:
        out = {
            "metadata": metadata,
            "tensors": {
                k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape), "values": v.flatten().tolist()}
                for k, v in state.items()
            },
        }
        json.dump(out, sys.stdout)
        return 0
    for k, v in state.items():
        print(f"{k}\t{str(v.dtype).replace('torch.', '')}\t{list(v.shape)}")
    for k, v in metadata.items():
        print(f"__metadata__ {k}={v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
