/* Loading Hugging Face tokenizer.json files: the model (BPE: vocab, merges
 * as "a b" strings or [a, b] pairs, unk_token, byte_fallback, fuse_unk,
 * ignore_merges; Unigram: [token, score] vocab, unk_id, byte_fallback;
 * WordPiece: vocab, unk_token, continuing_subword_prefix,
 * max_input_chars_per_word), added_tokens, and the supported
 * normalizer / pre_tokenizer / decoder components. Anything else is refused
 * with NB_ERR_UNIMPLEMENTED naming the field. The post_processor's special
 * tokens (single-sequence template) are kept for add_special_tokens;
 * truncation and padding are ignored. */
#include <cjson/cJSON.h>
#include <string.h>

#include "data/tokenizer/tok_internal.h"

typedef struct hf_load {
  nb_tok *t;
  const char *name;
  const char *pattern; /* regex found in the pre_tokenizer (borrowed from the JSON) */
  char *own_pattern;   /* an escaped String pattern */
  size_t own_cap;
  bool has_regex, byte_level;
} hf_load;

static nb_status bad(hf_load *L, nb_status s, const char *field, const char *what) {
  return nb_errorf(L->t->ctx, s, "%s: %s: %s", L->name, field, what);
}

static const char *type_of(const cJSON *o) {
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
  return cJSON_IsString(ty) ? ty->valuestring : "";
}

static bool get_bool(const cJSON *o, const char *key, bool dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static const char *get_str(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool get_id(const cJSON *v, int32_t *id) {
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (1 << 28) || v->valuedouble != (double)(int32_t)v->valuedouble)
    return false;
  *id = (int32_t)v->valuedouble;
  return true;
}

static bool is_null_or_absent(const cJSON *o) { return !o || cJSON_IsNull(o); }

/* Does any pre_tokenizer/decoder component say ByteLevel? */
static bool mentions_bytelevel(const cJSON *o) {
  if (!cJSON_IsObject(o)) return false;
  if (!strcmp(type_of(o), "ByteLevel")) return true;
  const cJSON *seq = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
  if (!seq) seq = cJSON_GetObjectItemCaseSensitive(o, "decoders");
  const cJSON *it;
  cJSON_ArrayForEach(it, seq) if (mentions_bytelevel(it)) return true;
  return false;
}

/* ---- normalizer ---- */

static nb_status add_norm(hf_load *L, const char *field, nb_tok__norm_kind kind) {
  if (L->t->n_norm == NB_TOK__MAX_NORM) return bad(L, NB_ERR_UNIMPLEMENTED, field, "too many normalizer steps");
  if (L->t->norm_prepend[0] || L->t->norm_replace_space)
    return bad(L, NB_ERR_UNIMPLEMENTED, field, "a Unicode normalizer step after Prepend/Replace is not supported");
  L->t->norm[L->t->n_norm++] = (nb_tok__norm_step){kind};
  return NB_OK;
}

static nb_status normalizer(hf_load *L, const cJSON *n, const char *field) {
  if (is_null_or_absent(n)) return NB_OK;
  const char *ty = type_of(n);
  char sub[96];
  if (!strcmp(ty, "Sequence")) {
    const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
    if (!cJSON_IsArray(arr)) return bad(L, NB_ERR_FORMAT, field, "Sequence without a 'normalizers' array");
    int i = 0;
    cJSON_ArrayForEach(it, arr) {
      snprintf(sub, sizeof sub, "%s.normalizers[%d]", field, i++);
      nb_status r = normalizer(L, it, sub);
      if (r) return r;
    }
    return NB_OK;
  }
  static const struct {
    const char *type;
    nb_tok__norm_kind kind;
  } unicode[] = {{"NFC", NB_TOK__NORM_NFC}, {"NFKC", NB_TOK__NORM_NFKC}, {"NFD", NB_TOK__NORM_NFD},
                 {"NFKD", NB_TOK__NORM_NFKD}, {"Lowercase", NB_TOK__NORM_LOWERCASE}, {"StripAccents", NB_TOK__NORM_STRIP_MARKS}};
  for (size_t i = 0; i < sizeof unicode / sizeof *unicode; i++)
    if (!strcmp(ty, unicode[i].type)) return add_norm(L, field, unicode[i].kind);
  if (!strcmp(ty, "BertNormalizer")) {
    bool lower = get_bool(n, "lowercase", true);
    const cJSON *sa = cJSON_GetObjectItemCaseSensitive(n, "strip_accents");
    bool strip = cJSON_IsBool(sa) ? cJSON_IsTrue(sa) : lower; /* null: follows lowercase */
    nb_status r = NB_OK;
    if (get_bool(n, "clean_text", true)) r = add_norm(L, field, NB_TOK__NORM_BERT_CLEAN);
    if (!r && get_bool(n, "handle_chinese_chars", true)) r = add_norm(L, field, NB_TOK__NORM_BERT_CJK);
    if (!r && strip) r = add_norm(L, field, NB_TOK__NORM_NFD);
    if (!r && strip) r = add_norm(L, field, NB_TOK__NORM_STRIP_MARKS);
    if (!r && lower) r = add_norm(L, field, NB_TOK__NORM_LOWERCASE);
    return r;
  }
  if (L->byte_level) return bad(L, NB_ERR_UNIMPLEMENTED, field, "Prepend and Replace are not supported with a byte-level model");
  if (!strcmp(ty, "Prepend")) {
    const char *p = get_str(n, "prepend");
    if (!p || strlen(p) >= sizeof L->t->norm_prepend || L->t->norm_prepend[0])
      return bad(L, NB_ERR_UNIMPLEMENTED, field, "Prepend needs one short 'prepend' string");
    strcpy(L->t->norm_prepend, p);
    return NB_OK;
  }
  if (!strcmp(ty, "Replace")) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
    const char *from = get_str(pat, "String"), *to = get_str(n, "content");
    if (!from || !to || strcmp(from, " ") != 0 || strcmp(to, "\xE2\x96\x81") != 0)
      return bad(L, NB_ERR_UNIMPLEMENTED, field, "only Replace of the String \" \" by \"\xE2\x96\x81\" is supported");
    L->t->norm_replace_space = true;
    return NB_OK;
  }
  char what[128];
  snprintf(what, sizeof what, "normalizer type '%.40s' is not supported", ty);
  return bad(L, NB_ERR_UNIMPLEMENTED, field, what);
}

