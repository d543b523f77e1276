"""Shared by the model golden generators: installs the reference stack when
it is missing (Hugging Face transformers' Flax models on JAX: PyTorch's
default wheels pull CUDA, so the JAX implementations are the reference),
writes safetensors and JSON files."""
import importlib
import json
import subprocess
import sys

REQUIREMENTS = ["transformers>=4.44,<4.50", "flax", "safetensors", "jax", "numpy"]


def ensure_reference():
    missing = []
    for mod in ("transformers", "flax", "safetensors", "jax", "numpy"):
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print("installing", REQUIREMENTS, file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *REQUIREMENTS])


def save_tensors(path, tensors):
    import numpy as np
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}, path)


def save_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=None, separators=(",", ":"))
        f.write("\n")


def floats(a):
    import numpy as np
    return [float(np.float32(v)) for v in np.asarray(a, dtype=np.float32).reshape(-1)]
