"""Writes a tiny random Llama in Hugging Face format, and what PyTorch +
transformers compute with it, for nabla's Hugging Face loader and generator.

  hf_llama_tiny/config.json         LlamaConfig (GQA, Llama-3.1 RoPE scaling, untied head)
  hf_llama_tiny/model.safetensors   f32 weights under HF names ([out, in] linears)
  hf_llama_tiny/tokenizer.json      a byte-level BPE trained here with `tokenizers`
  hf_llama_tiny.json                prompt text and ids, logits for the prompt,
                                    the greedy continuation of LlamaForCausalLM.generate

Run with Debian's PyTorch (apt-get install python3-torch; never pip's, which
pulls CUDA) and transformers/tokenizers/safetensors from PyPI, e.g.:
  /usr/bin/python3 -m venv --system-site-packages /tmp/hf
  /tmp/hf/bin/pip install "transformers<4.50" tokenizers safetensors
  /tmp/hf/bin/python tests/models/golden/make_hf_llama_tiny.py
"""
import json
import os

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

# Debian's torch 1.13 cannot import torch.distributed.fsdp under Python 3.11
# (a dataclass default error), and generate() asks it whether the model is
# FSDP-wrapped; it is not.
transformers.generation.utils.is_fsdp_managed_module = lambda module: False

OUT = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(OUT, "hf_llama_tiny")
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Llama 3's split pattern (cl100k's)
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = """In the beginning the model knew nothing, and every token was as likely as any other.
Then came the data: words and numbers, 1234 and 5678, sentences that ended and began again.
The tokenizer learned its merges from this text; the weights are random all the same.
A tiny model, two layers deep, four heads that share two keys and values, runs on the CPU.
Its logits are compared with nabla's to the last few bits of a float, token by token.
"""
PROMPT = "The tokenizer learned its merges"


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 4, trainer)
    return tok


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # RMSNorm scales around 1
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def main():
    os.makedirs(DIR, exist_ok=True)
    tok = train_tokenizer()
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    vocab = (tok.get_vocab_size() + 7) // 8 * 8  # padded, as real models pad their embeddings
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                      bos_token_id=bos, eos_token_id=eos, attn_implementation="eager")
    ids = [bos] + tok.encode(PROMPT).ids
    n_new = 12
    # a seed whose greedy path has clear winners (no near-ties that float
    # rounding could flip) and never emits eos
    for seed in range(100):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).eval()
        randomize(model, seed)
        with torch.no_grad():
            x = torch.tensor([ids])
            logits = model(x).logits[0].float()
            gen = model.generate(x, max_new_tokens=n_new, do_sample=False, eos_token_id=None, pad_token_id=eos,
                                 output_scores=True, return_dict_in_generate=True)
        new = gen.sequences[0, len(ids):].tolist()
        margin = min(float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in gen.scores)
        if len(new) == n_new and eos not in new and margin > 1e-2:
            break
    model.save_pretrained(DIR, safe_serialization=True)
    gc = os.path.join(DIR, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    os.chmod(os.path.join(DIR, "model.safetensors"), 0o644)
    tok.save(os.path.join(DIR, "tokenizer.json"))
    golden = {
        "reference": "transformers %s LlamaForCausalLM (eager attention), torch %s, tokenizers %s"
                     % (transformers.__version__, torch.__version__, __import__("tokenizers").__version__),
        "seed": seed, "prompt": PROMPT, "prompt_ids": ids,
        "logits_shape": list(logits.shape), "logits": [float("%.9g" % v) for v in logits.reshape(-1).tolist()],  # f32 round-trips
        "greedy_ids": new, "greedy_text": tok.decode(new), "greedy_min_margin": margin,
    }
    with open(os.path.join(OUT, "hf_llama_tiny.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print("hf llama tiny: vocab %d, seed %d, prompt %d ids, greedy %s (min margin %.3g)" % (vocab, seed, len(ids), new, margin))


if __name__ == "__main__":
    main()
