"""Shared helpers of the golden generators: arrays as JSON objects
{"dtype": nabla dtype name, "shape": [...], "data": [...]} (row-major)."""
import json

import numpy as np

NAMES = {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16", "int8": "i8", "uint8": "u8",
         "int32": "i32", "int64": "i64", "uint32": "u32", "bool": "bool"}


def arr(a):
    a = np.asarray(a)
    name = NAMES[str(a.dtype)]
    flat = a.reshape(-1)
    if name in ("f32", "f64", "bf16", "f16"):
        data = [float(v) for v in flat.astype(np.float64)]
    else:
        data = [int(v) for v in flat]
    return {"dtype": name, "shape": list(a.shape), "data": data}


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=None, separators=(",", ":"))
        f.write("\n")
