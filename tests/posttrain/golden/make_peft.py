"""Goldens for tests/posttrain/test_peft.c, made with PyPI peft + transformers
on Debian's CPU torch (the versions are recorded in peft_logits.json):

  python tests/posttrain/golden/make_peft.py            # writes the goldens
  python tests/posttrain/golden/make_peft.py OUT_DIR    # checks an adapter nabla exported (OUT_DIR) loads with
                                                        # peft and matches nabla's logits (OUT_DIR/nabla_logits.json)

A tiny random Llama (2 layers, d 32, GQA 4/2 heads, vocab 64, untied lm_head)
saved as a Hugging Face directory (peft_base/), a LoRA adapter on q_proj,
v_proj and down_proj of layer 0 and all of layer 1's o_proj, r 4, alpha 8,
rsLoRA off, with random A *and* B (init_lora_weights=False, so the adapter
changes the logits), saved by peft (peft_adapter/), and the logits of the
base and of base + adapter for fixed ids (peft_logits.json)."""
import json, os, sys

import peft
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
IDS = [[1, 5, 9, 33, 2, 60, 17, 4, 40, 11], [3, 3, 8, 50, 21, 7, 0, 63, 12, 30]]


def check_export(out):
    base = LlamaForCausalLM.from_pretrained(os.path.join(here, "peft_base"), torch_dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, out)
    with torch.no_grad():
        got = model(torch.tensor(IDS)).logits.double()
    want = torch.tensor(json.load(open(os.path.join(out, "nabla_logits.json")))["logits"], dtype=torch.float64)
    diff = (got - want).abs().max().item()
    print(f"peft {peft.__version__} on nabla's export: max |logit diff| {diff:.3g} at max |logit| {want.abs().max().item():.3g}")
    sys.exit(0 if diff <= 1e-4 * want.abs().max().item() else 1)


def main():
    if len(sys.argv) > 1:
        return check_export(sys.argv[1])
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False, initializer_range=0.2)
    base = LlamaForCausalLM(cfg).eval()
    base.save_pretrained(os.path.join(here, "peft_base"), safe_serialization=True)
    lc = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                         target_modules=r"model\.layers\.0\.(self_attn\.[qv]_proj|mlp\.down_proj)|model\.layers\.1\.self_attn\.o_proj")
    model = peft.get_peft_model(base, lc).eval()
    ids = torch.tensor(IDS)
    with torch.no_grad():
        with_adapter = model(ids).logits
        with model.disable_adapter():
            plain = model(ids).logits
    model.save_pretrained(os.path.join(here, "peft_adapter"))
    os.remove(os.path.join(here, "peft_adapter", "README.md"))  # peft's model-card template
    json.dump({"made_by": f"make_peft.py: torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}",
               "ids": IDS, "base_logits": plain.tolist(), "lora_logits": with_adapter.tolist()},
              open(os.path.join(here, "peft_logits.json"), "w"))


if __name__ == "__main__":
    main()
