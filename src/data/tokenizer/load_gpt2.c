/* Loading GPT-2 style vocabularies (vocab.json: token -> id in the byte-to-
 * unicode alphabet; merges.txt: one "left right" merge per line, best
 * first), reading whole files, and nb_tok_load's dispatch on what a path
 * holds. Not here: tokenizer.json (load_hf.c), SentencePiece (load_spm.c). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "data/tokenizer/tok_internal.h"

nb_status nb_tok__read_file(nb_ctx *ctx, const char *path, char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return nb_errorf(ctx, errno == ENOENT ? NB_ERR_NOT_FOUND : NB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return nb_errorf(ctx, NB_ERR_IO, "%s: not a regular file", path);
  }
  size_t n = (size_t)st.st_size;
  char *buf = nb_alloc(ctx, n + 1);
  if (!buf) return fclose(f), NB_ERR_NOMEM;
  size_t got = fread(buf, 1, n, f);
  fclose(f);
  if (got != n) {
    nb_dealloc(ctx, buf, n + 1);
    return nb_errorf(ctx, NB_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n);
  }
  buf[n] = 0;
  *data = buf;
  *len = n;
  return NB_OK;
}

static bool is_special_name(const nb_tok_gpt2_opts *o, const char *s) {
  if (!o || o->n_special == 0) return strcmp(s, "<|endoftext|>") == 0;
  for (int i = 0; i < o->n_special; i++)
    if (o->special[i] && strcmp(o->special[i], s) == 0) return true;
  return false;
}

static nb_status load_vocab(nb_tok *t, const char *json, size_t len, const nb_tok_gpt2_opts *o, const char *name) {
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root) return nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: not valid JSON (near byte %td)", name,
                              cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : (ptrdiff_t)-1);
  nb_status r = NB_OK;
  if (!cJSON_IsObject(root)) r = nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: the top level must be an object (token -> id)", name);
  uint8_t *buf = NULL;
  size_t cap = 0;
  int64_t entries = cJSON_GetArraySize(root);
  if (entries * 4 + 1024 < t->id_limit) t->id_limit = (int32_t)(entries * 4 + 1024);
  for (cJSON *it = root->child; it && !r; it = it->next) {
    double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
    if (v < 0 || v >= (1 << 28) || v != (double)(int32_t)v) {
      r = nb_errorf(t->ctx, NB_ERR_FORMAT, "%s: token '%.60s': id must be an integer in [0, 2^28)", name, it->string);
      break;
    }
    size_t n = strlen(it->string);
    if ((r = nb_tok__grow(t->ctx, (void **)&buf, &cap, n + 1, 1))) break;
    long m = nb_tok__unmap_bytes(it->string, n, buf);
    char where[160];
    snprintf(where, sizeof where, "%s: token '%.60s'", name, it->string);
    if (is_special_name(o, it->string)) {
      r = nb_tok__set_token(t, (int32_t)v, it->string, n, NB_TOK__F_ADDED | NB_TOK__F_SPECIAL, where);
    } else if (m < 0) {
      r = nb_errorf(t->ctx, NB_ERR_FORMAT, "%s has a character outside GPT-2's byte-to-unicode alphabet", where);
    } else {
      r = nb_tok__set_token(t, (int32_t)v, buf, (size_t)m, 0, where);
    }
  }
  if (buf) nb_dealloc(t->ctx, buf, cap);
  cJSON_Delete(root);
  return r;
}

/* Looks up one side of a merge line (alphabet text) as an id. */
static int32_t merge_side(nb_tok *t, const char *s, size_t n, uint8_t *buf) {
  long m = nb_tok__unmap_bytes(s, n, buf);
  return m < 0 ? -1 : nb_tok__lookup(t, buf, (size_t)m);
}

static nb_status load_merges(nb_tok *t, const char *txt, size_t len, const char *name) {
  uint8_t *buf = nb_alloc(t->ctx, len + 1);
  if (!buf) return NB_ERR_NOMEM;
  nb_status r = NB_OK;
  size_t i = 0, line = 0;
  while (i < len && !r) {
    size_t e = i;
    while (e < len && txt[e] != '\n') e++;
    line++;
    size_t end = e;
    if (end > i && txt[end - 1] == '\r') end--;
    const char *s = txt + i;
    size_t n = end - i;
    i = e + 1;
    if (n == 0 || (line == 1 && n >= 8 && !memcmp(s, "#version", 8))) continue;
    const char *sp = memchr(s, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)) || sp == s || sp + 1 == s + n) {
      r = nb_errorf(t->ctx, NB_ERR_FORMAT, "%s line %zu: expected two tokens separated by one space, got '%.*s'", name,
                    line, (int)(n < 60 ? n : 60), s);
      break;
    }
    int32_t a = merge_side(t, s, (size_t)(sp - s), buf), b = merge_side(t, sp + 1, (size_t)(s + n - sp - 1), buf);
    if (a < 0 || b < 0) {
      r = nb_errorf(t->ctx, NB_ERR_FORMAT, "%s line %zu: token '%.*s' is not in the vocabulary", name, line,
                    a < 0 ? (int)(sp - s) : (int)(s + n - sp - 1), a < 0 ? s : sp + 1);
      break;
    }
    char where[96];
    snprintf(where, sizeof where, "%s line %zu", name, line);
    r = nb_tok__add_merge(t, a, b, -1, where);
  }
  nb_dealloc(t->ctx, buf, len + 1);
  return r;
}

