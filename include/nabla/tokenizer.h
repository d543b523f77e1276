/* nabla tokenizer: the data library's tokenizers.
 *
 * Loads GPT-2 style `vocab.json` + `merges.txt`, Hugging Face
 * `tokenizer.json` files (BPE, byte-level as GPT-2 / Llama-3 / Qwen2 or
 * SentencePiece-style with "▁" for spaces and <0xNN> byte fallback as
 * Llama-2 / Gemma; Unigram as T5 / ALBERT; WordPiece as BERT) and
 * SentencePiece `tokenizer.model` files (BPE and Unigram), encodes text to ids
 * and decodes ids back, and trains new byte-level BPE vocabularies, saved as
 * a tokenizer.json that both nabla and the Python `tokenizers` package load.
 * docs/tokenizers.md lists the supported components and how each is checked
 * against `tokenizers` / `sentencepiece`.
 *
 * Encoding: added/special tokens are matched first (leftmost-longest, in the
 * raw text); each remaining segment is normalized (NFC/NFKC/..., lowercase,
 * BertNormalizer, a SentencePiece charsmap; "▁" for spaces in char-level
 * models), split by the pre-tokenizer (a PCRE2 regex, GPT-2 or cl100k/Llama-3
 * style, BertPreTokenizer, or the SentencePiece Metaspace rule) and each
 * piece is encoded by the model. BPE: repeatedly the adjacent pair with the
 * lowest merge rank, leftmost on ties; Unigram: the highest-scoring split
 * (Viterbi); WordPiece: longest vocabulary token first. With a
 * byte-level vocabulary that holds all 256 bytes, decode(encode(x)) == x for
 * every byte string x, invalid UTF-8 included: the regex runs only on valid
 * UTF-8 runs, and each run of invalid bytes is a piece of its own.
 *
 * Example:
 *
 *   nb_ctx *ctx = nb_ctx_create();
 *   nb_tok *tok = nb_tok_load(ctx, "models/gpt2");      // dir or tokenizer.json
 *   if (!tok) { fprintf(stderr, "%s\n", nb_ctx_error(ctx)); return 1; }
 *   nb_tok_ids ids = {0};
 *   nb_tok_encode(tok, "Hello world", 11, NULL, &ids);  // appends to ids
 *   nb_tok_text text = {0};
 *   nb_tok_decode(tok, ids.ids, ids.len, NULL, &text);  // "Hello world"
 *   nb_tok_text_free(tok, &text);
 *   nb_tok_ids_free(tok, &ids);
 *   nb_tok_destroy(tok);
 *   nb_ctx_destroy(ctx);
 *
 * Threads: a loaded tokenizer is immutable; nb_tok_encode / nb_tok_decode may
 * run on it from many threads at once (each with its own output buffers).
 * Errors go to the tokenizer's context (its message is thread-safe).
 */
#ifndef NABLA_TOKENIZER_H
#define NABLA_TOKENIZER_H

#include "nabla/export.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

/* Pre-tokenizer patterns (PCRE2 syntax, run with UTF + UCP). */
#define NB_TOK_PATTERN_GPT2 \
  "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* cl100k_base's pattern; Llama-3 uses the same one. */
#define NB_TOK_PATTERN_CL100K                                                              \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct nb_tok nb_tok;

typedef enum nb_tok_kind {
  NB_TOK_BYTE_LEVEL, /* tokens are byte strings (GPT-2 byte-to-unicode alphabet in files) */
  NB_TOK_CHAR_LEVEL, /* tokens are UTF-8 pieces, optionally with <0xNN> byte fallback */
  NB_TOK_KIND_COUNT
} nb_tok_kind;

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

/* Options for GPT-2 style vocab.json + merges.txt (zero-init = defaults). */
typedef struct nb_tok_gpt2_opts {
  const char *pattern;         /* NULL: NB_TOK_PATTERN_GPT2 */
  const char *const *special;  /* tokens of the vocabulary to treat as special; */
  int n_special;               /* with n_special == 0, "<|endoftext|>" if present */
} nb_tok_gpt2_opts;

/* Loads `path`: a tokenizer.json or SentencePiece model file (told apart by
 * their first bytes, whatever the file's name), or a directory holding
 * tokenizer.json, vocab.json + merges.txt, or tokenizer.model. Returns a new tokenizer (destroy it), or NULL
 * with an error on ctx naming the file and field that was wrong. */
nb_tok *nb_tok_load(nb_ctx *ctx, const char *path);
/* A Hugging Face tokenizer.json (BPE, Unigram or WordPiece model).
 * Unsupported components (a WordLevel model, a Precompiled normalizer, ...)
 * fail with NB_ERR_UNIMPLEMENTED naming the field. `name` (for messages) may
 * be NULL. */
