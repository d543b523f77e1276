/* Splitting text into BPE pieces: added/special tokens first (leftmost-
 * longest in the raw text), then per segment the normalizer (char-level:
 * prepend, spaces -> "▁") and the pre-tokenizer (PCRE2 regex over valid
 * UTF-8 runs, or Metaspace). Not here: the BPE merges (encode.c).
 *
 * Invalid UTF-8: PCRE2 in UTF mode must never see it (with NO_UTF_CHECK it
 * would be undefined behaviour), so a segment is cut into maximal valid runs
 * and the regex runs on each run as a string of its own; each maximal run of
 * invalid bytes becomes one piece. Valid text therefore splits exactly as the
 * reference tokenizers split it, and any byte string still round-trips. */
#include <string.h>

#include "data/tokenizer/tok_internal.h"

typedef struct split_state {
  const nb_tok *t;
  nb_tok__piece_fn on_piece;
  nb_tok__added_fn on_added;
  void *ud;
  pcre2_match_data *md;
  uint8_t *buf; /* normalization scratch */
  size_t cap;
} split_state;


static nb_status regex_run(split_state *st, const uint8_t *s, size_t n) {
  const nb_tok *t = st->t;
  size_t pos = 0, gap = 0;
  while (pos < n) {
    int rc = t->jit ? pcre2_jit_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK, st->md, NULL)
                    : pcre2_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK, st->md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK, st->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[200];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "tokenizer: pre-tokenizer pattern failed at byte %zu: %s", pos,
                       (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    size_t a = ov[0], b = ov[1];
    if (b <= a) { /* an empty match: step over one character, which stays in the gap */
      int l = nb_tok__utf8_len(s + a, n - a);
      pos = a + (l ? (size_t)l : 1);
      continue;
    }
    nb_status r;
    if (a > gap && !t->re_drop_gaps && (r = st->on_piece(st->ud, s + gap, a - gap))) return r;
    if ((r = st->on_piece(st->ud, s + a, b - a))) return r;
    gap = pos = b;
  }
  return gap < n && !t->re_drop_gaps ? st->on_piece(st->ud, s + gap, n - gap) : NB_OK;
}

static nb_status regex_split(split_state *st, const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t v = nb_tok__utf8_valid_prefix(s + i, n - i);
    if (v) {
      nb_status r = regex_run(st, s + i, v);
      if (r) return r;
      i += v;
    }
    size_t j = i;
    while (j < n && nb_tok__utf8_len(s + j, n - j) == 0) j++;
    if (j > i) {
      nb_status r = st->on_piece(st->ud, s + i, j - i);
      if (r) return r;
      i = j;
    }
  }
  return NB_OK;
}

/* Metaspace split: a new piece starts at every "▁" (with !ms_split_runs, at
 * the first "▁" of each run only). */
static nb_status meta_split(split_state *st, const uint8_t *s, size_t n) {
  const nb_tok *t = st->t;
  size_t start = 0;
  for (size_t i = 1; i + 3 <= n; i++) {
    if (s[i] == NB_TOK__META[0] && s[i + 1] == NB_TOK__META[1] && s[i + 2] == NB_TOK__META[2]) {
      if (!t->ms_split_runs && i >= 3 && !memcmp(s + i - 3, NB_TOK__META, 3)) {
        i += 2;
        continue;
      }
      nb_status r = st->on_piece(st->ud, s + start, i - start);
      if (r) return r;
      start = i;
      i += 2;
    }
  }
  return n > start ? st->on_piece(st->ud, s + start, n - start) : NB_OK;
}

static nb_status reserve(split_state *st, size_t need) {
  return nb_tok__grow(st->t->ctx, (void **)&st->buf, &st->cap, need, 1);
}

/* Normalizes a char-level segment into st->buf; returns its length. */
static nb_status normalize_char(split_state *st, const uint8_t *s, size_t n, bool at_start, size_t *out_n) {
  const nb_tok *t = st->t;
  size_t pre = strlen(t->norm_prepend);
  bool meta_prepend = t->metaspace && (t->ms_prepend == NB_TOK__PREPEND_ALWAYS ||
                                       (t->ms_prepend == NB_TOK__PREPEND_FIRST && at_start));
  if (reserve(st, pre + 3 + n * 3)) return NB_ERR_NOMEM;
  size_t o = 0;
  memcpy(st->buf, t->norm_prepend, pre);
  o = pre;
  if (t->spm_dummy_prefix && at_start) {
    memcpy(st->buf + o, NB_TOK__META, 3);
    o += 3;
  }
  bool replace = t->norm_replace_space || t->metaspace;
  if (meta_prepend && !(n >= 1 && (s[0] == ' ' || (n >= 3 && !memcmp(s, NB_TOK__META, 3))))) {
    memcpy(st->buf + o, NB_TOK__META, 3);
    o += 3;
  }
  for (size_t i = 0; i < n; i++) {
    if (replace && s[i] == ' ') {
      memcpy(st->buf + o, NB_TOK__META, 3);
      o += 3;
    } else {
      st->buf[o++] = s[i];
    }
  }
  *out_n = o;
  return NB_OK;
}