/* ---- pre-tokenizer ---- */

static nb_status set_regex(hf_load *L, const char *re, const char *field) {
  if (L->has_regex || L->t->metaspace)
    return bad(L, NB_ERR_UNIMPLEMENTED, field, "only one splitting pre-tokenizer (one regex, or Metaspace) is supported");
  L->has_regex = true;
  L->pattern = re;
  return NB_OK;
}

/* A String split pattern as a literal PCRE2 regex. */
static nb_status escape_literal(hf_load *L, const char *s) {
  size_t n = strlen(s);
  if (nb_tok__grow(L->t->ctx, (void **)&L->own_pattern, &L->own_cap, 2 * n + 1, 1)) return NB_ERR_NOMEM;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) && c >= 0x20)
      L->own_pattern[o++] = '\\';
    L->own_pattern[o++] = (char)c;
  }
  L->own_pattern[o] = 0;
  L->pattern = L->own_pattern;
  return NB_OK;
}

static nb_status prepend_scheme(hf_load *L, const cJSON *o, const char *field, nb_tok__prepend *out) {
  const char *s = get_str(o, "prepend_scheme");
  if (!s) {
    *out = get_bool(o, "add_prefix_space", true) ? NB_TOK__PREPEND_ALWAYS : NB_TOK__PREPEND_NEVER;
    return NB_OK;
  }
  if (!strcmp(s, "always")) *out = NB_TOK__PREPEND_ALWAYS;
  else if (!strcmp(s, "first")) *out = NB_TOK__PREPEND_FIRST;
  else if (!strcmp(s, "never")) *out = NB_TOK__PREPEND_NEVER;
  else return bad(L, NB_ERR_FORMAT, field, "prepend_scheme must be always, first or never");
  return NB_OK;
}

