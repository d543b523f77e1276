/* Unicode normalizers of tokenizer.json files (NFC, NFKC, NFD, NFKD,
 * Lowercase, StripAccents, BertNormalizer), run in the file's order on each
 * segment before pre-tokenization. The Unicode data comes from utf8proc
 * (Debian's libutf8proc: Unicode 15.0 in 2.8; `tokenizers` uses the Rust
 * unicode-normalization crate, 15.x/16.0: text new in 16.0 may differ).
 *
 * `tokenizers` only ever sees valid UTF-8; here a segment is cut into
 * maximal valid runs, each normalized, and invalid bytes pass through as they
 * are. Not here: the char-level "▁" rules (pretok.c) and SentencePiece's
 * precompiled charsmaps (spm_norm.c). */
#include <string.h>
#include <utf8proc.h>

#include "data/tokenizer/tok_internal.h"

/* Decodes the valid UTF-8 character at s (length l from nb_tok__utf8_len). */
static uint32_t decode_cp(const uint8_t *s, int l) {
  switch (l) {
  case 1: return s[0];
  case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
  case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
  default: return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
  }
}

/* Rust's char::is_whitespace (the White_Space property), as `tokenizers`. */
static bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* BertNormalizer's CJK ideograph blocks (as `tokenizers`, after Google's BERT). */
static bool is_cjk(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Category C* (Cc, Cf, Cs, Co, Cn) except \t \n \r: BertNormalizer drops these. */
static bool is_bert_control(uint32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
         k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN;
}

typedef struct norm_buf {
  nb_ctx *ctx;
  uint8_t *b;
  size_t len, cap;
} norm_buf;

static nb_status put(norm_buf *o, const void *p, size_t n) {
  if (nb_tok__grow(o->ctx, (void **)&o->b, &o->cap, o->len + n + 1, 1)) return NB_ERR_NOMEM;
  memcpy(o->b + o->len, p, n);
  o->len += n;
  return NB_OK;
}

static nb_status put_cp(norm_buf *o, uint32_t cp) {
  uint8_t u[4];
  return put(o, u, nb_tok__put_utf8(cp, u));
}

/* One of the NF* forms of a valid UTF-8 run, appended to o. */
static nb_status unicode_form(norm_buf *o, const uint8_t *s, size_t n, utf8proc_option_t opts, int32_t **scratch,
                              size_t *scap) {
  opts |= UTF8PROC_STABLE;
  utf8proc_ssize_t got;
  for (;;) {
    got = utf8proc_decompose(s, (utf8proc_ssize_t)n, *scratch, (utf8proc_ssize_t)*scap, opts);
    if (got < 0) return nb_errorf(o->ctx, NB_ERR_INVALID_ARG, "tokenizer: normalizer: %s", utf8proc_errmsg(got));
    if ((size_t)got + 1 <= *scap) break; /* reencode needs one spare unit for its NUL */
    if (nb_tok__grow(o->ctx, (void **)scratch, scap, (size_t)got + 1, sizeof **scratch)) return NB_ERR_NOMEM;
  }
  utf8proc_ssize_t bytes = utf8proc_reencode(*scratch, got, opts);
  if (bytes < 0) return nb_errorf(o->ctx, NB_ERR_INVALID_ARG, "tokenizer: normalizer: %s", utf8proc_errmsg(bytes));
  return put(o, *scratch, (size_t)bytes);
}

/* The per-character steps on a valid run: Lowercase, StripAccents (after an
 * NFD done by the caller), BertNormalizer's clean_text and CJK padding. */
static nb_status per_char(norm_buf *o, const uint8_t *s, size_t n, const nb_tok__norm_step *st) {
  for (size_t i = 0; i < n;) {
    int l = nb_tok__utf8_len(s + i, n - i);
    uint32_t c = decode_cp(s + i, l);
    i += (size_t)l;
    nb_status r = NB_OK;
    switch (st->kind) {
    case NB_TOK__NORM_LOWERCASE:
      /* Rust's char::to_lowercase: the simple mapping, and U+0130's full one */
      if (c == 0x130) r = put(o, "i\xCC\x87", 3);
      else r = put_cp(o, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
      break;
    case NB_TOK__NORM_STRIP_MARKS:
      if (utf8proc_category((utf8proc_int32_t)c) != UTF8PROC_CATEGORY_MN) r = put_cp(o, c);
      break;
    case NB_TOK__NORM_BERT_CLEAN:
      if (c == 0 || c == 0xFFFD || is_bert_control(c)) break;
      r = put_cp(o, is_white_space(c) ? ' ' : c);
      break;
    case NB_TOK__NORM_BERT_CJK:
      if (is_cjk(c)) r = put(o, " ", 1);
      if (!r) r = put_cp(o, c);
      if (!r && is_cjk(c)) r = put(o, " ", 1);
      break;
    default: r = put_cp(o, c); break;
    }
    if (r) return r;
  }
  return NB_OK;
}

static nb_status step(norm_buf *o, const uint8_t *s, size_t n, const nb_tok__norm_step *st, int32_t **scratch,
                      size_t *scap) {
  for (size_t i = 0; i < n;) {
    size_t v = nb_tok__utf8_valid_prefix(s + i, n - i);
    if (v) {
      nb_status r;
      switch (st->kind) {
      case NB_TOK__NORM_NFC: r = unicode_form(o, s + i, v, UTF8PROC_COMPOSE, scratch, scap); break;
      case NB_TOK__NORM_NFKC: r = unicode_form(o, s + i, v, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, scratch, scap); break;
      case NB_TOK__NORM_NFD: r = unicode_form(o, s + i, v, UTF8PROC_DECOMPOSE, scratch, scap); break;
      case NB_TOK__NORM_NFKD: r = unicode_form(o, s + i, v, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, scratch, scap); break;
      default: r = per_char(o, s + i, v, st); break;
      }
      if (r) return r;
      i += v;
    }
    size_t j = i;
    while (j < n && nb_tok__utf8_len(s + j, n - j) == 0) j++;
    if (j > i && put(o, s + i, j - i)) return NB_ERR_NOMEM;
    i = j;
  }
  return NB_OK;
}

nb_status nb_tok__normalize(const nb_tok *t, const uint8_t *s, size_t n, uint8_t **out, size_t *out_len, size_t *out_cap) {
  nb_ctx *ctx = t->ctx;
  norm_buf a = {ctx, NULL, 0, 0}, b = {ctx, NULL, 0, 0};
  int32_t *scratch = NULL;
  size_t scap = 0;
  nb_status r = put(&a, s, n);
  for (int k = 0; k < t->n_norm && !r; k++) {
    b.len = 0;
    r = step(&b, a.b, a.len, &t->norm[k], &scratch, &scap);
    norm_buf tmp = a;
    a = b;
    b = tmp;
  }
  if (scratch) nb_dealloc(ctx, scratch, scap * sizeof *scratch);
  if (b.b) nb_dealloc(ctx, b.b, b.cap);
  if (r) {
    if (a.b) nb_dealloc(ctx, a.b, a.cap);
    return r;
  }
  *out = a.b;
  *out_len = a.len;
  *out_cap = a.cap;
  return NB_OK;
}
