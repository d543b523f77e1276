"""Goldens for gather / scatter_add / take / take_along_axis / sort / top_k.

Peers: JAX's lax.gather (mode CLIP: starts clamped so the slice fits, as XLA)
and lax.scatter_add (mode FILL_OR_DROP: windows that do not fit are skipped),
NumPy's take, take_along_axis, sort and stable argsort, and jax.numpy's
stable descending argsort and lax.top_k. Fixed seeds; writes gather.json
beside this script: {name: array} with arrays as golden_util writes them,
except that NaNs are written as null (cJSON reads a non-number as NaN).

Run: python3 tests/core/golden/make_gather.py   (needs numpy and jax)
"""
import math
import os

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from golden_util import arr, write

jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(20240611)
goldens = {}


def put(name, a):
    j = arr(np.asarray(a))
    j["data"] = [None if isinstance(v, float) and math.isnan(v) else v for v in j["data"]]
    goldens[name] = j


def gdn(offset, collapsed, start_map, obatch=(), ibatch=()):
    return lax.GatherDimensionNumbers(offset_dims=tuple(offset), collapsed_slice_dims=tuple(collapsed),
                                      start_index_map=tuple(start_map), operand_batching_dims=tuple(obatch),
                                      start_indices_batching_dims=tuple(ibatch))


def sdn(window, inserted, to_operand, obatch=(), ibatch=()):
    return lax.ScatterDimensionNumbers(update_window_dims=tuple(window), inserted_window_dims=tuple(inserted),
                                       scatter_dims_to_operand_dims=tuple(to_operand),
                                       operand_batching_dims=tuple(obatch),
                                       scatter_indices_batching_dims=tuple(ibatch))


# The spec's example: batching dims, an index vector in the last dim, an out-of-range start.
op = np.arange(1, 49, dtype=np.int32).reshape(2, 3, 4, 2)
ix = np.array([[[[0, 0], [1, 0], [2, 1]], [[0, 1], [1, 1], [0, 9]]],
               [[[0, 0], [2, 1], [2, 2]], [[1, 2], [0, 1], [1, 0]]]], dtype=np.int64)
put("g1_operand", op)
put("g1_indices", ix)
put("g1_result", lax.gather(op, ix, gdn([3, 4], [1], [2, 1], [0], [1]), (1, 1, 2, 2),
                            mode=lax.GatherScatterMode.CLIP))

# 2-d windows, starts clamped from both sides.
op = rng.standard_normal((5, 6))
ix = np.array([[0, 0], [4, 5], [-3, 2], [2, 100], [1, -1]], dtype=np.int64)
put("g2_operand", op)
put("g2_indices", ix)
put("g2_result", lax.gather(op, ix, gdn([1, 2], [], [0, 1]), (2, 3), mode=lax.GatherScatterMode.CLIP))

# index_vector_dim = 0 (vectors along the first dim), one collapsed dim.
op = rng.standard_normal((4, 5, 3))
ix = np.array([[0, 3, 1], [4, 1, 2]], dtype=np.int32)  # (2, 3): three vectors of two
dn = gdn([1, 2], [0], [0, 1])
put("g3_operand", op)
put("g3_indices", ix)
put("g3_result", lax.gather(op, jnp.moveaxis(ix, 0, -1), dn, (1, 2, 3), mode=lax.GatherScatterMode.CLIP))

# scatter_add: the spec's example (batching dims, an out-of-range window skipped).
inp = np.arange(1, 49, dtype=np.int64).reshape(2, 3, 4, 2)
ix = np.array([[[[0, 0], [1, 0], [2, 1]], [[0, 1], [1, 1], [0, 9]]],
               [[[0, 0], [2, 1], [2, 2]], [[1, 2], [0, 1], [1, 0]]]], dtype=np.int64)
upd = np.ones((2, 2, 3, 2, 2), dtype=np.int64)
put("s1_operand", inp)
put("s1_indices", ix)
put("s1_updates", upd)
put("s1_result", lax.scatter_add(inp, ix, upd, sdn([3, 4], [1], [2, 1], [0], [1]),
                                 mode=lax.GatherScatterMode.FILL_OR_DROP))

# scatter_add: 2-d windows, duplicates, partly-out-of-range windows skipped whole.
inp = rng.standard_normal((5, 6))
ix = np.array([[0, 0], [0, 0], [3, 4], [4, 4], [-1, 0], [2, 3], [3, 3]], dtype=np.int32)
upd = rng.standard_normal((7, 2, 3))
put("s2_operand", inp)
put("s2_indices", ix)
put("s2_updates", upd)
put("s2_result", lax.scatter_add(inp, ix, upd, sdn([1, 2], [], [0, 1]), mode=lax.GatherScatterMode.FILL_OR_DROP))

# scatter_add of rows by ids (np.add.at), ids with repeats.
inp = rng.standard_normal((4, 3))
ids = np.array([1, 3, 1, 1, 0], dtype=np.int64)
upd = rng.standard_normal((5, 3))
ref = inp.copy()
np.add.at(ref, ids, upd)
put("s3_operand", inp)
put("s3_indices", ids)
put("s3_updates", upd)
put("s3_result", ref)

# take: ids of any shape, negative ids count from the end.
table = rng.standard_normal((6, 2, 3))
ids = np.array([[0, -1, 5], [-6, 2, 2]], dtype=np.int32)
put("t1_table", table)
put("t1_ids", ids)
put("t1_result", np.take(table, ids, axis=0))

# take_along_axis with broadcasting of the other dims and negative indices.
x = rng.standard_normal((3, 1, 5))
idx = np.array(rng.integers(-5, 5, size=(1, 4, 2)), dtype=np.int64)
put("t2_x", x)
put("t2_idx", idx)
put("t2_result", np.take_along_axis(x, idx, axis=2))

# sort: ties and NaNs, ascending (NumPy) along axis 1 and descending (jax.numpy) along axis 0.
x = np.array([[3.0, np.nan, 1.0, 3.0, -0.0, 0.0, 2.0],
              [np.nan, 1.0, 1.0, np.nan, -5.0, 1.0, 7.0],
              [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
put("o1_x", x)
put("o1_values", np.sort(x, axis=1, kind="stable"))
put("o1_indices", np.argsort(x, axis=1, kind="stable").astype(np.int32))
put("o2_values", jnp.sort(x, axis=0, descending=True))
put("o2_indices", jnp.argsort(x, axis=0, descending=True, stable=True).astype(np.int32))
xi = np.array(rng.integers(-3, 3, size=(2, 9)), dtype=np.int32)
put("o3_x", xi)
put("o3_values", np.sort(xi, axis=1, kind="stable"))
put("o3_indices", np.argsort(xi, axis=1, kind="stable").astype(np.int32))

# top_k: ties to the lower index, NaN first.
x = np.array([[1.0, 5.0, 3.0, 5.0, np.nan, 0.0],
              [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
v, i = lax.top_k(x, 3)
put("k1_x", x)
put("k1_values", v)
put("k1_indices", np.asarray(i).astype(np.int32))

goldens["made_with"] = "numpy %s, jax %s" % (np.__version__, jax.__version__)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gather.json")
write(out, goldens)
print("wrote", out)
