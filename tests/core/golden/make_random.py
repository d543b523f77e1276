#!/usr/bin/env python3
"""Writes tests/core/golden/random.json: JAX's threefry streams for
tests/core/test_random.c (keys, split, fold_in, bits, uniform, normal,
truncated_normal, bernoulli, categorical) over a few seeds, shapes and dtypes.

Two layouts, one file each: jax_threefry_partitionable=False (JAX's default
before 0.5, nabla's NB_PRNG_THREEFRY) in random.json, and with
--partitionable, jax_threefry_partitionable=True (JAX's default since 0.5,
NB_PRNG_THREEFRY_PARTITIONABLE) in random_partitionable.json. Values are
stored as hex bit patterns so the C side compares them exactly.

Run: pip install jax mpmath
     python3 tests/core/golden/make_random.py
     python3 tests/core/golden/make_random.py --partitionable
"""
import json
import os
import sys

import jax

PARTITIONABLE = "--partitionable" in sys.argv[1:]
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_threefry_partitionable", PARTITIONABLE)
jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402
import mpmath  # noqa: E402
import numpy as np  # noqa: E402

mpmath.mp.dps = 40

DTYPES = {"f32": jnp.float32, "f64": jnp.float64, "f16": jnp.float16, "bf16": jnp.bfloat16}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def hexes(a):
    a = np.asarray(a)
    if a.dtype == np.bool_:
        return ["%x" % int(v) for v in a.ravel()]
    if a.dtype.kind in "iu":
        return ["%x" % (int(v) & 0xFFFFFFFF) for v in a.ravel()]
    bits = a.view(UINT[a.dtype.itemsize])
    return ["%x" % int(v) for v in bits.ravel()]


def key_words(k):
    return [int(v) for v in np.asarray(k)]


records = []


def add(op, key, out, dtype, exact=None, **args):
    out = np.asarray(out)
    r = {"op": op, "key": key_words(key), "dtype": dtype, "shape": list(out.shape), "args": args, "hex": hexes(out)}
    if exact is not None:
        r["exact"] = hexes(exact)
    records.append(r)


def exact_normal(key, shape, dt):
    """sqrt(2) erfinv(u), correctly rounded to dt, for JAX's own uniform u:
    XLA's erf_inv is a polynomial accurate to some ulps; this is the truth."""
    t = DTYPES[dt]
    lo = np.nextafter(np.array(-1.0, t), np.array(0.0, t))
    u = np.asarray(jax.random.uniform(key, shape, t, lo, 1.0)).astype(np.float64)
    vals = [float(mpmath.sqrt(2) * mpmath.erfinv(mpmath.mpf(x))) for x in u.ravel()]
    # round once from the 40-digit value: via f64 then to t (double rounding is
    # harmless here: f64 has more than twice the bits of f32/f16/bf16)
    return np.array(vals, np.float64).astype(t).reshape(shape)


def main():
    seeds = [0, 42, 1234567, 2**32 + 7, 2**63 - 25]
    for s in seeds:
        k = jax.random.PRNGKey(s)
        records.append({"op": "key", "seed": str(s), "key": key_words(k)})
    k42 = jax.random.PRNGKey(42)
    derived = [k42, jax.random.PRNGKey(0), jax.random.split(k42, 3)[2], jax.random.fold_in(k42, 77)]

    for k in derived[:2]:
        for n in [1, 2, 3, 5]:
            add("split", k, jax.random.split(k, n), "u32", n=n)
        for d in [0, 1, 77, 2**31 + 3, 2**32 - 1]:
            add("fold_in", k, jax.random.fold_in(k, d), "u32", data=d)

    shapes = [(), (1,), (2,), (3,), (7,), (4, 5), (3, 3, 3), (2, 0)]
    for k in derived:
        for sh in shapes:
            add("bits", k, jax.random.bits(k, sh, dtype=jnp.uint32), "u32")

    for k in derived[:3]:
        for dt in ["f32", "f64", "f16", "bf16"]:
            for sh in [(1,), (5,), (4, 6), (3, 3, 3)]:
                add("uniform", k, jax.random.uniform(k, sh, DTYPES[dt]), dt, minval=0.0, maxval=1.0)
                add("uniform", k, jax.random.uniform(k, sh, DTYPES[dt], -2.0, 3.0), dt, minval=-2.0, maxval=3.0)
                add("normal", k, jax.random.normal(k, sh, DTYPES[dt]), dt, exact_normal(k, sh, dt))
            add("uniform", k, jax.random.uniform(k, (64,), DTYPES[dt], -0.3, 0.7), dt, minval=-0.3, maxval=0.7)
            add("normal", k, jax.random.normal(k, (257,), DTYPES[dt]), dt, exact_normal(k, (257,), dt))
        add("truncated_normal", k, jax.random.truncated_normal(k, -1.5, 2.0, (50,), jnp.float32), "f32",
            lower=-1.5, upper=2.0)
        add("truncated_normal", k, jax.random.truncated_normal(k, 0.5, 3.0, (9,), jnp.float64), "f64",
            lower=0.5, upper=3.0)
        add("bernoulli", k, jax.random.bernoulli(k, jnp.float32(0.3), (6, 7)), "bool", p=0.3)
        logits = (np.arange(40) % 7 * 0.5 - 1.0).astype(np.float32).reshape(5, 8)
        add("categorical", k, jax.random.categorical(k, jnp.asarray(logits), axis=-1), "i32", logits="(j % 7) * 0.5 - 1 [5,8] f32")

    name = "random_partitionable.json" if PARTITIONABLE else "random.json"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    with open(path, "w") as f:
        f.write('{"jax_version": "%s", "threefry_partitionable": %s, "records": [\n'
                % (jax.__version__, "true" if PARTITIONABLE else "false"))
        f.write(",\n".join(json.dumps(r, separators=(",", ":")) for r in records))
        f.write("\n]}\n")
    print("wrote %d records to %s" % (len(records), path))


if __name__ == "__main__":
    main()
