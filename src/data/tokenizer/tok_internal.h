/* Private to the BPE tokenizer (src/data/tokenizer/): the nb_tok struct, the
 * token table and its hash maps, the pre-tokenizer state, and the cross-file
 * helpers (nb_tok__*). Not public: include/nabla/tokenizer.h is the API. */
#ifndef NABLA_TOK_INTERNAL_H
#define NABLA_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "nabla/tokenizer.h"

/* token flags */
enum {
  NB_TOK__F_SPECIAL = 1, /* an added token with special=true: governed by nb_tok_special mode */
  NB_TOK__F_ADDED = 2,   /* any added token: matched in raw text before pre-tokenization */
  NB_TOK__F_BYTE = 4,    /* a byte-fallback token <0xNN>: decodes to one byte */
  NB_TOK__F_PRESENT = 8, /* the id is used (vocabularies may have holes) */
  NB_TOK__F_LSTRIP = 16, /* added token swallows whitespace on its left */
  NB_TOK__F_RSTRIP = 32, /* ... and on its right */
  NB_TOK__F_HIDDEN = 64, /* never produced by encoding (SentencePiece control/unused/unknown) */
};

/* One token: `len` bytes at blob + off. For byte-level vocabularies the bytes
 * are the raw bytes (the GPT-2 byte-to-unicode mapping is undone at load);
 * for char-level (SentencePiece-style) ones they are the UTF-8 piece with its
 * "▁" kept. byte_value is the byte of a byte-fallback token, else -1. */
typedef struct nb_tok__token {
  uint32_t off, len;
  int16_t byte_value;
  uint8_t flags;
} nb_tok__token;

/* Open-addressing map from a pair of ids to its merge: rank (priority, lower
 * first) and the resulting id. key = left << 32 | right; empty = UINT64_MAX. */
typedef struct nb_tok__merge {
  uint64_t key;
  int32_t rank, result;
} nb_tok__merge;

typedef enum nb_tok__model { NB_TOK__MODEL_BPE, NB_TOK__MODEL_UNIGRAM, NB_TOK__MODEL_WORDPIECE } nb_tok__model;

typedef enum nb_tok__prepend { NB_TOK__PREPEND_NEVER, NB_TOK__PREPEND_FIRST, NB_TOK__PREPEND_ALWAYS } nb_tok__prepend;

/* One step of a tokenizer.json normalizer (normalize.c), in file order. */
typedef enum nb_tok__norm_kind {
  NB_TOK__NORM_NFC = 1,
  NB_TOK__NORM_NFKC,
  NB_TOK__NORM_NFD,
  NB_TOK__NORM_NFKD,
  NB_TOK__NORM_LOWERCASE,   /* Rust's char::to_lowercase */
  NB_TOK__NORM_STRIP_MARKS, /* drop category Mn (StripAccents) */
  NB_TOK__NORM_BERT_CLEAN,  /* drop NUL, U+FFFD and controls; whitespace -> ' ' */
  NB_TOK__NORM_BERT_CJK,    /* ' ' around CJK ideographs */
} nb_tok__norm_kind;
typedef struct nb_tok__norm_step {
  nb_tok__norm_kind kind;
} nb_tok__norm_step;
#define NB_TOK__MAX_NORM 16
#define NB_TOK__MAX_POST 8

/* Invariants: tokens[id] for id < n_tokens; every PRESENT non-added token's
 * bytes map back to its id in the vocab map (first id wins on duplicates);
 * every merge's result is a PRESENT token whose bytes are left ++ right. */
