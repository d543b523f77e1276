#!/usr/bin/env python3
"""Single-stream greedy decode, nabla against llama.cpp, side by side in one run.

Claim under test (issue 14, "Performance"): single-stream decode tokens/s at
least 1.0x llama.cpp's on the same f32 weights and threads, and how far each
is from the memory-bandwidth floor.

The model is a random Llama-architecture one (default: d_model 768, 12
layers, 12 heads, ffn 2048, vocab 32000: 134M parameters), written once from
a seed as a Hugging Face folder (config.json + model.safetensors, which
`nabla generate --hf` and bench_serve_decode load) and as GGUF f32 with the
`gguf` package's writer (q and k rows permuted as llama.cpp's converter
does, so both sides compute the same function and their greedy ids can be
compared). No tokenizer: the prompt is token ids (the bytes of a short
text), given to both sides as ids.

--arch gpt2: gpt2-124m's shape (d 768, 12 layers, 12 heads, ffn 3072, vocab
50257, 1024 learned positions, biases, LayerNorm, tanh GELU, tied head),
random, written as a Hugging Face GPT2LMHeadModel folder (transformers'
GPT2Config, safetensors) and converted to GGUF f32 by llama.cpp's own
convert_hf_to_gguf.py (--convert-python: a Python with transformers and
torch); nabla reads the same tensors from a run dir (nabla ckpt import),
since its Hugging Face loader reads Llama folders only. The vocabulary maps
byte b to id b on both sides.

Per round and thread count, each side in its own process:
  llama.cpp  llama_cpp.Llama(n_ctx = context, n_threads = n_threads_batch = T),
             prompt evaluated, then N greedy tokens (argmax of the logits)
             one llama_decode each; decode tok/s = (N - 1) / time of those.
  generate   `nabla generate --hf DIR (gpt2: --run-dir DIR/nabla) --temperature 0 --max-tokens N
             --threads T --max-seq-len context` (its own decode tok/s line).
  serve      build/bench_serve_decode --hf DIR: one request through
             nb_serve_engine + nb_serve_model_step.
Medians over rounds (rounds interleave the sides, so load drifts hit all).
"tok per CPU-s": decode tokens per CPU second of the process (llama, serve, generate):
at one thread the figure a busy machine's other processes do not stretch
(they still take memory bandwidth); at two it counts spinning threads.

Floor: weights a decode step reads (all parameters but the input embedding,
of which one row) plus the keys and values of the average context (prompt +
N/2 tokens), over the read bandwidth bench_serve_decode measures with the
same thread count (1 GiB buffer, best of 5).

--quant q8_0 | q4_0 (issue 15): llama.cpp runs the GGUF of that type that
`nabla quantize --format gguf --type TYPE` writes from the same HF folder
(q4_0 keeps output.weight at q6_k, as llama.cpp's quantizer does); nabla
runs the run dir `nabla quantize --rules` writes: int8 g32 (q8_0: the same
codes as Q8_0 up to the f16 rounding of its scales) or int4 g32 symmetric
(q4_0) for every linear, lm_head int8 g32 under q4_0 (more bytes than
llama.cpp's q6_k: conservative). The f32 side ("generate-f32", nabla on
the f32 HF folder) gives the speed-up over nabla's own f32 decode;
"generate-gguf" is nabla on llama.cpp's very file (its Q8_0 / Q4_0 linears
as int8 / int4 g32, with int8 per-32-block activations by default as llama.cpp
computes them: --gguf-act none for weight-only; q4_0's q6_k output.weight as
int8 g16 with the same activations). --act int8_block gives the run dir's rules act_qtype int8_block too.

Usage (the venv has llama-cpp-python, gguf, numpy, safetensors):
  /work/venv-llamacpp/bin/python bench/decode_vs_llamacpp.py [--build build] [--rounds 3]
      [--tokens 128] [--threads 1,2] [--model-dir /tmp/nabla-llama134m] [--vocab 32000] ...
Not run by ctest: llama.cpp is a heavy peer.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

PROMPT_TEXT = "The quick brown fox"
FIRST_BYTE_ID = 3  # ids 0-2 are <unk> <s> </s>


def byte_chars():
    """GPT-2's byte-level alphabet: byte b -> a printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in keep]
    chars = {b: chr(b) for b in keep}
    chars.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return chars


