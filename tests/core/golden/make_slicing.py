"""Goldens for slice, pad and concatenate (tests/core/test_slicing.c), from
jax.lax on the CPU. Run from this folder: python3 make_slicing.py"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from golden_util import arr, write

jax.config.update("jax_enable_x64", True)
rng = np.random.RandomState(20240611)


def randn(shape, dtype):
    return jnp.asarray(rng.standard_normal(shape)).astype(dtype)


def randint(shape, dtype, lo=-100, hi=100):
    return jnp.asarray(rng.randint(lo, hi, size=shape)).astype(dtype)


slices = []
for x, start, limit, strides in [
    (randn((4, 6), jnp.float32), (1, 0), (4, 5), (1, 2)),
    (randint((5, 3, 7), jnp.int8), (0, 1, 2), (5, 3, 7), (3, 1, 4)),
    (randn((3, 4, 2, 5), jnp.bfloat16), (1, 0, 1, 0), (3, 4, 2, 5), (1, 3, 1, 2)),
    (randn((6,), jnp.float64), (5,), (6,), (1,)),
]:
    y = lax.slice(x, start, limit, strides)
    slices.append({"x": arr(x), "start": start, "limit": limit, "strides": strides, "y": arr(y)})

pads = []
for x, value, config in [
    (randn((3, 4), jnp.float32), -1.5, [(1, 2, 0), (-1, 0, 1)]),
    (randint((7,), jnp.int32), 9, [(-3, -4, 2)]),
    (randn((2, 3, 4), jnp.bfloat16), 0.25, [(0, 0, 3), (2, -2, 1), (-1, 1, 0)]),
    (randn((4, 2), jnp.float64), 0.0, [(-4, 1, 0), (1, 1, 0)]),
]:
    y = lax.pad(x, jnp.asarray(value, x.dtype), config)
    pads.append({"x": arr(x), "value": value, "lo": [c[0] for c in config], "hi": [c[1] for c in config],
                 "interior": [c[2] for c in config], "y": arr(y)})

concats = []
for xs, axis in [
    ([randint((2, 3), jnp.uint8, 0, 255), randint((2, 1), jnp.uint8, 0, 255), randint((2, 4), jnp.uint8, 0, 255)], 1),
    ([randn((1, 2, 3), jnp.float32), randn((4, 2, 3), jnp.float32)], 0),
    ([randn((2, 2, 1), jnp.float64), randn((2, 2, 0), jnp.float64), randn((2, 2, 2), jnp.float64)], 2),
]:
    y = lax.concatenate(xs, axis)
    concats.append({"xs": [arr(x) for x in xs], "axis": axis, "y": arr(y)})

write("slicing.json", {"slice": slices, "pad": pads, "concatenate": concats})
