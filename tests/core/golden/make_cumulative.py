"""Goldens for cumsum and cummax (tests/core/test_cumulative.c), from jax.lax
on the CPU: values in both directions and, for cummax on tie-free inputs, the
gradient of sum(w * cummax(x)). Run from this folder: python3 make_cumulative.py"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from golden_util import arr, write

jax.config.update("jax_enable_x64", True)
rng = np.random.RandomState(5150)


def randn(shape, dtype):
    return jnp.asarray(rng.standard_normal(shape)).astype(dtype)


def randint(shape, dtype):
    return jnp.asarray(rng.randint(-30, 30, size=shape)).astype(dtype)


scans = {"cumsum": [], "cummax": []}
for x, axis, reverse in [
    (randn((3, 5), jnp.float64), 1, False),
    (randn((3, 5), jnp.float64), 0, True),
    (randn((2, 3, 9), jnp.float32), 2, True),
    (randint((4, 6), jnp.int32), 1, False),
    (randint((5,), jnp.int8), 0, True),
]:
    for name, op in [("cumsum", lax.cumsum), ("cummax", lax.cummax)]:
        case = {"x": arr(x), "axis": axis, "reverse": reverse, "y": arr(op(x, axis=axis, reverse=reverse))}
        if name == "cummax" and x.dtype == jnp.float64:
            w = randn(x.shape, jnp.float64)
            gx = jax.grad(lambda v: jnp.sum(w * lax.cummax(v, axis=axis, reverse=reverse)))(x)
            case["w"] = arr(w)
            case["grad"] = arr(gx)
        scans[name].append(case)

write("cumulative.json", scans)