def write_tokenizer(d, V):
    """A byte-level BPE without merges: byte b is id FIRST_BYTE_ID + b (the GGUF's <0xXX> ids), the rest fillers;
    no special tokens, so neither side stops early on an end-of-text id."""
    c = byte_chars()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[c[b]] = FIRST_BYTE_ID + b
    for i in range(len(vocab), V):
        vocab[f"<filler{i}>"] = i
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f)


ARCH_DEFAULTS = {  # --arch: model folder, vocabulary, ffn, first byte id, the id llama.cpp would stop at
    "llama": dict(model_dir="/tmp/nabla-bench-llama134m", vocab=32000, ffn=2048, first_byte=3, eos=2),
    "gpt2": dict(model_dir="/tmp/nabla-bench-gpt2-124m", vocab=50257, ffn=3072, first_byte=0, eos=50256),
}
VENDOR = "/work/llamacpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp"


def add_model_args(ap):
    """The model's options, which make_model reads (shared with serve_vs_llamacpp.py). --arch gpt2 is
    GPT-2 small's shape (d 768, 12 layers, 12 heads, ffn 3072, vocab 50257, 1024 positions, tied head)."""
    ap.add_argument("--arch", choices=sorted(ARCH_DEFAULTS), default="llama")
    ap.add_argument("--model-dir", default=None, help="default: by --arch, under /tmp")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=None, help="default: by --arch (gpt2: 4 x d-model)")
    ap.add_argument("--vocab", type=int, default=None, help="default: by --arch")
    ap.add_argument("--convert-python", default="/tmp/venv-conv/bin/python",
                    help="--arch gpt2: a Python with transformers and torch for llama.cpp's convert_hf_to_gguf.py")
    ap.add_argument("--llama-vendor", default=VENDOR, help="llama.cpp's source folder (convert_hf_to_gguf.py)")


def fill_arch_defaults(a):
    d = ARCH_DEFAULTS[a.arch]
    for k in ("model_dir", "vocab", "ffn"):
        if getattr(a, k) is None:
            setattr(a, k, d[k])
    a.first_byte_id, a.eos_id = d["first_byte"], d["eos"]
    if a.arch == "gpt2" and a.ffn != 4 * a.d_model:
        sys.exit("--arch gpt2: llama.cpp's converter takes ffn = 4 x d-model")


def prompt_ids(a, text):
    """ids of an ASCII text on both sides: one token per byte"""
    return [a.first_byte_id + b for b in text.encode()]


def nabla_model_args(a):
    """how nabla generate / serve / bench_serve_decode are told the model"""
    return ["--hf", a.model_dir] if a.arch == "llama" else ["--run-dir", os.path.join(a.model_dir, "nabla")]


def nabla_serve_model(a):
    return a.model_dir if a.arch == "llama" else os.path.join(a.model_dir, "nabla")


def make_model(a):
    """Writes the model under --model-dir once (seeded); returns the GGUF file's path."""
    fill_arch_defaults(a)
    d = a.model_dir
    return make_gpt2(d, a) if a.arch == "gpt2" else make_llama(d, a)


