#!/usr/bin/env python3
"""COVAP's stable step size under momentum: a one-shard quadratic model (hooks/covap.go).

One coordinate with loss lambda*x^2/2, SGD with heavy-ball momentum (PyTorch's form:
v = beta*v + g, x -= lr*v; a = lr*lambda), and COVAP's filter for that shard: at iteration s
the shard is sent iff s mod I == 0, carrying acc = g + c*r (the paper's error feedback with
coefficient c), and otherwise keeps r = acc and applies nothing. Prints, per I and c, the
largest stable a (bisection; the stable set is an interval from 0) and how much smaller it is
than dense SGD's 2*(1+beta).

    python3 scripts/covap_stability.py
"""


def stable(a, interval, c, beta=0.9, steps=4000):
    x, v, r = 1.0, 0.0, 0.0
    for s in range(steps):
        acc = a * x + c * r
        if s % interval == 0:
            applied, r = acc, 0.0
        else:
            applied, r = 0.0, acc
        v = beta * v + applied
        x -= v
        if abs(x) > 1e6:
            return False
    return abs(x) < 1e3


def largest_stable(interval, c, beta=0.9):
    lo, hi = 1e-4, 10.0
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        if stable(mid, interval, c, beta):
            lo = mid
        else:
            hi = mid
    return lo


if __name__ == "__main__":
    beta = 0.9
    dense = 2 * (1 + beta)
    print(f"dense SGD, momentum {beta}: largest stable lr*lambda = {dense:.3f}")
    for c in (1.0, 0.5):
        for interval in (2, 3, 4):
            a = largest_stable(interval, c, beta)
            print(f"I = {interval}, c = {c}: largest stable lr*lambda = {a:.4f} ({dense / a:.1f}x smaller)")
