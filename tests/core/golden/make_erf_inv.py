#!/usr/bin/env python3
"""Writes tests/core/golden/erf_inv.json: erf^-1(y) in f64 correctly rounded
(mpmath at 256 bits) for tests/core/test_numerics.c, over the whole domain:
0 and subnormal y, a grid of the centre, y = +-(1 - 2^-k) for every k up to
53 (the last doubles below 1 in magnitude), 1 - 10^-k, and random y with
1 - |y| log-uniform. Arrays as {"dtype", "shape", "data"} (golden_util's
format; Python's float repr round-trips every double exactly).

Run: pip install mpmath; python3 tests/core/golden/make_erf_inv.py
"""
import json
import os
import random

import mpmath

mpmath.mp.prec = 256


def points():
    ys = [0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-30, 1e-16, 1e-8, 1e-4]
    ys += [i / 64 for i in range(1, 64)]
    ys += [1 - 2.0 ** -k for k in range(1, 54)]
    ys += [1 - 10.0 ** -k for k in range(1, 16)]
    ys += [0.9999999999, 0.5 - 2.0 ** -54, 0.5 + 2.0 ** -53, 0.85, 0.975]
    rng = random.Random(12)
    ys += [rng.random() for _ in range(200)]
    ys += [1 - 10.0 ** -rng.uniform(0, 15.9) for _ in range(200)]
    ys += [1 - 2.0 ** -rng.uniform(40, 53) for _ in range(40)]
    ys = sorted(set(ys))
    return [-y for y in reversed(ys) if y] + ys


def main():
    ys = points()
    xs = [float(mpmath.erfinv(mpmath.mpf(y))) for y in ys]
    out = {"y": {"dtype": "f64", "shape": [len(ys)], "data": ys},
           "x": {"dtype": "f64", "shape": [len(xs)], "data": xs}}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "erf_inv.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(ys)} points to {path}")


if __name__ == "__main__":
    main()