nb_tok *nb_tok_load_hf(nb_ctx *ctx, const char *path);
nb_tok *nb_tok_load_hf_string(nb_ctx *ctx, const char *json, size_t len, const char *name);
/* GPT-2 style files (opts may be NULL). */
nb_tok *nb_tok_load_gpt2(nb_ctx *ctx, const char *vocab_path, const char *merges_path, const nb_tok_gpt2_opts *opts);
nb_tok *nb_tok_load_gpt2_strings(nb_ctx *ctx, const char *vocab_json, size_t vocab_len, const char *merges_txt,
                                 size_t merges_len, const nb_tok_gpt2_opts *opts);
/* A SentencePiece model file (tokenizer.model): BPE (as Llama-2's: merges
 * by score, whitespace-only pieces) or Unigram, "▁" for spaces, <0xNN> byte
 * fallback, the normalizer_spec's charsmap (nmt_nfkc, nfkc, custom rules)
 * and whitespace options, control pieces (<s>) never matched in text. WORD
 * and CHAR models fail with NB_ERR_UNIMPLEMENTED naming the field. */
nb_tok *nb_tok_load_sentencepiece(nb_ctx *ctx, const char *path);
nb_tok *nb_tok_load_sentencepiece_bytes(nb_ctx *ctx, const void *data, size_t len, const char *name);
/* A SentencePiece model from its pieces in memory (a GGUF file's
 * tokenizer.ggml.tokens / scores / token_type): BPE with merges by score as
 * a .model file of model_type BPE gives, "▁" for spaces, identity
 * normalization (no charsmap, extra whitespace kept). Types are
 * SentencePiece's: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
 * 6 byte. Pieces are copied. `name` is for messages. */
typedef struct nb_tok_spm_piece {
  const char *text;
  size_t len;
  float score;
  int type;
} nb_tok_spm_piece;
typedef struct nb_tok_spm_opts {
  bool byte_fallback;     /* <0xNN> pieces stand in for bytes no piece covers */
  bool add_dummy_prefix;  /* "▁" before the text, as add_dummy_prefix / add_space_prefix */
} nb_tok_spm_opts;
nb_tok *nb_tok_create_sentencepiece(nb_ctx *ctx, const nb_tok_spm_piece *pieces, size_t n, const nb_tok_spm_opts *opts,
                                    const char *name);
/* The other way: a char-level BPE tokenizer (a SentencePiece BPE .model,
 * or a tokenizer.json BPE with "▁" for spaces as Llama-2's) as pieces that
 * nb_tok_create_sentencepiece (and llama.cpp's "llama" vocabulary) turn
 * back into the same tokenizer: pieces[id] for id < nb_tok_vocab_size (text
 * pointing into t; unused ids get type 5 and an empty text), scores
 * -(rank of the first merge giving the piece) (0 for single characters,
 * bytes and special tokens), opts filled. NB_ERR_UNIMPLEMENTED naming what
 * cannot be expressed (byte-level or Unigram models, a normalizer, another
 * pre-tokenizer). */
nb_status nb_tok_sentencepiece_pieces(const nb_tok *t, nb_tok_spm_piece *pieces, size_t cap, nb_tok_spm_opts *opts);
void nb_tok_destroy(nb_tok *t); /* NULL is allowed */

/* ------------------------------------------------------------------------ */
/* Inspection                                                                */
/* ------------------------------------------------------------------------ */

nb_ctx *nb_tok_ctx(const nb_tok *t);
nb_tok_kind nb_tok_get_kind(const nb_tok *t);
int32_t nb_tok_vocab_size(const nb_tok *t);   /* largest id + 1 (ids may have holes) */
int32_t nb_tok_num_merges(const nb_tok *t);
/* The split pattern; NULL when none. Valid while t is alive. */
const char *nb_tok_pattern(const nb_tok *t);
/* True when every byte value has a token (byte-level round trip is exact). */
bool nb_tok_covers_all_bytes(const nb_tok *t);
/* True when text is changed before it is split (NFC/NFKC, lowercasing, a
 * SentencePiece charsmap, ...): then decode(encode(x)) may differ from x. */
bool nb_tok_has_normalizer(const nb_tok *t);
/* The token's bytes (raw bytes for byte-level, the piece for char-level, the
 * content for added tokens); NULL for an id out of range or unused. Valid
 * while t is alive. */
const uint8_t *nb_tok_token_bytes(const nb_tok *t, int32_t id, size_t *len);
/* The id of the (non-added) token with exactly these bytes, or -1. */
int32_t nb_tok_token_id(const nb_tok *t, const void *bytes, size_t len);
/* The id of the added token with this content, or -1. */
int32_t nb_tok_added_id(const nb_tok *t, const char *content);
bool nb_tok_is_special(const nb_tok *t, int32_t id);
int32_t nb_tok_num_added(const nb_tok *t);
int32_t nb_tok_added_at(const nb_tok *t, int32_t i); /* i in [0, nb_tok_num_added) */
/* The BPE merges by rank: pairs[2 r], pairs[2 r + 1] are the left and right
 * ids of the merge of rank r, for r < min(cap, nb_tok_num_merges). */
