"""GPT-2 goldens for tests/posttrain/test_peft.c, made with PyPI peft + transformers
on Debian's CPU torch (the versions are recorded in peft_gpt2_logits.json):

  python tests/posttrain/golden/make_peft_gpt2.py           # writes the goldens
  python tests/posttrain/golden/make_peft_gpt2.py OUT_DIR   # checks an adapter nabla exported for
                                                            # peft_gpt2_base (OUT_DIR) against OUT_DIR/nabla_logits.json

GPT-2 computes q, k and v with one Conv1D, c_attn ([d, 3d], fan_in_fan_out),
where nabla has three linears with an adapter each. The export rule this
script writes down independently of nabla's C code: the adapted projections of
a layer, in q, k, v order, are stacked into one c_attn adapter of rank k * r
(k = how many of q, k, v are adapted):
  lora_A.weight [k r, d]   = the rows A_q^T, A_k^T, A_v^T (of those adapted)
  lora_B.weight [3 d, k r] = block-structured: B_p^T in rows of part p, columns of its A
  alpha                    = k * alpha (use_rslora: sqrt(k) * alpha), so alpha / rank stays nabla's scale
written as rank_pattern / alpha_pattern entries for c_attn.

Files:
  peft_gpt2_base/            a tiny random GPT2LMHeadModel (2 layers, d 32, 4 heads, vocab 64, tied)
  peft_gpt2_nabla.safetensors  nabla-layout adapters (layers/<i>/attn/wq/lora_a [d_in, r], lora_b [r, d_out]):
                             layer 0 q, k, v, wo and mlp/wo; layer 1 q, v and mlp/wi; r 4, alpha 8, random A and B
  peft_gpt2_adapter/         those adapters as peft saves them after loading them with the rule above
  peft_gpt2_native/          an adapter as peft itself makes it on GPT-2 (one c_attn LoRA of rank r, one A shared
                             by q, k, v; c_attn and c_proj of both layers), random A and B
  peft_gpt2_logits.json      logits for fixed ids: base, base + peft_gpt2_adapter, base + peft_gpt2_native"""
import json, math, os, sys

import peft
import safetensors.torch
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

here = os.path.dirname(os.path.abspath(__file__))
IDS = [[1, 5, 9, 33, 2, 60, 17, 4, 40, 11], [3, 3, 8, 50, 21, 7, 0, 63, 12, 30]]
D, R, ALPHA = 32, 4, 8.0
# nabla's adapted modules and their Hugging Face module (GPT2LMHeadModel names)
ADAPTED = ["layers/0/attn/wq", "layers/0/attn/wk", "layers/0/attn/wv", "layers/0/attn/wo", "layers/0/mlp/wo",
           "layers/1/attn/wq", "layers/1/attn/wv", "layers/1/mlp/wi"]
PARTS = {"wq": 0, "wk": 1, "wv": 2}


def hf_module(m):
    _, layer, block, lin = m.split("/")
    if lin in PARTS:
        return f"transformer.h.{layer}.attn.c_attn"
    return f"transformer.h.{layer}.{block}." + {"attn/wo": "c_proj", "mlp/wi": "c_fc", "mlp/wo": "c_proj"}[f"{block}/{lin}"]


def base_model():
    return GPT2LMHeadModel.from_pretrained(os.path.join(here, "peft_gpt2_base"), torch_dtype=torch.float32,
                                           attn_implementation="eager").eval()


def check_export(out):
    model = peft.PeftModel.from_pretrained(base_model(), out).eval()
    with torch.no_grad():
        got = model(torch.tensor(IDS)).logits.double()
    want = torch.tensor(json.load(open(os.path.join(out, "nabla_logits.json")))["logits"], dtype=torch.float64)
    diff = (got - want).abs().max().item()
    print(f"peft {peft.__version__} on nabla's GPT-2 export: max |logit diff| {diff:.3g} at max |logit| "
          f"{want.abs().max().item():.3g}")
    sys.exit(0 if diff <= 1e-4 * want.abs().max().item() else 1)


