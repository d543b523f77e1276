/* Loading SentencePiece models (tokenizer.model, a protobuf ModelProto:
 * pieces with scores and types, trainer_spec, normalizer_spec), BPE as
 * Llama-2 ships them and Unigram (T5, ALBERT, XLNet style). BPE merges come
 * "by score": an adjacent pair merges when its concatenation is a piece, the
 * highest-scoring such piece first (leftmost on ties); Unigram is in
 * unigram.c. The normalizer_spec (precompiled charsmap, extra whitespace
 * removal, dummy prefix) runs in spm_norm.c. WORD and CHAR models,
 * escape_whitespaces=false and treat_whitespace_as_suffix are refused with a
 * message naming the field. */
#include <string.h>

#include "data/tokenizer/tok_internal.h"

/* A minimal protobuf reader: varints and length-delimited fields. */
typedef struct pb {
  const uint8_t *p, *end;
  bool bad;
} pb;

static uint64_t pb_varint(pb *b) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (b->p >= b->end) break;
    uint8_t c = *b->p++;
    v |= (uint64_t)(c & 0x7F) << shift;
    if (!(c & 0x80)) return v;
  }
  b->bad = true;
  return 0;
}

/* Reads the next field: its number and wire type; for wire type 2 the
 * payload in *sub; for 0 the value in *val; for 5 the raw 32 bits. */
static bool pb_next(pb *b, uint32_t *field, int *wt, pb *sub, uint64_t *val) {
  if (b->bad || b->p >= b->end) return false;
  uint64_t key = pb_varint(b);
  *field = (uint32_t)(key >> 3);
  *wt = (int)(key & 7);
  switch (*wt) {
  case 0: *val = pb_varint(b); break;
  case 1:
    if (b->end - b->p < 8) return b->bad = true, false;
    b->p += 8;
    break;
  case 2: {
    uint64_t n = pb_varint(b);
    if (b->bad || n > (uint64_t)(b->end - b->p)) return b->bad = true, false;
    *sub = (pb){b->p, b->p + n, false};
    b->p += n;
    break;
  }
  case 5: {
    if (b->end - b->p < 4) return b->bad = true, false;
    uint32_t u;
    memcpy(&u, b->p, 4);
    *val = u;
    b->p += 4;
    break;
  }
  default: return b->bad = true, false;
  }
  return !b->bad;
}

enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER = 4, SP_UNUSED = 5, SP_BYTE = 6 };

typedef struct spm_load {
  nb_tok *t;
  const char *name;
  float *scores;
  size_t n_pieces, cap_scores;
  bool unigram;
  float min_normal; /* the lowest NORMAL piece score (Unigram's unknown score comes from it) */
} spm_load;

static nb_status add_piece(spm_load *L, const uint8_t *text, size_t len, float score, uint64_t type);

static nb_status piece(spm_load *L, pb sub) {
  const uint8_t *text = NULL;
  size_t len = 0;
  float score = 0;
  uint64_t type = SP_NORMAL, val;
  uint32_t f;
  int wt;
  pb s = {0};
  while (pb_next(&sub, &f, &wt, &s, &val)) {
    if (f == 1 && wt == 2) text = s.p, len = (size_t)(s.end - s.p);
    else if (f == 2 && wt == 5) {
      uint32_t u = (uint32_t)val;
      memcpy(&score, &u, 4);
    }
    else if (f == 3 && wt == 0) type = val;
  }
  if (sub.bad || !text) return nb_errorf(L->t->ctx, NB_ERR_FORMAT, "%s: pieces[%d]: malformed (no piece text)", L->name, (int32_t)L->n_pieces);
  return add_piece(L, text, len, score, type);
}

static nb_status add_piece(spm_load *L, const uint8_t *text, size_t len, float score, uint64_t type) {
  int32_t id = (int32_t)L->n_pieces;
  if (score != score) score = -1e30f; /* NaN would break the sort's order */
  if (type < SP_NORMAL || type > SP_BYTE) return nb_errorf(L->t->ctx, NB_ERR_FORMAT, "%s: pieces[%d]: unknown type %llu", L->name, id, (unsigned long long)type);
  uint8_t fl = type == SP_UNKNOWN || type == SP_UNUSED ? NB_TOK__F_HIDDEN
               : type == SP_CONTROL ? (NB_TOK__F_SPECIAL | NB_TOK__F_HIDDEN)
               : type == SP_USER ? NB_TOK__F_ADDED : 0;
  if (type == SP_UNKNOWN) L->t->unk_id = id;
  if (type == SP_NORMAL && score < L->min_normal) L->min_normal = score;
  if (nb_tok__grow(L->t->ctx, (void **)&L->scores, &L->cap_scores, L->n_pieces + 1, sizeof *L->scores)) return NB_ERR_NOMEM;
  L->scores[L->n_pieces++] = score;
  char where[96];
  snprintf(where, sizeof where, "%s: pieces[%d]", L->name, id);
  return nb_tok__set_token(L->t, id, text, len, fl, where);
}