struct nb_tok {
  nb_ctx *ctx;
  nb_tok_kind kind;
  int32_t n_tokens, cap_tokens;
  int32_t id_limit;        /* ids must be below this (loaders: 4 x entries + 1024) */
  nb_tok__token *tokens;
  uint8_t *blob;
  size_t blob_len, blob_cap;
  /* bytes -> id (non-added tokens only); slots hold id + 1, 0 = empty */
  int32_t *vmap;
  size_t vmap_cap;
  nb_tok__merge *merges;
  size_t merges_cap;
  int32_t n_merges;
  int32_t byte_token[256]; /* byte-level: id of the one-byte token; char-level: <0xNN>; -1 none */
  bool all_bytes;          /* byte_token has no -1 */
  /* model options */
  nb_tok__model model;
  int32_t unk_id;          /* -1 none */
  /* Unigram: per-id scores, the score of an unknown character, float sums
   * (SentencePiece) */
  double *scores;
  double uni_unk_score;
  bool uni_f32;
  /* Unigram and WordPiece: the ids of the tokens they match, sorted by
   * bytes (prefix.c) */
  int32_t *sorted;
  int32_t n_sorted;
  /* WordPiece: continuing_subword_prefix, max_input_chars_per_word */
  char wp_prefix[16];
  int wp_max_chars;
  bool byte_fallback, fuse_unk, ignore_merges;
  /* Unicode normalizer steps, before everything below */
  nb_tok__norm_step norm[NB_TOK__MAX_NORM];
  int n_norm;
  /* normalizer (char-level): prepend `norm_prepend` to each segment, then
   * replace spaces by "▁" when norm_replace_space */
  char norm_prepend[8];
  bool norm_replace_space;
  bool spm_dummy_prefix;   /* SentencePiece: "▁" before the first segment (at byte 0) */
  /* SentencePiece's own normalizer (spm_norm.c) instead of the rules above:
   * a charsmap trie (none: identity) and its replacement strings */
  bool spm_normalizer, spm_remove_extra;
  uint32_t *spm_trie;
  size_t spm_trie_n;
  char *spm_strs;
  size_t spm_strs_len;
  /* pre-tokenizer */
  char *pattern;           /* regex split (NULL: none) */
  pcre2_code *re;
  bool jit;
  bool re_drop_gaps;       /* the matches are the pieces; text between them is dropped */
  bool add_prefix_space;   /* byte-level: prepend ' ' to a segment not starting with one */
  bool metaspace;          /* char-level Metaspace pre-tokenizer */
  nb_tok__prepend ms_prepend;
  bool ms_split;           /* a piece starts at each "▁" ... */
  bool ms_split_runs;      /* ... also inside a run of "▁" (else a run starts one piece) */
  /* post-processor (with add_special_tokens): ids before and after */
  int32_t post_prefix[NB_TOK__MAX_POST], post_suffix[NB_TOK__MAX_POST];
  int n_post_prefix, n_post_suffix;
  /* SentencePiece: what <unk> decodes to (trainer_spec.unk_surface) */
  char unk_surface[32];
  /* WordPiece decoder: tokens joined by ' ' except those with this prefix
   * (which is removed); then `tokenizers`' cleanup of spaces before
   * punctuation and contractions */
  bool wp_decoder, wp_cleanup;
  char wp_dec_prefix[16];
  /* decoder: strip this many leading spaces from a decode's output */
  int strip_leading;
  /* added tokens, longest first (for leftmost-longest matching) */
  int32_t *added;
  int32_t n_added;
  uint8_t added_first[32]; /* bitmap of first bytes of added tokens */
};

/* ---- vocab.c: building a tokenizer ---- */
nb_tok *nb_tok__create(nb_ctx *ctx, nb_tok_kind kind);
/* Sets token `id` (copies bytes). Fails on a duplicate id. */
nb_status nb_tok__set_token(nb_tok *t, int32_t id, const void *bytes, size_t len, uint8_t flags, const char *where);
/* Adds a merge of two present ids whose concatenation is a present token;
 * rank = insertion order unless rank >= 0. Duplicate pairs keep the first. */
nb_status nb_tok__add_merge(nb_tok *t, int32_t left, int32_t right, int32_t rank, const char *where);
/* Builds the bytes->id map (and byte tables); call after all tokens are set
 * and before merges are added. */
nb_status nb_tok__index(nb_tok *t, const char *where);
/* Derives merges from token ranks: every split of a token into two present
 * tokens becomes a merge whose rank is the token's rank (SentencePiece's "by
 * score" rule: rank_of[id] orders tokens by score, best first; NULL: id). */
nb_status nb_tok__derive_merges(nb_tok *t, const int32_t *rank_of, const char *where);
/* Reads a whole file (NUL-terminated) into *data (nb_alloc'ed, *len + 1 bytes). */
nb_status nb_tok__read_file(nb_ctx *ctx, const char *path, char **data, size_t *len);
/* Compiles the split pattern (PCRE2, UTF + UCP, JIT when available). */
nb_status nb_tok__set_pattern(nb_tok *t, const char *pattern, const char *where);
/* Finishes the added-token table; call last. */
nb_status nb_tok__finish(nb_tok *t);
int32_t nb_tok__lookup(const nb_tok *t, const void *bytes, size_t len);
/* The added token with this content (works before nb_tok__finish), or -1. */
int32_t nb_tok__added_id(const nb_tok *t, const void *bytes, size_t len);
static inline const nb_tok__merge *nb_tok__find_merge(const nb_tok *t, int32_t a, int32_t b) {
  if (!t->merges) return NULL;
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  uint64_t h = key * 0x9e3779b97f4a7c15ull;
  size_t mask = t->merges_cap - 1, i = (size_t)(h >> 40) & mask;
  for (;;) {
    const nb_tok__merge *m = &t->merges[i];
    if (m->key == key) return m;
    if (m->key == UINT64_MAX) return NULL;
    i = (i + 1) & mask;
  }
}
static inline const uint8_t *nb_tok__bytes(const nb_tok *t, int32_t id) { return t->blob + t->tokens[id].off; }

/* GPT-2's byte <-> unicode alphabet: the code point standing for byte b, and
 * the byte for code point cp (-1 when cp is not in the alphabet). */
