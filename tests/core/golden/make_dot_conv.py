#!/usr/bin/env python3
"""Goldens for tests/core/test_dot_conv.c: inputs, outputs and VJPs of
dot_general, numpy.matmul and conv_general_dilated configurations (strides,
padding, dilations, feature and batch groups, layouts), computed by JAX on
the CPU in float64; plus a float32 case, a bf16 -> f32 case, and integer
cases whose wraparound is computed exactly with NumPy (int64 sums cast down).

Each case holds lhs, rhs, out and, for the f64 cases, ct (a random output
cotangent) with grad_lhs, grad_rhs = VJP(ct). Arrays are {dtype, shape,
data} with data row-major; floats are written with repr, so f64 round-trips.

Reproduce: pip install jax numpy && python3 tests/core/golden/make_dot_conv.py
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")

rng = np.random.default_rng(20240611)


def arr(a, dtype):
    a = np.asarray(a)
    if dtype == "bf16":
        data = [float(v) for v in np.asarray(a, np.float32).ravel()]
    elif dtype in ("f32", "f64"):
        data = [float(v) for v in a.ravel()]
    else:
        data = [int(v) for v in a.ravel()]
    return {"dtype": dtype, "shape": list(a.shape), "data": data}


def with_vjp(case, f, lhs, rhs):
    out, pull = jax.vjp(f, jnp.asarray(lhs), jnp.asarray(rhs))
    ct = rng.standard_normal(out.shape)
    gl, gr = pull(jnp.asarray(ct))
    case.update(lhs=arr(lhs, "f64"), rhs=arr(rhs, "f64"), out=arr(out, "f64"), ct=arr(ct, "f64"),
                grad_lhs=arr(gl, "f64"), grad_rhs=arr(gr, "f64"))
    return case


def dot_case(name, ls, rs, contract, batch):
    lhs, rhs = rng.standard_normal(ls), rng.standard_normal(rs)
    dn = (contract, batch)
    f = lambda a, b: lax.dot_general(a, b, dn, precision=lax.Precision.HIGHEST)
    case = {"name": name, "kind": "dot", "lhs_contract": contract[0], "rhs_contract": contract[1],
            "lhs_batch": batch[0], "rhs_batch": batch[1]}
    return with_vjp(case, f, lhs, rhs)


def matmul_case(name, ls, rs):
    lhs, rhs = rng.standard_normal(ls), rng.standard_normal(rs)
    return with_vjp({"name": name, "kind": "matmul"}, jnp.matmul, lhs, rhs)


def conv_case(name, ls, rs, strides, padding, lhs_dil, rhs_dil, fgc=1, bgc=1, specs=None):
    ns = len(strides)
    if specs is None:
        sp = tuple(range(2, 2 + ns))
        specs = ((0, 1) + sp, (0, 1) + sp, (0, 1) + sp)
    dn = lax.ConvDimensionNumbers(*specs)
    lhs, rhs = rng.standard_normal(ls), rng.standard_normal(rs)

    def f(a, b):
        return lax.conv_general_dilated(a, b, strides, padding, lhs_dil, rhs_dil, dn, fgc, bgc,
                                        precision=lax.Precision.HIGHEST)

    case = {"name": name, "kind": "conv", "strides": list(strides), "padding": [list(p) for p in padding],
            "lhs_dilation": list(lhs_dil), "rhs_dilation": list(rhs_dil), "feature_group_count": fgc,
            "batch_group_count": bgc, "lhs_spec": list(specs[0]), "rhs_spec": list(specs[1]),
            "out_spec": list(specs[2])}
    return with_vjp(case, f, lhs, rhs)


def typed_dot_cases():
    cases = []
    # f32: JAX computes in f32; the C side accumulates in f64 and rounds once.
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 3)).astype(np.float32)
    out = lax.dot_general(jnp.asarray(a), jnp.asarray(b), (([1], [0]), ([], [])), precision=lax.Precision.HIGHEST)
    cases.append({"name": "f32 matrix product", "kind": "dot", "lhs_contract": [1], "rhs_contract": [0],
                  "lhs_batch": [], "rhs_batch": [], "lhs": arr(a, "f32"), "rhs": arr(b, "f32"), "out": arr(out, "f32")})
    # bf16 inputs, f32 result (preferred_element_type); inputs are exact bf16 values.
    a = np.asarray(jnp.asarray(rng.standard_normal((2, 3, 8)), jnp.bfloat16).astype(jnp.float32))
    b = np.asarray(jnp.asarray(rng.standard_normal((2, 8, 4)), jnp.bfloat16).astype(jnp.float32))
    out = lax.dot_general(jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16), (([2], [1]), ([0], [0])),
                          preferred_element_type=jnp.float32)
    cases.append({"name": "bf16 batched product with f32 result", "kind": "dot", "out_dtype": "f32",
                  "lhs_contract": [2], "rhs_contract": [1], "lhs_batch": [0], "rhs_batch": [0],
                  "lhs": arr(a, "bf16"), "rhs": arr(b, "bf16"), "out": arr(out, "f32")})
    # integers: exact int64 sums, wrapped on the cast to the result dtype.
    a = rng.integers(-(1 << 20), 1 << 20, (4, 6))
    b = rng.integers(-(1 << 20), 1 << 20, (6, 3))
    out = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    cases.append({"name": "i32 matrix product that wraps", "kind": "dot", "lhs_contract": [1], "rhs_contract": [0],
                  "lhs_batch": [], "rhs_batch": [], "lhs": arr(a.astype(np.int32), "i32"),
                  "rhs": arr(b.astype(np.int32), "i32"), "out": arr(out, "i32")})
    a = rng.integers(0, 256, (3, 5))
    b = rng.integers(0, 256, (5, 2))
    out = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.uint8)
    cases.append({"name": "u8 matrix product that wraps", "kind": "dot", "lhs_contract": [1], "rhs_contract": [0],
                  "lhs_batch": [], "rhs_batch": [], "lhs": arr(a, "u8"), "rhs": arr(b, "u8"), "out": arr(out, "u8")})
    return cases


def main():
    cases = [
        dot_case("matrix product", (4, 5), (5, 3), ([1], [0]), ([], [])),
        dot_case("batched, lhs contracts its first dim", (2, 5, 3), (2, 5, 4), ([1], [1]), ([0], [0])),
        dot_case("two contracting dims out of order, batch at different positions", (3, 2, 4, 5), (5, 3, 2, 2),
                 ([3, 0], [0, 1]), ([1], [2])),
        dot_case("two batch dims", (2, 3, 4, 2), (3, 2, 5, 4), ([2], [3]), ([0, 1], [1, 0])),
        dot_case("outer product", (3,), (4,), ([], []), ([], [])),
        matmul_case("matmul broadcasting batch dims", (2, 1, 3, 4), (5, 4, 2)),
        matmul_case("matmul matrix @ batch", (3, 4), (2, 4, 5)),
        matmul_case("matmul vector @ batch", (4,), (2, 4, 3)),
        matmul_case("matmul batch @ vector", (2, 3, 4), (4,)),
        matmul_case("matmul vector @ vector", (5,), (5,)),
        conv_case("2-D basic, padding 1", (2, 3, 5, 5), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1)),
        conv_case("strides, asymmetric padding, rhs dilation", (1, 2, 7, 6), (3, 2, 2, 3), (2, 3), ((0, 1), (1, 0)),
                  (1, 1), (2, 1)),
        conv_case("lhs dilation, negative padding", (2, 2, 4, 3), (2, 2, 3, 2), (1, 2), ((1, 2), (-1, 1)), (2, 3),
                  (1, 1)),
        conv_case("feature groups", (2, 4, 5, 4), (6, 2, 3, 2), (2, 1), ((1, 1), (0, 1)), (1, 1), (1, 2), fgc=2),
        conv_case("depthwise 1-D", (2, 3, 7), (6, 1, 3), (1,), ((2, 0),), (1,), (1,), fgc=3),
        conv_case("batch groups 1-D", (4, 3, 6), (4, 3, 2), (2,), ((1, 1),), (2,), (1,), bgc=2),
        conv_case("batch groups 2-D", (6, 2, 4, 4), (6, 2, 2, 2), (1, 2), ((0, 0), (0, 0)), (1, 1), (2, 1), bgc=3),
        conv_case("NHWC / HWIO", (2, 5, 4, 3), (3, 2, 3, 4), (1, 2), ((1, 1), (0, 1)), (1, 1), (1, 1),
                  specs=((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))),
        conv_case("3-D", (1, 2, 3, 4, 3), (2, 2, 2, 2, 2), (1, 2, 1), ((0, 0), (1, 0), (0, 1)), (1, 1, 1), (1, 1, 1)),
        conv_case("1-D permuted layouts", (3, 6, 2), (3, 4, 3), (1,), ((0, 0),), (1,), (1,),
                  specs=((2, 0, 1), (1, 2, 0), (0, 2, 1))),
        conv_case("transposed conv (lhs dilation 2) with groups, NHWC / HWIO", (1, 3, 3, 4), (2, 3, 2, 4), (1, 1),
                  ((1, 1), (2, 2)), (2, 2), (1, 1), fgc=2, specs=((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))),
    ]
    cases += typed_dot_cases()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dot_conv.json")
    with open(path, "w") as f:
        json.dump({"generator": "make_dot_conv.py", "jax": jax.__version__, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