static nb_status trainer_spec(spm_load *L, pb b) {
  uint32_t f;
  int wt;
  pb s = {0};
  uint64_t v = 0;
  while (pb_next(&b, &f, &wt, &s, &v)) {
    if (f == 3 && wt == 0 && v != 1 && v != 2)
      return nb_errorf(L->t->ctx, NB_ERR_UNIMPLEMENTED, "%s: trainer_spec.model_type: %s models are not supported (only BPE and UNIGRAM)",
                       L->name, v == 3 ? "WORD" : v == 4 ? "CHAR" : "unknown");
    if (f == 3 && wt == 0) L->unigram = v == 1;
    if (f == 35 && wt == 0) L->t->byte_fallback = v != 0;
    if (f == 44 && wt == 2) {
      size_t n = (size_t)(s.end - s.p);
      if (n >= sizeof L->t->unk_surface)
        return nb_errorf(L->t->ctx, NB_ERR_UNIMPLEMENTED, "%s: trainer_spec.unk_surface: longer than %zu bytes", L->name,
                         sizeof L->t->unk_surface - 1);
      memcpy(L->t->unk_surface, s.p, n);
      L->t->unk_surface[n] = 0;
    }
    if (f == 24 && wt == 0 && v)
      return nb_errorf(L->t->ctx, NB_ERR_UNIMPLEMENTED, "%s: trainer_spec.treat_whitespace_as_suffix is not supported", L->name);
  }
  return b.bad ? nb_errorf(L->t->ctx, NB_ERR_FORMAT, "%s: trainer_spec: malformed", L->name) : NB_OK;
}

static nb_status normalizer_spec(spm_load *L, pb b) {
  uint32_t f;
  int wt;
  pb s = {0};
  uint64_t v = 0;
  bool dummy = true, extra = true, escape = true;
  nb_status r = NB_OK;
  while (!r && pb_next(&b, &f, &wt, &s, &v)) {
    if (f == 2 && wt == 2 && s.end > s.p) r = nb_tok__spm_set_charsmap(L->t, s.p, (size_t)(s.end - s.p), L->name);
    if (f == 3 && wt == 0) dummy = v != 0;
    if (f == 4 && wt == 0) extra = v != 0;
    if (f == 5 && wt == 0) escape = v != 0;
  }
  if (r) return r;
  if (b.bad) return nb_errorf(L->t->ctx, NB_ERR_FORMAT, "%s: normalizer_spec: malformed", L->name);
  L->t->spm_remove_extra = extra;
  if (!escape) return nb_errorf(L->t->ctx, NB_ERR_UNIMPLEMENTED, "%s: normalizer_spec.escape_whitespaces=false is not supported", L->name);
  L->t->spm_dummy_prefix = dummy;
  L->t->strip_leading = dummy ? 1 : 0;
  return NB_OK;
}

