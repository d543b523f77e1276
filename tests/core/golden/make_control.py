"""Goldens for control flow (tests/core/test_control.c), from jax.lax on the
CPU in f64: values and gradients through scan (both directions), cond and a
clamped switch, fori_loop over constant bounds; the JVP of a while_loop; a
Hessian-vector product through scan (grad of grad); vmap of cond with a
batched predicate and of scan with a batched carry.
Run from this folder: python3 make_control.py"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from golden_util import arr, write

jax.config.update("jax_enable_x64", True)
rng = np.random.RandomState(1313)


def randn(*shape):
    return jnp.asarray(rng.standard_normal(shape))


# scan: h = tanh(h * w + x), y = h * x; loss = sum(wh * h_T) + sum(wy * ys)
def rnn(w, h, xs, reverse):
    def body(h, x):
        return jnp.tanh(h * w + x), h * x

    return lax.scan(body, h, xs, reverse=reverse)


out = {"scan": []}
for reverse in (False, True):
    w, h, xs, wh, wy, v = randn(3), randn(3), randn(4, 3), randn(3), randn(4, 3), randn(3)

    def loss(w, h, xs):
        hT, ys = rnn(w, h, xs, reverse)
        return jnp.sum(wh * hT) + jnp.sum(wy * ys)

    hT, ys = rnn(w, h, xs, reverse)
    gw, gh, gxs = jax.grad(loss, argnums=(0, 1, 2))(w, h, xs)
    hvp = jax.grad(lambda w: jnp.vdot(jax.grad(loss)(w, h, xs), v))(w)
    out["scan"].append({"reverse": reverse, "w": arr(w), "h": arr(h), "xs": arr(xs), "wh": arr(wh), "wy": arr(wy),
                        "v": arr(v), "hT": arr(hT), "ys": arr(ys), "grad_w": arr(gw), "grad_h": arr(gh),
                        "grad_xs": arr(gxs), "hvp_w": arr(hvp)})


# cond: p * cond(p > 0, sin(x) * 2, cos(x) * x); loss = sum(wx * that)
def f_cond(p, x):
    return p * lax.cond(p > 0, lambda x: jnp.sin(x) * 2, lambda x: jnp.cos(x) * x, x)


out["cond"] = []
for p in (0.7, -1.3):
    x, wx = randn(3), randn(3)
    p = jnp.float64(p)
    gp, gx = jax.grad(lambda p, x: jnp.sum(wx * f_cond(p, x)), argnums=(0, 1))(p, x)
    out["cond"].append({"p": arr(p), "x": arr(x), "wx": arr(wx), "y": arr(f_cond(p, x)), "grad_p": arr(gp), "grad_x": arr(gx)})

# switch over [sin(x), cos(x) x, exp(x) / 2], index clamped
branches = [lambda x: jnp.sin(x), lambda x: jnp.cos(x) * x, lambda x: jnp.exp(x) / 2]
out["switch"] = []
for i in (-1, 0, 1, 2, 5):
    x, wx = randn(3), randn(3)
    y = lax.switch(i, branches, x)
    gx = jax.grad(lambda x: jnp.sum(wx * lax.switch(i, branches, x)))(x)
    out["switch"].append({"i": i, "x": arr(x), "wx": arr(wx), "y": arr(y), "grad_x": arr(gx)})


# fori_loop(1, 4): x = sin(x) * w + i / 4; loss = sum(wx * x)
def f_fori(w, x):
    return lax.fori_loop(1, 4, lambda i, x: jnp.sin(x) * w + i / 4, x)


w, x, wx = randn(3), randn(3), randn(3)
gw, gx = jax.grad(lambda w, x: jnp.sum(wx * f_fori(w, x)), argnums=(0, 1))(w, x)
out["fori"] = {"w": arr(w), "x": arr(x), "wx": arr(wx), "y": arr(f_fori(w, x)), "grad_w": arr(gw), "grad_x": arr(gx)}


# while sum(x) < 6: x = x + 1 + sin(x) * k; forward mode in x and k
def f_while(k, x):
    return lax.while_loop(lambda x: jnp.sum(x) < 6, lambda x: x + 1 + jnp.sin(x) * k, x)


k, x, tk, tx = jnp.float64(0.3), randn(3), jnp.float64(0.5), randn(3)
y, ty = jax.jvp(f_while, (k, x), (tk, tx))
out["while_jvp"] = {"k": arr(k), "x": arr(x), "tk": arr(tk), "tx": arr(tx), "y": arr(y), "ty": arr(ty)}

# vmap: cond with a batched predicate; scan with a batched carry (xs shared)
ps, xb = randn(4), randn(4, 3)
out["vmap_cond"] = {"p": arr(ps), "x": arr(xb), "y": arr(jax.vmap(f_cond)(ps, xb))}
w, hb, xs = randn(3), randn(5, 3), randn(4, 3)
hTb, ysb = jax.vmap(lambda h: rnn(w, h, xs, False))(hb)
out["vmap_scan"] = {"w": arr(w), "h": arr(hb), "xs": arr(xs), "hT": arr(hTb), "ys": arr(ysb)}

write("control.json", out)
