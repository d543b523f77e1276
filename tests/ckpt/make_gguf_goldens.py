#!/usr/bin/env python3
"""Golden GGUF file for nabla's GGUF reader and block codecs, written by the
reference `gguf` package (ggml's gguf-py, whose quants module is bit-exact
with ggml-quants.c's reference quantizers).

  make_gguf_goldens.py      writes tests/ckpt/golden/codecs.gguf

Contents (mirrored in tests/ckpt/test_gguf.c):
  metadata: one key of every value type, a string array, a nested array
            (array of arrays of int32), general.alignment = 64
  for T in F16, BF16, Q8_0, Q4_0 (codecs nabla encodes):
    src.T  f32 [2, 256]  values to encode (normal, plus a zero block, a
                         block of ties in magnitude, a NaN-free extreme block)
    enc.T  T   [2, 256]  gguf.quants.quantize(src.T, T)
    dec.T  f32 [2, 256]  gguf.quants.dequantize(enc.T, T)
  for T in Q4_K, Q6_K (decoded only): enc.T = random blocks with finite f16
    scales, dec.T their dequantization.
Needs the `gguf` and `numpy` packages (e.g. /work/venv-llamacpp, or
pip install gguf numpy).
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

ROWS, COLS = 2, 256


def source(rng):
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    x[0, 0:32] = 0                                  # a zero block: d = 0
    x[0, 32:64] = np.where(np.arange(32) % 2, 1.5, -1.5)  # magnitude ties: the first wins in Q4_0
    x[1, 0:32] *= 1e4                               # large values (F16 range)
    x[1, 32:64] *= 1e-6                             # tiny scales (f16 subnormal d)
    x[1, 64:96] = np.linspace(-1, 1, 32)            # exact halves after scaling
    return x


def k_blocks(rng, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(ROWS * COLS // block, size), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.1, size=(raw.shape[0], 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:
        raw[:, 0:4] = scales                          # d, dmin
    else:
        raw[:, 208:210] = scales[:, 0:2]              # d
    return raw.reshape(ROWS, -1)


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "codecs.gguf")
    rng = np.random.default_rng(15)
    w = gguf.GGUFWriter(out, arch="nabla-test")
    w.data_alignment = 64
    w.add_uint32("general.alignment", 64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.15625)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", -2.5e-300)
    w.add_array("t.strs", ["a", "", "ñ"])
    w.add_key_value("t.nested", [[1, 2], [3], [-4, 5, 6]], gguf.GGUFValueType.ARRAY)
    w.add_array("t.f32s", [0.5, -1.25])
    for qt in (Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0):
        src = source(rng)
        enc = quants.quantize(src, qt)
        dec = quants.dequantize(enc, qt).astype(np.float32)
        w.add_tensor("src." + qt.name, src)
        w.add_tensor("enc." + qt.name, enc, raw_dtype=qt)
        w.add_tensor("dec." + qt.name, dec)
    for qt in (Q.Q4_K, Q.Q6_K):
        enc = k_blocks(rng, qt)
        dec = quants.dequantize(enc, qt).astype(np.float32)
        w.add_tensor("enc." + qt.name, enc, raw_dtype=qt)
        w.add_tensor("dec." + qt.name, dec)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", out, os.path.getsize(out), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