def fused_weights(ours):
    """{hf module: (lora_A [rank, in], lora_B [out, rank])} from nabla-layout adapters, by the rule above"""
    out = {}
    for m in ADAPTED:
        hf, lin = hf_module(m), m.split("/")[-1]
        a, b = ours[m + "/lora_a"].t(), ours[m + "/lora_b"].t()  # [r, in], [out_part, r]
        if lin not in PARTS:
            out[hf] = (a, b)
            continue
        A, B = out.get(hf, (torch.zeros(0, D), torch.zeros(3 * D, 0)))
        col = torch.zeros(3 * D, R)
        col[PARTS[lin] * D:(PARTS[lin] + 1) * D] = b
        out[hf] = (torch.cat([A, a]), torch.cat([B, col], dim=1))
    return out


def save(model, name):
    model.peft_config["default"].base_model_name_or_path = "peft_gpt2_base"  # not this machine's path
    model.save_pretrained(os.path.join(here, name))
    os.remove(os.path.join(here, name, "README.md"))  # peft's model-card template


def logits(model):
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


def main():
    if len(sys.argv) > 1:
        return check_export(sys.argv[1])
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=D, n_layer=2, n_head=4, n_inner=None, layer_norm_epsilon=1e-5,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     tie_word_embeddings=True, initializer_range=0.2)
    GPT2LMHeadModel(cfg).eval().save_pretrained(os.path.join(here, "peft_gpt2_base"), safe_serialization=True)
    plain = logits(base_model())

    # nabla-layout adapters, then peft's model of them by the stacking rule
    g = torch.Generator().manual_seed(1)
    ours = {}
    for m in ADAPTED:
        d_out = 4 * D if m.endswith("mlp/wi") else D
        d_in = 4 * D if m.endswith("mlp/wo") else D
        ours[m + "/lora_a"] = torch.randn(d_in, R, generator=g) / math.sqrt(d_in)
        ours[m + "/lora_b"] = torch.randn(R, d_out, generator=g) * 0.3
    safetensors.torch.save_file(ours, os.path.join(here, "peft_gpt2_nabla.safetensors"))
    fused = fused_weights(ours)
    ranks = {hf.split("transformer.")[1]: A.shape[0] for hf, (A, _) in fused.items() if hf.endswith("c_attn")}
    lc = peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, init_lora_weights=False, fan_in_fan_out=True,
                         task_type="CAUSAL_LM", target_modules="|".join(m.replace(".", "\\.") for m in fused),
                         rank_pattern=ranks, alpha_pattern={k: ALPHA * v / R for k, v in ranks.items()})
    model = peft.get_peft_model(base_model(), lc).eval()
    sd = {}
    for hf, (A, B) in fused.items():
        sd[f"base_model.model.{hf}.lora_A.default.weight"] = A
        sd[f"base_model.model.{hf}.lora_B.default.weight"] = B
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not [k for k in missing if "lora_" in k], (missing, unexpected)
    stacked = logits(model)
    save(model, "peft_gpt2_adapter")

    # an adapter as peft makes it: one A for c_attn's three outputs
    torch.manual_seed(2)
    lc = peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, init_lora_weights=False, fan_in_fan_out=True,
                         task_type="CAUSAL_LM", target_modules=["c_attn", "attn.c_proj"])
    model = peft.get_peft_model(base_model(), lc).eval()
    native = logits(model)
    save(model, "peft_gpt2_native")

    json.dump({"made_by": f"make_peft_gpt2.py: torch {torch.__version__}, transformers {transformers.__version__}, "
                          f"peft {peft.__version__}",
               "ids": IDS, "base_logits": plain.tolist(), "stacked_logits": stacked.tolist(),
               "native_logits": native.tolist()},
              open(os.path.join(here, "peft_gpt2_logits.json"), "w"))


if __name__ == "__main__":
    main()