static nb_status pre_tokenizer(hf_load *L, const cJSON *p, const char *field) {
  if (is_null_or_absent(p)) return NB_OK;
  const char *ty = type_of(p);
  char sub[96];
  if (!strcmp(ty, "Sequence")) {
    const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    if (!cJSON_IsArray(arr)) return bad(L, NB_ERR_FORMAT, field, "Sequence without a 'pretokenizers' array");
    int i = 0;
    cJSON_ArrayForEach(it, arr) {
      snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", field, i++);
      nb_status r = pre_tokenizer(L, it, sub);
      if (r) return r;
    }
    return NB_OK;
  }
  if (!strcmp(ty, "ByteLevel")) {
    L->t->add_prefix_space = get_bool(p, "add_prefix_space", false);
    return get_bool(p, "use_regex", true) ? set_regex(L, NB_TOK_PATTERN_GPT2, field) : NB_OK;
  }
  if (!strcmp(ty, "Split")) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const char *re = get_str(pat, "Regex"), *lit = get_str(pat, "String"), *beh = get_str(p, "behavior");
    if (!re && !lit) return bad(L, NB_ERR_FORMAT, field, "Split needs pattern.Regex or pattern.String");
    if (!beh || strcmp(beh, "Isolated") != 0 || get_bool(p, "invert", false))
      return bad(L, NB_ERR_UNIMPLEMENTED, field, "only Split with behavior Isolated and invert false is supported");
    nb_status r = set_regex(L, re, field);
    if (!r && lit) r = escape_literal(L, lit);
    return r;
  }
  if (!strcmp(ty, "BertPreTokenizer") || !strcmp(ty, "WhitespaceSplit")) {
    /* whitespace (Rust's char::is_whitespace) removed; Bert: each punctuation
     * character (ASCII or Unicode P*) a piece of its own */
    nb_status r = set_regex(L, !strcmp(ty, "WhitespaceSplit") ? "[^\\t-\\r \\x{85}\\p{Z}]+"
                                : "[^\\t-\\r \\x{85}\\p{Z}!-/:-@\\[-`{-~\\p{P}]+|[!-/:-@\\[-`{-~\\p{P}]", field);
    L->t->re_drop_gaps = true;
    return r;
  }
  if (!strcmp(ty, "Metaspace")) {
    const char *rep = get_str(p, "replacement");
    if (rep && strcmp(rep, "\xE2\x96\x81") != 0) return bad(L, NB_ERR_UNIMPLEMENTED, field, "Metaspace replacement must be \xE2\x96\x81");
    if (L->has_regex || L->t->metaspace) return bad(L, NB_ERR_UNIMPLEMENTED, field, "only one splitting pre-tokenizer is supported");
    L->t->metaspace = true;
    L->t->ms_split = get_bool(p, "split", true);
    L->t->ms_split_runs = true;
    return prepend_scheme(L, p, field, &L->t->ms_prepend);
  }
  char what[128];
  snprintf(what, sizeof what, "pre-tokenizer type '%.40s' is not supported", ty);
  return bad(L, NB_ERR_UNIMPLEMENTED, field, what);
}

/* ---- decoder ---- */

