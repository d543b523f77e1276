#!/usr/bin/env python3
"""Goldens for tests/core/test_jax_diff.c: a set of composed functions of
(x[4,5], w[5]) evaluated by JAX (CPU, float64): value, gradients with respect
to x and w, a Hessian-vector product (jvp of grad_w along v), and per-example
gradients (vmap over the rows of x of grad_w). The C test builds the same
functions with nabla ops and compares.

Reproduce: pip install jax numpy && python3 tests/core/golden/make_jax_diff.py
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)


def softmax_xent(x, w):
    z = x * w
    m = jnp.max(z, axis=-1, keepdims=True)
    lse = jnp.log(jnp.sum(jnp.exp(z - m), axis=-1, keepdims=True)) + m
    y = jnp.eye(x.shape[-1])[jnp.arange(x.shape[0]) % x.shape[-1]] if x.ndim == 2 else jnp.eye(x.shape[-1])[1]
    return -jnp.sum(y * (z - lse))


def tanh_layer(x, w):
    return jnp.sum(jnp.tanh(x * w + 0.5) ** 2)


def gelu(x, w):
    return jnp.sum(0.5 * x * (1 + jax.scipy.special.erf(x / np.sqrt(2.0))) * w)


def layer_norm(x, w):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    y = (x - mu) / jnp.sqrt(var + 1e-5) * w
    return jnp.sum(y * y * jnp.arange(1.0, x.shape[-1] + 1))


def pow_atan(x, w):
    return jnp.sum((jnp.abs(x) + 1) ** w + jnp.arctan2(x, w + 2))


def prod_max(x, w):
    return jnp.sum(jnp.prod(x * w, axis=-1)) + jnp.sum(jnp.max(x * w, axis=0)) + jnp.sum(jax.nn.sigmoid(x - w))


FUNCS = {f.__name__: f for f in [softmax_xent, tanh_layer, gelu, layer_norm, pow_atan, prod_max]}


def main():
    rng = np.random.default_rng(1234)
    x = rng.normal(size=(4, 5))
    w = rng.normal(size=(5,)) * 0.5 + 1.0
    v = rng.normal(size=(5,))
    out = {"x": x.ravel().tolist(), "w": w.ravel().tolist(), "v": v.ravel().tolist(), "cases": {}}
    for name, f in FUNCS.items():
        val, (gx, gw) = jax.value_and_grad(f, argnums=(0, 1))(x, w)
        grad_w = jax.grad(f, argnums=1)
        _, hvp = jax.jvp(lambda ww: grad_w(x, ww), (w,), (v,))
        per_example = jax.vmap(grad_w, in_axes=(0, None))(x, w)
        out["cases"][name] = {
            "value": float(val),
            "grad_x": np.asarray(gx).ravel().tolist(),
            "grad_w": np.asarray(gw).ravel().tolist(),
            "hvp_w": np.asarray(hvp).ravel().tolist(),
            "per_example_grad_w": np.asarray(per_example).ravel().tolist(),
        }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_diff.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print("wrote", path, "with jax", jax.__version__)


if __name__ == "__main__":
    main()