static nb_status segment_normalized(split_state *st, const uint8_t *s, size_t n, bool at_start);

static nb_status segment(split_state *st, const uint8_t *s, size_t n, bool at_start) {
  const nb_tok *t = st->t;
  if (n == 0 || !t->n_norm) return segment_normalized(st, s, n, at_start);
  uint8_t *norm;
  size_t len, cap;
  nb_status r = nb_tok__normalize(t, s, n, &norm, &len, &cap);
  if (r) return r;
  r = segment_normalized(st, norm, len, at_start);
  nb_dealloc(t->ctx, norm, cap);
  return r;
}

/* After the Unicode normalizer steps: the char-level "▁" rules or the
 * byte-level prefix space, then the pre-tokenizer. */
static nb_status segment_normalized(split_state *st, const uint8_t *s, size_t n, bool at_start) {
  const nb_tok *t = st->t;
  if (n == 0) return NB_OK;
  if (t->spm_normalizer) {
    size_t m;
    nb_status r = nb_tok__spm_normalize(t, s, n, at_start, &st->buf, &st->cap, &m);
    if (r) return r;
    s = st->buf;
    n = m;
  } else if (t->kind == NB_TOK_CHAR_LEVEL) {
    size_t m;
    nb_status r = normalize_char(st, s, n, at_start, &m);
    if (r) return r;
    s = st->buf;
    n = m;
  } else if (t->add_prefix_space && s[0] != ' ') {
    if (reserve(st, n + 1)) return NB_ERR_NOMEM;
    st->buf[0] = ' ';
    memcpy(st->buf + 1, s, n);
    s = st->buf;
    n++;
  }
  if (t->re) return regex_split(st, s, n);
  if (t->metaspace && t->ms_split) return meta_split(st, s, n);
  return st->on_piece(st->ud, s, n);
}

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* The added token starting at text[i], longest first; -1 when none. */
static int32_t match_added(const nb_tok *t, const uint8_t *text, size_t n, size_t i, nb_tok_special mode) {
  for (int32_t k = 0; k < t->n_added; k++) {
    const nb_tok__token *tk = &t->tokens[t->added[k]];
    if (tk->len > n - i) continue;
    if ((tk->flags & NB_TOK__F_SPECIAL) && mode == NB_TOK_SPECIAL_AS_TEXT) continue;
    if (memcmp(t->blob + tk->off, text + i, tk->len) == 0) return t->added[k];
  }
  return -1;
}

nb_status nb_tok__split(const nb_tok *t, const uint8_t *text, size_t n, nb_tok_special mode,
                        nb_tok__piece_fn on_piece, nb_tok__added_fn on_added, void *ud) {
  split_state st = {.t = t, .on_piece = on_piece, .on_added = on_added, .ud = ud};
  if (t->re) {
    st.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!st.md) return nb_errorf(t->ctx, NB_ERR_NOMEM, "tokenizer: out of memory for regex match data");
  }
  nb_status r = NB_OK;
  size_t seg = 0;
  for (size_t i = 0; t->n_added && i < n && !r; i++) {
    if (!(t->added_first[text[i] >> 3] & (1u << (text[i] & 7)))) continue;
    int32_t id = match_added(t, text, n, i, mode);
    if (id < 0) continue;
    const nb_tok__token *tk = &t->tokens[id];
    if ((tk->flags & NB_TOK__F_SPECIAL) && mode == NB_TOK_SPECIAL_ERROR) {
      r = nb_errorf(t->ctx, NB_ERR_INVALID_ARG,
                    "tokenizer: input contains special token '%.*s' at byte %zu (special tokens are disallowed)",
                    (int)tk->len, (const char *)t->blob + tk->off, i);
      break;
    }
    size_t a = i, b = i + tk->len;
    while ((tk->flags & NB_TOK__F_LSTRIP) && a > seg && is_ws(text[a - 1])) a--;
    while ((tk->flags & NB_TOK__F_RSTRIP) && b < n && is_ws(text[b])) b++;
    r = segment(&st, text + seg, a - seg, seg == 0);
    if (!r) r = on_added(ud, id);
    seg = b;
    i = b - 1;
  }
  if (!r) r = segment(&st, text + seg, n - seg, seg == 0);
  if (st.md) pcre2_match_data_free(st.md);
  if (st.buf) nb_dealloc(t->ctx, st.buf, st.cap);
  return r;
}