static nb_status decoder(hf_load *L, const cJSON *d, const char *field) {
  if (is_null_or_absent(d)) return NB_OK;
  const char *ty = type_of(d);
  char sub[96];
  if (!strcmp(ty, "Sequence")) {
    const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(d, "decoders");
    if (!cJSON_IsArray(arr)) return bad(L, NB_ERR_FORMAT, field, "Sequence without a 'decoders' array");
    int i = 0;
    cJSON_ArrayForEach(it, arr) {
      snprintf(sub, sizeof sub, "%s.decoders[%d]", field, i++);
      nb_status r = decoder(L, it, sub);
      if (r) return r;
    }
    return NB_OK;
  }
  if (!strcmp(ty, "ByteLevel") || !strcmp(ty, "ByteFallback") || !strcmp(ty, "Fuse")) return NB_OK;
  if (!strcmp(ty, "Replace")) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(d, "pattern");
    const char *from = get_str(pat, "String"), *to = get_str(d, "content");
    if (!from || !to || strcmp(from, "\xE2\x96\x81") != 0 || strcmp(to, " ") != 0)
      return bad(L, NB_ERR_UNIMPLEMENTED, field, "only the Replace of \xE2\x96\x81 by \" \" is supported");
    return NB_OK;
  }
  if (!strcmp(ty, "Strip")) {
    const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start"), *stop = cJSON_GetObjectItemCaseSensitive(d, "stop");
    const char *content = get_str(d, "content");
    if (!content || strcmp(content, " ") || !cJSON_IsNumber(start) || start->valuedouble < 0 || start->valuedouble > 8 ||
        (cJSON_IsNumber(stop) && stop->valuedouble != 0))
      return bad(L, NB_ERR_UNIMPLEMENTED, field, "only Strip of leading spaces (content \" \", stop 0) is supported");
    L->t->strip_leading = (int)start->valuedouble;
    return NB_OK;
  }
  if (!strcmp(ty, "WordPiece")) {
    const char *prefix = get_str(d, "prefix");
    if (!prefix) prefix = "##";
    if (strlen(prefix) >= sizeof L->t->wp_dec_prefix) return bad(L, NB_ERR_UNIMPLEMENTED, field, "prefix longer than 15 bytes");
    strcpy(L->t->wp_dec_prefix, prefix);
    L->t->wp_decoder = true;
    L->t->wp_cleanup = get_bool(d, "cleanup", true);
    return NB_OK;
  }
  if (!strcmp(ty, "Metaspace")) {
    nb_tok__prepend p;
    nb_status r = prepend_scheme(L, d, field, &p);
    if (!r && p != NB_TOK__PREPEND_NEVER) L->t->strip_leading = 1;
    return r;
  }
  char what[128];
  snprintf(what, sizeof what, "decoder type '%.40s' is not supported", ty);
  return bad(L, NB_ERR_UNIMPLEMENTED, field, what);
}

/* ---- post-processor (applied with nb_tok_encode_opts.add_special_tokens) ---- */

static nb_status post_id(hf_load *L, int32_t id, bool prefix, const char *field) {
  nb_tok *t = L->t;
  if (id < 0 || id >= t->n_tokens || !(t->tokens[id].flags & NB_TOK__F_PRESENT))
    return bad(L, NB_ERR_FORMAT, field, "names a token id that is not in the vocabulary");
  int *n = prefix ? &t->n_post_prefix : &t->n_post_suffix;
  int32_t *ids = prefix ? t->post_prefix : t->post_suffix;
  if (*n == NB_TOK__MAX_POST) return bad(L, NB_ERR_UNIMPLEMENTED, field, "too many special tokens");
  ids[(*n)++] = id;
  return NB_OK;
}

/* A later processor wraps what the earlier ones made: its prefix goes first. */
static nb_status wrap(hf_load *L, const int32_t *pre, int npre, const int32_t *suf, int nsuf, const char *field) {
  nb_tok *t = L->t;
  int32_t old[NB_TOK__MAX_POST];
  int nold = t->n_post_prefix;
  memcpy(old, t->post_prefix, sizeof old);
  t->n_post_prefix = 0;
  nb_status r = NB_OK;
  for (int i = 0; i < npre && !r; i++) r = post_id(L, pre[i], true, field);
  for (int i = 0; i < nold && !r; i++) r = post_id(L, old[i], true, field);
  for (int i = 0; i < nsuf && !r; i++) r = post_id(L, suf[i], false, field);
  return r;
}

/* BertProcessing / RobertaProcessing: "cls": ["[CLS]", 101]. */
static nb_status pair_id(hf_load *L, const cJSON *p, const char *key, int32_t *id, const char *field) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, key);
  if (cJSON_GetArraySize(v) != 2 || !get_id(cJSON_GetArrayItem(v, 1), id)) {
    char what[96];
    snprintf(what, sizeof what, "'%s' must be a [token, id] pair", key);
    return bad(L, NB_ERR_FORMAT, field, what);
  }
  return NB_OK;
}

/* TemplateProcessing's single template: SpecialToken items before the one
 * Sequence "A" are the prefix, the others the suffix; each names an entry of
 * special_tokens whose "ids" are added. */
