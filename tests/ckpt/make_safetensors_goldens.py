#!/usr/bin/env python3
"""Golden safetensors files for nabla's ckpt tests, written by the reference
`safetensors` package (numpy API; bf16 through ml_dtypes), and a checker
that reads a file nabla wrote with that same package.

  make_safetensors_goldens.py                 writes tests/ckpt/golden/*
  make_safetensors_goldens.py --check FILE    exit 0 iff FILE holds exactly
                                              the all_dtypes tensors

Values are a fixed formula of (tensor index k, element index i), mirrored in
tests/ckpt/test_safetensors.c:
  floats:   ((7 i + 3 k) mod 23 - 11) / 4   (exact in bf16 and f16)
  signed:    (7 i + 3 k) mod 23 - 11
  unsigned:  (7 i + 3 k) mod 23
  bool:      (i + k) mod 3 == 0
Missing packages are pip-installed (safetensors, numpy, ml_dtypes).
"""
import json
import os
import subprocess
import sys


def ensure_packages():
    try:
        import ml_dtypes  # noqa: F401
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "safetensors", "numpy", "ml_dtypes"])


# (name, numpy dtype name, shape); k is the position in this list.
TENSORS = [
    ("w.f32", "float32", [2, 3]),
    ("w.f64", "float64", [5]),
    ("w.bf16", "bfloat16", [3, 4]),
    ("w.f16", "float16", [4]),
    ("w.i8", "int8", [6]),
    ("w.u8", "uint8", [2, 2, 2]),
    ("w.i32", "int32", [3]),
    ("w.i64", "int64", [2, 2]),
    ("w.u32", "uint32", [4]),
    ("w.bool", "bool", [5]),
    ("scalar", "float32", []),
    ("empty", "float32", [0]),
    ("empty2", "int32", [2, 0]),
]

# The sharded set: HF-style names, two shards.
SHARDS = [
    [("model.embed.weight", "float32", [4, 3]), ("model.layers.0.w", "bfloat16", [3])],
    [("model.layers.1.w", "float16", [2, 2]), ("lm_head.weight", "float32", [3, 4])],
]


def values(k, dtype, shape):
    import ml_dtypes
    import numpy as np

    n = int(np.prod(shape)) if shape else 1
    i = np.arange(n, dtype=np.int64)
    base = (7 * i + 3 * k) % 23
    if dtype == "bool":
        v = (i + k) % 3 == 0
    elif dtype in ("float32", "float64", "float16"):
        v = ((base - 11) / 4).astype(dtype)
    elif dtype == "bfloat16":
        v = ((base - 11) / 4).astype(ml_dtypes.bfloat16)
    elif dtype.startswith("u"):
        v = base.astype(dtype)
    else:
        v = (base - 11).astype(dtype)
    return v.reshape(shape)


def write_goldens(out):
    from safetensors.numpy import save_file

    os.makedirs(os.path.join(out, "sharded"), exist_ok=True)
    tensors = {name: values(k, dt, shape) for k, (name, dt, shape) in enumerate(TENSORS)}
    save_file(tensors, os.path.join(out, "all_dtypes.safetensors"), metadata={"format": "np", "by": "goldens"})
    weight_map, total, k = {}, 0, 0
    for s, shard in enumerate(SHARDS):
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, len(SHARDS))
        part = {}
        for name, dt, shape in shard:
            part[name] = values(k, dt, shape)
            weight_map[name] = fname
            total += part[name].nbytes
            k += 1
        save_file(part, os.path.join(out, "sharded", fname), metadata={"format": "np"})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out, "sharded", "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def check(path):
    """Reads path with the reference parser; compares every tensor."""
    import numpy as np
    from safetensors import deserialize

    with open(path, "rb") as f:
        got = {name: t for name, t in deserialize(f.read())}
    names = {"float32": "F32", "float64": "F64", "bfloat16": "BF16", "float16": "F16", "int8": "I8", "uint8": "U8",
             "int32": "I32", "int64": "I64", "uint32": "U32", "bool": "BOOL"}
    ok = set(got) == {t[0] for t in TENSORS}
    for k, (name, dt, shape) in enumerate(TENSORS):
        t = got.get(name)
        want = values(k, dt, shape)
        if t is None or t["dtype"] != names[dt] or list(t["shape"]) != shape or bytes(t["data"]) != want.tobytes():
            print("mismatch:", name, None if t is None else (t["dtype"], t["shape"]))
            ok = False
    print("ok" if ok else "FAILED", path)
    return 0 if ok else 1


def main():
    ensure_packages()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2]))
    write_goldens(os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden"))


if __name__ == "__main__":
    main()