static nb_tok *load_gpt2(nb_ctx *ctx, const char *vocab, size_t vlen, const char *vname, const char *merges,
                         size_t mlen, const char *mname, const nb_tok_gpt2_opts *o) {
  nb_tok *t = nb_tok__create(ctx, NB_TOK_BYTE_LEVEL);
  if (!t) return NULL;
  const char *pattern = o && o->pattern ? o->pattern : NB_TOK_PATTERN_GPT2;
  nb_status r = load_vocab(t, vocab, vlen, o, vname);
  if (!r) r = nb_tok__index(t, vname);
  if (!r) r = load_merges(t, merges, mlen, mname);
  if (!r) r = nb_tok__set_pattern(t, pattern, "gpt2 options: pattern");
  if (!r) r = nb_tok__finish(t);
  if (r) {
    nb_tok_destroy(t);
    return NULL;
  }
  return t;
}

nb_tok *nb_tok_load_gpt2_strings(nb_ctx *ctx, const char *vocab_json, size_t vocab_len, const char *merges_txt,
                                 size_t merges_len, const nb_tok_gpt2_opts *opts) {
  if (!vocab_json || !merges_txt) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_load_gpt2_strings: NULL"), NULL;
  return load_gpt2(ctx, vocab_json, vocab_len, "vocab.json", merges_txt, merges_len, "merges.txt", opts);
}

nb_tok *nb_tok_load_gpt2(nb_ctx *ctx, const char *vocab_path, const char *merges_path, const nb_tok_gpt2_opts *opts) {
  char *v = NULL, *m = NULL;
  size_t vn = 0, mn = 0;
  if (nb_tok__read_file(ctx, vocab_path, &v, &vn)) return NULL;
  if (nb_tok__read_file(ctx, merges_path, &m, &mn)) return nb_dealloc(ctx, v, vn + 1), NULL;
  nb_tok *t = load_gpt2(ctx, v, vn, vocab_path, m, mn, merges_path, opts);
  nb_dealloc(ctx, v, vn + 1);
  nb_dealloc(ctx, m, mn + 1);
  return t;
}

static bool exists(const char *dir, const char *file, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s", dir, file);
  struct stat st;
  return stat(out, &st) == 0 && S_ISREG(st.st_mode);
}

/* A file's kind by its first bytes, whatever its name: a tokenizer.json is
 * a JSON object ('{' after white space or a UTF-8 BOM); a SentencePiece
 * model is a protobuf ModelProto, which opens with its first piece (field 1,
 * length-delimited: byte 0x0a). */
static nb_tok *load_file(nb_ctx *ctx, const char *path) {
  char *data = NULL;
  size_t n = 0;
  if (nb_tok__read_file(ctx, path, &data, &n)) return NULL;
  const unsigned char *head = (const unsigned char *)data;
  size_t i = n >= 3 && head[0] == 0xef && head[1] == 0xbb && head[2] == 0xbf ? 3 : 0;
  while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r')) i++;
  nb_tok *t = NULL;
  if (i < n && head[i] == '{') t = nb_tok_load_hf_string(ctx, data, n, path);
  else if (n > 0 && head[0] == 0x0a) t = nb_tok_load_sentencepiece_bytes(ctx, data, n, path);
  else
    nb_errorf(ctx, NB_ERR_FORMAT, "%s: neither a tokenizer.json (a JSON object) nor a SentencePiece model (a protobuf)%s", path,
              n ? "" : ": the file is empty");
  nb_dealloc(ctx, data, n + 1);
  return t;
}

nb_tok *nb_tok_load(nb_ctx *ctx, const char *path) {
  if (!path) return nb_errorf(ctx, NB_ERR_INVALID_ARG, "nb_tok_load: NULL path"), NULL;
  struct stat st;
  if (stat(path, &st) != 0) return nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: no such file or directory", path), NULL;
  if (!S_ISDIR(st.st_mode)) return load_file(ctx, path);
  char a[4096], b[4096];
  if (exists(path, "tokenizer.json", a, sizeof a)) return nb_tok_load_hf(ctx, a);
  if (exists(path, "vocab.json", a, sizeof a) && exists(path, "merges.txt", b, sizeof b))
    return nb_tok_load_gpt2(ctx, a, b, NULL);
  if (exists(path, "tokenizer.model", a, sizeof a)) return nb_tok_load_sentencepiece(ctx, a);
  nb_errorf(ctx, NB_ERR_NOT_FOUND, "%s: holds no tokenizer.json, vocab.json + merges.txt, or tokenizer.model", path);
  return NULL;
}
