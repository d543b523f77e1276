"""Goldens for dynamic_slice and dynamic_update_slice (tests/core/test_dynamic.c),
from jax.lax on the CPU, with start indices past the end to pin the clamping.
Starts are non-negative here: jax.lax wraps negative starts Python-style
before clamping, while the primitive (as XLA's) clamps them to 0; the C test
checks negative starts by hand. Run from this folder: python3 make_dynamic.py"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from golden_util import arr, write

jax.config.update("jax_enable_x64", True)
rng = np.random.RandomState(77031)


def randn(shape, dtype):
    return jnp.asarray(rng.standard_normal(shape)).astype(dtype)


ds = []
for x, starts, idt, sizes in [
    (randn((5, 6), jnp.float32), (3, 1), jnp.int32, (2, 3)),
    (randn((5, 6), jnp.float32), (9, 4), jnp.int32, (2, 3)),
    (randn((4, 5, 3), jnp.float64), (200, 0, 1), jnp.uint8, (1, 5, 2)),
    (randn((7,), jnp.bfloat16), (100,), jnp.int64, (4,)),
    (jnp.asarray(rng.randint(-50, 50, size=(3, 4))).astype(jnp.int32), (1, 2), jnp.uint32, (2, 2)),
]:
    st = [jnp.asarray(s, idt) for s in starts]
    y = lax.dynamic_slice(x, st, sizes)
    ds.append({"x": arr(x), "starts": list(starts), "index_dtype": arr(st[0])["dtype"], "sizes": sizes, "y": arr(y)})

dus = []
for x, u, starts, idt in [
    (randn((5, 6), jnp.float32), randn((2, 3), jnp.float32), (4, 5), jnp.int32),
    (randn((4, 5, 3), jnp.float64), randn((2, 5, 1), jnp.float64), (1, 3, 7), jnp.int64),
    (randn((6,), jnp.bfloat16), randn((6,), jnp.bfloat16), (3,), jnp.int8),
    (jnp.asarray(rng.randint(0, 2, size=(3, 3))).astype(bool), jnp.ones((1, 2), bool), (1, 1), jnp.uint8),
]:
    st = [jnp.asarray(s, idt) for s in starts]
    y = lax.dynamic_update_slice(x, u, st)
    dus.append({"x": arr(x), "u": arr(u), "starts": list(starts), "index_dtype": arr(st[0])["dtype"], "y": arr(y)})

write("dynamic.json", {"dynamic_slice": ds, "dynamic_update_slice": dus})
