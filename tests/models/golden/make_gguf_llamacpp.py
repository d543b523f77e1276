#!/usr/bin/env python3
"""llama.cpp's view of GGUF files, as goldens for tests/models/test_gguf.c.

  make_gguf_llamacpp.py [BUILD_DIR]     (default BUILD_DIR: build)

Runs in a Python with llama-cpp-python (which builds llama.cpp from source)
and gguf-py, e.g. /work/venv-llamacpp, or: pip install llama-cpp-python gguf numpy.

1. `BUILD_DIR/models_test_gguf --write TMP` writes nabla's export of a small
   Llama (weights from an integer formula) as F32, F16, Q8_0 and Q4_0, and of
   a small GPT-2 as F32 and Q8_0, and of a width-256 Llama as Q4_K; llama.cpp
   runs each on PROMPT (logits_all) and its logits are recorded ("exports"),
   and so are its logits of an F32 copy whose tensors gguf-py dequantized
   ("<type>_as_f32"): the same weights without ggml's quantization of the
   activations (f16 for F16 weights, Q8_0 blocks for Q8_0 / Q4_0 weights).
2. Two small Llamas are written here with gguf-py the way llama.cpp's
   converter writes them (attn_q / attn_k rows permuted for llama.cpp's
   RoPE), with a SentencePiece vocabulary ("llama": scores, byte fallback)
   and a byte-level BPE one ("gpt2": merges, pre-tokenizer gpt-2), checked in
   as spm_tiny.gguf and bpe_tiny.gguf; llama.cpp's token ids for TEXTS and
   its logits for the first text and its greedy continuation (8 tokens) are
   recorded ("spm", "bpe").
3. The same binary writes small models carrying SentencePiece-style
   tokenizers of the tokenizer tests (a BPE .model, one with whitespace-only
   pieces, Llama-2's tokenizer.json layout) as llama.cpp "llama"
   vocabularies; llama.cpp's ids for the tokenizer tests' 32 texts are
   recorded ("tok_exports").
4. A width-256 Llama quantized by llama.cpp itself to Q4_K_M (Q4_K and Q6_K
   tensors as llama-quantize mixes them), checked in as
   q4_k_m_tiny.gguf; llama.cpp's logits on it and on a dequantized F32 copy
   ("q4_k_m").
5. nabla's export of the Hugging Face tiny Llama (tests/models/golden/
   hf_llama_tiny: Llama-3.1 RoPE scaling, Llama-3-style byte-level BPE):
   llama.cpp's ids for its prompt, logits and greedy ids ("hf_tiny").
Writes tests/models/golden/gguf_llamacpp.json (and the three .gguf files).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
PROMPT = [1, 5, 17, 42, 3, 88, 60, 7, 23, 95]
Q_PROMPT = [1, 5, 17, 42, 3, 24, 60, 7]  # the Q4_K_M model has 64 tokens
TEXTS = ["the cat sat on the mat", "Hello, world! ünïcödé 日本", "  two  spaces\nand a newline", "tea at the theater"]


def run(path, ids):
    # an f32 KV cache (the default is f16) and no flash attention: what
    # differs from nabla is then the weights' format and ggml's activations
    llm = Llama(model_path=path, n_ctx=64, n_batch=64, logits_all=True, n_threads=1, verbose=False,
                type_k=0, type_v=0, flash_attn=False)
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    return llm, [float(v) for v in out.reshape(-1)]


def dequantized_copy(src, dst):
    """src with every tensor dequantized by gguf-py to F32 (scalar metadata
    copied; nabla's exports carry no arrays): llama.cpp then runs the same
    weights without quantizing its activations."""
    r = gguf.GGUFReader(src)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(dst, arch=arch)
    for k, f in r.fields.items():
        t = f.types[0]
        if k.startswith("GGUF.") or k == "general.architecture" or k == "general.file_type":
            continue
        assert t != gguf.GGUFValueType.ARRAY, k
        w.add_key_value(k, str(bytes(f.parts[-1]), "utf-8") if t == gguf.GGUFValueType.STRING else f.parts[-1][0].item(), t)
    w.add_file_type(0)
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, x.reshape([int(v) for v in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def permute(w, n_head):
    """llama.cpp's converter (conversion/llama.py LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_model(path, vocab, seed):
    """A 2-layer Llama (d 32, 4 heads, 2 KV heads, d_ff 64) with the
    tokenizer keys in `vocab` (a function adding them to the writer)."""
    rng = np.random.default_rng(seed)
    d, ff, nh, nkv, layers = 32, 64, 4, 2, 2
    hd = d // nh
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_rope_dimension_count(hd)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)
    n_vocab = vocab(w)

    def mat(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, d, scale=1.0))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + mat(d, scale=0.1))
        w.add_tensor(f"blk.{i}.attn_q.weight", permute(mat(nh * hd, d), nh))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute(mat(nkv * hd, d), nkv))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(nkv * hd, d))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(d, nh * hd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + mat(d, scale=0.1))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(ff, d))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(ff, d))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(d, ff))
    w.add_tensor("output_norm.weight", 1 + mat(d, scale=0.1))
    w.add_tensor("output.weight", mat(n_vocab, d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


SPM_PIECES = ["▁", "e", "t", "h", "a", "s", "o", "n", "m", "c", "r", "l", "w", "d", "i",
              "▁t", "he", "▁the", "at", "▁c", "▁cat", "▁s", "▁sat", "on", "▁on", "▁m", "▁mat",
              "▁▁", "ea", "▁tea", "er", "▁a", "ll", "el", "▁w", "or", "ld"]


def spm_vocab(w):
    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    for b in range(256):
        toks.append(f"<0x{b:02X}>"), scores.append(0.0), types.append(6)
    for i, p in enumerate(SPM_PIECES):
        toks.append(p), scores.append(-float(i)), types.append(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template("{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}")  # a format nabla does not know
    return len(toks)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BPE_MERGES = ["Ġ t", "h e", "Ġt he", "a t", "Ġ c", "Ġc at", "Ġ s", "Ġs at", "o n", "Ġ on", "Ġ m", "Ġm at",
              "e a", "Ġt ea", "e r", "l l", "Ġ w", "o r", "l d", "Ġ ĠĠ", "Ġ Ġ"]


def bpe_vocab(w):
    enc = bytes_to_unicode()
    toks = [enc[b] for b in range(256)]
    for m in BPE_MERGES:
        a, b = m.split(" ")
        if a + b not in toks:
            toks.append(a + b)
    toks.append("<|endoftext|>")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(toks)
    w.add_token_types([1] * (len(toks) - 1) + [3])
    w.add_token_merges(BPE_MERGES)
    w.add_eos_token_id(len(toks) - 1)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    return len(toks)


def vocab_golden(name, vocab, seed):
    path = os.path.join(HERE, name)
    write_model(path, vocab, seed)
    llm = Llama(model_path=path, n_ctx=64, vocab_only=True, verbose=False)
    texts = [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=True, special=False)} for t in TEXTS]
    ids = texts[0]["ids"]
    llm, logits = run(path, ids)
    greedy = []  # llama.cpp's greedy continuation of the first text
    llm.reset()
    for t in llm.generate(ids, temp=0):
        greedy.append(t)
        if len(greedy) == 8:
            break
    return {"file": name, "texts": texts, "prompt_ids": ids, "logits": logits, "greedy": greedy}


def llamacpp_quantized(rng):
    """A Llama of width 256 (K-quant super-blocks) written in F32 by gguf-py
    and quantized by llama.cpp itself to Q4_K_M (Q4_K and Q6_K tensors mixed
    as llama-quantize chooses), checked in as q4_k_m_tiny.gguf; its
    logits through llama.cpp, and through llama.cpp on an F32 copy of the
    weights gguf-py dequantized."""
    import ctypes
    import llama_cpp
    name = "q4_k_m_tiny.gguf"
    out = os.path.join(HERE, name)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        d, ff, nh, nkv = 256, 256, 4, 2
        hd = d // nh
        w = gguf.GGUFWriter(f32, arch="llama")
        for k, v in (("context_length", 64), ("embedding_length", d), ("block_count", 1), ("feed_forward_length", ff)):
            w.add_uint32("llama." + k, v)
        w.add_rope_dimension_count(hd)
        w.add_head_count(nh)
        w.add_head_count_kv(nkv)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_file_type(0)
        w.add_tokenizer_model("no_vocab")
        w.add_vocab_size(64)

        def mat(*shape, scale=0.15):
            return (rng.standard_normal(shape) * scale).astype(np.float32)

        w.add_tensor("token_embd.weight", mat(64, d, scale=1.0))
        w.add_tensor("blk.0.attn_norm.weight", 1 + mat(d, scale=0.1))
        w.add_tensor("blk.0.attn_q.weight", permute(mat(nh * hd, d), nh))
        w.add_tensor("blk.0.attn_k.weight", permute(mat(nkv * hd, d), nkv))
        w.add_tensor("blk.0.attn_v.weight", mat(nkv * hd, d))
        w.add_tensor("blk.0.attn_output.weight", mat(d, nh * hd))
        w.add_tensor("blk.0.ffn_norm.weight", 1 + mat(d, scale=0.1))
        w.add_tensor("blk.0.ffn_gate.weight", mat(ff, d))
        w.add_tensor("blk.0.ffn_up.weight", mat(ff, d))
        w.add_tensor("blk.0.ffn_down.weight", mat(d, ff))
        w.add_tensor("output_norm.weight", 1 + mat(d, scale=0.1))
        w.add_tensor("output.weight", mat(64, d))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
        p.nthread = 1
        assert llama_cpp.llama_model_quantize(f32.encode(), out.encode(), ctypes.byref(p)) == 0
        _, logits = run(out, Q_PROMPT)
        dequantized_copy(out, os.path.join(tmp, "deq.gguf"))
        _, as_f32 = run(os.path.join(tmp, "deq.gguf"), Q_PROMPT)
    types = sorted({t.tensor_type.name for t in gguf.GGUFReader(out).tensors})
    return {"file": name, "prompt_ids": Q_PROMPT, "types": types, "logits": logits, "logits_as_f32": as_f32}


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    out = {"prompt_ids": PROMPT, "exports": {}}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.check_call([os.path.abspath(os.path.join(build, "models_test_gguf")), "--write", tmp], cwd=ROOT)
        for t in ("f32", "f16", "q8_0", "q4_0", "gpt2_f32", "gpt2_q8_0", "q4_k"):
            path = os.path.join(tmp, t + ".gguf")
            _, out["exports"][t] = run(path, PROMPT)
            dequantized_copy(path, path + ".f32")
            _, out["exports"][t + "_as_f32"] = run(path + ".f32", PROMPT)
        # the Hugging Face tiny Llama nabla exported: llama.cpp's ids for its
        # prompt, logits, greedy continuation (transformers' are in
        # hf_llama_tiny.json)
        with open(os.path.join(HERE, "hf_llama_tiny.json")) as f:
            hf = json.load(f)
        llm, logits = run(os.path.join(tmp, "hf_tiny.gguf"), hf["prompt_ids"])
        ids = llm.tokenize(hf["prompt"].encode(), add_bos=True, special=False)
        llm.reset()
        greedy = []
        for t in llm.generate(ids, temp=0):
            greedy.append(t)
            if len(greedy) == len(hf["greedy_ids"]):
                break
        out["hf_tiny"] = {"prompt_ids": ids, "logits": logits, "greedy": greedy}
        # the SentencePiece-style tokenizers nabla exported: llama.cpp's ids
        # for every text of the tokenizer tests (special tokens as text)
        with open(os.path.join(ROOT, "tests/tokenizer/golden/texts.json")) as f:
            texts = [bytes.fromhex(h) for h in json.load(f)["texts"]]
        out["tok_exports"] = {}
        for name in ("tok_spm", "tok_spm_ws", "tok_hf_llama"):
            llm = Llama(model_path=os.path.join(tmp, name + ".gguf"), vocab_only=True, verbose=False)
            out["tok_exports"][name] = [llm.tokenize(t, add_bos=False, special=False) for t in texts]
    out["spm"] = vocab_golden("spm_tiny.gguf", spm_vocab, 1)
    out["bpe"] = vocab_golden("bpe_tiny.gguf", bpe_vocab, 2)
    out["q4_k_m"] = llamacpp_quantized(np.random.default_rng(3))
    with open(os.path.join(HERE, "gguf_llamacpp.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
