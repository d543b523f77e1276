#!/usr/bin/env python3
"""Peer of bench/gpt2_step.c: the same GPT-2 training step in JAX on the CPU
(pip jax), jax.jit of value_and_grad plus optax.adamw(lr 3e-4, b1 0.9, b2
0.95, eps 1e-8, weight decay 0.1 on every parameter), params and optimizer
state donated: tied token embedding, learned positions, pre-LayerNorm
blocks, GELU (tanh), causal softmax attention, mean cross-entropy. The
process is pinned to --threads CPUs (default 2), which sizes XLA's pool.

  python3 bench/gpt2_step_jax.py [--preset gpt2-124m] [--vocab 50304] [--batch 4] [--seq 256] [--steps 3]
"""
import os
import sys
import time

from gpt2_step_args import PRESETS, parse_args, time_steps


def main():
    a = parse_args()
    # XLA sizes its thread pool by the CPUs this process may use
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: a.threads]))
    import jax
    import jax.numpy as jnp
    import optax

    vocab, d, layers, heads, ff, max_pos = PRESETS[a.preset]
    vocab = a.vocab or vocab
    B, T = a.batch, a.seq
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8 * layers + 8))

    def normal(*shape):
        return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

    def zeros(*shape):
        return jnp.zeros(shape, jnp.float32)

    params = {"wte": normal(vocab, d), "wpe": normal(max_pos, d), "ln_f": (jnp.ones(d), zeros(d)), "h": []}
    for _ in range(layers):
        params["h"].append({
            "ln_1": (jnp.ones(d), zeros(d)), "ln_2": (jnp.ones(d), zeros(d)),
            "c_attn": (normal(d, 3 * d), zeros(3 * d)), "attn_proj": (normal(d, d), zeros(d)),
            "c_fc": (normal(d, ff), zeros(ff)), "mlp_proj": (normal(ff, d), zeros(d)),
        })

    def layernorm(x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * p[0] + p[1]

    def block(x, p):
        h = layernorm(x, p["ln_1"])
        qkv = h @ p["c_attn"][0] + p["c_attn"][1]
        q, k, v = (t.reshape(B, T, heads, d // heads).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, axis=-1))
        s = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(jnp.float32(d // heads))
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
        o = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, T, d)
        x = x + o @ p["attn_proj"][0] + p["attn_proj"][1]
        h = jax.nn.gelu(layernorm(x, p["ln_2"]) @ p["c_fc"][0] + p["c_fc"][1], approximate=True)
        return x + h @ p["mlp_proj"][0] + p["mlp_proj"][1]

    def loss_fn(params, x, y):
        h = params["wte"][x] + params["wpe"][:T]
        for p in params["h"]:
            h = block(h, p)
        logits = layernorm(h, params["ln_f"]) @ params["wte"].T
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
        return (lse - picked).mean()

    tx = optax.adamw(3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1)
    opt_state = tx.init(params)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jstep = jax.jit(step, donate_argnums=(0, 1))
    n = sum(x.size for x in jax.tree_util.tree_leaves(params)) - params["wpe"].size
    tok = (jnp.arange(B * T + 1) * 7919 + 13) % vocab
    x, y = tok[:-1].reshape(B, T).astype(jnp.int32), tok[1:].reshape(B, T).astype(jnp.int32)
    t0 = time.perf_counter()
    compiled = jstep.lower(params, opt_state, x, y).compile()
    t_compile = time.perf_counter() - t0
    state = [params, opt_state]

    def run_step():
        state[0], state[1], loss = compiled(state[0], state[1], x, y)
        return float(loss)

    time_steps(a, "jax", jax.__version__, n, layers, d, vocab, run_step, f", compile {t_compile:.2f} s")

if __name__ == "__main__":
    sys.exit(main())
