#!/usr/bin/env python3
# Threshold accuracy of Ok-Topk from a training run's debug log (docs/ALGORITHMS.md §3, issue 6):
# how far the number of locally and globally selected values strays from k, per bucket, over
# the calls after the first exact re-evaluation.
#
#   go run ./examples/vgg ... -hook oktopk:density=0.01 -log-level debug -log-format json 2> oktopk.log
#   python3 scripts/oktopk_thresholds.py oktopk.log [--rank 0] [--calls 500]
import argparse
import json
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--rank", type=int, default=0, help="rank whose local counts are reported")
    ap.add_argument("--calls", type=int, default=500, help="calls per bucket to include")
    ap.add_argument("--band", type=float, default=0.25, help="relative deviation counted as within")
    a = ap.parse_args()
    rows = {}
    with open(a.log) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("msg") != "oktopk" or r.get("rank") != a.rank:
                continue
            rows.setdefault(r["bucket"], []).append(r)
    if not rows:
        sys.exit(f"{a.log}: no oktopk debug lines for rank {a.rank} (run with -log-level debug -log-format json)")
    print(f"| bucket | n | k | calls | count | mean dev | median dev | max dev | within ±{a.band:.0%} | exact re-evaluations | guard fired |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for b in sorted(rows):
        rs = sorted(rows[b], key=lambda r: r["call"])
        first = next((i for i, r in enumerate(rs) if r["reevaluated"]), 0)
        rs = rs[first:first + a.calls]
        k = rs[0]["k"]
        for kind in ("local", "global"):
            dev = [abs(r[kind] - r["k"]) / r["k"] for r in rs]
            within = sum(d <= a.band for d in dev) / len(dev)
            guard = sum(bool(r[kind + "_guard"]) for r in rs)
            reev = sum(bool(r["reevaluated"]) for r in rs)
            print(f"| {b} | {rs[0]['n']:,} | {k:,} | {len(rs)} | {kind} | {statistics.mean(dev):.1%} | "
                  f"{statistics.median(dev):.1%} | {max(dev):.1%} | {within:.1%} | {reev} | {guard} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
