"""Golden trajectories, schedules and losses from Optax itself, for
tests/optim/test_golden.c and test_loss.c.

  pip install "jax[cpu]" optax     # (the versions used are recorded in the file)
  python3 tests/optim/golden/make_goldens.py

Problem: a 4-6-3 tanh MLP on a fixed batch (8 examples), mean squared error;
each optimizer runs 100 steps in float32 from the same parameters, the
gradient taken at the current parameters. Parameters after steps 1, 10 and
100 are stored. Some runs inject NaN gradients at fixed steps (NAN_STEPS).
Losses are evaluated in float64 (values and gradients).
"""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "core", "golden"))
from golden_util import arr  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 100
KEEP = (1, 10, 100)
NAN_STEPS = (5, 30, 31, 32)


def problem():
    rng = np.random.default_rng(1234)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    params = {"w1": f(4, 6) * 0.5, "b1": f(6) * 0.1, "w2": f(6, 3) * 0.5, "b2": f(3) * 0.1}
    x, y = f(8, 4), f(8, 3)
    return params, x, y


PARAMS, X, Y = problem()


def loss_fn(p, x=X, y=Y):
    h = jnp.tanh(jnp.matmul(x, p["w1"], precision="highest") + p["b1"])
    out = jnp.matmul(h, p["w2"], precision="highest") + p["b2"]
    return jnp.mean((out - y) ** 2)


grad_fn = jax.jit(jax.grad(loss_fn))


def poison(g, step):
    g = dict(g)
    g["w1"] = g["w1"].at[0, 0].set(jnp.nan)
    return g


def run(tx, nan=False, wrap=None, on_step=None):
    p = {k: jnp.asarray(v) for k, v in PARAMS.items()}
    if wrap == "lookahead":
        p = optax.LookaheadParams.init_synced(p)
    state = tx.init(p)
    update = jax.jit(tx.update)
    out = {}
    for step in range(1, STEPS + 1):
        fast = p.fast if wrap == "lookahead" else p
        g = grad_fn(fast)
        if nan and step in NAN_STEPS:
            g = poison(g, step)
        if on_step:
            state = on_step(step, state)
        u, state = update(g, state, p)
        p = optax.apply_updates(p, u)
        if step in KEEP:
            cur = p.fast if wrap == "lookahead" else p
            out[str(step)] = {k: arr(np.asarray(v, np.float32)) for k, v in cur.items()}
    return out, state


def is_w(p):
    return {k: k.startswith("w") for k in p}


def is_b(p):
    return {k: k.startswith("b") for k in p}


def inject_change(step, state):
    if step == 51:
        state.hyperparams["learning_rate"] = jnp.asarray(3e-3, jnp.float32)
    return state


