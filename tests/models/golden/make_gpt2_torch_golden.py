"""Writes the PyTorch GPT-2 golden: the tiny GPT-2 of the Flax golden
(make_gpt2_golden.py) with the same weights, read from gpt2_tiny.safetensors,
loaded into Hugging Face's PyTorch GPT2LMHeadModel; its masked mean
next-token cross-entropy on the same batch and the gradients of that loss
with respect to every parameter, computed by torch.autograd in float64.

  gpt2_tiny_torch.json                config, inputs, targets, mask, the f64
                                      loss (and the f32 one, for scale), the
                                      weights file it was made from (sha256)
  gpt2_tiny_torch_grads.safetensors   F64 gradients under nabla's paths and
                                      layout ("<path>": c_attn split into
                                      wq/wk/wv, kernels [d_in, d_out])

Regenerate it whenever gpt2_tiny.safetensors changes.

HF's GPT-2 Conv1D already stores weight [in, out], nabla's kernel layout: the
kernels map over as they are, c_attn's [D, 3D] being wq | wk | wv side by
side. The output projection is tied to wte, as in nabla's GPT-2, so the
embedding gradient sums both uses.

Runs on Debian's CPU-only PyTorch (apt-get install python3-torch, 1.13; never
pip's, which pulls CUDA) with transformers and safetensors from PyPI in a
venv that sees the system site-packages. From the repository root:

  /usr/bin/python3 -m venv --system-site-packages /tmp/gen_venv/hf
  /tmp/gen_venv/hf/bin/pip install "transformers<4.50" safetensors
  /tmp/gen_venv/hf/bin/python tests/models/golden/make_gpt2_torch_golden.py

(made with transformers 4.49.0, safetensors 0.8.0, numpy 1.24.2, torch 1.13.0a0,
Python 3.11).
"""
import hashlib
import json
import os

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file

# Debian's torch 1.13 cannot import torch.distributed.fsdp under Python 3.11
# (a dataclass default error) and transformers asks it whether a model is
# FSDP-wrapped in generate(); nothing here is. The same patch as
# make_hf_llama_tiny.py, harmless where it is not needed.
transformers.generation.utils.is_fsdp_managed_module = lambda module: False
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WEIGHTS = os.path.join(HERE, "gpt2_tiny.safetensors")
FLAX_JSON = os.path.join(HERE, "gpt2_tiny.json")


QKV = ("wq", "wk", "wv")  # HF's c_attn holds them side by side: [D, 3D] (in, out)


def one_to_one(n_layers):
    """(nabla path, HF name) of every tensor that maps to one tensor."""
    pairs = [("embed/embedding", "transformer.wte.weight"), ("pos_embed/embedding", "transformer.wpe.weight"),
             ("final_norm/scale", "transformer.ln_f.weight"), ("final_norm/bias", "transformer.ln_f.bias")]
    for i in range(n_layers):
        h, p = f"transformer.h.{i}.", f"layers/{i}/"
        for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            pairs += [(p + ours + "/scale", h + theirs + ".weight"), (p + ours + "/bias", h + theirs + ".bias")]
        for ours, theirs in (("attn/wo", "attn.c_proj"), ("mlp/wi", "mlp.c_fc"), ("mlp/wo", "mlp.c_proj")):
            pairs += [(p + ours + "/kernel", h + theirs + ".weight"), (p + ours + "/bias", h + theirs + ".bias")]
    return pairs


def hf_to_ours(named, n_layers, d):
    """{HF GPT-2 parameter name: array} -> {nabla path: array}."""
    t = {ours: named[theirs] for ours, theirs in one_to_one(n_layers)}
    for i in range(n_layers):
        h, p = f"transformer.h.{i}.", f"layers/{i}/"
        w, b = named[h + "attn.c_attn.weight"], named[h + "attn.c_attn.bias"]
        for j, name in enumerate(QKV):
            t[p + f"attn/{name}/kernel"] = w[:, j * d:(j + 1) * d]
            t[p + f"attn/{name}/bias"] = b[j * d:(j + 1) * d]
    return t


