#!/usr/bin/env python3
"""The peer side of bench/random.c: JAX (CPU, jit, default non-partitionable
threefry) drawing the same 2^20 values; medians of 11 runs after a warm-up.

Run: pip install jax; python3 bench/random_vs_jax.py
"""
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_threefry_partitionable", False)
jax.config.update("jax_platforms", "cpu")
import jax.numpy as jnp  # noqa: E402

N = 1 << 20
CASES = {
    "bits u32": lambda k: jax.random.bits(k, (N,), jnp.uint32),
    "uniform f32": lambda k: jax.random.uniform(k, (N,), jnp.float32),
    "normal f32": lambda k: jax.random.normal(k, (N,), jnp.float32),
    "uniform f64": lambda k: jax.random.uniform(k, (N,), jnp.float64),
    "split (2^19 keys)": lambda k: jax.random.split(k, N // 2),
}

key = jax.random.PRNGKey(0)
for name, fn in CASES.items():
    f = jax.jit(fn)
    f(key).block_until_ready()
    times = []
    for _ in range(11):
        t0 = time.perf_counter()
        f(key).block_until_ready()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    print("%-20s median %8.2f ms  %7.1f M values/s" % (name, t * 1e3, N / t * 1e-6))