static nb_status template_single(hf_load *L, const cJSON *p, const char *field) {
  const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
  if (!cJSON_IsArray(single)) return bad(L, NB_ERR_FORMAT, field, "TemplateProcessing needs a 'single' array");
  int32_t pre[NB_TOK__MAX_POST], suf[NB_TOK__MAX_POST];
  int npre = 0, nsuf = 0, n_seq = 0, i = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, single) {
    char sub[128];
    snprintf(sub, sizeof sub, "%s.single[%d]", field, i++);
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence"), *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
    if (seq) {
      const char *which = get_str(seq, "id");
      if (!which || strcmp(which, "A") || n_seq++) return bad(L, NB_ERR_FORMAT, sub, "the single template must hold the sequence A once");
      continue;
    }
    const char *name = get_str(sp, "id");
    const cJSON *entry = name ? cJSON_GetObjectItemCaseSensitive(specials, name) : NULL;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
    if (!cJSON_IsArray(ids)) return bad(L, NB_ERR_FORMAT, sub, "a SpecialToken must name an entry of special_tokens with 'ids'");
    const cJSON *v;
    cJSON_ArrayForEach(v, ids) {
      int32_t id;
      int *n = n_seq ? &nsuf : &npre;
      if (!get_id(v, &id)) return bad(L, NB_ERR_FORMAT, sub, "special_tokens ids must be integers in [0, 2^28)");
      if (*n == NB_TOK__MAX_POST) return bad(L, NB_ERR_UNIMPLEMENTED, sub, "too many special tokens");
      (n_seq ? suf : pre)[(*n)++] = id;
    }
  }
  if (!n_seq) return bad(L, NB_ERR_FORMAT, field, "the single template must hold the sequence A once");
  return wrap(L, pre, npre, suf, nsuf, field);
}

static nb_status post_processor(hf_load *L, const cJSON *p, const char *field) {
  if (is_null_or_absent(p)) return NB_OK;
  const char *ty = type_of(p);
  char sub[96];
  if (!strcmp(ty, "Sequence")) {
    const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(p, "processors");
    if (!cJSON_IsArray(arr)) return bad(L, NB_ERR_FORMAT, field, "Sequence without a 'processors' array");
    int i = 0;
    cJSON_ArrayForEach(it, arr) {
      snprintf(sub, sizeof sub, "%s.processors[%d]", field, i++);
      nb_status r = post_processor(L, it, sub);
      if (r) return r;
    }
    return NB_OK;
  }
  if (!strcmp(ty, "ByteLevel")) return NB_OK; /* offsets only */
  if (!strcmp(ty, "TemplateProcessing")) return template_single(L, p, field);
  if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
    int32_t cls, sep;
    nb_status r = pair_id(L, p, "cls", &cls, field);
    if (!r) r = pair_id(L, p, "sep", &sep, field);
    return r ? r : wrap(L, &cls, 1, &sep, 1, field);
  }
  char what[128];
  snprintf(what, sizeof what, "post-processor type '%.40s' is not supported", ty);
  return bad(L, NB_ERR_UNIMPLEMENTED, field, what);
}

/* ---- model ---- */

static nb_status added_tokens(hf_load *L, const cJSON *arr) {
  if (is_null_or_absent(arr)) return NB_OK;
  if (!cJSON_IsArray(arr)) return bad(L, NB_ERR_FORMAT, "added_tokens", "must be an array");
  int i = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) {
    char field[64];
    snprintf(field, sizeof field, "added_tokens[%d]", i++);
    int32_t id;
    const char *content = get_str(it, "content");
    if (!get_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id) || !content)
      return bad(L, NB_ERR_FORMAT, field, "needs an integer 'id' in [0, 2^28) and a string 'content'");
    if (get_bool(it, "single_word", false)) return bad(L, NB_ERR_UNIMPLEMENTED, field, "single_word added tokens are not supported");
    uint8_t fl = NB_TOK__F_ADDED | (get_bool(it, "special", false) ? NB_TOK__F_SPECIAL : 0) |
                 (get_bool(it, "lstrip", false) ? NB_TOK__F_LSTRIP : 0) | (get_bool(it, "rstrip", false) ? NB_TOK__F_RSTRIP : 0);
    nb_status r = nb_tok__set_token(L->t, id, content, strlen(content), fl, L->name);
    if (r) return r;
  }
  return NB_OK;
}

