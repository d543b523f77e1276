/* SentencePiece's normalizer (normalizer.cc), driven by the model file's
 * normalizer_spec: the precompiled charsmap (nmt_nfkc, nfkc, ... compiled by
 * the trainer into a Darts-clone double-array trie over UTF-8 prefixes, plus
 * the replacement strings), remove_extra_whitespaces, add_dummy_prefix and
 * the escape of ' ' as "▁". At each position the longest rule matching a
 * prefix of the text replaces it; text no rule matches is copied a character
 * at a time.
 *
 * Differences, on purpose: bytes that are not UTF-8 are copied as they are
 * (sentencepiece turns each into U+FFFD), so that byte fallback round-trips
 * them; and the whitespace rules apply per segment between added tokens. */
#include <string.h>

#include "data/tokenizer/tok_internal.h"


/* Darts-clone unit fields. */
static bool has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }
static uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/* The longest rule matching a prefix of s: its length (0: none) and the
 * offset of its NUL-terminated replacement. A damaged trie never reads out
 * of bounds: it just stops matching. */
static size_t longest_rule(const nb_tok *t, const uint8_t *s, size_t n, uint32_t *value) {
  const uint32_t *units = t->spm_trie;
  size_t nu = t->spm_trie_n, best = 0, pos = 0;
  if (!nu) return 0;
  pos ^= unit_offset(units[0]);
  for (size_t i = 0; i < n; i++) {
    pos ^= s[i];
    if (pos >= nu) break;
    uint32_t u = units[pos];
    if (unit_label(u) != s[i]) break;
    pos ^= unit_offset(u);
    if (pos >= nu) break;
    if (has_leaf(u)) {
      uint32_t v = unit_value(units[pos]);
      if (v < t->spm_strs_len) {
        best = i + 1;
        *value = v;
      }
    }
  }
  return best;
}

/* The normalized form of the prefix at s: *rep (NUL-free bytes, *rep_n) for
 * the returned number of input bytes. */
static size_t next_prefix(const nb_tok *t, const uint8_t *s, size_t n, const uint8_t **rep, size_t *rep_n) {
  uint32_t v = 0;
  size_t len = longest_rule(t, s, n, &v);
  if (len) {
    *rep = (const uint8_t *)t->spm_strs + v;
    *rep_n = strlen(t->spm_strs + v);
    return len;
  }
  *rep = s;
  *rep_n = (size_t)nb_tok__char_len(s, n);
  return *rep_n;
}

nb_status nb_tok__spm_normalize(const nb_tok *t, const uint8_t *s, size_t n, bool at_start, uint8_t **buf, size_t *cap,
                                size_t *out_n) {
  const uint8_t *rep;
  size_t rep_n, i = 0, o = 0;
  bool extra = t->spm_remove_extra;
  if (extra) /* leading whitespace */
    while (i < n) {
      size_t len = next_prefix(t, s + i, n - i, &rep, &rep_n);
      if (rep_n != 1 || rep[0] != ' ') break;
      i += len;
    }
  *out_n = 0;
  if (i == n) return NB_OK;
  bool prev_space = extra;
  /* each input byte becomes at most 3 output bytes per replacement byte; grow as we go */
  if (nb_tok__grow(t->ctx, (void **)buf, cap, 3 + 3 * (n - i) + 1, 1)) return NB_ERR_NOMEM;
  if (t->spm_dummy_prefix && at_start) {
    memcpy(*buf, NB_TOK__META, 3);
    o = 3;
  }
  while (i < n) {
    size_t len = next_prefix(t, s + i, n - i, &rep, &rep_n);
    if (prev_space)
      while (rep_n && rep[0] == ' ') rep++, rep_n--;
    if (rep_n) {
      if (nb_tok__grow(t->ctx, (void **)buf, cap, o + 3 * rep_n + 1, 1)) return NB_ERR_NOMEM;
      for (size_t k = 0; k < rep_n; k++) {
        if (rep[k] == ' ') {
          memcpy(*buf + o, NB_TOK__META, 3);
          o += 3;
        } else {
          (*buf)[o++] = rep[k];
        }
      }
      prev_space = rep[rep_n - 1] == ' ';
    }
    i += len;
    if (!extra) prev_space = false;
  }
  if (extra) /* trailing whitespace */
    while (o >= 3 && !memcmp(*buf + o - 3, NB_TOK__META, 3)) o -= 3;
  *out_n = o;
  return NB_OK;
}

nb_status nb_tok__spm_set_charsmap(nb_tok *t, const uint8_t *blob, size_t len, const char *where) {
  uint32_t trie_bytes;
  if (len < 4) return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: normalizer_spec.precompiled_charsmap: truncated (%zu bytes)", where, len);
  memcpy(&trie_bytes, blob, 4);
  if (trie_bytes % 4 || trie_bytes == 0 || trie_bytes > len - 4)
    return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: normalizer_spec.precompiled_charsmap: trie size %u does not fit its %zu bytes",
                     where, trie_bytes, len);
  size_t strs = len - 4 - trie_bytes;
  if (strs == 0 || blob[len - 1] != 0)
    return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: normalizer_spec.precompiled_charsmap: replacement strings not NUL-terminated", where);
  if (!(t->spm_trie = nb_alloc(t->ctx, trie_bytes))) return NB_ERR_NOMEM;
  t->spm_trie_n = trie_bytes / 4;
  memcpy(t->spm_trie, blob + 4, trie_bytes); /* little-endian units, as sentencepiece writes them */
  if (!(t->spm_strs = nb_alloc(t->ctx, strs))) return NB_ERR_NOMEM;
  t->spm_strs_len = strs;
  memcpy(t->spm_strs, blob + 4 + trie_bytes, strs);
  return NB_OK;
}