def make_llama(d, a):
    """The HF folder (nabla reads it) and the GGUF file, written here with gguf's writer."""
    import numpy as np

    gguf_path = os.path.join(d, "model-f32.gguf")
    if os.path.exists(gguf_path):
        if not os.path.exists(os.path.join(d, "tokenizer.json")):
            write_tokenizer(d, a.vocab)
        return gguf_path
    from safetensors.numpy import save_file
    import gguf

    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    D, L, H, F, V = a.d_model, a.layers, a.heads, a.ffn, a.vocab
    hd = D // H

    def w(out_dim, in_dim):  # PyTorch layout [out, in]
        return (rng.standard_normal((out_dim, in_dim), dtype=np.float32) * 0.02).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, D), "model.norm.weight": np.ones(D, np.float32), "lm_head.weight": w(V, D)}
    for i in range(L):
        p = f"model.layers.{i}."
        for n in "qkvo":
            t[p + f"self_attn.{n}_proj.weight"] = w(D, D)
        t[p + "mlp.gate_proj.weight"] = w(F, D)
        t[p + "mlp.up_proj.weight"] = w(F, D)
        t[p + "mlp.down_proj.weight"] = w(D, F)
        t[p + "input_layernorm.weight"] = np.ones(D, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(D, np.float32)
    save_file(t, os.path.join(d, "model.safetensors"))
    write_tokenizer(d, V)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "intermediate_size": F,
           "num_attention_heads": H, "num_key_value_heads": H, "num_hidden_layers": L, "vocab_size": V,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
           "tie_word_embeddings": False, "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)

    def permute(x, n_head):  # HF's rotate-half rows -> llama.cpp's interleaved pairs (its converter's permute)
        return x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    g = gguf.GGUFWriter(gguf_path + ".tmp", "llama")
    g.add_name("nabla-bench-llama")
    g.add_context_length(2048)
    g.add_embedding_length(D)
    g.add_block_count(L)
    g.add_feed_forward_length(F)
    g.add_head_count(H)
    g.add_head_count_kv(H)
    g.add_rope_dimension_count(hd)
    g.add_rope_freq_base(10000.0)
    g.add_layer_norm_rms_eps(1e-5)
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    g.add_vocab_size(V)
    # a SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens, fillers
    toks, types = [b"<unk>", b"<s>", b"</s>"], [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    toks += [f"<0x{i:02X}>".encode() for i in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    toks += [f"t{i}".encode() for i in range(len(toks), V)]
    types += [gguf.TokenType.NORMAL] * (V - len(types))
    g.add_tokenizer_model("llama")
    g.add_token_list(toks)
    g.add_token_scores([0.0] * V)
    g.add_token_types(types)
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)
    g.add_add_bos_token(False)
    g.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    g.add_tensor("output_norm.weight", t["model.norm.weight"])
    g.add_tensor("output.weight", t["lm_head.weight"])
    for i in range(L):
        p = f"model.layers.{i}."
        g.add_tensor(f"blk.{i}.attn_q.weight", permute(t[p + "self_attn.q_proj.weight"], H))
        g.add_tensor(f"blk.{i}.attn_k.weight", permute(t[p + "self_attn.k_proj.weight"], H))
        g.add_tensor(f"blk.{i}.attn_v.weight", t[p + "self_attn.v_proj.weight"])
        g.add_tensor(f"blk.{i}.attn_output.weight", t[p + "self_attn.o_proj.weight"])
        g.add_tensor(f"blk.{i}.ffn_gate.weight", t[p + "mlp.gate_proj.weight"])
        g.add_tensor(f"blk.{i}.ffn_up.weight", t[p + "mlp.up_proj.weight"])
        g.add_tensor(f"blk.{i}.ffn_down.weight", t[p + "mlp.down_proj.weight"])
        g.add_tensor(f"blk.{i}.attn_norm.weight", t[p + "input_layernorm.weight"])
        g.add_tensor(f"blk.{i}.ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    os.rename(gguf_path + ".tmp", gguf_path)
    return gguf_path


GPT2_CONVERT = """
import sys
vendor = sys.argv[1]  # llama.cpp's folder: its conversion package and gguf-py
sys.path[:0] = [vendor, vendor + "/gguf-py"]
from transformers import GPT2Config
hf, out, V, D, L, H = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8])
GPT2Config(vocab_size=V, n_positions=1024, n_ctx=1024, n_embd=D, n_layer=L, n_head=H, activation_function="gelu_new",
           layer_norm_epsilon=1e-5, bos_token_id=V - 1, eos_token_id=V - 1, tie_word_embeddings=True,
           architectures=["GPT2LMHeadModel"]).save_pretrained(hf)
import torch
# Debian's torch 1.13 predates the float8 dtypes that the converter only names in its dtype tables
for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8)
import conversion.base
# the converter names a BPE pre-tokenizer by the hash of its tokens for a test text, known only for
# published tokenizers; this one is GPT-2's (ByteLevel with GPT-2's regex) without merges
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import runpy
sys.argv = [vendor + "/convert_hf_to_gguf.py", hf, "--outtype", "f32", "--outfile", out]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def make_gpt2(d, a):
    """GPT-2 (random, seeded) three ways from the same numbers:
    d/hf     a Hugging Face GPT2LMHeadModel folder: config.json by transformers' GPT2Config, model.safetensors
             (HF names, Conv1D [in, out] layout, fused c_attn, tied head), a byte-level tokenizer.json;
    d/model-f32.gguf  that folder through llama.cpp's own convert_hf_to_gguf.py --outtype f32;
    d/nabla  a nabla run dir (config.yaml: preset gpt2-124m's family with these sizes, byte-level
             tokenizer; checkpoints/ step 0 imported with `nabla ckpt import --hf-names` from the same
             tensors under nabla's paths: c_attn split into wq, wk, wv)."""
    import numpy as np
    from safetensors.numpy import save_file

    gguf_path = os.path.join(d, "model-f32.gguf")
    if os.path.exists(gguf_path):
        return gguf_path
    hf, nd = os.path.join(d, "hf"), os.path.join(d, "nabla")
    os.makedirs(hf, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    D, L, H, V, F, P = a.d_model, a.layers, a.heads, a.vocab, a.ffn, 1024

    def r(*shape, std=0.02, mean=0.0):
        return (mean + rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    t = {"transformer.wte.weight": r(V, D), "transformer.wpe.weight": r(P, D, std=0.01),
         "transformer.ln_f.weight": r(D, std=0.1, mean=1.0), "transformer.ln_f.bias": r(D)}
    for i in range(L):
        p = f"transformer.h.{i}."
        t[p + "ln_1.weight"], t[p + "ln_1.bias"] = r(D, std=0.1, mean=1.0), r(D)
        t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"] = r(D, 3 * D), r(3 * D)
        t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"] = r(D, D), r(D)
        t[p + "ln_2.weight"], t[p + "ln_2.bias"] = r(D, std=0.1, mean=1.0), r(D)
        t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"] = r(D, F), r(F)
        t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"] = r(F, D), r(D)
    save_file(t, os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})
    write_gpt2_tokenizer(hf, V)

    # nabla's tree: the same arrays under its paths (kernels are [in, out] like Conv1D's)
    n = {"embed.embedding": t["transformer.wte.weight"], "pos_embed.embedding": t["transformer.wpe.weight"],
         "final_norm.scale": t["transformer.ln_f.weight"], "final_norm.bias": t["transformer.ln_f.bias"]}
    for i in range(L):
        p, q = f"transformer.h.{i}.", f"layers.{i}."
        n[q + "attn_norm.scale"], n[q + "attn_norm.bias"] = t[p + "ln_1.weight"], t[p + "ln_1.bias"]
        w, b = t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"]
        for k, name in enumerate("qkv"):
            n[q + f"attn.w{name}.kernel"] = np.ascontiguousarray(w[:, k * D:(k + 1) * D])
            n[q + f"attn.w{name}.bias"] = np.ascontiguousarray(b[k * D:(k + 1) * D])
        n[q + "attn.wo.kernel"], n[q + "attn.wo.bias"] = t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"]
        n[q + "mlp_norm.scale"], n[q + "mlp_norm.bias"] = t[p + "ln_2.weight"], t[p + "ln_2.bias"]
        n[q + "mlp.wi.kernel"], n[q + "mlp.wi.bias"] = t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"]
        n[q + "mlp.wo.kernel"], n[q + "mlp.wo.bias"] = t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"]
    shutil.rmtree(nd, ignore_errors=True)  # a run that failed after the import left a step 0 that import refuses
    os.makedirs(nd)
    st = os.path.join(d, "nabla-params.safetensors")
    save_file(n, st)
    with open(os.path.join(nd, "config.yaml"), "w") as f:
        f.write(f"model:\n  preset: gpt2-124m\n  vocab_size: {V}\n  d_model: {D}\n  n_layers: {L}\n  n_heads: {H}\n"
                f"  n_kv_heads: {H}\n  d_ff: {F}\n  max_seq_len: {P}\n  dropout: 0.0\n"
                "data:\n  tokenizer: \"\"\nseed: 0\n")
    nabla = os.path.join(getattr(a, "build", "build"), "nabla")
    run([nabla, "ckpt", "import", st, os.path.join(nd, "checkpoints"), "--step", "0", "--item", "params", "--hf-names"])
    os.remove(st)

    out = run([a.convert_python, "-c", GPT2_CONVERT, a.llama_vendor, hf, gguf_path + ".tmp", str(V), str(D), str(L), str(H)])
    if not os.path.exists(gguf_path + ".tmp"):
        sys.exit("convert_hf_to_gguf.py wrote no file:\n" + out[-3000:])
    os.rename(gguf_path + ".tmp", gguf_path)
    return gguf_path


def write_gpt2_tokenizer(d, V):
    """GPT-2's byte-level BPE: byte b is id b (so a text of n bytes is the same n ids for nabla's byte-level
    tokenizer and for llama.cpp), fillers up to V - 1, <|endoftext|> = V - 1 as GPT-2's. One merge (two NUL
    bytes, id 256), as llama.cpp refuses a BPE vocabulary without merges; no ASCII text ever uses it."""
    c = byte_chars()
    vocab = {c[b]: b for b in range(256)}
    vocab[c[0] + c[0]] = 256
    for i in range(257, V - 1):
        vocab[f"<filler{i}>"] = i
    vocab["<|endoftext|>"] = V - 1
    eot = {"id": V - 1, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": True, "special": True}
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [eot], "normalizer": None,
           "pre_tokenizer": bl, "post_processor": bl, "decoder": bl,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                     "merges": [[c[0], c[0]]]}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "add_prefix_space": False,
                   "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, f)


QUANT_RULES = {
    "q8_0": "quant:\n  rules:\n    - {module_path: '.*', weight_qtype: int8, tile_size: 32}\n",
    "q4_0": "quant:\n  rules:\n    - {module_path: lm_head, weight_qtype: int8, tile_size: 32}\n"
            "    - {module_path: '.*', weight_qtype: int4, tile_size: 32}\n",
}


def make_quantized(nabla, d, quant, w8a8=False, rules_file=None, act="none"):
    """The GGUF of type quant (llama.cpp's side) and nabla's run dir quantized by rules, written once.
    w8a8 (q8_0 only): int8 g32 weights with int8 dynamic activations, which is what llama.cpp's
    Q8_0 product does on the CPU (it quantizes the activations to Q8_0 blocks)."""
    d = d.rstrip("/")  # outputs beside the HF folder (nabla quantize refuses to write into its input)
    gguf_path = f"{d}-{quant}.gguf"
    if not os.path.exists(gguf_path):
        run([nabla, "quantize", d, "--format", "gguf", "--type", quant, "-o", gguf_path])
    tag = quant + ("-w8a8" if w8a8 else "") + ("" if act == "none" else "-" + act)
    if rules_file:  # nabla's side quantized by these rules instead
        tag = os.path.splitext(os.path.basename(rules_file))[0]
    run_dir = f"{d}-nabla-{tag}"
    if rules_file and not os.path.exists(run_dir):
        run([nabla, "quantize", d, "--rules", rules_file, "-o", run_dir])
    if not os.path.exists(run_dir):
        rules = f"{d}-rules-{tag}.yaml"
        text = QUANT_RULES[quant]
        if w8a8:
            text = text.replace("tile_size: 32}", "tile_size: 32, act_qtype: int8_dynamic}")
        elif act != "none":
            text = text.replace("tile_size: 32}", f"tile_size: 32, act_qtype: {act}}}")
        with open(rules, "w") as f:
            f.write(text)
        run([nabla, "quantize", d, "--rules", rules, "-o", run_dir])
    return gguf_path, run_dir


def llama_worker(gguf_path, ids, n, threads, ctx):
    """Runs in a child process: prints 'RESULT llama decode_tok_s' and the ids."""
    import numpy as np
    import llama_cpp

    llm = llama_cpp.Llama(model_path=gguf_path, n_ctx=ctx, n_batch=64, n_threads=threads, n_threads_batch=threads,
                          logits_all=False, verbose=False)
    out = []
    for rep in range(2):  # the first run warms up (page cache, first-touch of the KV cache)
        llm.reset()
        llm.eval(ids)
        out = []
        t0 = c0 = None
        for i in range(n):
            logits = llm._ctx.get_logits()  # the last evaluated position's row
            tok = int(np.argmax(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),))))
            out.append(tok)
            if i == 0:
                t0, c0 = time.perf_counter(), time.process_time()
            if i + 1 < n:
                llm.eval([tok])
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print("RESULT llama %.4f %.4f" % ((n - 1) / dt, (n - 1) / dc))
    print("IDS " + ",".join(map(str, out)))


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", default="1,2")
    add_model_args(ap)
    ap.add_argument("--sides", default=None, help="default llama,generate,serve; with --quant llama,generate,generate-gguf,generate-f32")
    ap.add_argument("--quant", choices=["none", "q8_0", "q4_0"], default="none")
    ap.add_argument("--nabla-rules", help="with --quant: a rules file for nabla's side instead of the built-in ones")
    ap.add_argument("--w8a8", action="store_true", help="with --quant q8_0: nabla's int8 weights with int8 dynamic activations")
    ap.add_argument("--act", choices=["none", "int8_block"], default="none",
                    help="with --quant: nabla's rules' act_qtype (int8_block: x int8 per 32, llama.cpp's arithmetic)")
    ap.add_argument("--gguf-act", choices=["none", "int8_block"], default="int8_block",
                    help="generate-gguf's --gguf-act (nabla's default: int8_block)")
    ap.add_argument("--serve-reps", type=int, default=2)
    ap.add_argument("--llama-worker", nargs=5, metavar=("GGUF", "IDS", "N", "T", "CTX"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.llama_worker:
        g, ids, n, t, ctx = a.llama_worker
        llama_worker(g, [int(x) for x in ids.split(",")], int(n), int(t), int(ctx))
        return
    gguf_path = make_model(a)
    ids = prompt_ids(a, PROMPT_TEXT)
    N = a.tokens
    ctx = 256
    while ctx < len(ids) + N:
        ctx *= 2
    nabla = os.path.join(a.build, "nabla")
    sides = (a.sides or ("llama,generate,serve" if a.quant == "none" else "llama,generate,generate-gguf,generate-f32")).split(",")
    run_dir = None
    if a.quant != "none":
        if a.arch != "llama":
            sys.exit("--quant goes with --arch llama (the quantized run dir is made from the Llama HF folder)")
        if a.w8a8 and a.quant != "q8_0":
            sys.exit("--w8a8 goes with --quant q8_0 (W8A8 needs int8 weights)")
        gguf_path, run_dir = make_quantized(nabla, a.model_dir, a.quant, a.w8a8, a.nabla_rules, a.act)
    serve_bench = os.path.join(a.build, "bench_serve_decode")
    res = {}  # (side, T) -> [tok/s]
    cpu = {}  # (side, T) -> [tokens per CPU second of the process] (llama, serve)
    floor = {}  # T -> [(floor tok/s, bytes, GB/s)]
    last_ids = {}
    for r in range(a.rounds):
        for T in [int(x) for x in a.threads.split(",")]:
            for side in sides:
                if side == "llama":
                    out = run([sys.executable, __file__, "--llama-worker", gguf_path, ",".join(map(str, ids)), str(N), str(T),
                               str(ctx)])
                    f = re.search(r"RESULT llama (\S+) (\S+)", out)
                    v = float(f.group(1))
                    cpu.setdefault((side, T), []).append(float(f.group(2)))
                elif side.startswith("generate"):
                    src = (["--run-dir", run_dir] if run_dir and side == "generate" else
                           ["--gguf", gguf_path, "--gguf-act", a.gguf_act] if side == "generate-gguf" else nabla_model_args(a))
                    out = run([nabla, "generate", *src, "--prompt", PROMPT_TEXT, "--temperature", "0",
                               "--max-tokens", str(N), "--threads", str(T), "--max-seq-len", str(ctx), "--show-ids"])
                    v = float(re.search(r"decode\s+\S+ ms\s+(\S+) tokens/s", out).group(1))
                    f = re.search(r"decode CPU\s+\S+ ms\s+(\S+) tokens per CPU-s", out)
                    if f:
                        cpu.setdefault((side, T), []).append(float(f.group(1)))
                    m = re.search(r"generated ids:([0-9 ]*)", out)
                    if m:
                        out = "IDS " + ",".join(m.group(1).split())
                else:
                    out = run([serve_bench, *nabla_model_args(a), "--prompt-ids", ",".join(map(str, ids)), "--tokens", str(N),
                               "--reps", str(a.serve_reps), "--threads", str(T), "--ids"])
                    f = re.search(r"RESULT serve \S+ (\S+) (\S+) (\S+) (\S+) (\S+)", out)
                    v = float(f.group(1))
                    cpu.setdefault((side, T), []).append(float(f.group(5)))
                    floor.setdefault(T, []).append((float(f.group(2)), float(f.group(3)), float(f.group(4))))
                m = re.search(r"IDS (\S+)", out)
                if m:
                    last_ids[side] = m.group(1).split(",")
                res.setdefault((side, T), []).append(v)
                print(f"round {r + 1} T={T} {side}: {v:.2f} tok/s", flush=True)
    print()
    print(f"model: {a.arch} {a.model_dir} (d {a.d_model}, {a.layers} layers, {a.heads} heads, ffn {a.ffn}, vocab {a.vocab}, f32), "
          f"prompt {len(ids)} ids, {N} greedy tokens, context {ctx}, {a.rounds} rounds"
          + (f"; quant {a.quant}: llama.cpp {os.path.basename(gguf_path)}, nabla {run_dir} (generate-f32: the f32 HF folder)"
             if run_dir else ""))
    if "llama" in last_ids:
        for s in sides:
            if s != "llama" and s in last_ids:
                same = 0
                for x, y in zip(last_ids[s], last_ids["llama"]):
                    if x != y:
                        break
                    same += 1
                print(f"greedy ids: {s} agrees with llama.cpp on the first {same} of {N}")
    print()
    print("| threads | side | decode tok/s (median) | all rounds | vs llama.cpp | floor tok/s | of floor | tok per CPU-s |")
    print("|---|---|---|---|---|---|---|---|")
    for T in [int(x) for x in a.threads.split(",")]:
        fl = statistics.median([f[0] for f in floor[T]]) if T in floor else float("nan")
        base = statistics.median(res[("llama", T)]) if ("llama", T) in res else float("nan")
        for side in sides:
            v = res[(side, T)]
            med = statistics.median(v)
            c = f"{statistics.median(cpu[(side, T)]):.2f}" if (side, T) in cpu else "-"
            print(f"| {T} | {side} | {med:.2f} | {', '.join('%.2f' % x for x in v)} | {med / base:.2f}x | {fl:.1f} | "
                  f"{100 * med / fl:.0f}% | {c} |")
        if ("generate", T) in res and ("generate-f32", T) in res:
            print(f"nabla quantized over nabla f32, T={T}: "
                  f"{statistics.median(res[('generate', T)]) / statistics.median(res[('generate-f32', T)]):.2f}x")
    for T, f in sorted(floor.items()):
        print(f"floor T={T}: {statistics.median([x[1] for x in f]) / 1e6:.1f} MB/token, read bandwidth "
              f"{', '.join('%.1f' % x[2] for x in f)} GB/s")


if __name__ == "__main__":
    main()