/* rank_of[id]: position of id when pieces are sorted by score, best first. */
static int cmp_score(const void *a, const void *b, void *ud) {
  const float *sc = ud;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (sc[x] != sc[y]) return sc[x] > sc[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

/* SentencePiece encodes the whole normalized text as one sequence; nabla cuts
 * it into pieces at "▁" where no piece can span the cut, so that the result is
 * the same. Without allow_whitespace_only_pieces a "▁" only starts a piece, so
 * every "▁" is a safe cut; with it (Llama-2) pieces like "▁▁▁▁" exist, and a
 * run of "▁" is cut only where it starts. A vocabulary with "▁" after other
 * characters (split_by_whitespace=false) is not cut at all. */
static void choose_split(nb_tok *t) {
  bool after_meta = false, after_other = false;
  for (int32_t id = 0; id < t->n_tokens; id++) {
    const nb_tok__token *tk = &t->tokens[id];
    if (!(tk->flags & NB_TOK__F_PRESENT) || (tk->flags & (NB_TOK__F_ADDED | NB_TOK__F_HIDDEN | NB_TOK__F_BYTE))) continue;
    const uint8_t *b = nb_tok__bytes(t, id);
    for (uint32_t k = 3; k + 3 <= tk->len; k++) {
      if (memcmp(b + k, "\xE2\x96\x81", 3) != 0) continue;
      if (!memcmp(b + k - 3, "\xE2\x96\x81", 3)) after_meta = true;
      else after_other = true;
    }
  }
  t->ms_split = !after_other;
  t->ms_split_runs = !after_meta;
}

static nb_status unigram(spm_load *L) {
  nb_tok *t = L->t;
  t->scores = nb_alloc(t->ctx, (size_t)t->n_tokens * sizeof *t->scores);
  if (!t->scores) return NB_ERR_NOMEM;
  for (int32_t id = 0; id < t->n_tokens; id++) t->scores[id] = L->scores[id];
  t->uni_f32 = true;
  if (t->unk_id < 0) return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: pieces: a Unigram model needs an UNKNOWN piece", L->name);
  return nb_tok__unigram_finish(t, L->min_normal, true); /* byte pieces only stand in for unknown characters */
}

static nb_status derive(spm_load *L) {
  nb_ctx *ctx = L->t->ctx;
  size_t n = L->n_pieces;
  int32_t *order = nb_alloc(ctx, n * sizeof *order), *rank = nb_alloc(ctx, n * sizeof *rank);
  nb_status r = order && rank ? NB_OK : NB_ERR_NOMEM;
  if (!r) {
    for (size_t i = 0; i < n; i++) order[i] = (int32_t)i;
    qsort_r(order, n, sizeof *order, cmp_score, L->scores);
    for (size_t i = 0; i < n; i++) rank[order[i]] = (int32_t)i;
    r = nb_tok__derive_merges(L->t, rank, L->name);
  }
  if (order) nb_dealloc(ctx, order, n * sizeof *order);
  if (rank) nb_dealloc(ctx, rank, n * sizeof *rank);
  return r;
}

/* A new char-level tokenizer with SentencePiece's defaults. */
static nb_tok *spm_create(nb_ctx *ctx) {
  nb_tok *t = nb_tok__create(ctx, NB_TOK_CHAR_LEVEL);
  if (!t) return NULL;
  t->metaspace = true;
  t->ms_prepend = NB_TOK__PREPEND_NEVER;
  t->spm_dummy_prefix = true;
  t->spm_normalizer = true;
  strcpy(t->unk_surface, " \xE2\x81\x87 "); /* " ⁇ ", sentencepiece's default */
  t->strip_leading = 1;
  return t;
}

/* The pieces are in: index, derive the model, finish. Frees L's scratch;
 * destroys t on failure. */
static nb_tok *spm_finish(spm_load *L, nb_status r) {
  nb_tok *t = L->t;
  if (!r) r = nb_tok__index(t, L->name);
  if (!r && !L->unigram) choose_split(t); /* Unigram: float path scores depend on where the text starts */
  if (!r) r = L->unigram ? unigram(L) : derive(L);
  if (!r) r = nb_tok__finish(t);
  if (L->scores) nb_dealloc(t->ctx, L->scores, L->cap_scores * sizeof *L->scores);
  if (r) {
    nb_tok_destroy(t);
    return NULL;
  }
  return t;
}

nb_tok *nb_tok_create_sentencepiece(nb_ctx *ctx, const nb_tok_spm_piece *pieces, size_t n, const nb_tok_spm_opts *opts,
                                    const char *name) {
  if ((!pieces && n) || !opts) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_create_sentencepiece: NULL pieces or options"), NULL;
  nb_tok *t = spm_create(ctx);
  if (!t) return NULL;
  spm_load L = {.t = t, .name = name ? name : "sentencepiece", .min_normal = 3.0e38f};
  t->byte_fallback = opts->byte_fallback;
  t->spm_dummy_prefix = opts->add_dummy_prefix;
  t->strip_leading = opts->add_dummy_prefix ? 1 : 0;
  t->spm_remove_extra = false;
  nb_status r = n ? NB_OK : nb_errorf(ctx, NB_ERR_FORMAT, "%s: no pieces", L.name);
  for (size_t i = 0; !r && i < n; i++)
    r = add_piece(&L, (const uint8_t *)pieces[i].text, pieces[i].len, pieces[i].score, (uint64_t)(pieces[i].type > 0 ? pieces[i].type : 0));
  return spm_finish(&L, r);
}

nb_tok *nb_tok_load_sentencepiece_bytes(nb_ctx *ctx, const void *data, size_t len, const char *name) {
  if (!data && len) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_load_sentencepiece_bytes: NULL data"), NULL;
  nb_tok *t = spm_create(ctx);
  if (!t) return NULL;
  spm_load L = {.t = t, .name = name ? name : "tokenizer.model", .min_normal = 3.0e38f};
  pb b = {data, (const uint8_t *)data + len, false}, s;
  uint32_t f;
  int wt;
  uint64_t v = 0;
  nb_status r = NB_OK;
  bool saw_trainer = false;
  while (!r && pb_next(&b, &f, &wt, &s, &v)) {
    if (f == 1 && wt == 2) r = piece(&L, s);
    else if (f == 2 && wt == 2) r = trainer_spec(&L, s), saw_trainer = true;
    else if (f == 3 && wt == 2) r = normalizer_spec(&L, s);
  }
  if (!r && b.bad) r = nb_errorf(ctx, NB_ERR_FORMAT, "%s: not a SentencePiece model (malformed protobuf)", L.name);
  if (!r && (L.n_pieces == 0 || !saw_trainer))
    r = nb_errorf(ctx, NB_ERR_FORMAT, "%s: not a SentencePiece model (%s missing)", L.name, L.n_pieces ? "trainer_spec" : "pieces");
  return spm_finish(&L, r);
}

nb_tok *nb_tok_load_sentencepiece(nb_ctx *ctx, const char *path) {
  char *data;
  size_t n;
  if (nb_tok__read_file(ctx, path, &data, &n)) return NULL;
  nb_tok *t = nb_tok_load_sentencepiece_bytes(ctx, data, n, path);
  nb_dealloc(ctx, data, n + 1);
  return t;
}

nb_status nb_tok_sentencepiece_pieces(const nb_tok *t, nb_tok_spm_piece *pieces, size_t cap, nb_tok_spm_opts *opts) {
  const char *why = t->kind != NB_TOK_CHAR_LEVEL || t->model != NB_TOK__MODEL_BPE ? "only char-level BPE models are"
                    : t->n_norm > 0 || t->spm_trie_n > 0 || t->spm_remove_extra ? "a normalizer is not"
                    : t->pattern ? "a split pattern is not"
                                 : NULL;
  /* where "▁" comes from: SentencePiece's own rule, or tokenizer.json's
   * Prepend("▁") + Replace(" ", "▁") normalizer */
  bool dummy = t->spm_normalizer ? t->spm_dummy_prefix : !strcmp(t->norm_prepend, "\xE2\x96\x81");
  if (!why && !t->spm_normalizer && (!t->norm_replace_space || (t->norm_prepend[0] && !dummy) || t->metaspace))
    why = "this space handling is not";
  if (why) return nb_errorf(t->ctx, NB_ERR_UNIMPLEMENTED, "tokenizer: %s expressible as SentencePiece pieces", why);
  int32_t n = t->n_tokens;
  if (cap < (size_t)n) return nb_errorf(t->ctx, NB_ERR_INVALID_ARG, "nb_tok_sentencepiece_pieces: room for %zu pieces, %d needed", cap, n);
  int32_t *rank = nb_alloc(t->ctx, ((size_t)n + 1) * sizeof *rank);
  if (!rank) return NB_ERR_NOMEM;
  for (int32_t id = 0; id < n; id++) rank[id] = -1;
  for (size_t i = 0; t->merges && i < t->merges_cap; i++) {
    const nb_tok__merge *m = &t->merges[i];
    if (m->key != UINT64_MAX && m->result >= 0 && m->result < n && (rank[m->result] < 0 || m->rank < rank[m->result]))
      rank[m->result] = m->rank;
  }
  for (int32_t id = 0; id < n; id++) {
    const nb_tok__token *tk = &t->tokens[id];
    nb_tok_spm_piece *p = &pieces[id];
    *p = (nb_tok_spm_piece){.text = "", .len = 0, .score = 0, .type = SP_UNUSED};
    if (!(tk->flags & NB_TOK__F_PRESENT)) continue;
    p->text = (const char *)nb_tok__bytes(t, id);
    p->len = tk->len;
    p->score = rank[id] >= 0 ? -(float)rank[id] : 0;
    p->type = id == t->unk_id ? SP_UNKNOWN
              : tk->flags & NB_TOK__F_BYTE ? SP_BYTE
              : tk->flags & NB_TOK__F_SPECIAL ? SP_CONTROL
              : tk->flags & NB_TOK__F_ADDED ? SP_USER
              : tk->flags & NB_TOK__F_HIDDEN ? SP_UNUSED
                                              : SP_NORMAL;
  }
  nb_dealloc(t->ctx, rank, ((size_t)n + 1) * sizeof *rank);
  *opts = (nb_tok_spm_opts){.byte_fallback = t->byte_fallback, .add_dummy_prefix = dummy};
  return NB_OK;
}
