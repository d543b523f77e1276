"""What PyPI transformers makes of nabla's Hugging Face export.

`models_test_hf_peer --write DIR` (built from tests/models/test_hf_peer.c)
exports four tiny models with deterministic parameters (GPT-2, Llama,
Mistral, Qwen2) as Hugging Face folders. This script loads each folder with
transformers' AutoModelForCausalLM (no custom code, float32), and writes

  hf_export_transformers.json   per architecture: the xxh3-64 of every tensor
                                it read (safetensors' bytes) and its logits on
                                the fixed token ids; the versions used.

The C test exports the same models again and checks them against this file,
so CI needs neither Python nor transformers.

Run with Debian's PyTorch (apt-get install python3-torch) and transformers,
safetensors, xxhash from PyPI:
  /usr/bin/python3 -m venv --system-site-packages /tmp/hf
  /tmp/hf/bin/pip install "transformers<4.50" safetensors xxhash
  /tmp/hf/bin/python tests/models/golden/make_hf_export_goldens.py build/models_test_hf_peer
"""
import json
import os
import platform
import subprocess
import sys
import tempfile

import safetensors
import safetensors.torch
import torch
import transformers
import xxhash
from transformers import AutoModelForCausalLM

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_export_transformers.json")
ARCHS = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
         "qwen2": "Qwen2ForCausalLM"}


def main():
    tool = sys.argv[1] if len(sys.argv) > 1 else "build/models_test_hf_peer"
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ids = json.loads(subprocess.run([tool, "--write", tmp], check=True, capture_output=True,
                                        text=True).stdout)["ids"]
        models = {}
        for arch, cls in ARCHS.items():
            d = os.path.join(tmp, arch)
            tensors = safetensors.torch.load_file(os.path.join(d, "model.safetensors"))
            hashes = {k: xxhash.xxh3_64_hexdigest(v.contiguous().numpy().tobytes()) for k, v in tensors.items()}
            model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
            assert type(model).__name__ == cls, type(model).__name__
            model.eval()
            # every parameter came from the file (no random init of a missing weight)
            sd = model.state_dict()
            for k, v in tensors.items():
                assert torch.equal(sd[k], v), k
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float()
            models[arch] = {
                "class": cls,
                "tensors": hashes,
                "logits": {"dtype": "f32", "shape": list(logits.shape),
                           "data": [float(f"{x:.9g}") for x in logits.flatten().tolist()]},
            }
            print(f"{arch}: {len(tensors)} tensors, logits {tuple(logits.shape)}, |max| {logits.abs().max():.3f}")
    golden = {
        "about": "transformers on nabla's HF export (tests/models/golden/make_hf_export_goldens.py)",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "safetensors": safetensors.__version__,
                     "xxhash": xxhash.VERSION},
        "ids": ids,
        "models": models,
    }
    with open(OUT, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