static nb_status vocab(hf_load *L, const cJSON *v) {
  if (!cJSON_IsObject(v)) return bad(L, NB_ERR_FORMAT, "model.vocab", "must be an object (token -> id)");
  nb_tok *t = L->t;
  uint8_t *buf = NULL;
  size_t cap = 0;
  nb_status r = NB_OK;
  for (const cJSON *it = v->child; it && !r; it = it->next) {
    int32_t id;
    char field[128];
    snprintf(field, sizeof field, "model.vocab['%.60s']", it->string);
    if (!get_id(it, &id)) {
      r = bad(L, NB_ERR_FORMAT, field, "id must be an integer in [0, 2^28)");
      break;
    }
    if (id < t->n_tokens && (t->tokens[id].flags & NB_TOK__F_ADDED)) continue; /* also an added token */
    size_t n = strlen(it->string);
    if (!L->byte_level) {
      r = nb_tok__set_token(t, id, it->string, n, 0, L->name);
      continue;
    }
    if ((r = nb_tok__grow(t->ctx, (void **)&buf, &cap, n + 1, 1))) break;
    long m = nb_tok__unmap_bytes(it->string, n, buf);
    if (m < 0) r = bad(L, NB_ERR_FORMAT, field, "has a character outside the byte-level alphabet");
    else r = nb_tok__set_token(t, id, buf, (size_t)m, 0, L->name);
  }
  if (buf) nb_dealloc(t->ctx, buf, cap);
  return r;
}

/* A merge operand: a vocab token, else an added token of that content. */
static int32_t merge_side(hf_load *L, const char *s, size_t n, uint8_t *buf) {
  int32_t id = -1;
  if (!L->byte_level) {
    id = nb_tok__lookup(L->t, s, n);
  } else {
    long m = nb_tok__unmap_bytes(s, n, buf);
    if (m >= 0) id = nb_tok__lookup(L->t, buf, (size_t)m);
  }
  return id >= 0 ? id : nb_tok__added_id(L->t, s, n);
}

static nb_status merges(hf_load *L, const cJSON *arr) {
  if (!cJSON_IsArray(arr)) return bad(L, NB_ERR_FORMAT, "model.merges", "must be an array");
  nb_status r = NB_OK;
  uint8_t *buf = NULL;
  size_t cap = 0;
  int i = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) {
    char field[64];
    snprintf(field, sizeof field, "model.merges[%d]", i++);
    const char *a, *b;
    size_t an, bn;
    if (cJSON_IsString(it)) {
      const char *s = it->valuestring, *sp = strchr(s, ' ');
      if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) {
        r = bad(L, NB_ERR_FORMAT, field, "a merge string must be two tokens separated by one space");
        break;
      }
      a = s, an = (size_t)(sp - s), b = sp + 1, bn = strlen(sp + 1);
    } else if (cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) && cJSON_IsString(it->child->next)) {
      a = it->child->valuestring, an = strlen(a), b = it->child->next->valuestring, bn = strlen(b);
    } else {
      r = bad(L, NB_ERR_FORMAT, field, "a merge must be a string \"a b\" or a pair [\"a\", \"b\"]");
      break;
    }
    if ((r = nb_tok__grow(L->t->ctx, (void **)&buf, &cap, an + bn + 1, 1))) break;
    int32_t x = merge_side(L, a, an, buf), y = merge_side(L, b, bn, buf);
    if (x < 0 || y < 0) {
      char what[128];
      snprintf(what, sizeof what, "token '%.*s' is not in model.vocab", x < 0 ? (int)an : (int)bn, x < 0 ? a : b);
      r = bad(L, NB_ERR_FORMAT, field, what);
      break;
    }
    char where[160];
    snprintf(where, sizeof where, "%s: %s", L->name, field);
    if ((r = nb_tok__add_merge(L->t, x, y, -1, where))) break;
  }
  if (buf) nb_dealloc(L->t->ctx, buf, cap);
  return r;
}

/* The unk token: a vocab token, else an added token of that content; -1 when name is NULL. */
static nb_status unk_token(hf_load *L, const char *name, const char *field) {
  nb_tok *t = L->t;
  if (!name) return NB_OK;
  t->unk_id = nb_tok__lookup(t, name, strlen(name));
  if (t->unk_id < 0) t->unk_id = nb_tok__added_id(t, name, strlen(name));
  return t->unk_id < 0 ? bad(L, NB_ERR_FORMAT, field, "is not in the vocabulary") : NB_OK;
}