def ours_to_hf(w, n_layers):
    """The inverse: nabla's tree -> HF state dict entries (numpy)."""
    sd = {theirs: w[ours] for ours, theirs in one_to_one(n_layers)}
    for i in range(n_layers):
        h, p = f"transformer.h.{i}.", f"layers/{i}/"
        sd[h + "attn.c_attn.weight"] = np.concatenate([w[p + f"attn/{n}/kernel"] for n in QKV], axis=1)
        sd[h + "attn.c_attn.bias"] = np.concatenate([w[p + f"attn/{n}/bias"] for n in QKV])
    return sd


def loss_and_grads(model, inputs, targets, mask):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=inputs).logits  # [B, T, V]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    loss = (ce * mask.reshape(-1)).sum() / mask.sum()
    loss.backward()
    return loss.item(), {n: p.grad.detach().cpu().numpy().copy() for n, p in model.named_parameters()}


def main():
    with open(FLAX_JSON) as f:
        flax = json.load(f)
    cfg = flax["config"]
    weights = {k: v for k, v in load_file(WEIGHTS).items() if not k.startswith("grad/")}
    with open(WEIGHTS, "rb") as f:
        weights_sha = hashlib.sha256(f.read()).hexdigest()
    L, D = cfg["n_layers"], cfg["d_model"]

    hf = GPT2Config(vocab_size=cfg["vocab_size"], n_positions=cfg["max_seq_len"], n_embd=D, n_layer=L,
                    n_head=cfg["n_heads"], n_inner=cfg["d_ff"], layer_norm_epsilon=cfg["norm_eps"],
                    activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                    tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(hf).eval()  # eval: no dropout (the rates are 0 anyway)

    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in ours_to_hf(weights, L).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # lm_head.weight is wte (tied); the attention mask buffers are not weights
    missing = [m for m in missing if m != "lm_head.weight" and not m.endswith((".attn.bias", ".attn.masked_bias"))]
    assert not missing and not unexpected, (missing, unexpected)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "lm_head not tied to wte"
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == sum(v.size for v in weights.values()), "parameter counts differ"

    inputs = torch.tensor(flax["inputs"], dtype=torch.long)
    targets = torch.tensor(flax["targets"], dtype=torch.long)
    mask32 = torch.tensor(flax["mask"], dtype=torch.float32)

    loss32, _ = loss_and_grads(model, inputs, targets, mask32)
    model.double()
    loss64, grads = loss_and_grads(model, inputs, targets, mask32.double())

    ours = hf_to_ours(grads, L, D)
    assert set(ours) == set(weights), set(ours) ^ set(weights)
    flax_grad = {k[5:]: v for k, v in load_file(WEIGHTS).items() if k.startswith("grad/")}
    worst = max(float(np.abs(ours[k] - flax_grad[k]).max() / (np.abs(ours[k]).max() + 1e-2)) for k in ours)
    print("gpt2 torch golden: loss f64 %.15g, f32 %.9g, flax golden %.9g; worst grad difference from the flax golden "
          "%.3g (relative to the tensor's largest)" % (loss64, loss32, flax["loss"], worst))

    grads_path = os.path.join(HERE, "gpt2_tiny_torch_grads.safetensors")
    save_file({k: np.ascontiguousarray(v, dtype=np.float64) for k, v in sorted(ours.items())}, grads_path)
    os.chmod(grads_path, 0o644)
    golden = {
        "reference": "transformers %s GPT2LMHeadModel (eager attention), torch %s, float64"
                     % (transformers.__version__, torch.__version__),
        "weights": "tests/models/golden/gpt2_tiny.safetensors", "weights_sha256": weights_sha,
        "config": cfg, "inputs": flax["inputs"], "targets": flax["targets"], "mask": flax["mask"],
        "loss": loss64, "loss_f32": loss32,
    }
    with open(os.path.join(HERE, "gpt2_tiny_torch.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
