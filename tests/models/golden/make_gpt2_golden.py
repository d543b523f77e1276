"""Writes the GPT-2 golden: a tiny GPT-2 with random weights, its masked
mean next-token cross-entropy on one batch and the gradients of that loss
with respect to every weight, computed by Hugging Face's
FlaxGPT2LMHeadModel under jax.value_and_grad.

  gpt2_tiny.safetensors  weights ("<path>") and gradients ("grad/<path>")
                         under nabla's paths and layout (c_attn split into
                         wq/wk/wv, Conv1D kernels transposed to [d_in, d_out])
  gpt2_tiny.json         config, inputs, targets, mask, loss

Run from the repository root: python3 tests/models/golden/make_gpt2_golden.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from golden_models import ensure_reference, save_json, save_tensors  # noqa: E402

ensure_reference()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from transformers import FlaxGPT2LMHeadModel, GPT2Config  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
OUT = os.path.dirname(os.path.abspath(__file__))
CFG = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=128, max_seq_len=16, norm_eps=1e-5)

hf = GPT2Config(vocab_size=CFG["vocab_size"], n_positions=CFG["max_seq_len"], n_embd=CFG["d_model"],
                n_layer=CFG["n_layers"], n_head=CFG["n_heads"], n_inner=CFG["d_ff"],
                layer_norm_epsilon=CFG["norm_eps"], activation_function="gelu_new",
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = FlaxGPT2LMHeadModel(hf, seed=0, dtype=jnp.float32)

rng = np.random.default_rng(4321)
def rand_like(path, x):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if name.endswith("scale"):
        return (1.0 + 0.2 * rng.standard_normal(x.shape)).astype(np.float32)
    return (0.2 * rng.standard_normal(x.shape)).astype(np.float32)
params = jax.tree_util.tree_map_with_path(rand_like, model.params)

tokens = rng.integers(0, CFG["vocab_size"], size=(2, 13)).astype(np.int32)
inputs, targets = tokens[:, :-1], tokens[:, 1:]
mask = np.ones(targets.shape, np.float32)
mask[1, -3:] = 0


def loss_fn(p):
    logits = model(inputs, params=p, train=False).logits
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.sum((logz - picked) * mask) / jnp.sum(mask)


loss, grads = jax.value_and_grad(loss_fn)(params)
D = CFG["d_model"]


def to_ours(tree, prefix):
    tr = tree["transformer"]
    t = {prefix + "embed/embedding": tr["wte"]["embedding"], prefix + "pos_embed/embedding": tr["wpe"]["embedding"],
         prefix + "final_norm/scale": tr["ln_f"]["scale"], prefix + "final_norm/bias": tr["ln_f"]["bias"]}
    for i in range(CFG["n_layers"]):
        h, p = tr["h"][str(i)], f"{prefix}layers/{i}"
        for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            t[f"{p}/{ours}/scale"] = h[theirs]["scale"]
            t[f"{p}/{ours}/bias"] = h[theirs]["bias"]
        ck, cb = np.asarray(h["attn"]["c_attn"]["kernel"]), np.asarray(h["attn"]["c_attn"]["bias"])  # [3D, D] (out, in)
        for j, name in enumerate(("wq", "wk", "wv")):
            t[f"{p}/attn/{name}/kernel"] = ck[j * D:(j + 1) * D].T
            t[f"{p}/attn/{name}/bias"] = cb[j * D:(j + 1) * D]
        t[f"{p}/attn/wo/kernel"] = np.asarray(h["attn"]["c_proj"]["kernel"]).T
        t[f"{p}/attn/wo/bias"] = h["attn"]["c_proj"]["bias"]
        t[f"{p}/mlp/wi/kernel"] = np.asarray(h["mlp"]["c_fc"]["kernel"]).T
        t[f"{p}/mlp/wi/bias"] = h["mlp"]["c_fc"]["bias"]
        t[f"{p}/mlp/wo/kernel"] = np.asarray(h["mlp"]["c_proj"]["kernel"]).T
        t[f"{p}/mlp/wo/bias"] = h["mlp"]["c_proj"]["bias"]
    return t


tensors = to_ours(params, "")
tensors.update(to_ours(grads, "grad/"))
save_tensors(os.path.join(OUT, "gpt2_tiny.safetensors"), tensors)
save_json(os.path.join(OUT, "gpt2_tiny.json"),
          {"reference": "transformers %s FlaxGPT2LMHeadModel, jax %s" % (__import__("transformers").__version__, jax.__version__),
           "config": CFG, "inputs": inputs.tolist(), "targets": targets.tolist(), "mask": mask.tolist(),
           "loss": float(loss)})
print("gpt2 golden: loss", float(loss))