def optimizers():
    wcd = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 10, 100, 1e-3)
    o = {
        "sgd": dict(tx=optax.sgd(0.1)),
        "sgd_momentum": dict(tx=optax.sgd(0.05, momentum=0.9)),
        "sgd_nesterov": dict(tx=optax.sgd(0.05, momentum=0.9, nesterov=True)),
        "adam": dict(tx=optax.adam(1e-2)),
        "adam_schedule": dict(tx=optax.adam(wcd)),
        "adamw": dict(tx=optax.adamw(1e-2, weight_decay=0.1)),
        "adamw_masked": dict(tx=optax.adamw(1e-2, weight_decay=0.1, mask=is_w)),
        "amsgrad": dict(tx=optax.amsgrad(1e-2)),
        "nadam": dict(tx=optax.nadam(1e-2)),
        "nadamw": dict(tx=optax.nadamw(1e-2, weight_decay=0.1)),
        "adamax": dict(tx=optax.adamax(1e-2)),
        "radam": dict(tx=optax.radam(1e-2)),
        "rmsprop": dict(tx=optax.rmsprop(1e-2)),
        "rmsprop_centered": dict(tx=optax.rmsprop(1e-3, centered=True, momentum=0.9, initial_scale=0.1)),
        "adagrad": dict(tx=optax.adagrad(0.1)),
        "adadelta": dict(tx=optax.adadelta(1.0, weight_decay=0.01)),
        "adafactor": dict(tx=optax.adafactor(1e-2, min_dim_size_to_factor=4)),
        "lamb": dict(tx=optax.lamb(1e-2, weight_decay=0.01)),
        "lars": dict(tx=optax.lars(0.5, weight_decay=0.01, trust_coefficient=0.01)),
        "lion": dict(tx=optax.lion(1e-3, weight_decay=0.01)),
        "clip_global_adam": dict(tx=optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-2))),
        "clip_sgd": dict(tx=optax.chain(optax.clip(0.05), optax.sgd(0.1))),
        "block_rms_sgd": dict(tx=optax.chain(optax.clip_by_block_rms(0.01), optax.sgd(0.1))),
        "agc_sgd": dict(tx=optax.chain(optax.adaptive_grad_clip(0.05), optax.sgd(0.1))),
        "ema_sgd": dict(tx=optax.chain(optax.ema(0.9), optax.scale(-0.1))),
        "freeze_biases": dict(tx=optax.chain(optax.masked(optax.set_to_zero(), is_b), optax.adam(1e-2))),
        "multi_transform": dict(tx=optax.multi_transform({"w": optax.adam(1e-2), "b": optax.sgd(0.1)},
                                                          lambda p: {k: k[0] for k in p})),
        "multi_steps": dict(tx=optax.MultiSteps(optax.adam(1e-2), 4)),
        "apply_if_finite": dict(tx=optax.apply_if_finite(optax.adam(1e-2), 3), nan=True),
        "zero_nans": dict(tx=optax.chain(optax.zero_nans(), optax.sgd(0.1)), nan=True),
        "lookahead": dict(tx=optax.lookahead(optax.adam(1e-2), 5, 0.5), wrap="lookahead"),
        "inject_adam": dict(tx=optax.inject_hyperparams(optax.adam)(learning_rate=1e-2), on_step=inject_change),
        "muon": dict(tx=optax.contrib.muon(0.02, weight_decay=0.01)),
    }
    res = {}
    for name, spec in o.items():
        traj, state = run(spec["tx"], nan=spec.get("nan", False), wrap=spec.get("wrap"), on_step=spec.get("on_step"))
        res[name] = traj
        if name == "apply_if_finite":
            res[name]["total_notfinite"] = int(state.total_notfinite)
    return res


def schedules():
    s = {
        "constant": optax.constant_schedule(0.3),
        "linear": optax.linear_schedule(1.0, 0.1, 50, 10),
        "polynomial": optax.polynomial_schedule(1.0, 0.01, 2.0, 80, 5),
        "exponential": optax.exponential_decay(1.0, 10, 0.5, 5, False, 0.05),
        "exponential_staircase": optax.exponential_decay(2.0, 7, 0.8, 0, True),
        "cosine": optax.cosine_decay_schedule(1.0, 90, 0.1),
        "cosine_exponent": optax.cosine_decay_schedule(0.5, 60, 0.0, 2.0),
        "warmup_cosine": optax.warmup_cosine_decay_schedule(0.0, 1.0, 10, 100, 0.05),
        "warmup_constant": optax.warmup_constant_schedule(0.1, 1.0, 20),
        "piecewise": optax.piecewise_constant_schedule(1.0, {10: 0.5, 40: 0.1, 70: 2.0}),
        "linear_onecycle": optax.linear_onecycle_schedule(100, 1.0),
        "cosine_onecycle": optax.cosine_onecycle_schedule(100, 1.0, 0.25),
        "join": optax.join_schedules([optax.constant_schedule(1.0), optax.linear_schedule(1.0, 0.0, 30),
                                      optax.cosine_decay_schedule(0.5, 40)], [20, 60]),
        "sgdr": optax.sgdr_schedule([dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=40, end_value=0.1),
                                     dict(init_value=0.1, peak_value=0.5, warmup_steps=10, decay_steps=60, end_value=0.0)]),
    }
    steps = jnp.arange(0, 121, dtype=jnp.int32)
    return {k: [float(v) for v in np.asarray(jax.vmap(f)(steps), np.float64)] for k, f in s.items()}