/* "vocab": [["token", score], ...], ids in order; "unk_id": id or null. */
static nb_status model_unigram(hf_load *L, const cJSON *m) {
  nb_tok *t = L->t;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "vocab");
  int n = cJSON_GetArraySize(v);
  if (!cJSON_IsArray(v) || n == 0) return bad(L, NB_ERR_FORMAT, "model.vocab", "must be a non-empty array of [token, score] pairs");
  if (L->byte_level) return bad(L, NB_ERR_UNIMPLEMENTED, "model", "a Unigram model with a ByteLevel pre-tokenizer/decoder is not supported");
  double *sc = nb_alloc(t->ctx, (size_t)n * sizeof *sc), min = 0;
  if (!sc) return NB_ERR_NOMEM;
  nb_status r = NB_OK;
  int id = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, v) {
    char field[64];
    snprintf(field, sizeof field, "model.vocab[%d]", id);
    const cJSON *tok = cJSON_GetArrayItem(it, 0), *score = cJSON_GetArrayItem(it, 1);
    if (cJSON_GetArraySize(it) != 2 || !cJSON_IsString(tok) || !cJSON_IsNumber(score) || !(score->valuedouble > -1e300 && score->valuedouble < 1e300)) {
      r = bad(L, NB_ERR_FORMAT, field, "must be a [token, finite score] pair");
      break;
    }
    sc[id] = score->valuedouble;
    if (id == 0 || sc[id] < min) min = sc[id];
    if (!(id < t->n_tokens && (t->tokens[id].flags & NB_TOK__F_ADDED)) &&
        (r = nb_tok__set_token(t, id, tok->valuestring, strlen(tok->valuestring), 0, L->name)))
      break;
    id++;
  }
  if (!r) r = nb_tok__index(t, L->name);
  if (!r && !(t->scores = nb_calloc(t->ctx, (size_t)t->n_tokens * sizeof *t->scores))) r = NB_ERR_NOMEM;
  if (!r) memcpy(t->scores, sc, (size_t)n * sizeof *sc);
  nb_dealloc(t->ctx, sc, (size_t)n * sizeof *sc);
  if (r) return r;
  const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_id");
  if (!is_null_or_absent(unk)) {
    if (!get_id(unk, &t->unk_id) || t->unk_id >= n) return bad(L, NB_ERR_FORMAT, "model.unk_id", "must be the index of a model.vocab entry");
  }
  t->byte_fallback = get_bool(m, "byte_fallback", false);
  return nb_tok__unigram_finish(t, min, false);
}

static nb_status model_wordpiece(hf_load *L, const cJSON *m) {
  nb_tok *t = L->t;
  if (L->byte_level) return bad(L, NB_ERR_UNIMPLEMENTED, "model", "a WordPiece model with a ByteLevel pre-tokenizer/decoder is not supported");
  const char *prefix = get_str(m, "continuing_subword_prefix");
  if (!prefix) prefix = "##";
  if (strlen(prefix) >= sizeof t->wp_prefix) return bad(L, NB_ERR_UNIMPLEMENTED, "model.continuing_subword_prefix", "longer than 15 bytes");
  strcpy(t->wp_prefix, prefix);
  const cJSON *mx = cJSON_GetObjectItemCaseSensitive(m, "max_input_chars_per_word");
  t->wp_max_chars = 100;
  if (!is_null_or_absent(mx) && !get_id(mx, &t->wp_max_chars))
    return bad(L, NB_ERR_FORMAT, "model.max_input_chars_per_word", "must be an integer in [0, 2^28)");
  nb_status r = vocab(L, cJSON_GetObjectItemCaseSensitive(m, "vocab"));
  if (!r) r = nb_tok__index(t, L->name);
  const char *unk = get_str(m, "unk_token");
  if (!r) r = unk_token(L, unk ? unk : "[UNK]", "model.unk_token");
  t->model = NB_TOK__MODEL_WORDPIECE;
  return r ? r : nb_tok__prefix_index(t, false);
}

