#!/usr/bin/env python3
# Summarises scripts/resnet_seed_study.sh's results files (one or more): per cell (trainer,
# stream owner, init owner) the runs' epoch-3 test accuracy mean, standard deviation and median,
# the mean epoch-1 train loss, and the spargo − PyTorch difference of the plain runs with its
# standard error.  Usage: scripts/resnet_seed_study.py results.txt [more.txt …]
import math
import re
import statistics as st
import sys

LINE = re.compile(r"(\w+) stream=(\w) init=(\w) seed=(\d+) e1 (\S+) (\S+)\s+e2 (\S+) (\S+)\s+e3 (\S+) (\S+)")
NAMES = {("spargo", "S", "S"): "spargo on spargo's draw (= examples/resnet)",
         ("torch", "T", "T"): "PyTorch on PyTorch's draw (= torch_vgg_cifar.py)",
         ("torch", "S", "T"): "PyTorch: spargo's stream, PyTorch's weights",
         ("torch", "T", "S"): "PyTorch: PyTorch's stream, spargo's weights",
         ("torch", "S", "S"): "PyTorch on spargo's draw",
         ("spargo", "T", "T"): "spargo on PyTorch's draw"}


def main():
    cells = {}
    for path in sys.argv[1:]:
        for line in open(path):
            m = LINE.match(line)
            if not m:
                continue  # runs stopped before their last epoch print no accuracies
            key = m.group(1, 2, 3)
            cells.setdefault(key, {})[int(m.group(4))] = (float(m.group(5)), 100 * float(m.group(10)))
    print("| runs | seeds | epoch-3 test acc mean | sd | median | epoch-1 train loss mean |")
    print("|---|---|---|---|---|---|")
    for key, runs in sorted(cells.items()):
        acc = [a for _, a in runs.values()]
        sd = st.stdev(acc) if len(acc) > 1 else float("nan")
        print(f"| {NAMES.get(key, key)} | {len(acc)} | {st.mean(acc):.2f} % | {sd:.2f} | {st.median(acc):.2f} % "
              f"| {st.mean(l for l, _ in runs.values()):.3f} |")
    a, b = cells.get(("spargo", "S", "S")), cells.get(("torch", "T", "T"))
    if a and b and len(a) > 1 and len(b) > 1:
        xa, xb = [v[1] for v in a.values()], [v[1] for v in b.values()]
        se = math.sqrt(st.variance(xa) / len(xa) + st.variance(xb) / len(xb))
        print(f"\nspargo − PyTorch (plain runs): {st.mean(xa) - st.mean(xb):+.2f} points, standard error {se:.2f}")


if __name__ == "__main__":
    main()