def losses():
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(99)
    logits = rng.standard_normal((4, 5)) * 2
    probs = rng.random((4, 5))
    probs = probs / probs.sum(-1, keepdims=True)
    ilab = np.array([0, 3, 4, 1], np.int32)
    weights = np.array([1.0, 0.0, 1.0, 0.5])
    blog = rng.standard_normal((3, 4)) * 3
    blab = (rng.random((3, 4)) > 0.5).astype(np.int32)
    pred, targ = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    signs = np.where(rng.random((3, 4)) > 0.5, 1.0, -1.0)
    logp = jax.nn.log_softmax(jnp.asarray(logits))

    def ce_int(lg, ls=0.0, z=0.0):
        # optax's integer-label loss, with label smoothing and z-loss written out
        C = lg.shape[-1]
        onehot = jax.nn.one_hot(ilab, C, dtype=lg.dtype)
        target = optax.smooth_labels(onehot, ls) if ls else onehot
        lse = jax.nn.logsumexp(lg, axis=-1)
        return (optax.softmax_cross_entropy(lg, target) + z * lse ** 2) * weights

    cases = {
        "softmax_cross_entropy": (lambda a: optax.softmax_cross_entropy(a, probs), logits),
        "softmax_cross_entropy_int": (lambda a: optax.softmax_cross_entropy_with_integer_labels(a, ilab), logits),
        "softmax_cross_entropy_int_smooth_z": (lambda a: ce_int(a, 0.1, 1e-3), logits),
        "sigmoid_binary_cross_entropy": (lambda a: optax.sigmoid_binary_cross_entropy(a, blab), blog),
        "sigmoid_focal_loss": (lambda a: optax.sigmoid_focal_loss(a, blab, alpha=0.25, gamma=2.0), blog),
        "l2_loss": (lambda a: optax.l2_loss(a, targ), pred),
        "squared_error": (lambda a: optax.squared_error(a, targ), pred),
        "huber_loss": (lambda a: optax.huber_loss(a, targ, delta=0.7), pred),
        "log_cosh": (lambda a: optax.log_cosh(a, targ), pred),
        "hinge_loss": (lambda a: optax.hinge_loss(a, signs), pred),
        "cosine_similarity": (lambda a: optax.cosine_similarity(a, targ, epsilon=1e-8), pred),
        "cosine_distance": (lambda a: optax.cosine_distance(a, targ, epsilon=1e-8), pred),
        "kl_divergence": (lambda a: optax.kl_divergence(a, jnp.asarray(probs)), logp),
    }
    res = {"inputs": {"logits": arr(logits), "probs": arr(probs), "int_labels": arr(ilab), "weights": arr(weights),
                      "bin_logits": arr(blog), "bin_labels": arr(blab), "pred": arr(pred), "targ": arr(targ),
                      "signs": arr(signs), "log_probs": arr(np.asarray(logp))}}
    for name, (f, x) in cases.items():
        x = jnp.asarray(x, jnp.float64)
        v = f(x)
        gr = jax.grad(lambda a: jnp.sum(f(a) * jnp.arange(1, v.size + 1).reshape(v.shape)))(x)
        res[name] = {"value": arr(np.asarray(v)), "grad": arr(np.asarray(gr))}
    return res


def f32_digits(obj):
    """Floats with 9 significant digits: every float32 round-trips, the file stays small."""
    if isinstance(obj, float):
        return float("%.9g" % obj)
    if isinstance(obj, list):
        return [f32_digits(v) for v in obj]
    if isinstance(obj, dict):
        return {k: f32_digits(v) for k, v in obj.items()}
    return obj


def main():
    meta = {"optax": optax.__version__, "jax": jax.__version__, "steps": STEPS, "nan_steps": list(NAN_STEPS)}
    prob = {"params": {k: arr(v) for k, v in PARAMS.items()}, "x": arr(X), "y": arr(Y)}
    out = {"meta": meta, "problem": prob, "optimizers": optimizers(), "schedules": schedules()}
    with open(os.path.join(HERE, "optim.json"), "w") as f:
        json.dump(f32_digits(out), f, separators=(",", ":"))
        f.write("\n")
    with open(os.path.join(HERE, "losses.json"), "w") as f:
        json.dump({"meta": meta, **losses()}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
