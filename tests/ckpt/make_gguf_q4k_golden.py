#!/usr/bin/env python3
"""Golden Q4_K and Q6_K blocks from llama.cpp's own quantizer (gguf-py has
no K-quant encoders), for nabla's encoders in tests/ckpt/test_gguf.c.

  make_gguf_q4k_golden.py     writes tests/ckpt/golden/q4k_llamacpp.gguf

Writes a one-layer Llama (width 256) in F32 with gguf-py, quantizes it with
llama.cpp twice (llama_model_quantize, ftype Q4_K_S and Q6_K, pure: every
2-D tensor of that type, no importance matrix, so ggml's
quantize_row_q4_K_ref / _q6_K_ref), and keeps the first 4 rows of each 2-D
tensor: "src.<name>" (f32 [4, 256]), "enc.<name>" (Q4_K) and "enc6.<name>"
(Q6_K). The source values mix normal, uniform,
all-positive and all-zero rows. Needs llama-cpp-python and gguf-py (e.g.
/work/venv-llamacpp).
"""
import ctypes
import os
import tempfile

import numpy as np
import gguf
import llama_cpp

ROWS = 4


def source_model(path, rng):
    d, ff = 256, 256
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_context_length(32)
    w.add_embedding_length(d)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    w.add_tokenizer_model("no_vocab")
    w.add_vocab_size(32)
    kinds = [
        lambda s: rng.standard_normal(s),
        lambda s: rng.uniform(-1, 1, s),
        lambda s: np.abs(rng.standard_normal(s)) + 0.5,       # min > 0: the fit clamps the min to 0
        lambda s: rng.standard_normal(s) * np.where(rng.uniform(size=s) < 0.9, 1e-3, 5.0),  # outliers
    ]
    tensors = {}

    def mat(name, rows):
        x = np.concatenate([kinds[(i + len(tensors)) % 4]((1, d)) for i in range(rows)]).astype(np.float32)
        x[0, 64:96] = 0  # an all-zero sub-block
        tensors[name] = x
        w.add_tensor(name, x)

    mat("token_embd.weight", 32)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(d, np.float32))
    for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        mat(f"blk.0.{n}.weight", 256)
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(d, np.float32))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    mat("output.weight", 32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "q4k_llamacpp.gguf")
    rng = np.random.default_rng(12)
    with tempfile.TemporaryDirectory() as tmp:
        f32, q4k = os.path.join(tmp, "f32.gguf"), os.path.join(tmp, "q4k.gguf")
        src = source_model(f32, rng)
        w = gguf.GGUFWriter(out, arch="nabla-test")
        for name in src:
            w.add_tensor("src." + name, src[name][:ROWS])
        for prefix, ftype, qtype in (("enc.", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S, gguf.GGMLQuantizationType.Q4_K),
                                     ("enc6.", llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K, gguf.GGMLQuantizationType.Q6_K)):
            p = llama_cpp.llama_model_quantize_default_params()
            p.ftype = ftype
            p.pure = True
            p.nthread = 1
            assert llama_cpp.llama_model_quantize(f32.encode(), q4k.encode(), ctypes.byref(p)) == 0
            bytes_per_row = gguf.GGML_QUANT_SIZES[qtype][1]
            for t in gguf.GGUFReader(q4k).tensors:
                if t.name in src and t.tensor_type == qtype:
                    w.add_tensor(prefix + t.name, np.array(t.data).reshape(-1, bytes_per_row)[:ROWS], raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    print("wrote", out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