nb_status nb_tok_merges(const nb_tok *t, int32_t *pairs, size_t cap);

/* ------------------------------------------------------------------------ */
/* Encoding and decoding                                                     */
/* ------------------------------------------------------------------------ */

/* Growable outputs, owned by the caller: zero-init, pass to encode/decode
 * any number of times (they append), free with the *_free calls. */
typedef struct nb_tok_ids {
  int32_t *ids;
  size_t len, cap;
} nb_tok_ids;
typedef struct nb_tok_text {
  char *data; /* NUL-terminated after every successful decode */
  size_t len, cap;
} nb_tok_text;
void nb_tok_ids_free(const nb_tok *t, nb_tok_ids *ids);
void nb_tok_text_free(const nb_tok *t, nb_tok_text *text);

/* What to do with special tokens' text found in the input. Non-special added
 * tokens are always matched. */
typedef enum nb_tok_special {
  NB_TOK_SPECIAL_ALLOW,   /* encode it as the special token (as `tokenizers`) */
  NB_TOK_SPECIAL_AS_TEXT, /* encode it as ordinary text */
  NB_TOK_SPECIAL_ERROR,   /* fail with NB_ERR_INVALID_ARG (as tiktoken's default) */
  NB_TOK_SPECIAL_COUNT
} nb_tok_special;

typedef struct nb_tok_encode_opts {
  nb_tok_special special;
  /* Add the special tokens of the file's post-processor around the ids
   * (tokenizer.json TemplateProcessing / BertProcessing / RobertaProcessing:
   * BOS/EOS, [CLS] ... [SEP]), as `tokenizers`' add_special_tokens=True.
   * Off by default. SentencePiece .model files carry no such rule. */
  bool add_special_tokens;
} nb_tok_encode_opts;

/* Encodes len bytes of text (any bytes), appending ids to out. opts may be
 * NULL (= allow specials). Borrows everything. On error out keeps what was
 * appended before the call. */
nb_status nb_tok_encode(const nb_tok *t, const void *text, size_t len, const nb_tok_encode_opts *opts,
                        nb_tok_ids *out);

typedef struct nb_tok_decode_opts {
  bool skip_special; /* leave out special tokens' content */
} nb_tok_decode_opts;

/* Decodes n ids, appending the bytes to out (opts may be NULL). An id out of
 * range fails with NB_ERR_INVALID_ARG naming its position. */
nb_status nb_tok_decode(const nb_tok *t, const int32_t *ids, size_t n, const nb_tok_decode_opts *opts,
                        nb_tok_text *out);

/* ------------------------------------------------------------------------ */
/* Training and saving                                                       */
/* ------------------------------------------------------------------------ */

/* Byte-level BPE training. Ids: 0..255 are the bytes in byte order, then one
 * id per merge in the order learned, then the special tokens in the order
 * given. Each step merges the adjacent pair with the highest count over the
 * pre-tokenized corpus (pieces counted with multiplicity; special tokens'
 * text is cut out first); ties go to the pair with the smallest (left id,
 * right id). Training stops at vocab_size or when the best count is below
 * min_frequency. Deterministic for a fixed input: the result depends only on
 * the concatenated feeds' pieces, not on how the text was split into feeds
 * (provided feeds break at piece boundaries, e.g. at document ends). */
typedef struct nb_tok_train_opts {
  int32_t vocab_size;         /* total, including the 256 bytes and the specials */
  const char *pattern;        /* NULL: NB_TOK_PATTERN_GPT2 */
  const char *const *special; /* added as special tokens */
  int n_special;
  int64_t min_frequency;      /* 0 or 1: any pair seen at least once */
} nb_tok_train_opts;

typedef struct nb_tok_trainer nb_tok_trainer;
/* Returns a new trainer (destroy it), or NULL with an error (bad options, a
 * pattern that does not compile). Copies what it needs from opts. */
nb_tok_trainer *nb_tok_trainer_create(nb_ctx *ctx, const nb_tok_train_opts *opts);
/* Counts the pieces of len bytes of text. Borrows text. */
nb_status nb_tok_trainer_feed(nb_tok_trainer *tr, const void *text, size_t len);
/* Learns the merges; returns a new tokenizer (destroy it) or NULL. The
 * trainer may be destroyed afterwards and is not reusable. */
nb_tok *nb_tok_trainer_finish(nb_tok_trainer *tr);
void nb_tok_trainer_destroy(nb_tok_trainer *tr); /* NULL is allowed */

/* Writes t as a Hugging Face tokenizer.json (BPE model, Split + ByteLevel
 * pre-tokenizer, ByteLevel decoder). Byte-level tokenizers only; others fail
 * with NB_ERR_UNIMPLEMENTED. Written to path.tmp and renamed. */
nb_status nb_tok_save_hf(const nb_tok *t, const char *path);

NB_END_DECLS
#endif /* NABLA_TOKENIZER_H */