static nb_status model(hf_load *L, const cJSON *m) {
  nb_tok *t = L->t;
  if (!cJSON_IsObject(m)) return bad(L, NB_ERR_FORMAT, "model", "missing or not an object");
  const char *ty = get_str(m, "type");
  if (ty && !strcmp(ty, "Unigram")) return model_unigram(L, m);
  if (ty && !strcmp(ty, "WordPiece")) return model_wordpiece(L, m);
  if (ty && strcmp(ty, "BPE") != 0) {
    char what[128];
    snprintf(what, sizeof what, "model type '%.40s' is not supported (BPE, Unigram and WordPiece are)", ty);
    return bad(L, NB_ERR_UNIMPLEMENTED, "model.type", what);
  }
  const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
  if (!is_null_or_absent(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0))
    return bad(L, NB_ERR_UNIMPLEMENTED, "model.dropout", "BPE dropout is not supported");
  const char *csp = get_str(m, "continuing_subword_prefix"), *eow = get_str(m, "end_of_word_suffix");
  if ((csp && *csp) || (eow && *eow))
    return bad(L, NB_ERR_UNIMPLEMENTED, csp && *csp ? "model.continuing_subword_prefix" : "model.end_of_word_suffix",
               "subword prefixes/suffixes are not supported");
  t->byte_fallback = get_bool(m, "byte_fallback", false);
  t->fuse_unk = get_bool(m, "fuse_unk", false);
  t->ignore_merges = get_bool(m, "ignore_merges", false);
  nb_status r = vocab(L, cJSON_GetObjectItemCaseSensitive(m, "vocab"));
  if (!r) r = nb_tok__index(t, L->name);
  if (r) return r;
  if ((r = unk_token(L, get_str(m, "unk_token"), "model.unk_token"))) return r;
  const cJSON *mg = cJSON_GetObjectItemCaseSensitive(m, "merges");
  if (is_null_or_absent(mg)) return bad(L, NB_ERR_FORMAT, "model.merges", "missing");
  return merges(L, mg);
}

static nb_tok *load(nb_ctx *ctx, const char *json, size_t len, const char *name) {
  nb_tok *t = nb_tok__create(ctx, NB_TOK_BYTE_LEVEL);
  if (!t) return NULL;
  hf_load L = {.t = t, .name = name ? name : "tokenizer.json"};
  cJSON *root = cJSON_ParseWithLength(json, len);
  nb_status r = NB_OK;
  if (!root) r = nb_errorf(ctx, NB_ERR_FORMAT, "%s: not valid JSON", L.name);
  else if (!cJSON_IsObject(root)) r = bad(&L, NB_ERR_FORMAT, "(top level)", "must be an object");
  if (!r) {
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    L.byte_level = mentions_bytelevel(pre) || mentions_bytelevel(dec);
    t->kind = L.byte_level ? NB_TOK_BYTE_LEVEL : NB_TOK_CHAR_LEVEL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    int64_t entries = (int64_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) +
                      cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "vocab"));
    if (entries * 4 + 1024 < t->id_limit) t->id_limit = (int32_t)(entries * 4 + 1024);
    r = added_tokens(&L, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (!r) r = model(&L, cJSON_GetObjectItemCaseSensitive(root, "model"));
    if (!r) r = normalizer(&L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer");
    if (!r) r = pre_tokenizer(&L, pre, "pre_tokenizer");
    if (!r) r = decoder(&L, dec, "decoder");
    if (!r) r = post_processor(&L, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor");
    if (!r && L.pattern) {
      char where[128];
      snprintf(where, sizeof where, "%s: pre_tokenizer", L.name);
      r = nb_tok__set_pattern(t, L.pattern, where);
    }
    if (!r) r = nb_tok__finish(t);
  }
  if (root) cJSON_Delete(root);
  if (L.own_pattern) nb_dealloc(ctx, L.own_pattern, L.own_cap);
  if (r) {
    nb_tok_destroy(t);
    return NULL;
  }
  return t;
}

nb_tok *nb_tok_load_hf_string(nb_ctx *ctx, const char *json, size_t len, const char *name) {
  if (!json) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_load_hf_string: NULL json"), NULL;
  return load(ctx, json, len, name);
}

nb_tok *nb_tok_load_hf(nb_ctx *ctx, const char *path) {
  char *data;
  size_t n;
  if (nb_tok__read_file(ctx, path, &data, &n)) return NULL;
  nb_tok *t = load(ctx, data, n, path);
  nb_dealloc(ctx, data, n + 1);
  return t;
}