uint32_t nb_tok__byte_to_cp(uint8_t b);
int nb_tok__cp_to_byte(uint32_t cp);
/* Decodes a byte-level vocabulary string (UTF-8 of alphabet code points) into
 * raw bytes in out (cap >= strlen(s)); returns the length or -1. */
long nb_tok__unmap_bytes(const char *s, size_t n, uint8_t *out);
/* Encodes raw bytes as alphabet UTF-8 into out (cap >= 2n); returns length. */
size_t nb_tok__map_bytes(const uint8_t *b, size_t n, char *out);

/* ---- utf8 ---- */
/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
int nb_tok__utf8_len(const uint8_t *s, size_t n);
/* The bytes of one character at s: an invalid byte is a character of its own. */
static inline int nb_tok__char_len(const uint8_t *s, size_t n) {
  int l = nb_tok__utf8_len(s, n);
  return l ? l : 1;
}
/* SentencePiece's word boundary "▁" (U+2581) in UTF-8. */
static const uint8_t NB_TOK__META[3] = {0xE2, 0x96, 0x81};
/* Writes cp (<= U+10FFFF) as UTF-8, up to 4 bytes; returns the length. */
size_t nb_tok__put_utf8(uint32_t cp, uint8_t *out);
/* Length of the longest valid UTF-8 prefix of s. */
size_t nb_tok__utf8_valid_prefix(const uint8_t *s, size_t n);

/* ---- normalize.c ---- */
/* Runs t->norm over n bytes of text into a new buffer (*out, nb_alloc'ed
 * with capacity *out_cap, at least 1 byte more than *out_len). */
nb_status nb_tok__normalize(const nb_tok *t, const uint8_t *s, size_t n, uint8_t **out, size_t *out_len, size_t *out_cap);

/* ---- encode.c, unigram.c, wordpiece.c: the models ---- */
nb_status nb_tok__push(const nb_tok *t, nb_tok_ids *out, int32_t id);
/* Appends the ids of one pre-tokenized piece. */
nb_status nb_tok__unigram_encode(const nb_tok *t, const uint8_t *s, size_t n, nb_tok_ids *out);
nb_status nb_tok__wordpiece_encode(const nb_tok *t, const uint8_t *s, size_t n, nb_tok_ids *out);
/* Makes t a Unigram model (t->scores set; min_score as the reference
 * computes it); call after nb_tok__index. <0xNN> tokens are matched in text
 * unless skip_bytes (SentencePiece). */
nb_status nb_tok__unigram_finish(nb_tok *t, double min_score, bool skip_bytes);

/* ---- prefix.c: the vocabulary as a sorted-array trie ---- */
/* The tokens sharing the `depth` bytes walked so far: sorted[lo..hi). */
typedef struct nb_tok__range {
  int32_t lo, hi;
  uint32_t depth;
} nb_tok__range;
/* Builds t->sorted from the indexed vocabulary (not added or hidden tokens;
 * not <0xNN> ones when skip_bytes). */
nb_status nb_tok__prefix_index(nb_tok *t, bool skip_bytes);
static inline nb_tok__range nb_tok__range_all(const nb_tok *t) { return (nb_tok__range){0, t->n_sorted, 0}; }
/* Walks one more byte; false when no token continues the prefix. */
bool nb_tok__range_step(const nb_tok *t, nb_tok__range *r, uint8_t c);
/* The token equal to the prefix walked, or -1. */
int32_t nb_tok__range_exact(const nb_tok *t, const nb_tok__range *r);

/* ---- spm_norm.c ---- */
/* Copies a precompiled_charsmap (validated; `where` names the file). */
nb_status nb_tok__spm_set_charsmap(nb_tok *t, const uint8_t *blob, size_t len, const char *where);
/* SentencePiece-normalizes a segment into *buf (grown), "▁" escapes and the
 * dummy prefix (at_start) included; *out_n = its length. */
nb_status nb_tok__spm_normalize(const nb_tok *t, const uint8_t *s, size_t n, bool at_start, uint8_t **buf, size_t *cap,
                                size_t *out_n);

/* ---- pretok.c: splitting text into pieces ---- */
/* Called once per piece (bytes in model space, already normalized). */
typedef nb_status (*nb_tok__piece_fn)(void *ud, const uint8_t *piece, size_t n);
/* Called for each added token matched (when allowed). */
typedef nb_status (*nb_tok__added_fn)(void *ud, int32_t id);
/* Splits text at added tokens (per mode), normalizes and pre-tokenizes each
 * segment, and calls the callbacks in order. */
nb_status nb_tok__split(const nb_tok *t, const uint8_t *text, size_t n, nb_tok_special mode,
                        nb_tok__piece_fn on_piece, nb_tok__added_fn on_added, void *ud);

/* ---- growable buffers through the context allocator ---- */
nb_status nb_tok__grow(nb_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem);

#endif
