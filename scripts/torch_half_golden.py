#!/usr/bin/env python3
# Golden float32 -> float16 / bfloat16 conversions for spargo's hooks.Float32ToHalf and
# hooks.Float32ToBFloat16: numpy's float16 cast and torch's bfloat16 cast (both round to
# nearest, ties to even) of a fixed set of float32 bit patterns.
#
# Regenerate with (from the repository root):
#   OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_half_golden.py hooks/testdata/half_golden.json
#
# The Go test TestHalfGolden in hooks/half_test.go reads the file. NaNs are left out (the
# libraries differ in the payload they keep; the Go tests check NaNs themselves).
import json
import sys

import numpy as np
import torch


def patterns():
    rng = np.random.default_rng(20240521)
    bits = list(rng.integers(0, 1 << 32, size=1000, dtype=np.uint64))
    # Every float32 exponent, with fractions at and around the fp16 and bf16 rounding points.
    for exp in range(0, 256):
        for frac in (0, 0xFFF, 0x1000, 0x1001, 0x3000, 0x8000, 0x8001, 0x18000, 0x7FFFFF):
            bits.append((exp & 1) << 31 | (exp << 23) | frac)
    for v in (65504.0, 65519.0, 65520.0, 65535.0, 2.0**-14, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-26, 3.4028235e38):
        b = int(np.array([v], dtype=np.float32).view(np.uint32)[0])
        bits += [b, b | (1 << 31), b + 1, b - 1]
    out = []
    for b in bits:
        b = int(b) & 0xFFFFFFFF
        if (b & 0x7F800000) == 0x7F800000 and (b & 0x7FFFFF) != 0:
            continue  # NaN
        out.append(b)
    return sorted(set(out))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "hooks/testdata/half_golden.json"
    bits = patterns()
    f32 = np.array(bits, dtype=np.uint32).view(np.float32)
    with np.errstate(over="ignore"):
        fp16 = f32.astype(np.float16).view(np.uint16)
    bf16 = torch.from_numpy(f32.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    golden = dict(torch_version=torch.__version__, numpy_version=np.__version__,
                  float32_bits=[int(b) for b in bits], fp16_bits=[int(h) for h in fp16],
                  bf16_bits=[int(h) for h in bf16])
    with open(path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
