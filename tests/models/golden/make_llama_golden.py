"""Writes the Llama golden: a tiny Llama-architecture model (GQA, RoPE,
RMSNorm, SwiGLU) with random weights, run by Hugging Face's
FlaxLlamaForCausalLM on fixed tokens.

  llama_tiny.safetensors  weights under nabla's paths and layout ([d_in, d_out] kernels)
  llama_tiny.json         config, tokens [B, T], logits [B, T, V]

Run from the repository root: python3 tests/models/golden/make_llama_golden.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from golden_models import ensure_reference, floats, save_json, save_tensors  # noqa: E402

ensure_reference()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from transformers import FlaxLlamaForCausalLM, LlamaConfig  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
OUT = os.path.dirname(os.path.abspath(__file__))
CFG = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=32,
           norm_eps=1e-5, rope_theta=10000.0)

hf = LlamaConfig(vocab_size=CFG["vocab_size"], hidden_size=CFG["d_model"], intermediate_size=CFG["d_ff"],
                 num_hidden_layers=CFG["n_layers"], num_attention_heads=CFG["n_heads"],
                 num_key_value_heads=CFG["n_kv_heads"], max_position_embeddings=CFG["max_seq_len"],
                 rms_norm_eps=CFG["norm_eps"], rope_theta=CFG["rope_theta"], tie_word_embeddings=False)
model = FlaxLlamaForCausalLM(hf, seed=0, dtype=jnp.float32)

# replace the init (std 0.02) by larger random weights so logits are far from uniform
rng = np.random.default_rng(1234)
def rand_like(path, x):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if name.endswith("weight"):  # RMSNorm scales around 1
        return (1.0 + 0.2 * rng.standard_normal(x.shape)).astype(np.float32)
    return (0.3 * rng.standard_normal(x.shape)).astype(np.float32)
params = jax.tree_util.tree_map_with_path(rand_like, model.params)

tokens = np.array([[1, 5, 9, 2, 63, 0, 17, 33], [40, 41, 3, 3, 3, 12, 60, 7]], dtype=np.int32)
logits = np.asarray(model(tokens, params=params).logits, dtype=np.float32)

m = params["model"]
t = {"embed/embedding": m["embed_tokens"]["embedding"], "final_norm/scale": m["norm"]["weight"],
     "lm_head/kernel": params["lm_head"]["kernel"]}
for i in range(CFG["n_layers"]):
    L, p = m["layers"][str(i)], f"layers/{i}"
    t[f"{p}/attn_norm/scale"] = L["input_layernorm"]["weight"]
    t[f"{p}/mlp_norm/scale"] = L["post_attention_layernorm"]["weight"]
    for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
        t[f"{p}/attn/{ours}/kernel"] = L["self_attn"][theirs]["kernel"]
    for ours, theirs in (("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj")):
        t[f"{p}/mlp/{ours}/kernel"] = L["mlp"][theirs]["kernel"]
save_tensors(os.path.join(OUT, "llama_tiny.safetensors"), t)
save_json(os.path.join(OUT, "llama_tiny.json"),
          {"reference": "transformers %s FlaxLlamaForCausalLM, jax %s" % (__import__("transformers").__version__, jax.__version__),
           "config": CFG, "tokens": tokens.tolist(), "logits_shape": list(logits.shape), "logits": floats(logits)})
print("llama golden: logits", logits.shape, "max |logit|", float(np.abs(logits).max()))
